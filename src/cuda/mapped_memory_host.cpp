#include <cstdlib>
#include <cstring>
#include <new>

#include "cuda/mapped_memory.h"

namespace ferry::cuda {

std::shared_ptr<MappedBlock> alloc_host_for_testing(size_t bytes) {
  bytes = (bytes + kSlotBytes - 1) / kSlotBytes * kSlotBytes;
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  auto b = std::make_shared<MappedBlock>();
  b->host = static_cast<uint8_t*>(p);
  b->device = reinterpret_cast<uint64_t>(p);
  b->bytes = bytes;
  b->kind = "host (testing)";
  b->owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return b;
}

}  // namespace ferry::cuda

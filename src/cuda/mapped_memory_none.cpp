// Build without CUDA: the GPU-facing allocators exist and refuse.
#include "cuda/mapped_memory.h"
#include "ferry/status.h"

namespace ferry::cuda {

namespace {
[[noreturn]] void unavailable() {
  throw Error(Code::kUnimplemented,
              "ferry was built without CUDA (FERRY_CUDA=OFF or no CUDA toolkit found): UVM "
              "watchers and GPU-visible immediate counters are unavailable");
}
}  // namespace

std::shared_ptr<MappedBlock> alloc_mapped_host(size_t) {
  unavailable();
}
std::shared_ptr<MappedBlock> alloc_flag_memory(size_t) {
  unavailable();
}
bool cuda_built() {
  return false;
}

}  // namespace ferry::cuda

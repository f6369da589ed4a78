// The fixed pool of per-operation contexts handed to libfabric (OpPool).
#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

const char* op_kind_name(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kWrite:
      return "write";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kInternalRecv:
      return "internal recv";
    case OpKind::kOrphan:
      return "abandoned op";
    case OpKind::kFree:
      break;
  }
  return "unknown op";
}

OpPool::OpPool(size_t capacity)
    : capacity_(capacity),
      entries_(std::make_unique<OpEntry[]>(capacity)),
      free_(std::make_unique_for_overwrite<uint32_t[]>(capacity)),
      free_count_(capacity) {
  // Lowest index on top: recently used entries stay warm in cache.
  for (size_t i = 0; i < capacity; ++i) free_[i] = static_cast<uint32_t>(capacity - 1 - i);
}

}  // namespace ferry::fabric

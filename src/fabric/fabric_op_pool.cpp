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

OpEntry* OpPool::acquire(OpKind kind, uint64_t user_ctx) noexcept {
  if (free_count_ == 0) return nullptr;
  OpEntry* e = &entries_[free_[--free_count_]];
  e->user_ctx = user_ctx;
  e->kind = kind;
  e->buf = nullptr;
  e->desc = nullptr;
  e->len = 0;
  e->peer = FI_ADDR_NOTAVAIL;
  e->seen_scan = 0;
  return e;
}

void OpPool::release(OpEntry* entry) noexcept {
  if (entry == nullptr || entry->kind == OpKind::kFree) return;
  entry->kind = OpKind::kFree;
  free_[free_count_++] = static_cast<uint32_t>(entry - entries_.get());
}

OpEntry* OpPool::from_context(void* op_context) noexcept {
  const auto p = reinterpret_cast<uintptr_t>(op_context);
  const auto begin = reinterpret_cast<uintptr_t>(entries_.get());
  const uintptr_t end = begin + capacity_ * sizeof(OpEntry);
  if (p < begin || p >= end || (p - begin) % sizeof(OpEntry) != 0) return nullptr;
  return reinterpret_cast<OpEntry*>(op_context);
}

}  // namespace ferry::fabric

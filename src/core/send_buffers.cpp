#include "core/send_buffers.h"

namespace ferry::core {

void SendBuffers::reset(uint32_t n) {
  next_ = std::make_unique<std::atomic<uint32_t>[]>(n);
  for (uint32_t i = 0; i < n; ++i) next_[i].store(i + 1 < n ? i + 1 : kNone);
  head_.store(n > 0 ? 0 : kNone);
}

bool SendBuffers::try_pop(uint32_t* out) {
  uint64_t h = head_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t top = index_of(h);
    if (top == kNone) return false;
    // Stale when another thread took `top` meanwhile; the tag then fails the CAS.
    const uint32_t below = next_[top].load(std::memory_order_relaxed);
    if (head_.compare_exchange_weak(h, with(h, below), std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      *out = top;
      return true;
    }
  }
}

void SendBuffers::push(uint32_t i) {
  uint64_t h = head_.load(std::memory_order_relaxed);
  do {
    next_[i].store(index_of(h), std::memory_order_relaxed);
  } while (!head_.compare_exchange_weak(h, with(h, i), std::memory_order_seq_cst,
                                        std::memory_order_relaxed));
}

Status SendBuffers::acquire(Clock::time_point deadline, bool wait, uint32_t* out) {
  auto none = [] {
    return Status(Code::kResourceExhausted,
                  "submit_send: every send buffer is in flight (EngineConfig::send_buffer_count)");
  };
  if (room_.closed()) return RoomWait::stopped();
  if (try_pop(out)) return {};
  if (!wait) return none();
  return room_.wait(
      deadline, [&] { return try_pop(out); }, none);
}

}  // namespace ferry::core

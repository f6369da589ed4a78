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
  auto stopped = [] { return Status(Code::kFailedPrecondition, "the transfer engine is stopped"); };
  auto none = [] {
    return Status(Code::kResourceExhausted,
                  "submit_send: every send buffer is in flight (EngineConfig::send_buffer_count)");
  };
  if (closed_.load(std::memory_order_acquire)) return stopped();
  if (try_pop(out)) return {};
  if (!wait) return none();
  std::unique_lock lk(mu_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  // Pairs with release: its push is seen below, or its load sees this waiter.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Status st;
  for (;;) {
    if (closed_.load(std::memory_order_acquire)) {
      st = stopped();
      break;
    }
    if (try_pop(out)) break;
    if (deadline == Clock::time_point{}) {
      cv_.wait(lk);
    } else if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      if (closed_.load(std::memory_order_acquire))
        st = stopped();
      else if (!try_pop(out))
        st = none();
      break;
    }
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return st;
}

void SendBuffers::close() {
  closed_.store(true, std::memory_order_release);
  std::lock_guard lk(mu_);
  cv_.notify_all();
}

}  // namespace ferry::core

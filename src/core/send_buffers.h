// Indices of the engine's free send buffers: taken by submitters (submit_send)
// and given back by the worker once the send completed. A lock-free stack (R.
// K. Treiber's, its head tagged against ABA), so neither side takes a lock on
// its way to the wire; the lock and condition variable are only for a
// submitter that finds none and waits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ferry/types.h"

namespace ferry::core {

class SendBuffers {
 public:
  using Clock = std::chrono::steady_clock;

  // n buffers, every one free. Before any other call.
  void reset(uint32_t n);
  // Any thread.
  void release(uint32_t i) {
    push(i);
    // Pairs with acquire's fence: a waiter either finds i, or is counted here.
    // push's exchange and this load are sequentially consistent, so no fence
    // here (on x86 a second full barrier after the locked exchange).
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lk(mu_);
      cv_.notify_one();
    }
  }
  // kOk with *out set; kResourceExhausted when none came by the deadline (at
  // once when !wait; epoch = no deadline); kFailedPrecondition once closed.
  Status acquire(Clock::time_point deadline, bool wait, uint32_t* out);
  // Wakes every waiter; acquire fails from now on.
  void close();

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static uint32_t index_of(uint64_t head) { return uint32_t(head); }
  static uint64_t with(uint64_t head, uint32_t index) {
    return (((head >> 32) + 1) << 32) | index;  // every change bumps the tag
  }
  bool try_pop(uint32_t* out);
  void push(uint32_t i);

  std::unique_ptr<std::atomic<uint32_t>[]> next_;
  alignas(64) std::atomic<uint64_t> head_{kNone};  // tag << 32 | top index
  alignas(64) std::atomic<int32_t> waiters_{0};
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace ferry::core

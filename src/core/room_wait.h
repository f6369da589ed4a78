// Where submitters wait for room that a lock-free counter or stack hands out
// (a group's admission credits, the engine's send buffers). Taking and giving
// back room take no lock; only a submitter that finds none waits here, and a
// give-back takes the lock only when someone waits.
//
// The pairing that keeps a give-back from going unseen: the giver changes the
// room with a sequentially consistent read-modify-write, then released()
// loads the count of waiters (sequentially consistent); a waiter counts
// itself, fences, then tries to take. Either the taker sees the room, or the
// giver sees the waiter and notifies under the lock the waiter holds between
// its try and its wait.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "ferry/types.h"

namespace ferry::core {

class RoomWait {
 public:
  using Clock = std::chrono::steady_clock;

  // After giving room back (see above): wakes one waiter if any.
  void released() {
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lk(mu_);
      cv_.notify_one();
    }
  }
  // What a wait, and the owner's own calls, return once close() was called.
  static Status stopped() {
    return Status(Code::kFailedPrecondition, "the transfer engine is stopped");
  }
  // Wakes every waiter; they, and every wait from now on, fail with stopped().
  void close() {
    closed_.store(true, std::memory_order_seq_cst);
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Threads inside wait() now (a gauge: the owner may look before it sleeps).
  int32_t waiting() const { return waiters_.load(std::memory_order_relaxed); }

  // Waits until take() returns true (kOk), the deadline passes (full();
  // epoch = no deadline) or close() (stopped()). take() runs under the lock.
  template <typename Take, typename Full>
  Status wait(Clock::time_point deadline, Take&& take, Full&& full) {
    std::unique_lock lk(mu_);
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    Status st;
    for (;;) {
      if (closed()) {
        st = stopped();
        break;
      }
      if (take()) break;
      if (deadline == Clock::time_point{}) {
        cv_.wait(lk);
      } else if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
        if (closed())
          st = stopped();
        else if (!take())
          st = full();
        break;
      }
    }
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
    return st;
  }

 private:
  alignas(64) std::atomic<int32_t> waiters_{0};
  std::atomic<bool> closed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace ferry::core

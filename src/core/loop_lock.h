// The worker's loop lock (Worker::loop_mu_): held by whoever drives the
// worker's NICs, the worker itself or a thread posting or polling for it.
// Everyone but the worker's first turn takes it with try_lock and spins or
// yields on failure, so the lock needs no sleeping waiters: taking it is one
// exchange and releasing it one store, where a mutex's unlock is a second
// atomic read-modify-write (for waiters to wake that never exist here) on
// every helping poll and every inline post.
#pragma once

#include <sched.h>

#include <atomic>

namespace ferry::core {

class LoopLock {
 public:
  // Reads first: a thread that finds the lock held leaves its line shared
  // rather than taking it from the holder.
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) &&
           !held_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept {
    while (!try_lock()) ::sched_yield();
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

}  // namespace ferry::core

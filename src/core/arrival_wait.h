// How an application thread waits for what a worker hands it (an immediate
// counter's arrivals, a received message): it spins first, polling the NICs
// itself while the worker idles (progress_help.h), since arrivals are often
// microseconds away; then it sleeps on a condition variable that the worker
// signals only while someone sleeps, so an arrival nobody sleeps on costs the
// worker one load. ImmCounter and RecvQueue share it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "core/cpu_relax.h"
#include "core/progress_help.h"

namespace ferry::core {

struct ArrivalSignal {
  std::atomic<int32_t> waiters{0};
  // Set when the engine stops (or the counter is removed): every wait ends
  // once nothing is left to take.
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  std::condition_variable cv;

  void cancel() {
    cancelled.store(true, std::memory_order_seq_cst);
    std::lock_guard lk(mu);
    cv.notify_all();
  }

  // After an arrival is published. A waiter registers before it looks again,
  // so either it sees the arrival or this sees it registered and wakes it.
  void notify() {
    if (waiters.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lk(mu);
      cv.notify_all();
    }
  }
};

enum class WaitEnd : uint8_t { kTaken, kCancelled, kExpired };

// Fruitless polls a waiter spins through before it yields its core between
// polls: a yield per poll would put a system call between an arrival and the
// thread that waits for it. The callback thread helping the workers follows it.
inline constexpr uint32_t kSpinPollsBeforeYield = 200;

// now + timeout, saturated: a timeout of years must not overflow the clock.
inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) {
  return timeout >= std::chrono::steady_clock::time_point::max() - now
             ? std::chrono::steady_clock::time_point::max()
             : now + timeout;
}

// take(): takes what is waited for if it is there (no helping). help (may be
// null): polls the NICs for an idle worker while this thread spins, and is
// left before it sleeps. spin: never sleep (a core busy for the whole wait, no
// wake-up). What is there is taken even after a cancel or at the deadline.
template <typename Take>
WaitEnd wait_arrival(ArrivalSignal& s, Take&& take, ProgressHelp* help,
                     std::chrono::steady_clock::time_point deadline, bool spin) {
  auto try_take = [&] { return take() || (help != nullptr && help->try_help() && take()); };
  if (spin) {
    for (uint32_t i = 1;; ++i) {
      if (try_take()) return WaitEnd::kTaken;
      if (s.cancelled.load(std::memory_order_acquire))
        return take() ? WaitEnd::kTaken : WaitEnd::kCancelled;
      // A clock read costs tens of pause instructions: one per 64 polls.
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline)
        return take() ? WaitEnd::kTaken : WaitEnd::kExpired;
      // A thread that polls the NICs spins as a poll-mode driver does: each
      // poll is long already, and a pause (over a hundred cycles on some
      // server cores) would only stand between an arrival and its poll.
      if (help == nullptr) cpu_relax();
    }
  }
  for (int i = 0; i < 2000; ++i) {
    if (try_take()) return WaitEnd::kTaken;
    if (s.cancelled.load(std::memory_order_acquire))
      return take() ? WaitEnd::kTaken : WaitEnd::kCancelled;
    if (uint32_t(i) > kSpinPollsBeforeYield) std::this_thread::yield();
  }
  if (help != nullptr) help->leave();
  s.waiters.fetch_add(1, std::memory_order_seq_cst);
  WaitEnd end = WaitEnd::kTaken;
  {
    std::unique_lock lk(s.mu);
    // No helping from here: an arrival counted on this thread would take mu.
    for (;;) {
      if (take()) break;
      if (s.cancelled.load(std::memory_order_acquire)) {
        end = take() ? WaitEnd::kTaken : WaitEnd::kCancelled;
        break;
      }
      if (s.cv.wait_until(lk, deadline) == std::cv_status::timeout) {
        end = take() ? WaitEnd::kTaken : WaitEnd::kExpired;
        break;
      }
    }
  }
  s.waiters.fetch_sub(1, std::memory_order_seq_cst);
  return end;
}

}  // namespace ferry::core

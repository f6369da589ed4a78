// Lets threads outside the engine call into it (poll its NICs, give a receive
// buffer back) only while it runs: after close() returns no call is inside
// and none will enter, so what the call touches may go away. Objects that may
// outlive their engine (counters, receive queues, messages) hold one shared.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace ferry::core {

class Lifeline {
 public:
  // Runs f() unless closed; true when it ran.
  template <typename F>
  bool run(F&& f) {
    users_.fetch_add(1, std::memory_order_seq_cst);
    const bool live = live_.load(std::memory_order_seq_cst);
    if (live) f();
    users_.fetch_sub(1, std::memory_order_release);
    return live;
  }

  void close() {
    live_.store(false, std::memory_order_seq_cst);
    while (users_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }

 private:
  std::atomic<int32_t> users_{0};
  std::atomic<bool> live_{true};
};

}  // namespace ferry::core

// A thread waiting for arrivals (ImmCounter::try_consume, wait) may drive the
// NICs itself while the worker idles, instead of waiting for the worker to be
// scheduled: on a machine with fewer cores than spinning threads each such
// hand-off is a context switch. The engine installs the hook (adaptive polling
// with NICs any thread may call) and closes it before its workers stop; a
// counter may outlive its engine, so the hook is shared and checked per use.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

namespace ferry::core {

class ProgressHelp {
 public:
  explicit ProgressHelp(std::function<bool()> help) : help_(std::move(help)) {}

  // True when the call polled something (an arrival may now be counted).
  bool try_help() {
    users_.fetch_add(1, std::memory_order_seq_cst);
    bool did = false;
    if (live_.load(std::memory_order_seq_cst)) did = help_();
    users_.fetch_sub(1, std::memory_order_release);
    return did;
  }

  // After close() returns no call is inside help_ and none will enter it.
  void close() {
    live_.store(false, std::memory_order_seq_cst);
    while (users_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }

 private:
  std::function<bool()> help_;
  std::atomic<int32_t> users_{0};
  std::atomic<bool> live_{true};
};

}  // namespace ferry::core

// The monotonic clock as of the kernel's last tick: the same origin as
// steady_clock (CLOCK_MONOTONIC), 1-4 ms behind it, and several times cheaper
// to read. For the per-post liveness checks of the transports, whose periods
// are tens of milliseconds, and the deadlines of submissions, which the worker
// checks once a millisecond: a precise read there sat on the way to the wire.
#pragma once

#include <time.h>

#include <chrono>

namespace ferry::core {

inline std::chrono::steady_clock::time_point coarse_now() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) +
                                               std::chrono::nanoseconds(ts.tv_nsec));
}

// How far coarse_now() may be behind the precise clock: a deadline computed
// from it is pushed this much later, so that it is never early.
inline std::chrono::nanoseconds coarse_tick() noexcept {
  static const std::chrono::nanoseconds tick = [] {
    timespec ts{};
    clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  }();
  return tick;
}

}  // namespace ferry::core

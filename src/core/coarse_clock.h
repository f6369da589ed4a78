// The monotonic clock as of the kernel's last tick: the same origin as
// steady_clock (CLOCK_MONOTONIC), 1-4 ms behind it, and several times cheaper
// to read. For the per-post liveness checks of the transports, whose periods
// are tens of milliseconds: a precise read there sat between the worker and
// the provider on every post.
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

}  // namespace ferry::core

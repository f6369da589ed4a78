// The results of a point (each implementation's run, the median of several,
// the fraction ferry / baseline) and the loops that produce them: a window of
// requests kept in flight, and a ping-pong. Both implementations of a point
// run the same loop, so they differ only in what a request is.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "options.h"
#include "plan.h"

namespace ferry_bench {

struct Result {
  bool ran = false;
  uint64_t requests = 0, writes = 0, bytes = 0, errors = 0;
  double seconds = 0, cpu = 0;
  std::vector<double> lat_us;  // per request (throughput) or half round trip (latency)
  std::string verify;          // "", "ok" or what failed
  std::string error;

  double pct(double q) const {
    if (lat_us.empty()) return 0;
    std::vector<double> v = lat_us;
    size_t i = std::min(v.size() - 1, size_t(q * double(v.size())));
    std::nth_element(v.begin(), v.begin() + long(i), v.end());
    return v[i];
  }
  double gbs() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
  double ops() const { return seconds > 0 ? double(requests) / seconds : 0; }
  double wps() const { return seconds > 0 ? double(writes) / seconds : 0; }
  double cpu_us_per_op() const { return requests ? cpu * 1e6 / double(requests) : 0; }
  double cpu_us_per_write() const { return writes ? cpu * 1e6 / double(writes) : 0; }
};

struct PointResult {
  Point point;
  size_t window = 0;
  uint64_t bytes_per_req = 0;
  uint32_t writes_per_req = 1;
  Result ferry, raw;                  // with --repeat: the median repetition of each
  std::vector<double> rep_fractions;  // one per repetition (raw and ferry back to back)
  // Ping-pongs and barriers compare p50 latency; everything else GB/s.
  static bool by_latency(const Point& p) { return p.latency() || p.kind == Kind::kBarrier; }
  bool latency_metric() const { return by_latency(point); }
  // Throughput: ferry / raw bytes. Latency: raw p50 / ferry p50.
  static double fraction_of(const Point& p, const Result& ferry, const Result& raw) {
    if (!ferry.ran || !raw.ran) return NAN;
    if (by_latency(p)) {
      double f = ferry.pct(0.5), r = raw.pct(0.5);
      return f > 0 ? r / f : NAN;
    }
    return raw.gbs() > 0 ? ferry.gbs() / raw.gbs() : NAN;
  }
  double fraction() const { return fraction_of(point, ferry, raw); }
};

// The median of several runs of one implementation, by the metric the
// fraction uses (GB/s, or p50 latency), so one noisy second cannot decide.
inline Result median_run(std::vector<Result>& runs, bool latency) {
  if (runs.empty()) return {};
  auto key = [latency](const Result& r) { return latency ? r.pct(0.5) : r.gbs(); };
  std::sort(runs.begin(), runs.end(),
            [&](const Result& a, const Result& b) { return key(a) < key(b); });
  return std::move(runs[runs.size() / 2]);
}

struct DriveConfig {
  size_t window = 1;
  double seconds = 1;
  double warmup = 0.1;
  uint64_t iters = 0;
  uint64_t bytes_per_req = 0;
  uint32_t writes_per_req = 1;
};

// Keeps `window` requests in flight: admit(r, slot) starts request number r in
// `slot`; progress(done) posts what is queued and calls done(slot, ok) for each
// request that finished, returning how many did. A warm-up phase (connection
// setup, first-touch of provider buffers) runs before the measured one.
template <typename Admit, typename Progress, typename Idle>
Result drive(const DriveConfig& c, uint64_t* next_req, Admit&& admit, Progress&& progress,
             Idle&& idle) {
  Result res;
  res.ran = true;
  std::vector<Clock::time_point> started(c.window);
  std::vector<uint32_t> free_slots;
  for (size_t i = c.window; i-- > 0;) free_slots.push_back(uint32_t(i));
  for (int measured = 0; measured < 2; ++measured) {
    uint64_t admitted = 0, finished = 0, errors = 0;
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    const auto until = t0 + std::chrono::duration<double>(measured ? c.seconds : c.warmup);
    const uint64_t limit = measured ? c.iters : 0;
    bool admitting = true;
    auto on_done = [&](uint32_t slot, bool ok) {
      if (measured)
        res.lat_us.push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - started[slot]).count());
      errors += !ok;
      ++finished;
      free_slots.push_back(slot);
    };
    for (;;) {
      if (admitting) {
        auto now = Clock::now();
        if (limit ? admitted >= limit : (now >= until && admitted > 0)) admitting = false;
        while (admitting && !free_slots.empty() && (!limit || admitted < limit)) {
          uint32_t slot = free_slots.back();
          free_slots.pop_back();
          started[slot] = Clock::now();
          admit((*next_req)++, slot);
          ++admitted;
        }
      }
      if (!admitting && finished == admitted) break;
      if (progress(on_done) == 0) idle();
    }
    if (measured) {
      res.seconds = secs_since(t0);
      res.cpu = cpu_seconds() - cpu0;
      res.requests = admitted;
      res.writes = admitted * c.writes_per_req;
      res.bytes = admitted * c.bytes_per_req;
      res.errors = errors;
    }
  }
  return res;
}

// Ping-pong: one(r) runs a single round trip; the result holds half of each.
template <typename One>
Result pingpong(const DriveConfig& c, One&& one) {
  Result res;
  res.ran = true;
  for (int measured = 0; measured < 2; ++measured) {
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    const double limit = measured ? c.seconds : c.warmup;
    uint64_t n = 0;
    while (c.iters && measured ? n < c.iters : secs_since(t0) < limit) {
      auto t = Clock::now();
      if (!one(n)) {
        res.errors++;
        break;
      }
      if (measured)
        res.lat_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() /
                             2);
      ++n;
    }
    if (measured) {
      res.seconds = secs_since(t0);
      res.cpu = cpu_seconds() - cpu0;
      res.requests = res.writes = n;
    }
  }
  return res;
}

}  // namespace ferry_bench

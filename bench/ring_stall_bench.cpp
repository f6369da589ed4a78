// What a submitter preempted inside its ring cell costs the others
// (core/submit_ring.h). One producer pushes a timestamp every `gap` µs; a
// second one, every `every` of its pushes, sleeps `stall` µs between claiming
// its cell and filling it, as a submitter descheduled there would. The
// consumer (the worker's role) takes values either only at the oldest
// position, as the ring did before it took cells past an unfilled one
// ("in order"), or with next() ("past holes"), and records for the first
// producer's values how long each waited from its push to its taking.
//
//   ring_stall_bench [--cpus C,P] [--seconds S] [--gap US] [--stall US]
//                    [--every N] [--rounds R]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_relax.h"
#include "core/log.h"
#include "core/stats.h"
#include "core/submit_ring.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  int64_t pushed_ns = 0;  // 0: the stalling producer's
};

struct Result {
  double p50_us, p99_us, p999_us, max_us;
  uint64_t taken, stalls;
};

Result run(bool past_holes, int consumer_cpu, int producer_cpu, double seconds, int gap_us,
           int stall_us, int every) {
  ferry::core::SubmitRing<Item> ring(256);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> stalls{0};
  std::thread steady([&] {
    ferry::core::pin_current_thread(producer_cpu, "steady producer");
    auto next = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
      next += std::chrono::microseconds(gap_us);
      while (Clock::now() < next) ferry::core::cpu_relax();
      const int64_t t = ferry::core::now_ns();
      while (!ring.try_emplace([&](Item& it) { it.pushed_ns = t; }) && !stop.load())
        std::this_thread::yield();
    }
  });
  // Unpinned: it sleeps most of the time, in its cell once every `every` pushes.
  std::thread staller([&] {
    for (uint64_t i = 1; !stop.load(std::memory_order_relaxed); ++i) {
      const bool stall = i % uint64_t(every) == 0;
      while (!ring.try_emplace([&](Item& it) {
        if (stall) {
          std::this_thread::sleep_for(std::chrono::microseconds(stall_us));
          stalls.fetch_add(1, std::memory_order_relaxed);
        }
        it.pushed_ns = 0;
      }) && !stop.load())
        std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us * 4));
    }
  });
  ferry::core::pin_current_thread(consumer_cpu, "consumer");
  std::vector<double> waits;
  waits.reserve(size_t(seconds * 1e6 / gap_us) + 16);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t taken = 0;
  while (Clock::now() < end) {
    uint64_t pos = 0;
    Item* it = ring.next(&pos);
    if (it == nullptr || (!past_holes && pos != ring.head())) {
      ferry::core::cpu_relax();
      continue;
    }
    if (it->pushed_ns != 0) waits.push_back(double(ferry::core::now_ns() - it->pushed_ns) / 1e3);
    ring.pop(pos);
    ++taken;
  }
  stop.store(true);
  // Let both producers finish what they claimed.
  for (uint64_t pos = 0; ring.head() < ring.claimed();)
    if (ring.next(&pos) != nullptr) ring.pop(pos);
  steady.join();
  staller.join();
  std::sort(waits.begin(), waits.end());
  auto at = [&](double q) {
    return waits.empty() ? 0 : waits[size_t(q * double(waits.size() - 1))];
  };
  return {at(0.5), at(0.99), at(0.999), waits.empty() ? 0 : waits.back(), taken, stalls.load()};
}

}  // namespace

int main(int argc, char** argv) {
  int consumer_cpu = 0, producer_cpu = 1, gap_us = 5, stall_us = 200, every = 20, rounds = 3;
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--cpus")
      std::sscanf(argv[i + 1], "%d,%d", &consumer_cpu, &producer_cpu);
    else if (k == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (k == "--gap")
      gap_us = std::atoi(argv[i + 1]);
    else if (k == "--stall")
      stall_us = std::atoi(argv[i + 1]);
    else if (k == "--every")
      every = std::atoi(argv[i + 1]);
    else if (k == "--rounds")
      rounds = std::atoi(argv[i + 1]);
  }
  std::printf(
      "wait of the steady producer's values, µs (a value every %d µs; the other producer "
      "sleeps %d µs in its cell every %d pushes; %.1f s per point)\n",
      gap_us, stall_us, every, seconds);
  std::printf("round  consumer    p50      p99    p99.9      max   taken  stalls\n");
  for (int r = 0; r < rounds; ++r)
    for (bool past : {false, true}) {
      const Result x = run(past, consumer_cpu, producer_cpu, seconds, gap_us, stall_us, every);
      std::printf("%5d  %-10s %6.2f %8.2f %8.2f %8.1f %7llu %7llu\n", r,
                  past ? "past holes" : "in order", x.p50_us, x.p99_us, x.p999_us, x.max_us,
                  (unsigned long long)x.taken, (unsigned long long)x.stalls);
    }
  return 0;
}

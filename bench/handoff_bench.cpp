// What one hand-off between two threads on two cores costs, by the kind of
// queue: the worker's command queue (moodycamel::ConcurrentQueue, as in
// core/worker.h) with a 64-byte and a Command-sized (360-byte) element, against
// a single-producer ring of one-cache-line slots. Two threads pinned to two
// CPUs bounce one message back and forth; half the round trip is reported.
//
//   handoff_bench [--cpus A,B] [--iters N] [--rounds R]
#include <concurrentqueue/concurrentqueue.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_relax.h"
#include "core/log.h"

namespace {

using Clock = std::chrono::steady_clock;

void pin(int cpu) {
  ferry::core::pin_current_thread(cpu, "handoff_bench");
}

template <size_t N>
struct Msg {
  unsigned char bytes[N];
};

double median(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One-way p50 in ns through two moodycamel queues (there and back).
template <size_t N>
double via_queue(int a, int b, int iters) {
  moodycamel::ConcurrentQueue<Msg<N>> there, back;
  std::thread echo([&] {
    pin(b);
    Msg<N> m;
    for (int i = 0; i < iters; ++i) {
      while (!there.try_dequeue(m)) ferry::core::cpu_relax();
      back.enqueue(m);
    }
  });
  pin(a);
  Msg<N> m{};
  std::vector<double> half;
  half.reserve(size_t(iters));
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    m.bytes[0] = uint8_t(i);
    there.enqueue(m);
    while (!back.try_dequeue(m)) ferry::core::cpu_relax();
    half.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 2);
  }
  echo.join();
  return median(half);
}

// The same through two rings of one-line slots: the payload and its sequence
// number share the line, so a hand-off moves that line once.
struct alignas(64) Slot {
  std::atomic<uint64_t> seq{0};
  unsigned char payload[56];
};

double via_ring(int a, int b, int iters) {
  constexpr size_t kSlots = 1024;
  std::vector<Slot> there(kSlots), back(kSlots);
  std::thread echo([&] {
    pin(b);
    for (int i = 1; i <= iters; ++i) {
      Slot& in = there[size_t(i) % kSlots];
      while (in.seq.load(std::memory_order_acquire) != uint64_t(i)) ferry::core::cpu_relax();
      Slot& out = back[size_t(i) % kSlots];
      std::memcpy(out.payload, in.payload, sizeof(out.payload));
      out.seq.store(uint64_t(i), std::memory_order_release);
    }
  });
  pin(a);
  std::vector<double> half;
  half.reserve(size_t(iters));
  for (int i = 1; i <= iters; ++i) {
    const auto t0 = Clock::now();
    Slot& out = there[size_t(i) % kSlots];
    out.payload[0] = uint8_t(i);
    out.seq.store(uint64_t(i), std::memory_order_release);
    Slot& in = back[size_t(i) % kSlots];
    while (in.seq.load(std::memory_order_acquire) != uint64_t(i)) ferry::core::cpu_relax();
    half.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / 2);
  }
  echo.join();
  return median(half);
}

}  // namespace

int main(int argc, char** argv) {
  int a = 0, b = 1, iters = 200'000, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--cpus")
      std::sscanf(argv[i + 1], "%d,%d", &a, &b);
    else if (k == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (k == "--rounds")
      rounds = std::atoi(argv[i + 1]);
  }
  std::printf("one-way hand-off p50, ns (CPUs %d and %d, %d round trips per point)\n", a, b, iters);
  std::printf("round  queue 64 B  queue 360 B  one-line ring\n");
  for (int r = 0; r < rounds; ++r)
    std::printf("%5d  %10.0f  %11.0f  %13.0f\n", r, via_queue<64>(a, b, iters),
                via_queue<360>(a, b, iters), via_ring(a, b, iters));
  return 0;
}

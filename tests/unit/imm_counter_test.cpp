#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "core/callback_thread.h"
#include "core/imm_table.h"
#include "core/stats.h"

namespace ferry::core {
namespace {

using namespace std::chrono_literals;

TEST(ImmCounter, WaitConsumesAndCarriesSurplus) {
  ImmTable t(nullptr);
  auto c = t.counter(1);
  for (int i = 0; i < 5; ++i) t.on_arrival(1);
  EXPECT_TRUE(c.wait(3, 1s).is_ok());
  EXPECT_EQ(c.value(), 2);
  EXPECT_FALSE(c.try_consume(3));
  EXPECT_TRUE(c.try_consume(2));
  EXPECT_EQ(c.value(), 0);
}

TEST(ImmCounter, WaitTimesOutWithoutConsuming) {
  ImmTable t(nullptr);
  auto c = t.counter(1);
  t.on_arrival(1);
  auto st = c.wait(2, 20ms);
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(c.value(), 1);
}

TEST(ImmCounter, WaiterWakesWhenArrivalsComeFromAnotherThread) {
  ImmTable t(nullptr);
  auto c = t.counter(4);
  std::thread producer([&] {
    for (int i = 0; i < 100000; ++i) t.on_arrival(4);
  });
  EXPECT_TRUE(c.wait(100000, 30s).is_ok());
  producer.join();
  EXPECT_EQ(c.value(), 0);
}

// A spinning wait (it never sleeps) keeps wait's contract: arrivals from another thread, a deadline
// that consumes nothing, cancellation by the engine's stop.
TEST(ImmCounter, SpinningWaitArrivesTimesOutAndIsCancelled) {
  using Mode = ImmCounter::WaitMode;
  ImmTable t(nullptr);
  auto c = t.counter(4);
  std::atomic<bool> go{false};
  std::thread producer([&] {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < 10000; ++i) t.on_arrival(4);
  });
  go.store(true);
  EXPECT_TRUE(c.wait(10000, 30s, Mode::kSpin).is_ok());
  producer.join();
  EXPECT_EQ(c.value(), 0);

  t.on_arrival(4);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.wait(2, 20ms, Mode::kSpin).code(), Code::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
  EXPECT_EQ(c.value(), 1);

  std::thread stopper([&] {
    while (c.value() != 0) std::this_thread::yield();  // the waiter took its arrival
    t.cancel_all();
  });
  EXPECT_TRUE(c.wait(1, 30s, Mode::kSpin).is_ok());
  EXPECT_EQ(c.wait(1, 30s, Mode::kSpin).code(), Code::kCancelled);
  stopper.join();
}

// A wait's length ends at the arrival that satisfied it, as the counting
// worker timed it (its turn's clock), so the waiter reads no clock on its way
// out. Arrival times are given here, so the recorded lengths are exact.
TEST(ImmCounter, WaitLengthEndsAtTheArrivalTheWorkerTimed) {
  if (!kStatsEnabled) GTEST_SKIP() << "statistics compiled out (FERRY_STATS=OFF)";
  ImmTable t(nullptr);
  auto c = t.counter(1);
  const StatHistogram& h = t.counter_waits();
  // Stamped 40 ms ahead: the wait returns at once yet lasts ~40 ms, which only
  // the stamp can give.
  t.on_arrival(1, 1, now_ns() + 40'000'000);
  ASSERT_TRUE(c.wait(1, 1s).is_ok());
  const uint64_t first = h.sum_ns();
  EXPECT_GT(first, 39'000'000u);
  EXPECT_LE(first, 40'000'000u);
  // An arrival from before the call: the wait took nothing.
  t.on_arrival(1, 1, now_ns() - 1'000'000'000);
  ASSERT_TRUE(c.wait(1, 1s).is_ok());
  EXPECT_EQ(h.sum_ns(), first);
  // No time known (0): the clock at the return, far from the 40 ms above.
  t.on_arrival(1);
  ASSERT_TRUE(c.wait(1, 1s).is_ok());
  EXPECT_LT(h.sum_ns() - first, 20'000'000u);
  // A timeout has no arrival: it lasts until the return, past its deadline.
  const uint64_t before = h.sum_ns();
  EXPECT_EQ(c.wait(1, 20ms).code(), Code::kDeadlineExceeded);
  EXPECT_GE(h.sum_ns() - before, 20'000'000u);
  uint64_t waits = 0;
  for (int i = 0; i < StatHistogram::kBuckets; ++i) waits += h.bucket(i);
  EXPECT_EQ(waits, 4u);
}

// One wait in N per thread is timed (the thread's first included), and the
// counting worker reads its clock for an arrival only while a timed wait is in
// progress on that counter: here nobody waits, so it is never read.
TEST(ImmCounter, OneWaitInNIsTimedAndUnwatchedArrivalsReadNoClock) {
  if (!kStatsEnabled) GTEST_SKIP() << "statistics compiled out (FERRY_STATS=OFF)";
  ImmTable t(nullptr);
  t.set_wait_sample_every(4);
  auto c = t.counter(1);
  int reads = 0;
  auto read = [](void* n) {
    ++*static_cast<int*>(n);
    return now_ns();
  };
  // A thread of its own: the countdown of waits to the next timed one is per thread.
  std::thread([&] {
    for (int i = 0; i < 9; ++i) {
      t.on_arrival(1, 1, ArrivalClock(read, &reads));
      ASSERT_TRUE(c.wait(1, 1s).is_ok());
    }
  }).join();
  EXPECT_EQ(reads, 0);
  uint64_t waits = 0;
  for (int i = 0; i < StatHistogram::kBuckets; ++i) waits += t.counter_waits().bucket(i);
  EXPECT_EQ(waits, 3u);  // waits 1, 5 and 9
}

TEST(ImmTable, ExpectedCountFiresExactlyOncePerCountAcrossThreads) {
  ImmTable t(nullptr);
  CallbackThread cb(&t, -1);
  t.set_callbacks(&cb);
  std::atomic<int> fired{0};
  t.expect(9, 7, [&] { fired.fetch_add(1); });
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      for (int i = 0; i < 7000; ++i) t.on_arrival(9);
    });
  for (auto& w : workers) w.join();
  cb.stop();
  EXPECT_EQ(fired.load(), 4000);
}

TEST(ImmTable, UncountedImmediatesReachPlainCallbacks) {
  ImmTable t(nullptr);
  CallbackThread cb(&t, -1);
  t.set_callbacks(&cb);
  std::atomic<uint64_t> sum{0};
  t.add_plain_callback([&](uint32_t imm) { sum += imm; });
  t.on_arrival(5);
  t.on_arrival(6);
  cb.stop();
  EXPECT_EQ(sum.load(), 11u);
}

// Domains that finish writes in batches report a run of equal immediates as
// one arrival with a count; every consumer must see the same as n single ones.
TEST(ImmTable, RunsOfArrivalsCountLikeSingles) {
  ImmTable t(nullptr);
  CallbackThread cb(&t, -1);
  t.set_callbacks(&cb);
  auto c = t.counter(1);
  t.on_arrival(1, 1024);
  t.on_arrival(1, 0);
  EXPECT_EQ(c.value(), 1024);

  // expect(): one callback per multiple crossed, runs straddling multiples.
  std::atomic<int> fired{0};
  t.expect(2, 10, [&] { fired.fetch_add(1); });
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int i = 0; i < 1000; ++i) t.on_arrival(2, uint32_t(1 + (i + w) % 7));
    });
  for (auto& w : workers) w.join();
  uint64_t total = 0;
  for (int w = 0; w < 4; ++w)
    for (int i = 0; i < 1000; ++i) total += uint64_t(1 + (i + w) % 7);

  std::atomic<uint32_t> plain{0};
  t.add_plain_callback([&](uint32_t imm) {
    if (imm == 3) plain.fetch_add(1);
  });
  t.on_arrival(3, 5);
  cb.stop();
  EXPECT_EQ(fired.load(), int(total / 10));
  EXPECT_EQ(plain.load(), 5u);  // plain callbacks still see each immediate
}

TEST(ImmTable, GpuFlagAdvancesToTheLastGenerationARunCrosses) {
  ImmTable t(nullptr);
  alignas(4) uint32_t flag = 0;
  t.expect_gpu_flag(4, 8, &flag, nullptr);
  t.on_arrival(4, 7);
  EXPECT_EQ(flag, 0u);
  t.on_arrival(4, 1);
  EXPECT_EQ(flag, 1u);
  t.on_arrival(4, 20);  // 28 arrivals: generation 3
  EXPECT_EQ(flag, 3u);
}

// A worker's arrival cache counts like the table, and every change of the
// table reaches the next arrival: a new counter for a removed one, a callback
// for a counter, plain callbacks once nothing counts the value, a GPU flag. Values that
// share a line (5 and 21 of 16 lines) evict each other.
TEST(ImmArrivalCache, CountsLikeTheTableAndSeesEveryChange) {
  ImmTable t(nullptr);
  CallbackThread cb(&t, -1);
  t.set_callbacks(&cb);
  ImmArrivalCache cache;
  std::atomic<int> plain{0}, fired{0};
  t.add_plain_callback([&](uint32_t imm) {
    if (imm == 5) plain.fetch_add(1);
  });
  auto first = t.counter(5);
  auto other = t.counter(21);
  for (int i = 0; i < 10; ++i) {
    t.on_arrival(cache, 5, 2, {});
    t.on_arrival(cache, 21, 1, {});
  }
  EXPECT_EQ(first.value(), 20);
  EXPECT_EQ(other.value(), 10);

  t.remove(5);
  auto second = t.counter(5);
  t.on_arrival(cache, 5, 3, {});
  EXPECT_EQ(first.value(), 20) << "an arrival after remove() went to the removed counter";
  EXPECT_EQ(second.value(), 3);

  t.remove(5);
  t.expect(5, 2, [&] { fired.fetch_add(1); });
  for (int i = 0; i < 4; ++i) t.on_arrival(cache, 5, 1, {});
  EXPECT_EQ(second.value(), 3);

  t.remove(5);
  t.on_arrival(cache, 5, 1, {});
  alignas(4) uint32_t flag = 0;
  t.expect_gpu_flag(21 + 16, 1, &flag, nullptr);  // a third value on the same line
  t.on_arrival(cache, 37, 2, {});
  EXPECT_EQ(flag, 2u);
  cb.stop();
  EXPECT_EQ(fired.load(), 2);
  EXPECT_EQ(plain.load(), 1) << "plain callbacks see the arrival of 5 that nothing counted";
}

// A removed counter or flag stays alive in the cache only until a look at the
// table's version finds its line stale.
TEST(ImmArrivalCache, DropStaleLetsGoOfRemovedEntries) {
  ImmTable t(nullptr);
  ImmArrivalCache cache;
  auto lease = std::make_shared<int>(0);
  std::weak_ptr<int> watch = lease;
  alignas(4) uint32_t flag = 0;
  t.expect_gpu_flag(3, 1, &flag, std::move(lease));
  t.on_arrival(cache, 3, 1, {});
  EXPECT_EQ(flag, 1u);
  t.remove(3);
  EXPECT_FALSE(watch.expired()) << "the cache holds the entry it counted last";
  cache.drop_stale(t);
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace ferry::core

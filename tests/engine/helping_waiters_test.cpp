// Who drives an adaptive worker's NICs while application threads help
// (core/progress_help.h). Over shm the NIC has no wait object, so an idle
// worker naps: a submitter that posted its request in full does not wake it,
// one whose request needs the worker does, and a waiter that stops helping
// (it is about to sleep) wakes it. The assertions count wake-ups by cause, so
// they hold on a loaded machine; no latency bound is asserted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

// Workers that nap as soon as they are idle (shm: no wait object to block on).
EngineConfig napping() {
  return test::adaptive_config_for("shm");
}

// True once `workers` workers nap or block (a condition, polled with a deadline).
bool all_asleep(int64_t workers) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (wake_counters().asleep.load() < workers) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// True once no request of e is in flight (a condition, polled with a deadline).
bool nothing_in_flight(TransferEngine& e) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    uint64_t n = 0;
    for (auto& w : e.stats().workers) n += w.in_flight;
    if (n == 0) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

// An immediate with no OnDone, posted by its submitter while the worker naps,
// leaves the worker nothing to do before its nap ends: no eventfd write. The
// immediate arrives, and its completion still gives its credit back.
TEST(HelpingWaiters, ANappingWorkerIsNotWokenForAPostItsSubmitterFinished) {
  TransferEngine a(napping()), b(napping());
  auto dst = test::region(b, 4096);
  auto ping = b.imm_counter(7);
  // Without the rule every round wakes it; with it, only rounds in which the
  // worker held its loop lock (on its way into or out of a nap, longer when
  // preempted there on a loaded machine) do.
  constexpr uint64_t kRounds = 40, kSlack = kRounds / 4;
  // The first immediate to a new peer may take the slot path (the provider
  // refuses the first post while it connects), and its slot needs the worker
  // until its completion, which on a loaded machine took longer than all the
  // rounds: send it and wait until nothing is in flight before counting.
  a.submit_imm(7, dst.d, OnDone::none());
  ASSERT_TRUE(test::take_one_spinning(ping)) << "no first arrival";
  ASSERT_TRUE(nothing_in_flight(a)) << "the first immediate never completed";
  const uint64_t notifies = wake_counters().notifies.load();
  const uint64_t posted = wake_counters().inline_posts.load();
  for (uint64_t i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(all_asleep(2)) << "round " << i << ": workers never napped";
    a.submit_imm(7, dst.d, OnDone::none());
    ASSERT_TRUE(test::take_one_spinning(ping)) << "round " << i << ": no arrival";
  }
  EXPECT_LE(wake_counters().notifies.load() - notifies, kSlack);
  EXPECT_GE(wake_counters().inline_posts.load() - posted, kRounds - kSlack);
  EXPECT_TRUE(nothing_in_flight(a)) << "a completion never gave its credit back";
  EXPECT_EQ(a.stats().transfers_ok(), kRounds + 1);
}

// A request with an OnDone needs the worker for its completion: the submitter
// posts it and wakes the napping worker, and the OnDone runs once.
TEST(HelpingWaiters, ANappingWorkerIsWokenForACompletionSomeoneWaitsFor) {
  TransferEngine a(napping()), b(napping());
  auto dst = test::region(b, 4096);
  constexpr uint64_t kRounds = 20;
  std::atomic<uint64_t> done{0};
  const uint64_t notifies = wake_counters().notifies.load();
  for (uint64_t i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(all_asleep(2)) << "round " << i << ": workers never napped";
    a.submit_imm(7, dst.d, OnDone::counter(done));
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (done.load() < i + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_EQ(done.load(), i + 1) << "round " << i;
  }
  // A nap may end between all_asleep() and the submit (under ThreadSanitizer
  // on a loaded machine in 3 rounds of 20): that round's submitter finds the
  // worker awake and rightly writes nothing. A submitter that never woke a
  // napping worker for an OnDone would write nothing in every round.
  EXPECT_GE(wake_counters().notifies.load() - notifies, kRounds / 2);
}

// A waiter that gives up spinning (its wait is long) stops polling for the
// worker: it wakes a worker that napped meanwhile, which then watches the NIC
// itself rather than at the end of its nap.
TEST(HelpingWaiters, AWaiterAboutToSleepWakesTheNappingWorker) {
  TransferEngine b(napping());
  auto never = b.imm_counter(9);
  constexpr uint64_t kRounds = 10, kSlack = 3;
  const uint64_t notifies = wake_counters().notifies.load();
  for (uint64_t i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(all_asleep(1)) << "round " << i << ": the worker never napped";
    EXPECT_EQ(never.wait(1, 50ms).code(), Code::kDeadlineExceeded);
  }
  // Each wait spins and helps first; the worker naps almost all of that time,
  // so the wait's switch to sleeping nearly always finds it napping.
  EXPECT_GE(wake_counters().notifies.load() - notifies, kRounds - kSlack);
}

// A submitter that does not wait through the engine (it watches a flag set by
// an inline receive callback) never polls for the worker: the worker keeps
// taking the arrivals itself instead of napping between them.
TEST(HelpingWaiters, AWorkerNobodyHelpsDoesNotNapThroughAPingPong) {
  // A worker idle this long naps: far longer than a round, far shorter than
  // the ping-pong.
  EngineConfig cfg = napping();
  cfg.spin_before_block = 1'000us;
  TransferEngine a(cfg), b(cfg);
  auto on_a = test::region(a, 4096), on_b = test::region(b, 4096);
  std::atomic<uint64_t> pongs{0};
  a.expect_imm_count(
      11, 1, [&] { pongs++; }, CallbackOn::kWorker);
  b.expect_imm_count(
      10, 1, [&] { b.submit_imm(11, on_a.d, OnDone::none()); }, CallbackOn::kWorker);
  // Only calm rounds are judged: a round that took less than the spin, after
  // one that did too. A worker that takes every arrival itself cannot have
  // been idle for a whole spin in such a round, so it does not nap there. A
  // round stalled for longer (a thread preempted on a loaded machine) lets
  // both workers nap, many times if the stall is long, and so does the round
  // right after it, whose arrival waits for the nap's end. A worker that left
  // the arrivals to a submitter naps in nearly every round, calm or not
  // (1 990 of 2 000).
  constexpr uint64_t kCalmRounds = 1000;
  constexpr auto kCalm = 1'000us;
  uint64_t calm = 0, calm_with_naps = 0, rounds = 0;
  bool last_calm = false;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (calm < kCalmRounds && std::chrono::steady_clock::now() < give_up) {
    const uint64_t naps = wake_counters().naps.load();
    const auto start = std::chrono::steady_clock::now();
    a.submit_imm(10, on_b.d, OnDone::none());
    ++rounds;
    const auto deadline = start + 10s;
    while (pongs.load() < rounds && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_EQ(pongs.load(), rounds) << "round " << rounds;
    const bool is_calm = std::chrono::steady_clock::now() - start < kCalm;
    if (is_calm && last_calm) {
      ++calm;
      if (wake_counters().naps.load() != naps) ++calm_with_naps;
    }
    last_calm = is_calm;
  }
  if (calm < kCalmRounds)
    GTEST_SKIP() << "too loaded to judge: " << calm << " calm rounds of " << rounds << " in 30 s";
  EXPECT_LE(calm_with_naps, calm / 4) << "of " << calm << " calm rounds (" << rounds << " in all)";
}

// Where spinning threads outnumber the CPUs (SpinYield::kYield) a worker whose
// NICs can block (tcp) naps on its eventfd while a waiter polls its arrivals,
// even inside its spin phase: a worker that kept spinning, finding what its
// helper would have found, stayed one more runnable thread per hand-off, and on
// two cores whole ping-pongs then ran ten times slower.
TEST(HelpingWaiters, AWorkerWhoseWaiterDrivesBlockableNicsNapsInsteadOfSpinning) {
  EngineConfig cfg = test::adaptive_config_for("tcp");
  cfg.spin_yield = SpinYield::kYield;
  // Longer than the test: without the rule the worker spins throughout.
  cfg.spin_before_block = 60s;
  TransferEngine e(cfg);
  auto own = test::region(e, 4096);
  auto ping = e.imm_counter(12);
  // Round trips until the worker has napped a few times and the waiter has
  // taken an arrival itself, or 20 s: how soon a poll of the waiter first
  // finds the worker's lock free (the worker yields between idle turns)
  // depends on the machine (one ASan run took more than 2 000 round trips),
  // and under TSan a worker waking from its shortest naps took every arrival
  // of the first five naps itself; without the rule the worker never naps.
  constexpr uint64_t kNaps = 5;
  const uint64_t naps = wake_counters().naps.load();
  const uint64_t helped = wake_counters().helped_polls.load();
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  uint64_t rounds = 0;
  while ((wake_counters().naps.load() - naps < kNaps ||
          wake_counters().helped_polls.load() == helped) &&
         std::chrono::steady_clock::now() < give_up) {
    e.submit_imm(12, own.d, OnDone::none());
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    bool arrived = false;
    while (!(arrived = ping.try_consume(1)) && std::chrono::steady_clock::now() < deadline) {
    }
    ASSERT_TRUE(arrived) << "round " << rounds << ": the immediate never arrived";
    ++rounds;
  }
  // Each nap lasts 20-320 µs, ended early by nothing but a submitter that
  // needs the worker; meanwhile the waiter takes the arrivals.
  EXPECT_GE(wake_counters().naps.load() - naps, kNaps) << "after " << rounds << " round trips";
  EXPECT_GT(wake_counters().helped_polls.load() - helped, 0u)
      << "after " << rounds << " round trips";
}

// The same counts reach the public statistics (EngineStats::wake, process-wide):
// a napping worker is seen asleep, and a ping-pong to itself driven by its
// submitter and waiter shows up as their inline posts and helped polls, not as
// wake-ups of the worker.
TEST(HelpingWaiters, TheStatisticsShowTheNappingWorkerAndTheWorkOthersDidForIt) {
  TransferEngine e(napping());
  auto own = test::region(e, 4096);
  auto ping = e.imm_counter(13);
  // A worker on shm naps for 20-320 µs at a time and may be between naps when
  // the statistics are taken: take them until one shows it asleep.
  WakeStats before;
  test::wait_until(
      [&] {
        before = e.stats().wake;
        return before.asleep >= 1;
      },
      10s);
  EXPECT_GE(before.asleep, 1) << "the statistics never showed the worker asleep";
  EXPECT_GE(before.naps, 1u);
  constexpr uint64_t kRounds = 200;
  for (uint64_t i = 0; i < kRounds; ++i) {
    e.submit_imm(13, own.d, OnDone::none());
    ASSERT_TRUE(ping.wait(1, 10s).is_ok()) << "round " << i;
  }
  const WakeStats after = e.stats().wake;
  // Rounds in which the worker held its loop lock (on its way into or out of a
  // nap) are posted or polled by it instead: on a loaded machine (sanitizers,
  // a build beside) a good share, but not most.
  EXPECT_GE(after.inline_posts - before.inline_posts, kRounds / 4);
  EXPECT_GE(after.helped_polls - before.helped_polls, kRounds / 4);
  EXPECT_LE(after.notifies - before.notifies, kRounds / 2);
  EXPECT_GE(after.naps, before.naps);
}

}  // namespace
}  // namespace ferry

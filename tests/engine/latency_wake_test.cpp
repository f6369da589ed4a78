// How an idle adaptive worker is woken (src/core/wake.h): a worker blocked in
// poll(2) must be woken by the submission's eventfd and by a completion's wait
// object, not by its timer. The assertions count wake-ups by cause, so they
// hold on a loaded machine; no latency bound is asserted.
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/wake.h"
#include "core/worker.h"
#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

struct Snapshot {
  uint64_t blocks, by_submission, by_completion, notifies, inline_posts, helped_polls;
  static Snapshot now() {
    auto& w = wake_counters();
    return {w.blocks.load(),   w.by_submission.load(), w.by_completion.load(),
            w.notifies.load(), w.inline_posts.load(),  w.helped_polls.load()};
  }
};

EngineConfig busy_config(const std::string& provider) {
  EngineConfig c = test::config_for(provider);
  c.poll_mode = PollMode::kBusy;
  return c;
}

// True once `workers` workers sit in poll(2) (a condition, polled with a deadline).
bool all_asleep(int64_t workers) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (wake_counters().asleep.load() < workers)
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    else
      std::this_thread::yield();
  return true;
}

class Wake : public ::testing::TestWithParam<std::string> {};

// Each round starts with both workers blocked: the submitter posts the ping
// itself (the worker idles) and still writes the sender's eventfd (its
// worker's fi_trywait came before that post); the receiver's worker wakes
// through its CQ.
TEST_P(Wake, BlockedWorkersWakeForASubmissionAndForACompletion) {
  TransferEngine a(test::adaptive_config_for(GetParam())), b(test::adaptive_config_for(GetParam()));
  auto dst = test::region(b, 4096);
  // Counted on the callback thread, not by a counter: a thread waiting on a
  // counter would poll the CQ itself (WaiterPollsForASleepingWorker), and the
  // receiver's worker would not have to wake. With spin_before_block 0 the
  // callback thread does not poll either.
  std::atomic<uint64_t> pings{0};
  b.expect_imm_count(7, 1, [&] { pings++; });
  constexpr int kRounds = 20;
  const Snapshot before = Snapshot::now();
  std::atomic<uint64_t> sent{0};
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(all_asleep(2)) << "round " << i << ": workers never blocked";
    a.submit_imm(7, dst.d, OnDone::counter(sent));
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (pings.load() < uint64_t(i + 1) && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    ASSERT_EQ(pings.load(), uint64_t(i + 1)) << "round " << i;
    // The sender's worker has handled its completion, so the next round finds
    // it asleep again rather than still on its way out of this round's wake.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (sent.load() < uint64_t(i + 1) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_EQ(sent.load(), uint64_t(i + 1)) << "round " << i;
  }
  const Snapshot after = Snapshot::now();
  // Every round wakes both workers by an event, the sender's by its eventfd or
  // its own completion, the receiver's by the ping. A worker's timer can only
  // expire first when a round waited 10 ms for both to fall asleep: allow two.
  const uint64_t slack = 2, rounds = kRounds;
  EXPECT_GE(after.inline_posts - before.inline_posts, rounds - slack);
  EXPECT_GE(after.notifies - before.notifies, rounds - slack);
  EXPECT_GE(after.by_submission - before.by_submission + after.by_completion - before.by_completion,
            2 * rounds - slack);
  EXPECT_GE(after.by_completion - before.by_completion, rounds - slack);
}

// A reply posted from an inline callback (CallbackOn::kWorker) runs on the
// worker that counted the ping: no hop, and the reply arrives. It is posted
// from the callback itself, not queued for the worker's next turn
// (Worker::answering_inline).
TEST_P(Wake, InlineCallbackRepliesFromTheWorker) {
  const uint64_t replies = wake_counters().inline_replies.load();
  TransferEngine a(test::adaptive_config_for(GetParam())), b(test::adaptive_config_for(GetParam()));
  auto on_a = test::region(a, 4096), on_b = test::region(b, 4096);
  std::atomic<int> ran{0};
  std::atomic<bool> off_worker{false};
  b.expect_imm_count(
      9, 1,
      [&] {
        if (!core::Worker::on_worker_thread()) off_worker = true;
        ran++;
        b.submit_imm(10, on_a.d, OnDone::none());
      },
      CallbackOn::kWorker);
  auto pong = a.imm_counter(10);
  for (int i = 0; i < 10; ++i) {
    a.submit_imm(9, on_b.d, OnDone::none());
    ASSERT_TRUE(pong.wait(1, 10s).is_ok()) << "round " << i;
  }
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(off_worker.load());
  // A post the NIC refuses for now (a connection still being set up) is
  // queued for the worker instead; the rest went out from the callback.
  EXPECT_GE(wake_counters().inline_replies.load() - replies, 8u);
}

// An inline callback that throws does not take the worker down: it keeps
// running it and counting.
TEST_P(Wake, InlineCallbackThatThrowsIsCounted) {
  TransferEngine a(test::adaptive_config_for(GetParam())), b(test::adaptive_config_for(GetParam()));
  auto on_b = test::region(b, 4096);
  std::atomic<int> ran{0};
  b.expect_imm_count(
      11, 1,
      [&] {
        ran++;
        throw std::runtime_error("inline callback failure");
      },
      CallbackOn::kWorker);
  for (int i = 0; i < 3; ++i) a.submit_imm(11, on_b.d, OnDone::none());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (ran.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 3);
  auto counted = b.imm_counter(12);
  a.submit_imm(12, on_b.d, OnDone::none());
  EXPECT_TRUE(counted.wait(1, 10s).is_ok());
}

// Busy polling never blocks.
TEST_P(Wake, BusyWorkersNeverBlock) {
  const EngineConfig c = busy_config(GetParam());
  TransferEngine a(c), b(c);
  auto dst = test::region(b, 4096);
  auto ping = b.imm_counter(7);
  const Snapshot before = Snapshot::now();
  constexpr uint64_t kWaits = 20;
  for (uint64_t i = 0; i < kWaits; ++i) {
    a.submit_imm(7, dst.d, OnDone::none());
    ASSERT_TRUE(ping.wait(1, 10s).is_ok());
  }
  EXPECT_EQ(Snapshot::now().blocks, before.blocks);
  // Submissions write no eventfd; a wait that stops spinning (over tcp a poll
  // is a system call, and 2 000 of them may pass before the answer) wakes the
  // worker that stepped aside for it, which sleeps on its eventfd: at most one
  // write per wait.
  EXPECT_LE(Snapshot::now().notifies - before.notifies, kWaits);
  // Who posts and polls: step_aside_test.cpp.
}

// Several threads submitting to one busy engine at once: every write lands
// once with its bytes and completes once.
TEST_P(Wake, BusySubmittersFromManyThreadsDeliverEveryWriteOnce) {
  const EngineConfig c = busy_config(GetParam());
  TransferEngine a(c), b(c);
  test::writes_from_threads(a, b, 4, 200, 256, 30, 3);
}

// With busy polling the callback thread spins while callbacks keep coming: a
// callback that answers an immediate costs no futex wake-up. Stop still ends
// the spinning thread.
TEST_P(Wake, BusyCallbackThreadSpinsWhileCallbacksCome) {
  const EngineConfig c = busy_config(GetParam());
  auto a = std::make_unique<TransferEngine>(c);
  auto b = std::make_unique<TransferEngine>(c);
  auto on_a = test::region(*a, 4096);
  auto on_b = test::region(*b, 4096);
  std::atomic<int> answered{0}, pongs{0};
  // Counted before the answer goes out: the answer may come back (pongs) before
  // a count after the submit, since the callback thread can post it itself
  // when the busy worker has stepped aside.
  b->expect_imm_count(21, 1, [&] {
    answered.fetch_add(1);
    b->submit_imm(22, on_a.d, OnDone::none());
  });
  // Both engines' callback threads see an event every round.
  a->expect_imm_count(22, 1, [&] { pongs.fetch_add(1); });
  // The first events may find the threads still on their way into the loop.
  a->submit_imm(21, on_b.d, OnDone::none());
  ASSERT_TRUE(test::wait_until([&] { return pongs.load() == 1; }, 10s));
  const uint64_t blocks = wake_counters().callback_blocks.load();
  for (int i = 0; i < 50; ++i) {
    a->submit_imm(21, on_b.d, OnDone::none());
    ASSERT_TRUE(test::wait_until([&] { return pongs.load() == i + 2; }, 10s)) << "round " << i;
  }
  EXPECT_EQ(answered.load(), 51);
  EXPECT_EQ(wake_counters().callback_blocks.load(), blocks);
  const auto t0 = std::chrono::steady_clock::now();
  a->stop();
  b->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// A busy engine whose application takes no callbacks does not keep a core
// spinning for them: its callback thread starts asleep (not after a spin
// window of a second), and still runs the first callback that comes later.
TEST_P(Wake, BusyCallbackThreadSleepsWithoutCallbacks) {
  const EngineConfig c = busy_config(GetParam());
  uint64_t blocks = wake_counters().callback_blocks.load();
  if (GetParam() == "fake") {
    // The spin window is a second from the thread's start: asleep sooner means
    // it was never opened. Only where an engine starts in milliseconds (a tcp
    // engine took 0.9 s under ThreadSanitizer).
    const auto t0 = std::chrono::steady_clock::now();
    TransferEngine solo(c);
    ASSERT_TRUE(test::wait_until(
        [&] { return wake_counters().callback_blocks.load() >= blocks + 1; }, 10s));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 900ms)
        << "the callback thread spun before its first callback";
    blocks = wake_counters().callback_blocks.load();
  }
  TransferEngine a(c), b(c);
  auto on_b = test::region(b, 4096);
  ASSERT_TRUE(
      test::wait_until([&] { return wake_counters().callback_blocks.load() >= blocks + 2; }, 10s))
      << "both callback threads keep spinning with no callback to run";
  std::atomic<int> ran{0};
  b.expect_imm_count(23, 1, [&] { ran.fetch_add(1); });
  a.submit_imm(23, on_b.d, OnDone::none());
  EXPECT_TRUE(test::wait_until([&] { return ran.load() == 1; }, 10s));
}

// A busy receiver that only counts (no answer ever follows an arrival) stops
// watching for answers after a few empty windows: one arrival turn in 1024 at
// most from then on, so a stream is not slowed by them. Arrival turns are at
// most as many as the immediates; the bound below allows the first ten windows
// and one per 1024 of the rest.
TEST_P(Wake, BusyReceiverOfAStreamSeldomWatchesForAnswers) {
  const EngineConfig c = busy_config(GetParam());
  TransferEngine a(c), b(c);
  auto on_b = test::region(b, 4096);
  auto got = b.imm_counter(31);
  constexpr int kImms = 6000;
  const uint64_t windows = wake_counters().reply_windows.load();
  for (int i = 0; i < kImms; ++i) a.submit_imm(31, on_b.d, OnDone::none());
  ASSERT_TRUE(got.wait(kImms, 30s).is_ok());
  const uint64_t watched = wake_counters().reply_windows.load() - windows;
  EXPECT_GE(watched, 1u) << "the receiver never watched for an answer";
  EXPECT_LE(watched, 10u + kImms / 1024 + 1) << "windows kept opening on a stream";
}

// One CPU the process may run on.
int first_allowed_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) return c;
  return 0;
}

// A thread spinning on a counter while the worker yields polls the NIC itself
// (core/progress_help.h) and counts the arrival, instead of waiting for the
// worker to be scheduled again. The workers are pinned to one CPU, so they
// yield between turns (they would spin holding their NICs on a CPU of their
// own), and spin for the whole test instead of blocking.
// Engines whose workers yield between idle turns for the whole test: pinned to
// one CPU (a worker with a CPU of its own spins holding its NICs) and never
// blocking (a worker the kernel wakes usually beats a spinning waiter).
EngineConfig yielding(const std::string& kind) {
  EngineConfig c = test::config_for(kind);
  c.poll_mode = PollMode::kAdaptive;
  c.spin_before_block = 60'000'000us;
  c.groups[0].worker_cpu = first_allowed_cpu();
  return c;
}

TEST_P(Wake, WaiterPollsForAYieldingWorker) {
  TransferEngine a(yielding(GetParam())), b(yielding(GetParam()));
  auto dst = test::region(b, 4096);
  auto ping = b.imm_counter(7);
  // At least 200 rounds, then more until a waiter's poll has found an
  // arrival (20 s at most): the worker counts many arrivals itself, more on a
  // loaded machine; without helping the count stays 0 however long it runs.
  constexpr int kRounds = 200;
  const Snapshot before = Snapshot::now();
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  int rounds = 0;
  for (; rounds < kRounds || (Snapshot::now().helped_polls == before.helped_polls &&
                              std::chrono::steady_clock::now() < give_up);
       ++rounds) {
    a.submit_imm(7, dst.d, OnDone::none());
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!ping.try_consume(1))
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "round " << rounds << ": no arrival";
  }
  EXPECT_EQ(ping.value(), 0);  // every arrival counted once
  EXPECT_GE(Snapshot::now().helped_polls - before.helped_polls, uint64_t(1))
      << "after " << rounds << " rounds";
}

// An inline callback (CallbackOn::kWorker) may run on a waiter that polls
// for the worker; it still fires once per arrival, and what it submits is
// posted (the waiter posts it before it lets go of the worker).
TEST_P(Wake, InlineCallbackOnAHelpingWaiterFiresOnceAndItsReplyGoesOut) {
  TransferEngine a(yielding(GetParam())), b(yielding(GetParam()));
  auto on_a = test::region(a, 4096), on_b = test::region(b, 4096);
  std::atomic<bool> done{false};
  std::thread::id helper_id;
  std::atomic<int> ran{0}, ran_on_helper{0};
  std::thread helper;
  {
    auto never = b.imm_counter(13);
    helper = std::thread([&done, never]() mutable {
      while (!done.load()) never.try_consume(1);
    });
  }
  helper_id = helper.get_id();
  b.expect_imm_count(
      9, 1,
      [&] {
        ran++;
        if (std::this_thread::get_id() == helper_id) ran_on_helper++;
        b.submit_imm(10, on_a.d, OnDone::none());
      },
      CallbackOn::kWorker);
  auto pong = a.imm_counter(10);
  // Over tcp the helper runs some of the callbacks (it needs the worker's lock
  // while that worker yields): at least 200 rounds, then more until it has
  // run one (20 s at most). On the fake NIC the receiving worker took every
  // arrival in a third of the idle runs here, so there only the outcome counts.
  constexpr int kRounds = 200;
  const bool want_helper = GetParam() == "tcp";
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  int rounds = 0;
  for (; rounds < kRounds ||
         (want_helper && ran_on_helper.load() == 0 && std::chrono::steady_clock::now() < give_up);
       ++rounds) {
    a.submit_imm(9, on_b.d, OnDone::none());
    ASSERT_TRUE(pong.wait(1, 10s).is_ok()) << "round " << rounds;
  }
  done = true;
  helper.join();
  EXPECT_EQ(ran.load(), rounds);
  RecordProperty("callbacks_on_the_helper", ran_on_helper.load());
  if (want_helper) EXPECT_GE(ran_on_helper.load(), 1) << "after " << rounds << " rounds";
}

// Waiters helping from several threads count each arrival exactly once, and
// stop() returns while they still spin; their calls after it return false.
TEST_P(Wake, ConcurrentHelpersCountExactlyAndStopEndsHelping) {
  TransferEngine a(test::adaptive_config_for(GetParam()));
  auto b = std::make_unique<TransferEngine>(test::adaptive_config_for(GetParam()));
  auto on_b = test::region(*b, 4096);
  auto ping = b->imm_counter(7);
  constexpr uint64_t kSent = 2000;
  std::atomic<uint64_t> consumed{0};
  std::atomic<bool> quit{false};
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t)
    waiters.emplace_back([&, c = ping]() mutable {
      while (!quit.load())
        if (c.try_consume(1)) consumed++;
    });
  for (uint64_t i = 0; i < kSent; ++i) a.submit_imm(7, on_b.d, OnDone::none());
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (consumed.load() < kSent && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(consumed.load(), kSent);
  b->stop();  // the waiters keep calling try_consume meanwhile
  b.reset();
  quit = true;
  for (auto& w : waiters) w.join();
  EXPECT_EQ(consumed.load(), kSent);
  EXPECT_FALSE(ping.try_consume(1));
}

INSTANTIATE_TEST_SUITE_P(Providers, Wake, ::testing::Values("fake", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

// How an idle adaptive worker is woken (src/core/wake.h): a worker blocked in
// poll(2) must be woken by the submission's eventfd and by a completion's wait
// object, not by its timer. The assertions count wake-ups by cause, so they
// hold on a loaded machine; no latency bound is asserted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/wake.h"
#include "core/worker.h"
#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

struct Snapshot {
  uint64_t blocks, by_submission, by_completion, notifies, inline_posts;
  static Snapshot now() {
    auto& w = wake_counters();
    return {w.blocks.load(), w.by_submission.load(), w.by_completion.load(), w.notifies.load(),
            w.inline_posts.load()};
  }
};

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

EngineConfig adaptive(const std::string& kind) {
  EngineConfig c = test::config_for(kind);
  c.poll_mode = PollMode::kAdaptive;
  c.spin_before_block = 0us;  // block as soon as there is nothing to do
  return c;
}

class Wake : public ::testing::TestWithParam<std::string> {};

// Each round starts with both workers blocked: the submitter posts the ping
// itself (the worker idles) and still writes the sender's eventfd (its
// worker's fi_trywait came before that post); the receiver's worker wakes
// through its CQ.
TEST_P(Wake, BlockedWorkersWakeForASubmissionAndForACompletion) {
  TransferEngine a(adaptive(GetParam())), b(adaptive(GetParam()));
  auto dst = test::region(b, 4096);
  auto ping = b.imm_counter(7);
  constexpr int kRounds = 20;
  const Snapshot before = Snapshot::now();
  std::atomic<uint64_t> sent{0};
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(all_asleep(2)) << "round " << i << ": workers never blocked";
    a.submit_imm(7, dst.d, OnDone::counter(sent));
    ASSERT_TRUE(ping.wait(1, 10s).is_ok()) << "round " << i;
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
// worker that counted the ping: no hop, and the reply arrives.
TEST_P(Wake, InlineCallbackRepliesFromTheWorker) {
  TransferEngine a(adaptive(GetParam())), b(adaptive(GetParam()));
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
}

// An inline callback that throws does not take the worker down: it keeps
// running it and counting.
TEST_P(Wake, InlineCallbackThatThrowsIsCounted) {
  TransferEngine a(adaptive(GetParam())), b(adaptive(GetParam()));
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
  EngineConfig c = test::config_for(GetParam());
  c.poll_mode = PollMode::kBusy;
  TransferEngine a(c), b(c);
  auto dst = test::region(b, 4096);
  auto ping = b.imm_counter(7);
  const Snapshot before = Snapshot::now();
  for (int i = 0; i < 20; ++i) {
    a.submit_imm(7, dst.d, OnDone::none());
    ASSERT_TRUE(ping.wait(1, 10s).is_ok());
  }
  EXPECT_EQ(Snapshot::now().blocks, before.blocks);
  EXPECT_EQ(Snapshot::now().notifies, before.notifies);
  EXPECT_EQ(Snapshot::now().inline_posts, before.inline_posts);  // busy: the worker posts
}

INSTANTIATE_TEST_SUITE_P(Providers, Wake, ::testing::Values("fake", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

// A spinning worker steps aside for threads that spin on its counters and
// queues (EngineConfig::busy_step_aside): they poll its NICs and post their
// own submissions, with no crossing to the worker. Busy workers, and adaptive
// ones in their spin phase where idle polls do not yield (many CPUs; forced
// here with EngineConfig::spin_yield). The assertions count what each thread
// did (wake.h), so they hold on a loaded machine; no latency bound is
// asserted.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <tuple>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

// (provider, poll mode): "busy", or "adaptive" spinning without yields for
// long enough that the spin phase outlasts each test.
using Param = std::tuple<std::string, std::string>;

EngineConfig spinning(const Param& p, bool step_aside = true,
                      std::chrono::microseconds spin = std::chrono::microseconds(60'000'000)) {
  EngineConfig c = test::config_for(std::get<0>(p));
  if (std::get<1>(p) == "busy") {
    c.poll_mode = PollMode::kBusy;
  } else {
    c.poll_mode = PollMode::kAdaptive;
    c.spin_yield = SpinYield::kNoYield;
    c.spin_before_block = spin;
  }
  c.busy_step_aside = step_aside;
  return c;
}

struct Counts {
  uint64_t asides, helped_polls, inline_posts, notifies, blocks, naps;
  static Counts now() {
    auto& w = wake_counters();
    return {w.asides.load(),   w.helped_polls.load(), w.inline_posts.load(),
            w.notifies.load(), w.blocks.load(),       w.naps.load()};
  }
};

// Both sides spin on counters: their workers step aside, the application
// threads count the arrivals and post the answers themselves. Batches of
// `batch` rounds until done() says so, at most 60 s. Returns the rounds played.
template <typename Done>
uint64_t ping_pong(TransferEngine& a, TransferEngine& b, int batch, Done&& done) {
  uint64_t rounds = 0;
  auto on_a = test::region(a, 4096), on_b = test::region(b, 4096);
  auto ping = b.imm_counter(40), pong = a.imm_counter(41);
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  do {
    std::atomic<bool> failed{false};
    std::thread server([&] {
      for (int i = 0; i < batch && !failed; ++i) {
        if (!test::take_one_spinning(ping)) {
          failed = true;
          return;
        }
        b.submit_imm(41, on_a.d, OnDone::none());
      }
    });
    for (int i = 0; i < batch && !failed; ++i) {
      a.submit_imm(40, on_b.d, OnDone::none());
      if (!test::take_one_spinning(pong)) failed = true;
    }
    server.join();
    EXPECT_FALSE(failed.load()) << "a round of the ping-pong did not complete";
    if (failed.load()) return rounds;
    rounds += uint64_t(batch);
  } while (!done() && std::chrono::steady_clock::now() < give_up);
  EXPECT_EQ(ping.value(), 0);
  EXPECT_EQ(pong.value(), 0);
  return rounds;
}

class StepAside : public ::testing::TestWithParam<Param> {};

TEST_P(StepAside, SpinningWaitersDriveTheNicsAndPostTheirOwnAnswers) {
  TransferEngine a(spinning(GetParam())), b(spinning(GetParam()));
  const Counts before = Counts::now();
  // Where threads outnumber cores (this suite under a sanitizer on two cores)
  // a waiter may not run within a step aside's 50 µs, and the worker takes
  // its NICs back: play rounds until each has been seen, not a fixed number.
  auto seen_all = [&] {
    const Counts now = Counts::now();
    return now.asides > before.asides && now.helped_polls > before.helped_polls &&
           now.inline_posts > before.inline_posts;
  };
  const uint64_t rounds = ping_pong(a, b, 200, seen_all);
  const Counts after = Counts::now();
  EXPECT_GE(after.asides - before.asides, 1u) << "no worker stepped aside";
  EXPECT_GE(after.helped_polls - before.helped_polls, 1u) << "no waiter polled";
  EXPECT_GE(after.inline_posts - before.inline_posts, 1u) << "no submitter posted itself";
  // No worker blocks or naps, and the answers do not travel by eventfd: a
  // worker that stepped aside sleeps on its eventfd, written when a helper
  // leaves, and otherwise only by a submitter that saw the worker asleep just
  // as it came back (it read sleeping_, was preempted, then found the step
  // aside over). A loaded CI run had two such writes; one per 50 rounds is
  // far above that and far below one per round.
  EXPECT_EQ(after.blocks, before.blocks) << "a spinning worker blocked in poll(2)";
  EXPECT_EQ(after.naps, before.naps) << "a spinning worker napped";
  EXPECT_LE(after.notifies - before.notifies, rounds / 50)
      << "eventfd writes in " << rounds << " rounds";
}

// Off, the spinning worker keeps its NICs: it posts and polls everything.
TEST_P(StepAside, OffTheWorkerPostsAndPollsEverything) {
  TransferEngine a(spinning(GetParam(), false)), b(spinning(GetParam(), false));
  const Counts before = Counts::now();
  ping_pong(a, b, 100, [] { return true; });
  const Counts after = Counts::now();
  EXPECT_EQ(after.asides, before.asides);
  EXPECT_EQ(after.helped_polls, before.helped_polls);
  EXPECT_EQ(after.inline_posts, before.inline_posts);
}

// While a thread spins on a counter that never fills (the worker aside for
// it), transfers that need the worker (OnDone counters: slots, plans, shards)
// still complete with their bytes, from this and other threads at once.
TEST_P(StepAside, TransfersWithOnDoneCompleteWhileAWaiterDrivesTheNics) {
  TransferEngine a(spinning(GetParam())), b(spinning(GetParam()));
  auto never = a.imm_counter(43);
  const uint64_t asides = wake_counters().asides.load();
  // Stopped and joined however the test ends.
  struct Spinner {
    std::atomic<bool> stop{false};
    std::thread th;
    ~Spinner() {
      stop = true;
      if (th.joinable()) th.join();
    }
  } spinner;
  spinner.th = std::thread([&] {
    while (!spinner.stop.load()) never.try_consume(1);
  });
  // The spinner asks a's worker to step aside; wait until it did, so that the
  // writes below are submitted to a worker that stepped aside.
  ASSERT_TRUE(test::wait_until([&] { return wake_counters().asides.load() > asides; }, 10s));
  test::writes_from_threads(a, b, 3, 200, 4096, 42, 5);
}

// stop() ends a step aside, the waits of the threads the worker stepped aside
// for and the submissions of a thread posting for it meanwhile; repeated, so
// that stop() lands at different points of a step aside.
TEST_P(StepAside, StopEndsTheStepAsideTheWaitsAndTheSubmissions) {
  const int cycles = std::get<0>(GetParam()) == "tcp" ? 10 : 30;
  for (int c = 0; c < cycles; ++c) {
    auto a = std::make_unique<TransferEngine>(spinning(GetParam()));
    auto self = test::region(*a, 4096);
    auto never = a->imm_counter(44);
    const uint64_t asides = wake_counters().asides.load();
    Status waited;
    std::atomic<int> refused{0};
    std::thread waiter([&] { waited = never.wait(1, 60s, ImmCounter::WaitMode::kSpin); });
    const bool aside =
        test::wait_until([&] { return wake_counters().asides.load() > asides; }, 10s);
    // Then immediates to itself on a value nobody counts, posted by this
    // thread while the worker is aside, until stop() refuses them.
    std::thread submitter([&] {
      for (;;) {
        try {
          a->submit_imm(45, self.d, OnDone::none());
        } catch (const Error& e) {
          if (e.code() == Code::kFailedPrecondition) refused = 1;
          break;
        }
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    a->stop();
    waiter.join();
    submitter.join();
    ASSERT_TRUE(aside) << "cycle " << c << ": the worker never stepped aside";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "cycle " << c;
    EXPECT_EQ(waited.code(), Code::kCancelled) << "cycle " << c << ": " << waited.to_string();
    EXPECT_EQ(refused.load(), 1) << "cycle " << c
                                 << ": submissions did not end in kFailedPrecondition";
  }
}

// An adaptive worker's spin phase is prolonged only by what its helpers
// find: a thread that spins on a counter nothing arrives for does not keep it
// spinning, and it naps or blocks as it did before it stepped aside (its idle
// CPU does not grow).
TEST_P(StepAside, AnAdaptiveWorkerWhoseWaiterFindsNothingSleepsAfterItsSpinPhase) {
  if (std::get<1>(GetParam()) != "adaptive") GTEST_SKIP() << "busy workers never sleep";
  // A spin phase long enough for the spinner to start within it on a loaded
  // machine under a sanitizer.
  TransferEngine a(spinning(GetParam(), true, 300'000us));
  auto never = a.imm_counter(46);
  const Counts before = Counts::now();
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load()) never.try_consume(1);
  });
  const bool slept = test::wait_until(
      [&] {
        const Counts now = Counts::now();
        return now.asides > before.asides && now.naps + now.blocks > before.naps + before.blocks;
      },
      10s);
  stop = true;
  spinner.join();
  EXPECT_TRUE(slept) << "asides " << Counts::now().asides - before.asides
                     << "; the worker never napped or blocked while a waiter spun";
}

INSTANTIATE_TEST_SUITE_P(Providers, StepAside,
                         ::testing::Combine(::testing::Values("fake", "tcp", "shm"),
                                            ::testing::Values("busy", "adaptive")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace ferry

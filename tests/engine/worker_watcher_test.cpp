// UVM watchers polled by the first group's worker (WatchOn::kWorker): the
// callback runs on the worker, its submission goes out in the same turn, the
// worker stays awake while a word is armed and sleeps again once none is, and
// stop() ends the callbacks. The watcher words are plain host memory here
// (FERRY_TESTING_HOST_WATCHERS), with a host thread storing as a kernel would.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;
using test::code_of;

void store(uint64_t* w, uint64_t v) {
  std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release);
}

bool until(const std::function<bool()>& p, std::chrono::seconds t = 10s) {
  return test::wait_until(p, t);
}

EngineConfig adaptive(const std::string& kind) {
  ::setenv("FERRY_TESTING_HOST_WATCHERS", "1", 1);
  return test::adaptive_config_for(kind);
}

uint64_t sleeps() {
  return wake_counters().blocks.load() + wake_counters().naps.load();
}

class WorkerWatcher : public ::testing::TestWithParam<std::string> {};

// Each store waits for the previous immediate, so no change coalesces: ten
// callbacks, ten immediates. stop() from the callback is refused: it runs on an
// engine thread (the worker), which stop() would have to join.
TEST_P(WorkerWatcher, CallbackRunsOnTheWorkerAndItsSubmissionArrives) {
  TransferEngine a(adaptive(GetParam())), b(adaptive(GetParam()));
  auto dst = test::region(b, 4096);
  auto arrivals = b.imm_counter(5);
  std::atomic<int> calls{0}, stop_code{-1};
  uint64_t* word = a.alloc_uvm_watcher(
      [&](uint64_t, uint64_t now) {
        if (calls++ == 0) stop_code = int(code_of([&] { a.stop(); }));
        a.submit_imm(5, dst.d, OnDone::none());
        return now < 10;
      },
      WatchOn::kWorker);
  for (uint64_t v = 1; v <= 10; ++v) {
    store(word, v);
    ASSERT_TRUE(arrivals.wait(1, 10s).is_ok()) << "value " << v;
  }
  EXPECT_EQ(calls.load(), 10);
  EXPECT_EQ(stop_code.load(), int(Code::kFailedPrecondition));
  EXPECT_FALSE(arrivals.try_consume(1));
}

// An idle adaptive worker blocks in poll(2), which a store into host memory
// cannot end: while a word is armed it must not block or nap at all.
TEST_P(WorkerWatcher, WorkerStaysAwakeWhileArmedAndSleepsAgainAfter) {
  TransferEngine a(adaptive(GetParam()));
  std::atomic<int> calls{0};
  uint64_t* word = a.alloc_uvm_watcher(
      [&](uint64_t, uint64_t now) {
        calls++;
        return now != 2;  // 2 releases the word
      },
      WatchOn::kWorker);
  store(word, 1);
  ASSERT_TRUE(until([&] { return calls.load() == 1; }));
  const uint64_t before = sleeps();
  std::this_thread::sleep_for(50ms);  // idle time for the worker, not a synchronisation
  EXPECT_EQ(sleeps(), before) << "the worker slept with a watcher armed";
  store(word, 2);
  ASSERT_TRUE(until([&] { return calls.load() == 2; }));
  EXPECT_TRUE(until([&] { return wake_counters().asleep.load() >= 1; }))
      << "the worker did not go back to sleep once no word was armed";
}

// After stop() returns no callback runs; later allocations are refused.
TEST_P(WorkerWatcher, StopEndsCallbacksAndRefusesLaterWatchers) {
  TransferEngine a(adaptive(GetParam()));
  std::atomic<int> calls{0};
  uint64_t* word = a.alloc_uvm_watcher(
      [&](uint64_t, uint64_t) {
        calls++;
        return true;
      },
      WatchOn::kWorker);
  store(word, 1);
  ASSERT_TRUE(until([&] { return calls.load() == 1; }));
  a.stop();
  EXPECT_EQ(code_of([&] {
              a.alloc_uvm_watcher([](uint64_t, uint64_t) { return true; }, WatchOn::kWorker);
            }),
            Code::kFailedPrecondition);
  EXPECT_EQ(calls.load(), 1);
}

// The watcher thread is an engine thread too: stop() from its callback is
// refused instead of joining the thread it runs on.
TEST_P(WorkerWatcher, StopFromAWatcherThreadCallbackIsRefused) {
  TransferEngine a(adaptive(GetParam()));
  std::atomic<int> stop_code{-1};
  uint64_t* word = a.alloc_uvm_watcher([&](uint64_t, uint64_t) {
    stop_code = int(code_of([&] { a.stop(); }));
    return false;
  });
  store(word, 1);
  ASSERT_TRUE(until([&] { return stop_code.load() != -1; }));
  EXPECT_EQ(stop_code.load(), int(Code::kFailedPrecondition));
  a.stop();
}

// A callback on the worker that registers memory (a control call on that same
// worker) runs it at once: queued, it would wait for the worker to finish the
// very callback that waits (the control timeout, 30 s, then kDeadlineExceeded).
// Both kinds of worker callback: a watcher's, and an inline immediate callback.
TEST_P(WorkerWatcher, ControlCallsFromCallbacksOnTheWorkerRunAtOnce) {
  TransferEngine a(adaptive(GetParam())), b(adaptive(GetParam()));
  std::vector<uint8_t> mem_a(4096), mem_b(4096);
  auto register_and_drop = [](TransferEngine& e, std::vector<uint8_t>& mem) {
    return int(code_of([&] {
      auto [h, d] = e.reg_mr(mem.data(), mem.size());
      e.unreg_mr(h);
    }));
  };
  std::atomic<int> from_watcher{-1}, from_imm{-1};
  uint64_t* word = a.alloc_uvm_watcher(
      [&](uint64_t, uint64_t) {
        from_watcher = register_and_drop(a, mem_a);
        return false;
      },
      WatchOn::kWorker);
  auto dst = test::region(b, 4096);
  b.expect_imm_count(
      9, 1, [&] { from_imm = register_and_drop(b, mem_b); }, CallbackOn::kWorker);
  const auto t0 = std::chrono::steady_clock::now();
  store(word, 1);
  a.submit_imm(9, dst.d, OnDone::none());
  ASSERT_TRUE(until([&] { return from_watcher.load() != -1 && from_imm.load() != -1; }, 60s));
  EXPECT_EQ(from_watcher.load(), int(Code::kOk));
  EXPECT_EQ(from_imm.load(), int(Code::kOk));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

INSTANTIATE_TEST_SUITE_P(Providers, WorkerWatcher, ::testing::Values("fake", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

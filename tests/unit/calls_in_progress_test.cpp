// core::CallsInProgress: the count stop() waits out before it tears the engine
// down, spread over cache lines by calling thread.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "core/calls_in_progress.h"

namespace ferry::core {
namespace {

TEST(CallsInProgress, CountsACallUntilItLeaves) {
  CallsInProgress c;
  EXPECT_FALSE(c.any());
  const size_t a = c.enter();
  const size_t b = c.enter();  // nested, same thread: same shard
  EXPECT_EQ(a, b);
  EXPECT_TRUE(c.any());
  c.leave(b);
  EXPECT_TRUE(c.any());
  c.leave(a);
  EXPECT_FALSE(c.any());
}

// New threads take the shards in turn, so up to kShards threads started one
// after another never share a line.
TEST(CallsInProgress, ThreadsStartedInARowTakeDistinctShards) {
  CallsInProgress c;
  std::vector<size_t> got(CallsInProgress::kShards);
  for (size_t i = 0; i < got.size(); ++i)
    std::thread([&, i] {
      got[i] = c.enter();
      c.leave(got[i]);
    }).join();
  EXPECT_EQ(std::set<size_t>(got.begin(), got.end()).size(), got.size());
  EXPECT_FALSE(c.any());
}

// The closer's side of TransferEngine::stop(): set the flag, wait until no
// call is counted, tear down. A call's side: count in (call(c, body) runs body
// counted in c), check the flag, use the object, count out. No call may find
// the object torn down, and every call that saw no flag must have been waited
// for.
template <typename Call>
void expect_no_call_outlives_its_close(Call&& call) {
  constexpr int kThreads = 4, kRounds = 200;
  for (int round = 0; round < kRounds; ++round) {
    CallsInProgress c;
    std::atomic<bool> closed{false}, torn_down{false};
    std::atomic<int> calls{0}, late{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t)
      callers.emplace_back([&] {
        for (bool open = true; open;)
          call(c, [&] {
            if (closed.load(std::memory_order_seq_cst)) {
              open = false;
              return;
            }
            if (torn_down.load(std::memory_order_seq_cst)) late.fetch_add(1);
            calls.fetch_add(1);
            if (torn_down.load(std::memory_order_seq_cst)) late.fetch_add(1);
          });
      });
    while (calls.load() < 50 * kThreads) std::this_thread::yield();
    closed.store(true, std::memory_order_seq_cst);
    while (c.any()) std::this_thread::yield();
    torn_down.store(true, std::memory_order_seq_cst);
    for (auto& th : callers) th.join();
    ASSERT_EQ(late.load(), 0) << "round " << round;
    EXPECT_FALSE(c.any());
  }
}

// Counted by hand in the shards (what a call without a slot does).
TEST(CallsInProgress, NoCallOutlivesTheCloseThatWaitedForIt) {
  expect_no_call_outlives_its_close([](CallsInProgress& c, auto&& body) {
    const size_t s = c.enter();
    body();
    c.leave(s);
  });
}

// Through Counted, as the engine's calls use it: a slot of the calling
// thread's own where membarrier(2) works (core/presence.h).
TEST(CallsInProgress, NoCountedCallOutlivesTheCloseThatWaitedForIt) {
  expect_no_call_outlives_its_close([](CallsInProgress& c, auto&& body) {
    const CallsInProgress::Counted counted(c);
    body();
  });
}

}  // namespace
}  // namespace ferry::core

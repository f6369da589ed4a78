// Per-thread counts (core/thread_count.h): every add is counted once, by
// threads that are still running and by threads that exited, adds made while
// a thread exits (after its block was retired) are not lost, and a block
// given back counts from zero for the next thread that takes it.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_count.h"

namespace ferry::core {
namespace {

ThreadCount& counted() {
  static ThreadCount c;
  return c;
}

TEST(ThreadCount, SumsLiveAndExitedThreadsExactly) {
  ThreadCount& c = counted();
  const uint64_t before = c.load();
  constexpr int kThreads = 8, kAdds = 100'000;
  std::atomic<int> done{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) c.add();
      done.fetch_add(1);
      // Half the threads stay alive while the count is read.
      if (t % 2 == 0)
        while (!release.load()) std::this_thread::yield();
    });
  for (int t = 1; t < kThreads; t += 2) ts[size_t(t)].join();
  while (done.load() < kThreads) std::this_thread::yield();
  EXPECT_EQ(c.load() - before, uint64_t(kThreads) * kAdds);
  release.store(true);
  for (int t = 0; t < kThreads; t += 2) ts[size_t(t)].join();
  EXPECT_EQ(c.load() - before, uint64_t(kThreads) * kAdds);
}

// A thread_local whose destructor adds after the thread's block is retired.
struct AddsAtExit {
  bool armed = false;
  ~AddsAtExit() {
    if (armed) counted().add();
  }
};

TEST(ThreadCount, AnAddDuringThreadExitIsCounted) {
  ThreadCount& c = counted();
  const uint64_t before = c.load();
  std::thread t([&] {
    // Constructed before the thread's block is registered, so destroyed
    // after it is retired.
    static thread_local AddsAtExit at_exit;
    at_exit.armed = true;
    c.add();
  });
  t.join();
  EXPECT_EQ(c.load() - before, 2u);
}

// More threads over time than there are blocks: each exited thread's block is
// taken again, and what its first owner added is counted once, in the totals.
TEST(ThreadCount, BlocksOfExitedThreadsAreReusedAndCountedOnce) {
  ThreadCount& c = counted();
  const uint64_t before = c.load();
  constexpr size_t kThreads = kMaxCountingThreads + kMaxCountingThreads / 2;
  constexpr int kAdds = 7;
  for (size_t t = 0; t < kThreads; ++t)
    std::thread([&] {
      for (int i = 0; i < kAdds; ++i) c.add();
    }).join();
  EXPECT_EQ(c.load() - before, uint64_t(kThreads) * kAdds);
}

}  // namespace
}  // namespace ferry::core

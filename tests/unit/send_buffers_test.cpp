// The free list of send buffers (core/send_buffers.h): every index is held by
// at most one thread at a time, whatever the interleaving; a waiter is woken
// by a release and by close; a deadline ends the wait with kResourceExhausted.
#include "core/send_buffers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

using namespace std::chrono_literals;
using Clock = SendBuffers::Clock;

TEST(SendBuffers, HandsOutEveryIndexOnceThenRefuses) {
  SendBuffers b;
  b.reset(5);
  std::vector<bool> seen(5, false);
  for (int k = 0; k < 5; ++k) {
    uint32_t i = 99;
    ASSERT_TRUE(b.acquire({}, false, &i).is_ok());
    ASSERT_LT(i, 5u);
    EXPECT_FALSE(seen[i]) << "index " << i << " handed out twice";
    seen[i] = true;
  }
  uint32_t i = 99;
  EXPECT_EQ(b.acquire({}, false, &i).code(), Code::kResourceExhausted);
  b.release(3);
  ASSERT_TRUE(b.acquire({}, false, &i).is_ok());
  EXPECT_EQ(i, 3u);
}

// Four threads take and give back indices as fast as they can; each index has
// an owner flag that a second owner would find set.
TEST(SendBuffers, NoIndexHasTwoOwnersUnderContention) {
  constexpr uint32_t kBuffers = 3;
  constexpr int kThreads = 4, kRounds = 50'000;
  SendBuffers b;
  b.reset(kBuffers);
  std::vector<std::atomic<int>> owner(kBuffers);
  std::atomic<int> doubles{0}, waits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        uint32_t i = 0;
        if (!b.acquire(Clock::now() + 10s, true, &i).is_ok()) {
          waits++;
          continue;
        }
        int none = 0;
        if (!owner[i].compare_exchange_strong(none, t + 1)) doubles++;
        owner[i].store(0);
        b.release(i);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(doubles.load(), 0);
  EXPECT_EQ(waits.load(), 0);
  // All back: exactly kBuffers can be taken again.
  for (uint32_t k = 0; k < kBuffers; ++k) {
    uint32_t i = 0;
    ASSERT_TRUE(b.acquire({}, false, &i).is_ok());
  }
  uint32_t i = 0;
  EXPECT_EQ(b.acquire({}, false, &i).code(), Code::kResourceExhausted);
}

TEST(SendBuffers, AWaiterIsWokenByARelease) {
  SendBuffers b;
  b.reset(1);
  uint32_t held = 0;
  ASSERT_TRUE(b.acquire({}, false, &held).is_ok());
  auto waiter = std::async(std::launch::async, [&] {
    uint32_t i = 99;
    Status st = b.acquire(Clock::time_point{}, true, &i);  // no deadline
    return std::make_pair(st.code(), i);
  });
  // Whether the release comes before or after the waiter sleeps, it must get it.
  b.release(held);
  ASSERT_EQ(waiter.wait_for(20s), std::future_status::ready);
  auto [code, i] = waiter.get();
  EXPECT_EQ(code, Code::kOk);
  EXPECT_EQ(i, held);
}

TEST(SendBuffers, ADeadlineEndsTheWait) {
  SendBuffers b;
  b.reset(1);
  uint32_t i = 0;
  ASSERT_TRUE(b.acquire({}, false, &i).is_ok());
  const auto t0 = Clock::now();
  EXPECT_EQ(b.acquire(t0 + 50ms, true, &i).code(), Code::kResourceExhausted);
  EXPECT_GE(Clock::now() - t0, 50ms);
}

TEST(SendBuffers, CloseWakesEveryWaiterAndRefusesAfter) {
  SendBuffers b;
  b.reset(1);
  uint32_t i = 0;
  ASSERT_TRUE(b.acquire({}, false, &i).is_ok());
  std::vector<std::future<Code>> waiters;
  for (int k = 0; k < 3; ++k)
    waiters.push_back(std::async(std::launch::async, [&] {
      uint32_t j = 0;
      return b.acquire(Clock::time_point{}, true, &j).code();
    }));
  b.close();
  for (auto& w : waiters) {
    ASSERT_EQ(w.wait_for(20s), std::future_status::ready);
    EXPECT_EQ(w.get(), Code::kFailedPrecondition);
  }
  b.release(i);
  EXPECT_EQ(b.acquire({}, false, &i).code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace ferry::core

// The worker's submission ring (core/submit_ring.h): every pushed value comes
// out exactly once, a full ring refuses without taking the value, and cells are
// reused lap after lap.
#include "core/submit_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

TEST(SubmitRing, FullRingRefusesAndLeavesTheValue) {
  SubmitRing<std::unique_ptr<int>> ring(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(std::make_unique<int>(i)));
  auto extra = std::make_unique<int>(99);
  EXPECT_FALSE(ring.try_push(std::move(extra)));
  ASSERT_NE(extra, nullptr) << "a refused push moved the value away";
  EXPECT_EQ(ring.size_approx(), 4u);
  for (int lap = 0; lap < 3; ++lap) {
    for (int i = 0; i < 4; ++i) {
      auto* v = ring.front();
      ASSERT_NE(v, nullptr);
      EXPECT_EQ(**v, lap * 4 + i);
      ring.pop();
      ASSERT_TRUE(ring.try_push(std::make_unique<int>((lap + 1) * 4 + i)));
    }
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_NE(ring.front(), nullptr);
    ring.pop();
  }
  EXPECT_EQ(ring.front(), nullptr);
  EXPECT_EQ(ring.size_approx(), 0u);
}

// Producers race for cells while the consumer takes them; values refused by
// a full ring are pushed again. Each producer's values must arrive once each
// and, since each producer pushes in order and the ring is FIFO, in order.
TEST(SubmitRing, ManyProducersOneConsumerDeliverEachValueOnceInOrder) {
  constexpr int kProducers = 4;
  constexpr uint64_t kPerProducer = 200'000;
  SubmitRing<uint64_t> ring(64);
  std::atomic<bool> go{false};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      while (!go.load()) std::this_thread::yield();
      for (uint64_t i = 0; i < kPerProducer; ++i) {
        uint64_t v = (uint64_t(p) << 32) | i;
        while (!ring.try_push(std::move(v))) std::this_thread::yield();
      }
    });
  go.store(true);
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t got = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (got < kProducers * kPerProducer && std::chrono::steady_clock::now() < give_up) {
    uint64_t* v = ring.front();
    if (v == nullptr) {
      std::this_thread::yield();
      continue;
    }
    const auto p = size_t(*v >> 32);
    ASSERT_LT(p, size_t(kProducers));
    ASSERT_EQ(*v & 0xffffffffu, next[p]) << "producer " << p;
    ++next[p];
    ring.pop();
    ++got;
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(got, kProducers * kPerProducer);
  EXPECT_EQ(ring.front(), nullptr);
}

// A producer that claimed a cell and has not filled it yet holds back every
// value published after it: front() is null there. Draining up to claimed(),
// waiting at such a cell, reaches them all (the worker's shutdown does this;
// stopping at the first null left the later values, and their OnDones, behind).
TEST(SubmitRing, ValuesBehindACellBeingFilledAreReachedByDrainingToClaimed) {
  SubmitRing<int> ring(8);
  std::atomic<bool> claimed{false}, release{false};
  std::thread slow([&] {
    EXPECT_TRUE(ring.try_emplace([&](int& v) {
      claimed = true;
      while (!release.load()) std::this_thread::yield();
      v = 1;
    }));
  });
  while (!claimed.load()) std::this_thread::yield();
  ASSERT_TRUE(ring.try_push(2));
  ASSERT_TRUE(ring.try_push(3));
  EXPECT_EQ(ring.front(), nullptr);  // held back by the cell being filled
  EXPECT_EQ(ring.claimed(), 3u);
  std::vector<int> got;
  bool released = false;
  for (const uint64_t end = ring.claimed(); ring.head() < end;) {
    int* v = ring.front();
    if (v == nullptr) {
      if (!released) release = released = true;
      std::this_thread::yield();
      continue;
    }
    got.push_back(*v);
    ring.pop();
  }
  slow.join();
  EXPECT_EQ(got, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(ring.size_approx(), 0u);
}

}  // namespace
}  // namespace ferry::core

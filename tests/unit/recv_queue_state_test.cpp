// The receive queue's promise to its worker (core/recv_queue_state.h,
// core/message_ring.h): with at most `count` messages out, a push always
// finds room, lap after lap, however the takers interleave with it or stall
// in the middle of a take; and what goes in comes out once, in order for
// one taker.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/recv_queue_state.h"

namespace ferry {
namespace {

TEST(RecvQueueState, EveryBufferFitsLapAfterLapForAnyCount) {
  for (size_t count : {1u, 2u, 3u, 31u, 32u, 33u, 100u, 1000u}) {
    RecvQueue::State s(count, 16, nullptr, nullptr, 0);
    s.engine.close();  // nothing to give back to
    std::vector<uint32_t> out_of_queue;
    for (uint32_t b = 0; b < count; ++b) out_of_queue.push_back(b);
    uint64_t pushed = 0, taken = 0;
    for (int lap = 0; lap < 200; ++lap) {
      // Push every buffer the "NIC" holds, then take a varying share back.
      for (uint32_t b : out_of_queue) {
        ASSERT_TRUE(s.ring.try_push(RecvQueue::State::Item{b, b + 1u}))
            << "count " << count << " lap " << lap;
        ++pushed;
      }
      out_of_queue.clear();
      const size_t take = lap % 3 == 0 ? count : (lap * 7 + 1) % count + 1;
      RecvQueue::State::Item it;
      for (size_t k = 0; k < take && s.try_take(it); ++k) {
        EXPECT_EQ(it.len, it.buffer + 1u);
        out_of_queue.push_back(it.buffer);
        ++taken;
      }
    }
    RecvQueue::State::Item it;
    while (s.try_take(it)) ++taken;
    EXPECT_EQ(pushed, taken) << "count " << count;
  }
}

TEST(MessageRing, TakesInOrderAndRefusesOnlyWhenFull) {
  core::MessageRing r(5);  // rounded up to 8
  ASSERT_EQ(r.capacity(), 8u);
  core::MessageRing::Item it;
  EXPECT_FALSE(r.try_take(it));
  for (uint32_t lap = 0; lap < 3; ++lap) {
    for (uint32_t i = 0; i < 8; ++i) ASSERT_TRUE(r.try_push({i, 100u * lap + i}));
    EXPECT_FALSE(r.try_push({99, 99})) << "a ninth item in a ring of 8";
    EXPECT_EQ(r.size_approx(), 8u);
    for (uint32_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(r.try_take(it));
      EXPECT_EQ(it.buffer, i);
      EXPECT_EQ(it.len, 100u * lap + i);
    }
    EXPECT_FALSE(r.try_take(it));
    EXPECT_EQ(r.size_approx(), 0u);
  }
}

// One producer, three takers taking at once (State::try_take): every item is
// taken exactly once, and the producer never finds the queue full while it
// pushes only what was taken, though a taker may stall anywhere in its take
// while the others let the producer lap.
TEST(RecvQueueState, ConcurrentTakersTakeEachItemOnce) {
  constexpr size_t kCount = 64;
  constexpr uint32_t kItems = 60'000;
  RecvQueue::State s(kCount, 16, nullptr, nullptr, 0);
  s.engine.close();
  std::vector<std::atomic<uint32_t>> seen(kItems);
  std::atomic<uint32_t> taken{0}, credits{kCount};
  // A lost item leaves the takers short: they give up at the deadline and
  // the counts below fail.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<std::thread> takers;
  for (int t = 0; t < 3; ++t)
    takers.emplace_back([&] {
      RecvQueue::State::Item it;
      while (taken.load() < kItems && std::chrono::steady_clock::now() < until) {
        if (!s.try_take(it)) {
          std::this_thread::yield();
          continue;
        }
        seen[it.len].fetch_add(1);
        taken.fetch_add(1);
        credits.fetch_add(1);
      }
    });
  bool always_room = true;
  for (uint32_t i = 0; i < kItems; ++i) {
    while (credits.load() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    if (credits.load() == 0) break;  // past the deadline: the takers stop too
    credits.fetch_sub(1);
    always_room &= s.ring.try_push(RecvQueue::State::Item{uint32_t(i % kCount), i});
    s.signal.notify();
  }
  for (auto& t : takers) t.join();
  EXPECT_TRUE(always_room);
  for (uint32_t i = 0; i < kItems; ++i) ASSERT_EQ(seen[i].load(), 1u) << i;
}

}  // namespace
}  // namespace ferry

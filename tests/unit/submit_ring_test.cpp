// The worker's submission ring (core/submit_ring.h): every pushed value comes
// out exactly once, a full ring refuses without taking the value, cells are
// reused lap after lap, and a producer stalled inside its cell holds back
// nobody else's values.
#include "core/submit_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

// `producers` threads push `per_producer` values each, (producer << 32) | i,
// pushing again what a full ring refuses; a push whose stall_of(producer, i)
// is k yields k times inside its cell before filling it. This thread takes
// them and checks that each comes once and each producer's in order (a
// producer claims its next cell only after filling the last). A failure is
// recorded and the taking goes on, so the producers always finish. Returns
// how many values were taken past a cell still being filled.
template <typename StallOf>
uint64_t push_and_take(SubmitRing<uint64_t>& ring, int producers, uint64_t per_producer,
                       StallOf stall_of) {
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      while (!go.load()) std::this_thread::yield();
      for (uint64_t i = 0; i < per_producer; ++i) {
        const int stall = stall_of(p, i);
        const uint64_t v = (uint64_t(p) << 32) | i;
        while (!ring.try_emplace([&](uint64_t& cell) {
          for (int k = 0; k < stall; ++k) std::this_thread::yield();
          cell = v;
        }))
          std::this_thread::yield();
      }
    });
  go.store(true);
  std::vector<uint64_t> next(size_t(producers), 0);
  const uint64_t total = uint64_t(producers) * per_producer;
  uint64_t got = 0, past_a_hole = 0, wrong = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (got < total && std::chrono::steady_clock::now() < give_up) {
    uint64_t pos = 0;
    uint64_t* v = ring.next(&pos);
    if (v == nullptr) {
      std::this_thread::yield();
      continue;
    }
    const auto p = size_t(*v >> 32);
    if (p >= size_t(producers) || (*v & 0xffffffffu) != next[p]) {
      if (wrong++ == 0)
        ADD_FAILURE() << "value " << (*v & 0xffffffffu) << " of producer " << p << " out of order"
                      << (p < next.size() ? " (expected " + std::to_string(next[p]) + ")" : "");
      if (p < next.size()) next[p] = (*v & 0xffffffffu) + 1;
    } else {
      ++next[p];
    }
    past_a_hole += pos != ring.head();
    ring.pop(pos);
    ++got;
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0u) << "values out of their producer's order";
  EXPECT_EQ(got, total);
  uint64_t pos = 0;
  EXPECT_EQ(ring.next(&pos), nullptr);
  EXPECT_EQ(ring.size_approx(), 0u);
  EXPECT_EQ(ring.head(), ring.claimed());
  return past_a_hole;
}

TEST(SubmitRing, FullRingRefusesAndLeavesTheValue) {
  SubmitRing<std::unique_ptr<int>> ring(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(ring.try_push(std::make_unique<int>(i)));
  auto extra = std::make_unique<int>(99);
  EXPECT_FALSE(ring.try_push(std::move(extra)));
  ASSERT_NE(extra, nullptr) << "a refused push moved the value away";
  EXPECT_EQ(ring.size_approx(), 4u);
  for (int lap = 0; lap < 3; ++lap) {
    for (int i = 0; i < 4; ++i) {
      uint64_t pos = 0;
      auto* v = ring.next(&pos);
      ASSERT_NE(v, nullptr);
      EXPECT_EQ(**v, lap * 4 + i);
      ring.pop(pos);
      ASSERT_TRUE(ring.try_push(std::make_unique<int>((lap + 1) * 4 + i)));
    }
  }
  uint64_t pos = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_NE(ring.next(&pos), nullptr);
    ring.pop(pos);
  }
  EXPECT_EQ(ring.next(&pos), nullptr);
  EXPECT_EQ(ring.size_approx(), 0u);
}

// Producers race for cells while the consumer takes them; values refused by
// a full ring are pushed again. Each producer's values must arrive once each
// and in order: a producer claims its next cell only after filling the last,
// so even values taken past a cell still being filled keep their producer's order.
TEST(SubmitRing, ManyProducersOneConsumerDeliverEachValueOnceInOrder) {
  SubmitRing<uint64_t> ring(64);
  push_and_take(ring, 4, 200'000, [](int, uint64_t) { return 0; });
}

// Submitters that claim cells one after another and stall inside them until
// released, the first at position 0; submitter i fills in first + i.
class StalledProducers {
 public:
  StalledProducers(SubmitRing<int>& ring, int count, int first = 100) : release_(size_t(count)) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, &ring, i, first] {
        EXPECT_TRUE(ring.try_emplace([&](int& v) {
          claimed_.fetch_add(1);
          while (!release_[size_t(i)].load()) std::this_thread::yield();
          v = first + i;
        }));
      });
      while (claimed_.load() != i + 1) std::this_thread::yield();
    }
  }
  ~StalledProducers() {
    for (auto& r : release_) r.store(true);
    for (auto& t : threads_) t.join();
  }
  void release(int i) { release_[size_t(i)].store(true); }

 private:
  std::atomic<int> claimed_{0};
  std::vector<std::atomic<bool>> release_;
  std::vector<std::thread> threads_;
};

// A producer that claimed a cell and has not filled it yet (preempted, on the
// worker's ring) holds back nobody: the values published after its cell are
// taken while it stalls, the oldest position waits at its cell, and once it
// is filled and taken the oldest position moves over the values taken past
// it. Cells freed that way are used again by the next lap.
TEST(SubmitRing, ValuesPastACellBeingFilledAreTakenWhileItStalls) {
  SubmitRing<int> ring(8);
  StalledProducers slow(ring, 1, 1);
  ASSERT_TRUE(ring.try_push(2));
  ASSERT_TRUE(ring.try_push(3));
  uint64_t pos = 0;
  for (int want : {2, 3}) {
    int* v = ring.next(&pos);
    ASSERT_NE(v, nullptr) << "held back by the cell being filled";
    EXPECT_EQ(*v, want);
    ring.pop(pos);
  }
  EXPECT_EQ(ring.next(&pos), nullptr);
  EXPECT_EQ(ring.head(), 0u);
  EXPECT_EQ(ring.size_approx(), 1u);
  // The two cells taken are free for the next lap, the stalled one is not:
  // five more fit (positions 3-7), and the ninth position (lap 2 of cell 0)
  // is refused.
  for (int i = 4; i <= 8; ++i) ASSERT_TRUE(ring.try_push(int(i)));
  EXPECT_FALSE(ring.try_push(99));
  std::vector<int> got;
  while (int* v = ring.next(&pos)) {
    got.push_back(*v);
    ring.pop(pos);
  }
  EXPECT_EQ(got, (std::vector<int>{4, 5, 6, 7, 8}));
  EXPECT_EQ(ring.head(), 0u);
  slow.release(0);
  int* v = nullptr;
  while ((v = ring.next(&pos)) == nullptr) std::this_thread::yield();
  EXPECT_EQ(*v, 1);
  ring.pop(pos);
  EXPECT_EQ(ring.head(), 8u) << "the oldest position did not move over the values taken past it";
  EXPECT_EQ(ring.size_approx(), 0u);
  // Laps after it.
  for (int lap = 0; lap < 3; ++lap) {
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(ring.try_push(lap * 8 + i));
    EXPECT_FALSE(ring.try_push(99));
    for (int i = 0; i < 8; ++i) {
      v = ring.next(&pos);
      ASSERT_NE(v, nullptr);
      EXPECT_EQ(*v, lap * 8 + i);
      ring.pop(pos);
    }
  }
  EXPECT_EQ(ring.next(&pos), nullptr);
}

// Several submitters stalled in cells next to each other (one thread each,
// preempted one after the other) hold back nobody either, up to the ring's
// look-ahead of four cells past the oldest; past that, the values wait for
// the oldest hole to be filled and are taken then, still before the others.
TEST(SubmitRing, ValuesPastSeveralCellsBeingFilledInARowAreTaken) {
  for (int holes : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << holes << " cells being filled");
    SubmitRing<int> ring(16);
    StalledProducers stalled(ring, holes);
    ASSERT_TRUE(ring.try_push(1));
    ASSERT_TRUE(ring.try_push(2));
    uint64_t pos = 0;
    for (int want : {1, 2}) {
      int* v = ring.next(&pos);
      ASSERT_NE(v, nullptr) << "held back by the cells being filled";
      EXPECT_EQ(*v, want);
      EXPECT_EQ(pos, uint64_t(holes + want - 1));
      ring.pop(pos);
    }
    EXPECT_EQ(ring.next(&pos), nullptr);
    EXPECT_EQ(ring.head(), 0u);
  }
  SubmitRing<int> ring(16);
  StalledProducers stalled(ring, 5);
  ASSERT_TRUE(ring.try_push(1));
  uint64_t pos = 0;
  EXPECT_EQ(ring.next(&pos), nullptr) << "five holes in a row: past the look-ahead";
  stalled.release(0);
  int* v = nullptr;
  while ((v = ring.next(&pos)) == nullptr) std::this_thread::yield();
  EXPECT_EQ(*v, 100);
  ring.pop(pos);
  v = ring.next(&pos);
  ASSERT_NE(v, nullptr) << "four holes past the oldest: within the look-ahead";
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(pos, 5u);
  ring.pop(pos);
  EXPECT_EQ(ring.head(), 1u);
}

// Draining until head() reaches a claimed() read before, waiting where next()
// finds nothing, reaches every value claimed by then, the stalled one
// included (the worker's shutdown does this).
TEST(SubmitRing, DrainingToClaimedReachesTheCellBeingFilled) {
  SubmitRing<int> ring(8);
  StalledProducers slow(ring, 1, 1);
  ASSERT_TRUE(ring.try_push(2));
  ASSERT_TRUE(ring.try_push(3));
  EXPECT_EQ(ring.claimed(), 3u);
  std::vector<int> got;
  for (const uint64_t end = ring.claimed(); ring.head() < end;) {
    uint64_t pos = 0;
    int* v = ring.next(&pos);
    if (v == nullptr) {
      slow.release(0);
      std::this_thread::yield();
      continue;
    }
    got.push_back(*v);
    ring.pop(pos);
  }
  EXPECT_EQ(got, (std::vector<int>{2, 3, 1}));
  EXPECT_EQ(ring.size_approx(), 0u);
}

// Producers that stall inside their cells at random, over many laps of a
// small ring: every value arrives once, each producer's in order, and the
// ring ends empty.
TEST(SubmitRing, ProducersStallingInTheirCellsLoseAndReorderNothing) {
  SubmitRing<uint64_t> ring(8);
  // Each producer's own generator: 1 push in 32 stalls for 1-16 yields.
  std::vector<uint32_t> rng{12345u, 12346u, 12347u, 12348u};
  const uint64_t past_a_hole = push_and_take(ring, 4, 50'000, [&](int p, uint64_t) {
    uint32_t& r = rng[size_t(p)];
    r = r * 1664525u + 1013904223u;
    return (r >> 24) < 8 ? int(r >> 28) + 1 : 0;
  });
  RecordProperty("taken_past_a_hole", std::to_string(past_a_hole));
}

}  // namespace
}  // namespace ferry::core

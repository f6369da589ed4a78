// The watcher/flag slot allocator: pure logic, runs without CUDA or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <latch>
#include <set>
#include <thread>
#include <vector>

#include "cuda/slot_allocator.h"
#include "ferry/status.h"

namespace ferry::cuda {
namespace {

Code code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return Code::kOk;
}

TEST(SlotAllocator, HandsOutEverySlotOnceThenExhausts) {
  SlotAllocator a(8);
  std::set<uint32_t> got;
  for (int i = 0; i < 8; ++i) got.insert(a.acquire());
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(*got.rbegin(), 7u);
  EXPECT_EQ(a.in_use(), 8u);
  EXPECT_EQ(code_of([&] { a.acquire(); }), Code::kResourceExhausted);
}

TEST(SlotAllocator, ReleasedSlotsAreReusedLowestFirst) {
  SlotAllocator a(4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.acquire(), uint32_t(i));
  a.release(2);
  a.release(1);
  EXPECT_EQ(a.in_use(), 2u);
  EXPECT_EQ(a.acquire(), 1u);
  EXPECT_EQ(a.acquire(), 2u);
  EXPECT_EQ(code_of([&] { a.acquire(); }), Code::kResourceExhausted);
}

TEST(SlotAllocator, DoubleReleaseAndForeignSlotsAreErrors) {
  SlotAllocator a(4);
  uint32_t s = a.acquire();
  a.release(s);
  EXPECT_EQ(code_of([&] { a.release(s); }), Code::kFailedPrecondition);
  EXPECT_EQ(code_of([&] { a.release(3); }), Code::kFailedPrecondition);  // never acquired
  EXPECT_EQ(code_of([&] { a.release(4); }), Code::kInvalidArgument);     // past capacity
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_FALSE(a.taken(s));
}

TEST(SlotAllocator, ZeroCapacityIsAlwaysExhausted) {
  SlotAllocator a(0);
  EXPECT_EQ(code_of([&] { a.acquire(); }), Code::kResourceExhausted);
}

TEST(SlotAllocator, ConcurrentAcquireReleaseNeverSharesASlot) {
  constexpr uint32_t kCap = 64;
  SlotAllocator a(kCap);
  std::vector<std::atomic<int>> owners(kCap);
  std::atomic<int> clashes{0}, exhausted{0};
  std::vector<std::thread> threads;
  std::latch filled(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      std::vector<uint32_t> mine;
      // Everyone grabs 12 before anyone releases: 96 asks for 64 slots.
      for (int i = 0; i < 12; ++i) {
        try {
          uint32_t s = a.acquire();
          if (owners[s].fetch_add(1) != 0) clashes.fetch_add(1);
          mine.push_back(s);
        } catch (const Error&) {
          exhausted.fetch_add(1);
        }
      }
      filled.arrive_and_wait();
      for (int i = 0; i < 20000; ++i) {
        if (mine.size() < 12) {
          try {
            uint32_t s = a.acquire();
            if (owners[s].fetch_add(1) != 0) clashes.fetch_add(1);
            mine.push_back(s);
          } catch (const Error&) {
            exhausted.fetch_add(1);
          }
        } else {
          uint32_t s = mine[size_t(i) % mine.size()];
          mine.erase(std::find(mine.begin(), mine.end(), s));
          owners[s].fetch_sub(1);
          a.release(s);
        }
      }
      for (uint32_t s : mine) {
        owners[s].fetch_sub(1);
        a.release(s);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_EQ(a.in_use(), 0u);
  EXPECT_GE(exhausted.load(), 96 - int(kCap));
}

}  // namespace
}  // namespace ferry::cuda

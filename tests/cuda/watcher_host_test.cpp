// The watcher thread and GPU-flag immediate entries over plain host memory:
// everything but the CUDA allocation, without a GPU. A host thread plays the
// kernel with the same release stores device.cuh issues.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "core/imm_table.h"
#include "cuda/mapped_memory.h"
#include "cuda/watcher.h"
#include "ferry/engine.h"
#include "gpu_config.h"
#include "support/thread_cpu.h"

namespace ferry::cuda {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<SlotPool> host_pool(uint32_t slots) {
  return std::make_shared<SlotPool>(alloc_host_for_testing(slots * kSlotBytes));
}

void store(uint64_t* w, uint64_t v) {
  std::atomic_ref<uint64_t>(*w).store(v, std::memory_order_release);
}

bool eventually(const std::function<bool()>& p, std::chrono::milliseconds t = 5s) {
  auto end = std::chrono::steady_clock::now() + t;
  while (std::chrono::steady_clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(100us);
  }
  return p();
}

TEST(WatcherHost, SlotsAreDistinctCacheLines) {
  auto pool = host_pool(16);
  uint32_t a = pool->acquire(), b = pool->acquire();
  EXPECT_EQ(pool->device(b) - pool->device(a), kSlotBytes);
  EXPECT_EQ(pool->device(a) % kSlotBytes, 0u);
}

TEST(WatcherHost, ChangesArriveInOrderAndTheLastValueIsAlwaysSeen) {
  WatcherService ws(host_pool(16), -1);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> seen;
  std::atomic<uint64_t> last{0};
  uint64_t* w = ws.alloc([&](uint64_t o, uint64_t n) {
    std::lock_guard lk(mu);
    seen.emplace_back(o, n);
    last.store(n);
    return true;
  });
  constexpr uint64_t kN = 200000;
  for (uint64_t v = 1; v <= kN; ++v) store(w, v);
  ASSERT_TRUE(eventually([&] { return last.load() == kN; }));
  std::lock_guard lk(mu);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().first, 0u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_LT(seen[i].first, seen[i].second);
    if (i) EXPECT_EQ(seen[i].first, seen[i - 1].second);
  }
  EXPECT_EQ(seen.back().second, kN);
}

TEST(WatcherHost, ReturningFalseOrThrowingReleasesTheSlot) {
  auto pool = host_pool(4);
  WatcherService ws(pool, -1);
  std::atomic<int> calls{0};
  uint64_t* a = ws.alloc([&](uint64_t, uint64_t) {
    calls++;
    return false;
  });
  uint64_t* b = ws.alloc([&](uint64_t, uint64_t) -> bool {
    calls++;
    throw std::runtime_error("user bug");
  });
  ASSERT_TRUE(eventually([&] { return ws.armed() == 2; }));
  store(a, 5);
  store(b, 7);
  ASSERT_TRUE(eventually([&] { return ws.armed() == 0 && pool->allocator().in_use() == 0; }));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(ws.callback_failures(), 1u);
  // Released slots come back zeroed: a new watcher starts from 0.
  uint64_t* c = ws.alloc([&](uint64_t o, uint64_t) {
    EXPECT_EQ(o, 0u);
    calls++;
    return true;
  });
  EXPECT_EQ(*c, 0u);
  store(c, 1);
  ASSERT_TRUE(eventually([&] { return calls.load() == 3; }));
}

TEST(WatcherHost, ExhaustionIsResourceExhausted) {
  WatcherService ws(host_pool(2), -1);
  auto cb = [](uint64_t, uint64_t) { return true; };
  ws.alloc(cb);
  ws.alloc(cb);
  try {
    ws.alloc(cb);
    FAIL() << "third watcher in a pool of two";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kResourceExhausted);
  }
}

TEST(WatcherHost, ThreadSleepsWithNothingArmedAndSpinsWhileArmed) {
  WatcherService ws(host_pool(4), -1);
  ASSERT_TRUE(eventually([&] { return ws.thread_id() != 0; }));
  EXPECT_EQ(test::find_thread("ferry-watcher"), ws.thread_id());
  double c0 = test::thread_cpu_seconds(ws.thread_id());
  std::this_thread::sleep_for(500ms);
  double idle = test::thread_cpu_seconds(ws.thread_id()) - c0;
  EXPECT_LT(idle, 0.05) << "watcher thread burns CPU with no watcher armed";

  uint64_t* w = ws.alloc([](uint64_t, uint64_t n) { return n != 99; });
  ASSERT_TRUE(eventually([&] { return ws.armed() == 1; }));
  c0 = test::thread_cpu_seconds(ws.thread_id());
  std::this_thread::sleep_for(500ms);
  double busy = test::thread_cpu_seconds(ws.thread_id()) - c0;
  // Loose (two shared cores in CI): it polls, so it must have run at all.
  EXPECT_GE(busy, 0.01);

  store(w, 99);  // the callback says release
  ASSERT_TRUE(eventually([&] { return ws.armed() == 0; }));
  std::this_thread::sleep_for(50ms);
  c0 = test::thread_cpu_seconds(ws.thread_id());
  std::this_thread::sleep_for(500ms);
  EXPECT_LT(test::thread_cpu_seconds(ws.thread_id()) - c0, 0.05);
}

TEST(WatcherHost, StopJoinsWithWatchersArmed) {
  auto pool = host_pool(4);
  auto ws = std::make_unique<WatcherService>(pool, -1);
  ws->alloc([](uint64_t, uint64_t) { return true; });
  ws->stop();
  EXPECT_EQ(pool->allocator().in_use(), 0u);
  EXPECT_THROW(ws->alloc([](uint64_t, uint64_t) { return true; }), Error);
}

// --- GPU-flag entries in the ImmTable (what the NIC worker runs) -----------

TEST(GpuFlagCount, StoresTheGenerationAtEachMultiple) {
  core::ImmTable t(nullptr);
  alignas(64) uint32_t flag = 0;
  auto keep = std::make_shared<int>(0);
  t.expect_gpu_flag(7, 3, &flag, keep);
  EXPECT_EQ(keep.use_count(), 2);
  for (int i = 1; i <= 8; ++i) {
    t.on_arrival(7);
    EXPECT_EQ(flag, uint32_t(i / 3)) << "after " << i << " arrivals";
  }
  EXPECT_TRUE(t.remove(7));
  EXPECT_EQ(keep.use_count(), 1);  // the entry no longer pins the slot
}

TEST(GpuFlagCount, SeveralWorkersNeverMoveTheFlagBackwards) {
  core::ImmTable t(nullptr);
  alignas(64) uint32_t flag = 0;
  t.expect_gpu_flag(1, 2, &flag, nullptr);
  constexpr int kThreads = 4, kEach = 20000;
  std::atomic<bool> done{false};
  std::atomic<int> regressions{0};
  std::thread observer([&] {
    uint32_t prev = 0;
    while (!done.load()) {
      uint32_t v = std::atomic_ref<uint32_t>(flag).load(std::memory_order_acquire);
      if (int32_t(v - prev) < 0) regressions++;
      prev = v;
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i)
    workers.emplace_back([&] {
      for (int k = 0; k < kEach; ++k) t.on_arrival(1);
    });
  for (auto& w : workers) w.join();
  done = true;
  observer.join();
  EXPECT_EQ(regressions.load(), 0);
  EXPECT_EQ(flag, uint32_t(kThreads * kEach / 2));
}

// --- the engine's surface ----------------------------------------------------

TEST(GpuEngineApi, UnavailableWithoutCudaOtherwiseValidated) {
  TransferEngine e(test::gpu_test_config());
  if (!cuda_built()) {
    try {
      e.alloc_uvm_watcher([](uint64_t, uint64_t) { return true; });
      FAIL() << "alloc_uvm_watcher without CUDA";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Code::kUnimplemented);
    }
    try {
      e.imm_counter_gpu(1, 1);
      FAIL() << "imm_counter_gpu without CUDA";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Code::kUnimplemented);
    }
  }
  try {
    e.imm_counter_gpu(1, 0);
    FAIL() << "count 0 accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Code::kInvalidArgument);  // checked before CUDA is touched
  }
  e.stop();
  EXPECT_THROW(e.alloc_uvm_watcher([](uint64_t, uint64_t) { return true; }), Error);
}

}  // namespace
}  // namespace ferry::cuda

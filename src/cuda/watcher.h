// The engine's GPU signalling services (docs/GPU.md):
//  * SlotPool: a MappedBlock cut into 64-byte slots handed out by a SlotAllocator;
//  * WatcherService: the polling thread behind TransferEngine::alloc_uvm_watcher;
//  * GpuServices: what TransferEngine::Impl owns; creates the above lazily, on
//    first use, so engines that never touch a GPU never initialise CUDA.
// None of this includes CUDA headers: with host memory (alloc_host_for_testing)
// the whole machinery runs, and is tested, on machines without a GPU.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/stats.h"
#include "cuda/mapped_memory.h"
#include "cuda/slot_allocator.h"
#include "ferry/watcher.h"

namespace ferry::core {
class ImmTable;
}

namespace ferry::cuda {

class SlotPool {
 public:
  explicit SlotPool(std::shared_ptr<MappedBlock> block);
  uint32_t acquire() { return alloc_.acquire(); }
  // Zeroes the slot, then frees it: the next owner starts from 0.
  void release(uint32_t slot);
  uint8_t* host(uint32_t slot) const { return block_->host + size_t(slot) * kSlotBytes; }
  uint64_t device(uint32_t slot) const { return block_->device + uint64_t(slot) * kSlotBytes; }
  const SlotAllocator& allocator() const { return alloc_; }
  const MappedBlock& block() const { return *block_; }

 private:
  std::shared_ptr<MappedBlock> block_;
  SlotAllocator alloc_;
};

class WatcherService {
 public:
  // The thread starts at once and sleeps until the first watcher is armed.
  // cpu >= 0 pins it there. poll_lag (if any) gets the time between sweeps.
  WatcherService(std::shared_ptr<SlotPool> pool, int cpu, core::StatHistogram* poll_lag = nullptr);
  ~WatcherService();
  WatcherService(const WatcherService&) = delete;
  WatcherService& operator=(const WatcherService&) = delete;

  // Arms a zeroed word; returns the address kernels use.
  uint64_t* alloc(WatcherCallback cb);
  // Joins the thread; armed watchers are dropped without a callback.
  void stop();

  // Observability (tests, benchmarks).
  size_t armed() const { return armed_.load(std::memory_order_acquire); }
  uint64_t callback_failures() const { return failures_.load(std::memory_order_relaxed); }
  pid_t thread_id() const { return tid_.load(std::memory_order_acquire); }
  const SlotPool& pool() const { return *pool_; }

 private:
  struct Watch {
    uint32_t slot;
    const uint64_t* word;  // host address
    uint64_t last;
    WatcherCallback cb;
  };
  void run(int cpu);
  // Calls the user callback; false = release the watcher.
  bool deliver(Watch& w, uint64_t now);

  std::shared_ptr<SlotPool> pool_;
  core::StatHistogram* poll_lag_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Watch> incoming_;            // guarded by mu_
  std::atomic<bool> has_incoming_{false};  // lets the poll loop skip mu_
  std::atomic<bool> stop_{false};
  std::atomic<size_t> armed_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<pid_t> tid_{0};
  std::thread thread_;
};

// Owned by TransferEngine::Impl.
class GpuServices {
 public:
  GpuServices() = default;
  ~GpuServices() { stop(); }
  uint64_t* alloc_watcher(int cpu, WatcherCallback cb);
  // Installs a GPU-flag entry for imm in `table` (replacing any prior one);
  // returns the flag's device address.
  uint32_t* imm_counter(core::ImmTable& table, uint32_t imm, uint32_t count);
  void stop();
  // Time between two sweeps of the watcher thread over the armed words.
  const core::StatHistogram& poll_lag() const { return poll_lag_; }

  static constexpr uint32_t kWatcherSlots = 4096;  // 256 KiB of pinned memory
  static constexpr uint32_t kFlagSlots = 1024;     // one 64 KiB GPU page with GDRCopy

 private:
  std::mutex mu_;
  bool stopped_ = false;
  std::unique_ptr<WatcherService> watchers_;
  std::shared_ptr<SlotPool> flags_;
  core::StatHistogram poll_lag_;
};

}  // namespace ferry::cuda

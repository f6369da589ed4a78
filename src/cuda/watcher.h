// The engine's GPU signalling services (docs/GPU.md):
//  * SlotPool: a MappedBlock cut into 64-byte slots handed out by a SlotAllocator;
//  * WatchSet: armed words and their callbacks, swept by one thread;
//  * WatcherService: the polling thread behind TransferEngine::alloc_uvm_watcher;
//  * WorkerWatchers: the same words swept by a worker (WatchOn::kWorker);
//  * GpuServices: what TransferEngine::Impl owns; creates the above lazily, on
//    first use, so engines that never touch a GPU never initialise CUDA.
// None of this includes CUDA headers: with host memory (alloc_host_for_testing)
// the whole machinery runs, and is tested, on machines without a GPU.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/stats.h"
#include "core/turn_hook.h"
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

// The armed words and their callbacks. Any thread adds; one thread sweeps (the
// watcher thread, or a worker for WatchOn::kWorker) and runs the callbacks.
class WatchSet {
 public:
  explicit WatchSet(std::shared_ptr<SlotPool> pool);
  ~WatchSet();  // releases every slot still armed
  WatchSet(const WatchSet&) = delete;
  WatchSet& operator=(const WatchSet&) = delete;

  // Arms a zeroed word; returns the address kernels use.
  uint64_t* add(WatcherCallback cb);
  // Sweeping thread only: takes up new watches, then calls the callback of
  // every word that changed. True when a callback ran.
  bool sweep();
  // Releases every watch and drops its callback; no sweep may run meanwhile.
  void clear();
  bool has_incoming() const { return has_incoming_.load(std::memory_order_acquire); }
  size_t armed() const { return armed_.load(std::memory_order_acquire); }
  uint64_t callback_failures() const { return failures_.load(std::memory_order_relaxed); }
  const SlotPool& pool() const { return *pool_; }

 private:
  struct Watch {
    uint32_t slot;
    const uint64_t* word;  // host address
    uint64_t last;
    WatcherCallback cb;
  };
  // Calls the user callback; false = release the watcher.
  bool deliver(Watch& w, uint64_t now);
  void release(Watch& w);

  std::shared_ptr<SlotPool> pool_;
  std::mutex mu_;
  std::vector<Watch> incoming_;            // guarded by mu_
  std::atomic<bool> has_incoming_{false};  // lets the sweep skip mu_
  std::vector<Watch> live_;                // the sweeping thread's: its sweep takes no lock
  std::atomic<size_t> armed_{0};
  std::atomic<uint64_t> failures_{0};
};

// The thread behind alloc_uvm_watcher (WatchOn::kWatcherThread): sleeps while
// nothing is armed, spins over the armed words otherwise.
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
  size_t armed() const { return set_.armed(); }
  uint64_t callback_failures() const { return set_.callback_failures(); }
  pid_t thread_id() const { return tid_.load(std::memory_order_acquire); }
  std::thread::id std_thread_id() const { return thread_.get_id(); }
  const SlotPool& pool() const { return set_.pool(); }

 private:
  void run(int cpu);

  WatchSet set_;
  core::StatHistogram* poll_lag_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<pid_t> tid_{0};
  std::thread thread_;
};

// WatchOn::kWorker: the words swept by a worker at the start of each turn, so a
// callback's submissions are posted in that turn with no thread crossing. Keeps
// the worker from sleeping while one is armed (as the watcher thread spins).
class WorkerWatchers final : public core::TurnHook {
 public:
  explicit WorkerWatchers(std::shared_ptr<SlotPool> pool) : set_(std::move(pool)) {}
  uint64_t* alloc(WatcherCallback cb);
  // No callback runs once close() returns (one running now is waited for), nor
  // after; alloc throws kFailedPrecondition. Not from inside a callback.
  void close();
  bool run_wt() override;
  bool keeps_awake() const override { return set_.armed() > 0 || set_.has_incoming(); }

 private:
  WatchSet set_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> running_{false};
};

// Owned by TransferEngine::Impl.
class GpuServices {
 public:
  GpuServices() = default;
  ~GpuServices() { stop(); }
  uint64_t* alloc_watcher(int cpu, WatcherCallback cb);
  // WatchOn::kWorker. `install` runs once, with the hook the worker must run
  // each turn (on first use); the words come from the same pool.
  uint64_t* alloc_worker_watcher(
      WatcherCallback cb, const std::function<void(std::shared_ptr<core::TurnHook>)>& install);
  // Installs a GPU-flag entry for imm in `table` (replacing any prior one);
  // returns the flag's device address.
  uint32_t* imm_counter(core::ImmTable& table, uint32_t imm, uint32_t count);
  void stop();
  // Whether the caller is this engine's watcher thread (its callbacks run there).
  bool on_watcher_thread() const {
    return watcher_thread_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  // Time between two sweeps of the watcher thread over the armed words.
  const core::StatHistogram& poll_lag() const { return poll_lag_; }

  static constexpr uint32_t kWatcherSlots = 4096;  // 256 KiB of pinned memory
  static constexpr uint32_t kFlagSlots = 1024;     // one 64 KiB GPU page with GDRCopy

 private:
  std::mutex mu_;
  bool stopped_ = false;
  std::shared_ptr<SlotPool> watch_pool();  // mu_ held
  std::mutex install_mu_;                  // one worker-watcher installation at a time

  std::shared_ptr<SlotPool> watch_pool_;
  std::unique_ptr<WatcherService> watchers_;
  std::atomic<std::thread::id> watcher_thread_{};  // set once the thread exists
  std::shared_ptr<WorkerWatchers> worker_watchers_;
  std::shared_ptr<SlotPool> flags_;
  core::StatHistogram poll_lag_;
};

}  // namespace ferry::cuda

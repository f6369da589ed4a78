#include "cuda/watcher.h"

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/cpu_relax.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "ferry/status.h"

namespace ferry::cuda {

namespace {

using core::cpu_relax;

// Releases a flag slot when the last ImmTable entry referring to it is gone:
// a worker inside on_arrival, or a worker's arrival cache, holds the entry,
// so the slot is never reused while a store to it may still be coming.
struct FlagLease {
  std::shared_ptr<SlotPool> pool;
  uint32_t slot;
  ~FlagLease() {
    try {
      pool->release(slot);
    } catch (const std::exception& e) {
      core::log().error("GPU flag slot release: {}", e.what());
    }
  }
};

}  // namespace

// ---------------------------------------------------------------- SlotPool

SlotPool::SlotPool(std::shared_ptr<MappedBlock> block)
    : block_(std::move(block)), alloc_(uint32_t(block_->bytes / kSlotBytes)) {}

void SlotPool::release(uint32_t slot) {
  if (slot < alloc_.capacity() && alloc_.taken(slot))
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(host(slot)))
        .store(0, std::memory_order_relaxed);
  alloc_.release(slot);  // throws on a double release, before touching anything else
}

// ---------------------------------------------------------------- WatchSet

WatchSet::WatchSet(std::shared_ptr<SlotPool> pool) : pool_(std::move(pool)) {}

WatchSet::~WatchSet() {
  clear();
}

void WatchSet::clear() {
  for (auto& w : live_) release(w);
  live_.clear();
  std::lock_guard lk(mu_);
  for (auto& w : incoming_) release(w);
  incoming_.clear();
  has_incoming_.store(false, std::memory_order_relaxed);
  armed_.store(0, std::memory_order_release);
}

uint64_t* WatchSet::add(WatcherCallback cb) {
  if (!cb) throw Error(Code::kInvalidArgument, "alloc_uvm_watcher: empty callback");
  uint32_t slot = pool_->acquire();  // zeroed by its previous release (or the allocation)
  auto* word = reinterpret_cast<uint64_t*>(pool_->host(slot));
  {
    std::lock_guard lk(mu_);
    // last = 0 is captured now, so a kernel that writes before the sweep picks
    // the watch up is still seen as a change.
    incoming_.push_back(Watch{slot, word, 0, std::move(cb)});
    has_incoming_.store(true, std::memory_order_release);
  }
  return reinterpret_cast<uint64_t*>(pool_->device(slot));
}

void WatchSet::release(Watch& w) {
  try {
    pool_->release(w.slot);
  } catch (const std::exception& e) {
    core::log().error("UVM watcher release: {}", e.what());
  }
}

bool WatchSet::deliver(Watch& w, uint64_t now) {
  uint64_t old = w.last;
  w.last = now;
  try {
    return w.cb(old, now);
  } catch (const std::exception& e) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    core::log().error("UVM watcher callback threw ({}): watcher released", e.what());
  } catch (...) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    core::log().error("UVM watcher callback threw a non-exception: watcher released");
  }
  return false;
}

bool WatchSet::sweep() {
  if (has_incoming_.load(std::memory_order_acquire)) {
    std::lock_guard lk(mu_);
    for (auto& w : incoming_) live_.push_back(std::move(w));
    incoming_.clear();
    has_incoming_.store(false, std::memory_order_relaxed);
    armed_.store(live_.size(), std::memory_order_release);
  }
  bool ran = false;
  for (size_t i = 0; i < live_.size();) {
    // Acquire pairs with the kernel's release store at system scope: what the
    // kernel wrote before bumping the word is visible to the callback.
    uint64_t now = std::atomic_ref<const uint64_t>(*live_[i].word).load(std::memory_order_acquire);
    if (now == live_[i].last) {
      ++i;
      continue;
    }
    ran = true;
    if (!deliver(live_[i], now)) {
      release(live_[i]);
      live_[i] = std::move(live_.back());
      live_.pop_back();
      armed_.store(live_.size(), std::memory_order_release);
      continue;
    }
    ++i;
  }
  return ran;
}

// ---------------------------------------------------------- WatcherService

WatcherService::WatcherService(std::shared_ptr<SlotPool> pool, int cpu,
                               core::StatHistogram* poll_lag)
    : set_(std::move(pool)), poll_lag_(poll_lag) {
  thread_ = std::thread([this, cpu] { run(cpu); });
}

WatcherService::~WatcherService() {
  stop();
}

uint64_t* WatcherService::alloc(WatcherCallback cb) {
  if (stop_.load(std::memory_order_acquire))
    throw Error(Code::kFailedPrecondition, "alloc_uvm_watcher: the watcher thread is stopped");
  uint64_t* word = set_.add(std::move(cb));
  {
    // Under mu_ so that the thread cannot miss the wakeup between its
    // predicate check and its wait.
    std::lock_guard lk(mu_);
  }
  cv_.notify_one();
  return word;
}

void WatcherService::stop() {
  {
    std::lock_guard lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  set_.clear();  // the callbacks (and what they hold) go now, not with the service
}

void WatcherService::run(int cpu) {
  // Named so that operators (top -H) and benchmarks can find it.
  core::name_current_thread("ferry-watcher");
  tid_.store(pid_t(syscall(SYS_gettid)), std::memory_order_release);
  if (cpu >= 0) core::pin_current_thread(cpu, "watcher");
  int64_t last_sweep = 0;
  for (;;) {
    if (set_.armed() == 0 && !set_.has_incoming()) {
      last_sweep = 0;
      // Nothing to poll: sleep rather than spin.
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_.load() || set_.has_incoming(); });
    }
    if (stop_.load(std::memory_order_acquire)) break;
    set_.sweep();
    if (core::kStatsEnabled && poll_lag_ && set_.armed() > 0) {
      const int64_t t = core::now_ns();
      if (last_sweep != 0) poll_lag_->record(uint64_t(t - last_sweep));
      last_sweep = t;
    }
    cpu_relax();
  }
}

// ---------------------------------------------------------- WorkerWatchers

uint64_t* WorkerWatchers::alloc(WatcherCallback cb) {
  if (closed_.load(std::memory_order_acquire))
    throw Error(Code::kFailedPrecondition, "alloc_uvm_watcher: the engine is stopped");
  return set_.add(std::move(cb));
}

void WorkerWatchers::close() {
  // Pairs with run_wt: either the sweep sees closed_, or close sees running_.
  closed_.store(true, std::memory_order_seq_cst);
  while (running_.load(std::memory_order_seq_cst)) std::this_thread::yield();
  set_.clear();  // no sweep runs any more
}

bool WorkerWatchers::run_wt() {
  running_.store(true, std::memory_order_seq_cst);
  const bool ran = !closed_.load(std::memory_order_seq_cst) && set_.sweep();
  running_.store(false, std::memory_order_release);
  return ran;
}

// ------------------------------------------------------------- GpuServices

std::shared_ptr<SlotPool> GpuServices::watch_pool() {
  if (!watch_pool_) {
    // Testing only: plain host memory, so that the watcher machinery (both
    // sweeps, the engine's paths to them) runs on machines without a GPU.
    // Kernels cannot address it.
    const char* env = std::getenv("FERRY_TESTING_HOST_WATCHERS");
    const bool host = env && *env && *env != '0';
    watch_pool_ =
        std::make_shared<SlotPool>(host ? alloc_host_for_testing(kWatcherSlots * kSlotBytes)
                                        : alloc_mapped_host(kWatcherSlots * kSlotBytes));
  }
  return watch_pool_;
}

uint64_t* GpuServices::alloc_watcher(int cpu, WatcherCallback cb) {
  std::lock_guard lk(mu_);
  if (stopped_) throw Error(Code::kFailedPrecondition, "alloc_uvm_watcher: the engine is stopped");
  if (!watchers_) {
    watchers_ = std::make_unique<WatcherService>(watch_pool(), cpu, &poll_lag_);
    watcher_thread_.store(watchers_->std_thread_id(), std::memory_order_release);
    core::log().debug("watcher thread started ({} slots of {})", kWatcherSlots,
                      watchers_->pool().block().kind);
  }
  return watchers_->alloc(std::move(cb));
}

uint64_t* GpuServices::alloc_worker_watcher(
    WatcherCallback cb, const std::function<void(std::shared_ptr<core::TurnHook>)>& install) {
  auto stopped = [] {
    return Error(Code::kFailedPrecondition, "alloc_uvm_watcher: the engine is stopped");
  };
  std::shared_ptr<WorkerWatchers> ww;
  {
    std::lock_guard lk(mu_);
    if (stopped_) throw stopped();
    ww = worker_watchers_;
  }
  if (!ww) {
    // Installed without mu_: the worker may itself be waiting for mu_ (an
    // inline callback asking for a GPU flag) while install waits for it.
    std::lock_guard il(install_mu_);  // nobody else publishes meanwhile
    bool fresh = false;
    {
      std::lock_guard lk(mu_);
      if (stopped_) throw stopped();
      ww = worker_watchers_;
      if (!ww) {
        ww = std::make_shared<WorkerWatchers>(watch_pool());
        fresh = true;
      }
    }
    if (fresh) {
      install(ww);  // throws when the worker does not take it: nothing kept then
      std::lock_guard lk(mu_);
      if (stopped_) {  // stop() ran meanwhile and did not see this one
        ww->close();
        throw stopped();
      }
      worker_watchers_ = ww;
    }
  }
  return ww->alloc(std::move(cb));
}

uint32_t* GpuServices::imm_counter(core::ImmTable& table, uint32_t imm, uint32_t count) {
  if (count == 0) throw Error(Code::kInvalidArgument, "imm_counter_gpu: count must be positive");
  std::lock_guard lk(mu_);
  if (stopped_) throw Error(Code::kFailedPrecondition, "imm_counter_gpu: the engine is stopped");
  if (!flags_) flags_ = std::make_shared<SlotPool>(alloc_flag_memory(kFlagSlots * kSlotBytes));
  uint32_t slot = flags_->acquire();
  // Built in place: a moved-from temporary lease would release the slot.
  std::shared_ptr<FlagLease> lease(new FlagLease{flags_, slot});
  table.expect_gpu_flag(imm, count, reinterpret_cast<uint32_t*>(flags_->host(slot)),
                        std::move(lease));
  return reinterpret_cast<uint32_t*>(flags_->device(slot));
}

void GpuServices::stop() {
  std::unique_ptr<WatcherService> w;
  std::shared_ptr<WorkerWatchers> ww;
  {
    std::lock_guard lk(mu_);
    stopped_ = true;
    w = std::move(watchers_);
    ww = worker_watchers_;  // the worker keeps its reference until it stops
  }
  // Outside mu_: a callback may call back into the engine.
  if (w) w->stop();
  if (ww) ww->close();
}

}  // namespace ferry::cuda

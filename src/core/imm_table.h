// Per-immediate bookkeeping shared by every worker of an engine. Workers call
// on_arrival() from their CQ polling; it never blocks and never allocates.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "core/arrival_wait.h"
#include "core/progress_help.h"
#include "core/stats.h"
#include "ferry/engine.h"

namespace ferry {

struct ImmCounter::State {
  std::atomic<int64_t> value{0};
  std::atomic<int64_t> last_arrival_ns{0};  // core::now_ns() of the latest add (0: unknown)
  // Waits timing themselves now (one in sample_every per thread): an arrival
  // is timed by its worker only while one is, or when its time is known anyway.
  std::atomic<int32_t> timed_waiters{0};
  uint32_t sample_every = 1;
  // Cancelled when the engine stops or the counter is removed.
  core::ArrivalSignal signal;
  // Where wait() records how long it took (the engine's statistics; shared,
  // since a counter may outlive its engine).
  std::shared_ptr<core::StatHistogram> waits;
  // Set while the engine lets a waiting thread poll its NICs (progress_help.h).
  std::shared_ptr<core::ProgressHelp> help;

  void cancel() { signal.cancel(); }

  // at_ns: the counting worker's clock (its turn), 0 when it has none.
  void add(int64_t n, int64_t at_ns = 0) {
    // Before the count: a waiter that sees the count sees this time too (or a
    // later arrival's), and takes its wait's end from it, not from a clock.
    if constexpr (core::kStatsEnabled) last_arrival_ns.store(at_ns, std::memory_order_relaxed);
    value.fetch_add(n, std::memory_order_seq_cst);
    signal.notify();
  }
};

}  // namespace ferry

namespace ferry::core {

class CallbackThread;

// When an arrival was counted, for the statistics: a time the caller knows
// already, or the counting worker's clock for this turn, read only when a
// statistic asks for it (a precise read costs 20-45 ns on the worker's way
// to the next completion).
struct ArrivalClock {
  ArrivalClock(int64_t known = 0) : known_ns(known) {}  // NOLINT: a time converts
  ArrivalClock(int64_t (*r)(void*), void* c) : read(r), ctx(c) {}
  int64_t known_ns = 0;
  int64_t (*read)(void*) = nullptr;
  void* ctx = nullptr;
  bool known() const { return known_ns != 0; }
  int64_t now() const { return known_ns != 0 ? known_ns : read != nullptr ? read(ctx) : 0; }
};

struct ExpectedCount {
  std::atomic<uint64_t> arrived{0};  // monotonic: fires at each multiple of `every`
  // Firings not yet run: one queued event runs them all, so a flood of
  // immediates costs the callback queue one entry per counter, not per firing.
  std::atomic<uint64_t> pending{0};
  uint32_t every = 1;
  ImmCountCallback cb;
  bool on_worker = false;  // CallbackOn::kWorker: run by the worker that counted
};

// GPU-visible count (TransferEngine::imm_counter_gpu): the worker itself stores
// the generation arrived / every into *flag at each multiple, no callback hop.
struct GpuFlagCount {
  std::atomic<uint64_t> arrived{0};
  uint32_t every = 1;
  uint32_t* flag = nullptr;    // host address of a word kernels poll
  std::shared_ptr<void> keep;  // owns the flag's slot while the entry lives
};

class ImmTable;

// What one worker found in the ImmTable for the immediates it counted last:
// counters and GPU flags, tagged with the table's version at the lookup, so
// that a repeat arrival of the same value takes no lock and no hash lookup.
// Used under its worker's loop lock (by the worker or a thread helping it),
// so never by two threads at once. It holds its entries (a removed counter or
// flag lives until its line is replaced or dropped): callbacks are not
// cached, since their captures must not be released on a worker.
class ImmArrivalCache {
 public:
  ImmArrivalCache();
  ~ImmArrivalCache();
  ImmArrivalCache(const ImmArrivalCache&) = delete;
  ImmArrivalCache& operator=(const ImmArrivalCache&) = delete;
  // Lets go of lines older than the table's current version.
  void drop_stale(const ImmTable& table);

 private:
  friend class ImmTable;
  static constexpr uint32_t kLines = 16;
  struct Line;
  std::unique_ptr<Line[]> lines_;
};

class ImmTable {
 public:
  explicit ImmTable(CallbackThread* callbacks) : callbacks_(callbacks) {}
  // The callback thread needs the table and the table the thread: set after both exist.
  void set_callbacks(CallbackThread* callbacks) { callbacks_ = callbacks; }

  // One immediate is counted one way at a time. A mapping of the same kind
  // replaces the prior one (expect, expect_gpu_flag) or is shared (counter);
  // one of another kind throws Error(kAlreadyExists): remove() it first.
  void expect(uint32_t imm, uint32_t count, ImmCountCallback cb,
              CallbackOn on = CallbackOn::kCallbackThread);
  ImmCounter counter(uint32_t imm);
  void expect_gpu_flag(uint32_t imm, uint32_t count, uint32_t* flag, std::shared_ptr<void> keep);
  // Waiters on a removed counter return kCancelled.
  bool remove(uint32_t imm);
  // May be called from inside a plain callback.
  void add_plain_callback(ImmCallback cb);
  // Engine stop: every counter's waiters return kCancelled, now and later.
  void cancel_all();
  // Plain-callback events dropped because the queue held kMaxPlainEvents.
  uint64_t dropped_plain_events() const { return dropped_plain_.load(); }
  static constexpr uint32_t kMaxPlainEvents = 1u << 16;
  // ImmCounter::wait durations, all counters together.
  const StatHistogram& counter_waits() const { return *waits_; }
  // Counters made from now on let their waiters help the workers progress.
  void set_progress_help(std::shared_ptr<ProgressHelp> help) {
    std::unique_lock lk(mu_);
    help_ = std::move(help);
  }

  // Worker side: `n` immediates with value imm arrived (their data is visible).
  // clock: when, for the statistics (none: read where needed).
  void on_arrival(uint32_t imm, uint32_t n = 1, const ArrivalClock& clock = {});
  // The same, through a worker's cache.
  void on_arrival(ImmArrivalCache& cache, uint32_t imm, uint32_t n, const ArrivalClock& clock);
  // ImmCounter::wait times one wait in `every` per thread (the thread's first
  // included), like the engine's other latencies (EngineConfig::latency_sample_every).
  void set_wait_sample_every(uint32_t every) {
    std::unique_lock lk(mu_);
    wait_sample_every_ = every;
  }

  // Callback-thread side.
  void run_plain_callbacks(uint32_t imm, uint32_t count);
  void run_expected(ExpectedCount& e);

 private:
  void run_inline(ExpectedCount& e, uint64_t fires);
  struct Entry {
    std::shared_ptr<ImmCounter::State> counter;
    std::shared_ptr<ExpectedCount> expected;
    std::shared_ptr<GpuFlagCount> gpu;
  };
  using Map = std::unordered_map<uint32_t, Entry>;
  // on_arrival's work once imm was looked up (it: map_.end() when nobody
  // counts it) under lk, which it releases before any callback runs.
  void dispatch(std::shared_lock<std::shared_mutex>& lk, Map::iterator it, uint32_t imm, uint32_t n,
                const ArrivalClock& clock);
  // Counts n arrivals on a counter or a GPU flag.
  static void count(ImmCounter::State& c, uint32_t n, const ArrivalClock& clock);
  static void count(GpuFlagCount& g, uint32_t n);
  friend class ImmArrivalCache;
  // Under mu_, after every change of map_.
  void changed() { version_.fetch_add(1, std::memory_order_release); }
  CallbackThread* callbacks_;
  std::shared_mutex mu_;
  Map map_;
  // Read by every arrival of a cached value, written only when map_ changes.
  alignas(64) std::atomic<uint64_t> version_{1};
  // Copy on write: callbacks run on a snapshot, outside the lock.
  std::mutex plain_mu_;
  std::shared_ptr<const std::vector<ImmCallback>> plain_;
  std::atomic<uint32_t> plain_queued_{0};
  std::atomic<uint64_t> dropped_plain_{0};
  std::shared_ptr<StatHistogram> waits_ = std::make_shared<StatHistogram>();
  std::shared_ptr<ProgressHelp> help_;
  uint32_t wait_sample_every_ = 1;
};

}  // namespace ferry::core

// One thread per engine that runs user callbacks, so a slow or throwing
// callback never stalls a NIC worker. Workers push events through a lock-free
// queue; an exception escaping a user callback is logged and counted, never
// propagated.
#pragma once

#include <concurrentqueue/blockingconcurrentqueue.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "core/progress_help.h"
#include "core/stats.h"
#include "ferry/types.h"

namespace ferry::core {

struct ExpectedCount;
class ImmTable;

struct TransferDoneEvent {
  OnDone on_done;
  Status status;
};
struct ImmCountEvent {
  std::shared_ptr<ExpectedCount> entry;
};
struct PlainImmEvent {
  uint32_t imm;
  uint32_t count = 1;  // plain callbacks run once per immediate
};
// Runs an arbitrary function (the stop wake-up; rare work off the data path).
struct TaskEvent {
  std::function<void()> fn;
};
// A filled receive buffer: run(ctx, ...) shows the bytes to the user and gives
// the buffer back. A plain function and its arguments, so that a receive costs
// no allocation (a capturing std::function of this size would allocate).
struct RecvEvent {
  void (*run)(void* ctx, uint32_t pool, uint32_t buffer, uint64_t len) = nullptr;
  void* ctx = nullptr;
  uint32_t pool = 0, buffer = 0;
  uint64_t len = 0;
};

using CallbackEvent =
    std::variant<TransferDoneEvent, ImmCountEvent, PlainImmEvent, TaskEvent, RecvEvent>;

class CallbackThread;
// The callback thread this thread is, if it is one.
inline thread_local const CallbackThread* t_callback_thread_of = nullptr;

class CallbackThread {
 public:
  // spin: poll the queue without sleeping while events keep coming (PollMode::
  // kBusy, where every engine thread has a core of its own), blocking after
  // a second without one; otherwise block when idle.
  CallbackThread(ImmTable* imms, int cpu, bool spin = false);
  ~CallbackThread();
  // Who pushed an event (Queued::origin), reported for events stop() finds
  // still queued after the thread left.
  static constexpr uint8_t kFromWorkerThread = 1, kFromHelper = 2, kAfterStop = 4,
                           kFromThisThread = 8;
  // now_ns: the pushing thread's clock if it has read it already (a worker's
  // turn_ns()), for the queue-delay statistic; 0 reads it here. origin: the
  // pusher's kFrom* bits, if it knows them.
  void push(CallbackEvent ev, int64_t now = 0, uint8_t origin = 0) {
    if (stop_.load(std::memory_order_relaxed)) origin |= kAfterStop;
    if (t_callback_thread_of == this) {
      // This thread's own events (found while it polled for a worker, or by
      // a callback it runs) skip the queue: it runs them at its next turn.
      if (own_.size() < kOwnMax) {
        own_.push_back(Queued{std::move(ev), kStatsEnabled ? (now != 0 ? now : now_ns()) : 0,
                              uint8_t(origin | kFromThisThread)});
        return;
      }
      origin |= kFromThisThread;
    }
    if constexpr (kStatsEnabled)
      q_.enqueue(Queued{std::move(ev), now != 0 ? now : now_ns(), origin});
    else
      q_.enqueue(Queued{std::move(ev), 0, origin});
  }
  // For `window` after each event the thread polls for idle workers instead of
  // sleeping (progress_help.h), so an immediate that fires a callback needs no
  // wake-up of this thread. `help` must outlive the thread's run.
  void set_progress_help(ProgressHelp* help, std::chrono::nanoseconds window) {
    help_window_ns_.store(window.count(), std::memory_order_relaxed);
    help_.store(help, std::memory_order_release);
  }
  // Drains what is queued, then joins.
  void stop();
  uint64_t callback_failures() const { return failures_.load(); }
  // Runs a user's callable here or on a worker (inline callbacks): what it
  // throws is counted and logged under `what`, never propagated, so no
  // exception reaches an engine thread's loop.
  template <class F>
  void run_user(const char* what, F&& f) noexcept {
    try {
      std::forward<F>(f)();
    } catch (const std::exception& e) {
      note_failure(what, e.what());
    } catch (...) {
      note_failure(what, "an exception not derived from std::exception");
    }
  }
  std::thread::id thread_id() const { return thread_.get_id(); }
  // Statistics: time from push to dispatch; events waiting now (approximate).
  const StatHistogram& queue_delay() const { return delay_; }
  size_t queue_depth() const { return q_.size_approx(); }

 private:
  void run();
  void dispatch(CallbackEvent& ev);
  // Runs own_ (events this thread pushed itself), also those pushed
  // meanwhile; returns the clock it read first.
  int64_t run_own();
  void note_failure(const char* what, const char* why) noexcept;
  struct Queued {
    CallbackEvent ev;
    int64_t pushed_ns = 0;
    uint8_t origin = 0;
  };

  ImmTable* imms_;
  int cpu_;
  bool spin_;
  moodycamel::BlockingConcurrentQueue<Queued> q_;
  // Events the callback thread pushed itself: only it touches them. Bounded,
  // and reserved up front (no allocation on the way); past kOwnMax they go
  // through q_.
  static constexpr size_t kOwnMax = 256;
  std::vector<Queued> own_;
  StatHistogram delay_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> wake_pushed_{false};  // stop()'s wake-up is queued and counted
  std::atomic<ProgressHelp*> help_{nullptr};
  std::atomic<int64_t> help_window_ns_{0};
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
};

}  // namespace ferry::core

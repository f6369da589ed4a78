#include "core/callback_thread.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <string>

#include "core/arrival_wait.h"
#include "core/cpu_relax.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "core/wake.h"

namespace ferry::core {

namespace {

// A spinning callback thread (PollMode::kBusy) goes back to blocking after this
// long without an event; it checks every this many empty polls.
constexpr int64_t kSpinWindowNs = 1'000'000'000;
constexpr uint32_t kSpinPollsPerClock = 256;

}  // namespace

CallbackThread::CallbackThread(ImmTable* imms, int cpu, bool spin)
    : imms_(imms), cpu_(cpu), spin_(spin) {
  own_.reserve(kOwnMax);
  thread_ = std::thread([this] { run(); });
}

CallbackThread::~CallbackThread() {
  stop();
}

void CallbackThread::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  push(TaskEvent{});  // wake the thread
  // The queue counts an item only once its push has returned (item first,
  // then the semaphore), and a taker paid by one item's count may take
  // another's: the wake-up above, not yet counted, in place of an event
  // counted long before. Until this push has returned the count can thus read
  // 0 with an event queued; the thread may leave only after it.
  wake_pushed_.store(true, std::memory_order_release);
  thread_.join();
  // Whoever pushes has stopped by now (the engine stops its workers first),
  // so what is queued is all there will be; nothing should be left. Should
  // anything be, it runs here rather than never (docs/RELIABILITY.md).
  Queued left;
  size_t real = 0, by_kind[std::variant_size_v<CallbackEvent>] = {}, by_origin[16] = {};
  while (q_.try_dequeue(left)) {
    if (auto* t = std::get_if<TaskEvent>(&left.ev); t && !t->fn) continue;  // a wake-up
    ++real;
    ++by_kind[left.ev.index()];
    ++by_origin[left.origin & 15];
    dispatch(left.ev);
  }
  if (real == 0) return;
  std::string origins;
  for (int o = 0; o < 16; ++o)
    if (by_origin[o] != 0)
      origins += fmt::format(" [{}{}{}{}: {}]", o & kFromWorkerThread ? "worker thread" : "",
                             o & kFromHelper ? "helping a worker" : "",
                             o & kFromThisThread ? ", the callback thread" : "",
                             o & kAfterStop ? ", after stop began" : "", by_origin[o]);
  log().warn(
      "callback thread: {} events were still queued after it stopped; run at stop() (transfer "
      "done {}, counted immediate {}, plain immediate {}, task {}, receive {}; pushed by{})",
      real, by_kind[0], by_kind[1], by_kind[2], by_kind[3], by_kind[4], origins);
}

void CallbackThread::run() {
  name_current_thread("ferry-callback");
  pin_current_thread(cpu_, "callback thread");
  t_callback_thread_of = this;
  Queued batch[32];
  // A spinning thread starts blocked, as if its last event were a spin window
  // ago: an engine whose application takes no callbacks never gives it a
  // core, and the first event (one wake-up) starts the spinning.
  int64_t last_event_ns = now_ns() - kSpinWindowNs;
  // The next empty poll reads the clock: the thread spins (and polls the
  // workers' NICs) only within a spin window, not for the polls before the
  // next read after it starts or wakes from a timed wait. Those polls took a
  // worker's NICs every 50 ms, and woke it from a step aside when they ended.
  uint32_t empty_polls = kSpinPollsPerClock - 1;
  bool helped = false;     // polled for the workers since the last event
  uint32_t fruitless = 0;  // helping polls in a row that found nothing
  for (;;) {
    if (!own_.empty()) last_event_ns = run_own();
    size_t n = q_.try_dequeue_bulk(batch, 32);
    // Once stopping, leave as soon as the queue is drained (stop() pushed an
    // empty event to wake us), not after another idle timeout or help window;
    // its count is exact only once that push has returned (stop()).
    if (n == 0 && wake_pushed_.load(std::memory_order_acquire) && q_.size_approx() == 0 &&
        own_.empty())
      return;
    if (n == 0 && spin_) {
      // A blocked thread is woken through a futex: several microseconds per
      // callback, as much as a whole immediate round trip. But an engine whose
      // application takes no callbacks should not give this thread a core:
      // spin only while events came within the last kSpinWindowNs, reading
      // the clock once per kSpinPollsPerClock empty polls.
      if (++empty_polls % kSpinPollsPerClock != 0 || now_ns() - last_event_ns < kSpinWindowNs) {
        // A busy worker steps aside while this thread polls its NICs
        // (EngineConfig::busy_step_aside): arrivals whose callbacks run here
        // then reach the queue from this thread, with no crossing.
        ProgressHelp* help = help_.load(std::memory_order_acquire);
        helped |= help != nullptr;
        // No pause after a poll of the NICs (core/arrival_wait.h).
        if (help == nullptr)
          cpu_relax();
        else
          help->try_help();
        continue;
      }
    }
    if (n == 0) {
      ProgressHelp* help = help_.load(std::memory_order_acquire);
      // The window's clock is read once per 64 fruitless polls: a read costs
      // about as much as the poll.
      if (help && (fruitless % 64 != 0 ||
                   now_ns() - last_event_ns < help_window_ns_.load(std::memory_order_relaxed))) {
        helped = true;
        if (help->try_help())
          fruitless = 0;
        else if (++fruitless > kSpinPollsBeforeYield)
          ::sched_yield();
        else
          cpu_relax();
        continue;
      }
      if (help && std::exchange(helped, false)) help->leave();
      wake_counters().callback_blocks.fetch_add(1, std::memory_order_relaxed);
      n = q_.wait_dequeue_bulk_timed(batch, 32, std::chrono::milliseconds(50));
      if (n == 0) empty_polls = kSpinPollsPerClock - 1;
    }
    if (n > 0) {
      // One clock read per batch serves the help window and the queue delay.
      const int64_t now = now_ns();
      last_event_ns = now;
      fruitless = 0;
      if constexpr (kStatsEnabled)
        for (size_t i = 0; i < n; ++i)
          if (batch[i].pushed_ns != 0) delay_.record(uint64_t(now - batch[i].pushed_ns));
    }
    for (size_t i = 0; i < n; ++i) dispatch(batch[i].ev);
  }
}

int64_t CallbackThread::run_own() {
  // One clock read serves the help window and the queue delays, as for a batch.
  const int64_t now = now_ns();
  // By index: a callback run here may push more (it polled for a worker).
  for (size_t i = 0; i < own_.size(); ++i) {
    if constexpr (kStatsEnabled)
      if (own_[i].pushed_ns != 0)
        delay_.record(uint64_t(std::max<int64_t>(0, now - own_[i].pushed_ns)));
    CallbackEvent ev = std::move(own_[i].ev);
    dispatch(ev);
  }
  own_.clear();
  return now;
}

void CallbackThread::dispatch(CallbackEvent& ev) {
  run_user("user callback", [&] {
    if (auto* t = std::get_if<TransferDoneEvent>(&ev)) {
      t->on_done.invoke(t->status);
    } else if (auto* c = std::get_if<ImmCountEvent>(&ev)) {
      imms_->run_expected(*c->entry);
    } else if (auto* p = std::get_if<PlainImmEvent>(&ev)) {
      imms_->run_plain_callbacks(p->imm, p->count);
    } else if (auto* k = std::get_if<TaskEvent>(&ev)) {
      if (k->fn) k->fn();
    } else if (auto* r = std::get_if<RecvEvent>(&ev)) {
      r->run(r->ctx, r->pool, r->buffer, r->len);
    }
  });
}

void CallbackThread::note_failure(const char* what, const char* why) noexcept {
  failures_.fetch_add(1);
  try {
    log().error("{} threw: {} (the engine keeps running)", what, why);
  } catch (...) {
    // Logging itself failed (out of memory); the count above still tells.
  }
}

}  // namespace ferry::core

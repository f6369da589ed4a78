// How an idle worker sleeps and is woken. A worker in PollMode::kAdaptive that
// found nothing to do blocks in poll(2) on its submission eventfd and on every
// NIC's completion wait object; a submitter writes the eventfd only when the
// worker said it sleeps, so a spinning worker costs the submitter no syscall.
// The counters say why each block ended, so tests can check that a submission
// or a completion woke the worker rather than its timer.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/thread_count.h"
#include "core/unique_fd.h"
#include "ferry/engine.h"

namespace ferry::core {

// Process-wide totals over every worker (relaxed: read by tests and
// statistics). Those on the idle path are plain atomics; those that busy
// engines add to per transfer are counted per thread (core/thread_count.h).
struct WakeCounters {
  std::atomic<uint64_t> blocks{0};         // poll(2) on the eventfd and every CQ
  std::atomic<uint64_t> by_submission{0};  // ...ended because a submitter wrote the eventfd
  std::atomic<uint64_t> by_completion{0};  // ...ended because a CQ's wait object fired
  std::atomic<uint64_t> by_timer{0};       // ...ended by its timeout (deadlines, housekeeping)
  std::atomic<uint64_t> naps{0};           // a NIC had no wait object: slept a short nap instead
  ThreadCount notifies;                    // eventfd writes by submitters
  ThreadCount inline_posts;                // submitters that posted while the worker idled
  ThreadCount inline_replies;  // callbacks run for a completion whose answer was posted at once
  ThreadCount helped_polls;    // waiters' polls that found work while the worker idled
  std::atomic<uint64_t> callback_blocks{0};  // a callback thread blocked waiting for an event
  ThreadCount reply_windows;                 // a busy worker watched for an answer to arrivals
  ThreadCount reply_hits;                    // ...and a submission came within the window
  ThreadCount asides;                        // a busy worker stepped aside for spinning helpers
  std::atomic<int64_t> asleep{0};            // gauge: workers inside poll(2) or a nap now
};

inline WakeCounters& wake_counters() {
  static WakeCounters c;
  return c;
}

// The submission eventfd of one worker.
class WakeFd {
 public:
  WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  int fd() const { return fd_.get(); }
  void notify() {
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(fd_.get(), &one, sizeof(one));
    wake_counters().notifies.add();
  }
  // Resets the eventfd after a wake-up (non-blocking).
  void drain() {
    uint64_t v;
    [[maybe_unused]] auto r = ::read(fd_.get(), &v, sizeof(v));
  }

 private:
  UniqueFd fd_;
};

// How an adaptive worker polls before it blocks: EngineConfig::spin_before_block
// (-1: 200 µs), yielding the CPU between idle iterations when the process may
// run on fewer than 8 CPUs (EngineConfig::spin_yield). With fewer cores than spinning threads (a
// worker and an application thread per engine, two engines on two cores) a worker that spins
// without yielding takes the core from the very thread it waits for, and every hand-off waits for a
// scheduler tick; one that blocks at once pays a wake-up per hand-off instead.
struct IdleSpin {
  std::chrono::microseconds spin;
  bool yield;
};
IdleSpin resolve_idle_spin(std::chrono::microseconds configured, SpinYield yield);

}  // namespace ferry::core

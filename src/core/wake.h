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

#include "core/unique_fd.h"
#include "ferry/engine.h"

namespace ferry::core {

// A count added to per submission or per poll, possibly by the threads of
// several workers at once (their helpers, their submitters): each thread adds
// on one of kShards lines of its own, so they do not contend for one line;
// load() sums them (relaxed: for tests and statistics). A locked add each:
// per-thread cells written by a plain load and store were tried and put tcp
// `imm-cb` on the 2-core machine into an 80 µs mode in about one run in four
// (docs/PERFORMANCE.md, "Fewer locked instructions"), so the add stays.
class ShardedCount {
 public:
  void add() { shards_[shard()].v.fetch_add(1, std::memory_order_relaxed); }
  uint64_t load() const {
    uint64_t sum = 0;
    for (const auto& s : shards_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr size_t kShards = 16;
  struct alignas(64) Shard {
    std::atomic<uint64_t> v{0};
  };
  static size_t shard() {
    static std::atomic<uint32_t> next{0};
    thread_local const size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kShards;
    return mine;
  }
  std::array<Shard, kShards> shards_{};
};

// Process-wide totals over every worker (relaxed: read by tests and
// statistics). Those on the idle path are plain atomics; those that busy
// engines add to per transfer are sharded.
struct WakeCounters {
  std::atomic<uint64_t> blocks{0};         // poll(2) on the eventfd and every CQ
  std::atomic<uint64_t> by_submission{0};  // ...ended because a submitter wrote the eventfd
  std::atomic<uint64_t> by_completion{0};  // ...ended because a CQ's wait object fired
  std::atomic<uint64_t> by_timer{0};       // ...ended by its timeout (deadlines, housekeeping)
  std::atomic<uint64_t> naps{0};           // a NIC had no wait object: slept a short nap instead
  ShardedCount notifies;                   // eventfd writes by submitters
  ShardedCount inline_posts;               // submitters that posted while the worker idled
  ShardedCount inline_replies;  // callbacks run for a completion whose answer was posted at once
  ShardedCount helped_polls;    // waiters' polls that found work while the worker idled
  std::atomic<uint64_t> callback_blocks{0};  // a callback thread blocked waiting for an event
  ShardedCount reply_windows;                // a busy worker watched for an answer to arrivals
  ShardedCount reply_hits;                   // ...and a submission came within the window
  ShardedCount asides;                       // a busy worker stepped aside for spinning helpers
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

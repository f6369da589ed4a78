// How an adaptive worker sleeps when it has nothing to do: blocked in poll(2)
// on its submission eventfd and every NIC's wait object, or, where a NIC has
// none, in naps that lengthen while nothing comes (wake.h counts each end);
// and how a spinning worker (busy, or adaptive in its spin phase on a host
// with CPUs to spare) steps aside for threads that poll its NICs.
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#include "core/cpu_relax.h"
#include "core/worker.h"

namespace ferry::core {

namespace {

// Naps: each twice the last, from 20 µs up to 320 µs, so an idle engine wakes
// rarely and a busy one soon.
constexpr long kFirstNapNs = 20'000;
constexpr uint32_t kMaxNapDoublings = 4;
// Longest block in poll(2) when no deadline is nearer; wakes come from the
// eventfd and the CQs, the timer only runs deadlines and housekeeping.
constexpr auto kMaxBlock = std::chrono::milliseconds(10);
// A worker that stepped aside first looks whether helpers still poll after
// kAsideNs, then at twice the last interval while they do, up to
// kAsideMaxNs: each look is a wake-up from a sleep (8-9.5 µs of CPU in a VM), so
// looking every 50 µs cost the worker 16-19 % of a core while aside. It
// runs a turn of its own (deadlines) at least every kAsideTurnNs.
constexpr int64_t kAsideNs = 50'000;
constexpr int64_t kAsideMaxNs = 200'000;
constexpr int64_t kAsideTurnNs = 1'000'000;

}  // namespace

void Worker::relock(std::unique_lock<LoopLock>& loop) {
  while (!loop.try_lock()) ::sched_yield();
}

bool Worker::idle_wait(bool may_nap, bool helpers_drive, std::unique_lock<LoopLock>& loop) {
  // Can every NIC block? Asked first: fi_trywait may progress the provider,
  // which can make a completion appear. While helpers drive the NICs the
  // worker naps on its eventfd alone: blocked on the CQs it would be woken by
  // every completion they take, and would take a core from one of them.
  pollfd fds[1 + kMaxNics];
  nfds_t n = 0;
  fds[n++] = {wake_.fd(), POLLIN, 0};
  bool all_blockable = !helpers_drive;
  for (size_t k = 0; all_blockable && k < nics_.size(); ++k) {
    Domain& d = *nics_[k].domain;
    const int fd = d.wait_fd();
    if (fd < 0 || !d.can_block())
      all_blockable = false;
    else
      fds[n++] = {fd, POLLIN, 0};
  }
  if (!all_blockable && !may_nap) return false;
  napped_ = !all_blockable;
  // Release: a waker that sees it asleep sees it no longer aside (wake_up).
  sleeping_.store(true, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // mirror of submit()
  if (has_commands() || stop_.load()) {
    sleeping_.store(false);
    return true;
  }
  auto& wc = wake_counters();
  wc.asleep.fetch_add(1, std::memory_order_relaxed);
  if (all_blockable) {
    // Until the next deadline (rounded up), at most kMaxBlock; 1 ms while a
    // retired registration waits to be closed.
    std::chrono::milliseconds timeout = retired_.empty() ? kMaxBlock : std::chrono::milliseconds(1);
    if (dl_head_ != kNone) {
      auto until =
          std::chrono::ceil<std::chrono::milliseconds>(slots_[dl_head_].deadline - Clock::now());
      timeout = std::clamp(until, std::chrono::milliseconds(1), timeout);
    }
    wc.blocks.fetch_add(1, std::memory_order_relaxed);
    loop.unlock();
    const int ready = ::poll(fds, n, int(timeout.count()));
    relock(loop);
    if (ready <= 0) {
      wc.by_timer.fetch_add(1, std::memory_order_relaxed);
    } else {
      if (fds[0].revents != 0) {
        called_ = true;
        wc.by_submission.fetch_add(1, std::memory_order_relaxed);
      }
      for (nfds_t i = 1; i < n; ++i)
        if (fds[i].revents != 0) {
          wc.by_completion.fetch_add(1, std::memory_order_relaxed);
          break;
        }
    }
  } else {
    wc.naps.fetch_add(1, std::memory_order_relaxed);
    napping_.store(true, std::memory_order_release);
    timespec ts{0, kFirstNapNs << std::min(naps_in_row_, kMaxNapDoublings)};
    ++naps_in_row_;
    // A submission ends the nap early.
    loop.unlock();
    called_ = ::ppoll(fds, 1, &ts, nullptr) > 0;
    relock(loop);
    napping_.store(false, std::memory_order_relaxed);
  }
  wc.asleep.fetch_sub(1, std::memory_order_relaxed);
  wake_.drain();
  sleeping_.store(false, std::memory_order_seq_cst);
  return true;
}

void Worker::step_aside(std::unique_lock<LoopLock>& loop) {
  if (want_aside_.load(std::memory_order_relaxed))
    want_aside_.store(false, std::memory_order_relaxed);
  aside_wake_.store(false, std::memory_order_relaxed);
  // A write meant for an earlier step aside; later ones come after this.
  wake_.drain();
  // Before sleeping_: a waker that sees that sees this too (wake_up).
  aside_active_.store(true, std::memory_order_seq_cst);
  napped_ = true;
  // Submitters that found the worker not aside left their commands in the
  // ring: post them first (helpers are spinning, so the next ones will come
  // soon; a stream of them keeps the worker at work).
  for (int tries = 0;; ++tries) {
    sleeping_.store(true, std::memory_order_relaxed);
    napping_.store(true, std::memory_order_relaxed);
    // Submitters that see napping_ post for themselves; what came before is
    // posted here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!has_commands() && !stop_.load()) break;
    napping_.store(false, std::memory_order_relaxed);
    sleeping_.store(false, std::memory_order_seq_cst);
    if (tries == 3 || stop_.load()) {
      aside_active_.store(false, std::memory_order_relaxed);
      return;
    }
    post_queued();
  }
  wake_counters().asides.add();
  loop.unlock();
  // Not spinning: the helpers do the work meanwhile, and a core spinning
  // beside theirs slows them (docs/PERFORMANCE.md, "A worker aside sleeps").
  // It sleeps on its eventfd until the next look, a wake (wake_up writes the
  // eventfd while aside_active_ is set) or its turn. While helpers keep
  // polling it stays aside, up to kAsideTurnNs (deadlines are scanned every
  // millisecond), looking after kAsideNs, then less often.
  const int64_t start = now_ns();
  int64_t look = kAsideNs;
  int64_t until = start + look;
  uint32_t seen = helped_.load(std::memory_order_relaxed);
  pollfd fd{wake_.fd(), POLLIN, 0};
  for (;;) {
    if (aside_wake_.load(std::memory_order_acquire)) {
      called_ = true;
      break;
    }
    if (stop_.load(std::memory_order_relaxed)) break;
    const int64_t t = now_ns();
    if (t >= until) {
      const uint32_t h = helped_.load(std::memory_order_relaxed);
      if (h == seen || t - start >= kAsideTurnNs) break;
      seen = h;
      look = std::min(2 * look, kAsideMaxNs);
      until = t + look;
    }
    timespec ts{0, long(until - t)};
    if (::ppoll(&fd, 1, &ts, nullptr) > 0) wake_.drain();
  }
  // A helper holds the lock for a few hundred nanoseconds: spin for it, but
  // not on the lock's line, which the helper writes.
  while (!loop.try_lock())
    for (int k = 0; k < 32; ++k) cpu_relax();
  napping_.store(false, std::memory_order_relaxed);
  sleeping_.store(false, std::memory_order_seq_cst);
  // After sleeping_: a waker that still saw the worker asleep saw it aside,
  // and may have written its eventfd; it is back at work, and the write is
  // drained when it next steps aside or blocks.
  aside_active_.store(false, std::memory_order_seq_cst);
}

}  // namespace ferry::core

// How an adaptive worker sleeps when it has nothing to do: blocked in poll(2)
// on its submission eventfd and every NIC's wait object, or, where a NIC has
// none, in naps that lengthen while nothing comes (wake.h counts each end).
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

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

}  // namespace

void Worker::relock(std::unique_lock<std::mutex>& loop) {
  while (!loop.try_lock()) ::sched_yield();
}

bool Worker::idle_wait(bool may_nap, std::unique_lock<std::mutex>& loop) {
  // Can every NIC block? Asked first: fi_trywait may progress the provider,
  // which can make a completion appear.
  pollfd fds[1 + kMaxNics];
  nfds_t n = 0;
  fds[n++] = {wake_.fd(), POLLIN, 0};
  bool all_blockable = true;
  for (auto& nic : nics_) {
    int fd = nic.domain->wait_fd();
    if (fd < 0 || !nic.domain->can_block()) {
      all_blockable = false;
      break;
    }
    fds[n++] = {fd, POLLIN, 0};
  }
  if (!all_blockable && !may_nap) return false;
  napped_ = !all_blockable;
  sleeping_.store(true, std::memory_order_relaxed);
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
    napping_.store(true, std::memory_order_relaxed);
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

}  // namespace ferry::core

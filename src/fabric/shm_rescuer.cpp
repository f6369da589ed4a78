// The shm lock rescuer: a thread, idle on the watched peers' pidfds until one
// exits, that releases a region lock a dead process left taken (see ShmPeer).
#include <poll.h>
#include <sys/eventfd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu_relax.h"
#include "core/log.h"
#include "core/stats.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

void FabricDomain::start_rescuer() {
  if (rescuer_.joinable()) return;
  rescuer_wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  watch_polls_.store(true, std::memory_order_release);
  rescuer_ = std::thread([this] { rescuer_main(); });
}

void FabricDomain::stop_rescuer() {
  {
    std::lock_guard lk(rescuer_mu_);
    rescuer_stop_ = true;
  }
  if (rescuer_wake_fd_.valid()) ::eventfd_write(rescuer_wake_fd_.get(), 1);
  if (rescuer_.joinable()) rescuer_.join();
}

namespace {

// A provider call that has been spinning for this long on the region lock of
// a peer whose process is gone will never return by itself; a sender holds
// our lock for the microseconds of queueing one command.
constexpr auto kRescueAfter = std::chrono::milliseconds(200);
// Once a peer process has exited: how often the rescuer looks at the calls
// in progress, and at our own lock while it may be the dead peer's.
constexpr int kRescuePeriodMs = 50;
constexpr int kOwnLockPeriodMs = 1;
// Our lock counts as held at a look only if it stays taken this long, and is
// released only after this many such looks (besides kRescueAfter).
constexpr int64_t kOwnLockLookNs = 20000;
constexpr uint32_t kOwnLockLooks = 100;

}  // namespace

// Idle (blocked on the peers' pidfds) until a watched peer process exits:
// every rescue below is for a lock a dead process left taken. Afterwards it
// looks at the provider calls in progress every kRescuePeriodMs, and at our
// own lock every kOwnLockPeriodMs until it is seen free or released. A dead
// process cannot take a lock again: once our own lock and the lock of every
// peer that exited have been seen free, no rescue is left to make and it is
// idle again until the next exit.
void FabricDomain::rescuer_main() {
  std::unique_lock lk(rescuer_mu_);
  std::vector<pollfd> fds;
  std::vector<ShmPeer*> watched;
  bool looking = false;
  while (!rescuer_stop_) {
    fds.assign(1, pollfd{rescuer_wake_fd_.get(), POLLIN, 0});
    watched.clear();
    for (ShmPeer* p : rescue_peers_) {
      if (p->exit_seen) continue;
      fds.push_back(pollfd{p->watch->fd(), POLLIN, 0});
      watched.push_back(p);
    }
    int timeout = own_lock_watch_ ? kOwnLockPeriodMs : looking ? kRescuePeriodMs : -1;
    if (!rescuer_wake_fd_.valid() && (timeout < 0 || timeout > kRescuePeriodMs))
      timeout = kRescuePeriodMs;  // no eventfd: look for new peers and stop now and then
    lk.unlock();
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    lk.lock();
    if (rescuer_stop_) break;
    if (ready == 0) rescuer_timed_wakes_.fetch_add(1, std::memory_order_relaxed);
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      eventfd_t v;
      ::eventfd_read(rescuer_wake_fd_.get(), &v);
    }
    for (size_t i = 0; ready > 0 && i < watched.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      watched[i]->exit_seen = true;
      rescuer_exits_seen_.fetch_add(1, std::memory_order_relaxed);
      looking = true;
      // It may have died inside its post to us, holding our lock.
      if (own_lock_ != nullptr && !own_lock_watch_) {
        own_lock_watch_ = true;
        own_lock_held_since_ = 0;
        own_lock_held_looks_ = 0;
      }
    }
    if (!looking) continue;
    const int64_t now = core::now_ns();
    if (const int64_t polling = polling_call_.load(std::memory_order_acquire); polling != 0)
      rescue_poll(polling, now);
    if (own_lock_watch_) watch_own_lock(now);
    rescue_post(now);
    looking = own_lock_watch_ || dead_peer_lock_taken();
    if (!looking) rescuer_rests_.fetch_add(1, std::memory_order_relaxed);
  }
}

void FabricDomain::rescue_post(int64_t now) {
  const int64_t since = posting_since_ns_.load(std::memory_order_acquire);
  ShmPeer* p = posting_peer_.load(std::memory_order_acquire);
  if (since == 0 || p == nullptr || p->lock == nullptr || !p->watch) return;
  if (now - since < std::chrono::nanoseconds(kRescueAfter).count()) return;
  if (!p->watch->exited()) return;  // a live holder lets go by itself
  // Only while the same call still spins: whoever took the lock since then
  // changed the word, and the exchange fails.
  if (release_lock(p->lock, posting_since_ns_, since)) {
    core::log().warn(
        "fabric NIC '{}': a provider call spun {} ms on the region lock of peer {} (pid {}), "
        "whose process exited holding it; released the lock",
        res_->nic_name, (now - since) / 1000000, p->name, p->pid);
  }
}

bool FabricDomain::dead_peer_lock_taken() const {
  const int unlocked = spin_unlocked_value();
  for (const ShmPeer* p : rescue_peers_)
    if (p->exit_seen && __atomic_load_n(p->lock, __ATOMIC_ACQUIRE) != unlocked) return true;
  return false;
}

ShmRescuerCounts FabricDomain::rescuer_counts() const {
  ShmRescuerCounts c;
  c.exits_seen = rescuer_exits_seen_.load(std::memory_order_relaxed);
  c.timed_wakes = rescuer_timed_wakes_.load(std::memory_order_relaxed);
  c.rests = rescuer_rests_.load(std::memory_order_relaxed);
  return c;
}

ShmRescuerCounts shm_rescuer_counts(const core::Domain& domain) {
  const auto* d = dynamic_cast<const FabricDomain*>(&domain);
  return d != nullptr ? d->rescuer_counts() : ShmRescuerCounts{};
}

bool FabricDomain::release_lock(int* lock, const std::atomic<int64_t>& call, int64_t expected) {
  const int unlocked = spin_unlocked_value();
  int held = __atomic_load_n(lock, __ATOMIC_ACQUIRE);
  if (held == unlocked || call.load(std::memory_order_acquire) != expected) return false;
  return __atomic_compare_exchange_n(lock, &held, unlocked, false, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED);
}

// Called with rescuer_mu_ held. A sender takes the receiver's region lock
// only to queue a command (microseconds), so our lock held for kRescueAfter
// while our own progress spins on it, with a peer process gone meanwhile, is
// that peer's. The call is timed from the first look that saw it (a poll that
// returns is gone by the next look, kRescuePeriodMs later). The exchange only
// succeeds on the value seen, and only while the same poll still spins.
void FabricDomain::rescue_poll(int64_t call, int64_t now) {
  if (call != poll_seen_) {
    poll_seen_ = call;
    poll_seen_at_ns_ = now;
    return;
  }
  const int64_t since = poll_seen_at_ns_;
  if (now - since < std::chrono::nanoseconds(kRescueAfter).count()) return;
  const ShmPeer* gone = nullptr;
  for (const ShmPeer* p : rescue_peers_)
    if (p->watch && p->watch->exited()) {
      gone = p;
      break;
    }
  if (gone == nullptr) return;  // every holder is alive and lets go by itself
  auto release = [&](int* lock, const char* whose) {
    if (release_lock(lock, polling_call_, call))
      core::log().warn(
          "fabric NIC '{}': progress spun {} ms or more on {} while peer {} (pid {}) has exited; "
          "released the lock it left taken",
          res_->nic_name, (now - since) / 1000000, whose, gone->name, gone->pid);
  };
  // The region of a dead peer is used by nobody else; ours only by senders.
  for (const ShmPeer* p : rescue_peers_)
    if (p->lock != nullptr && p->watch && p->watch->exited())
      release(p->lock, "a dead peer's lock");
  if (own_lock_ != nullptr) release(own_lock_, "our own region lock");
}

// Called with rescuer_mu_ held, while own_lock_watch_. A peer that died
// inside its post to us, before it queued anything, leaves our lock taken
// while our own progress never needs it (nothing is queued to us): no call of
// ours spins, yet every sender backs off from the lock for good. A dead
// process cannot take the lock again, so once it is seen free the watch ends;
// taken at every look for kRescueAfter (each look lasting kOwnLockLookNs,
// while a live sender holds it for microseconds) with no fi_cq_read of ours
// in progress (which may hold it itself), it is the dead peer's.
void FabricDomain::watch_own_lock(int64_t now) {
  const int unlocked = spin_unlocked_value();
  const int64_t polling = polling_call_.load(std::memory_order_acquire);
  for (int64_t t = now;; t = core::now_ns()) {
    if (__atomic_load_n(own_lock_, __ATOMIC_ACQUIRE) == unlocked) {
      own_lock_watch_ = false;
      return;
    }
    if (t - now >= kOwnLockLookNs) break;
    core::cpu_relax();
  }
  // Our own progress may be the holder: this look tells nothing.
  if (polling != 0 || polling_call_.load(std::memory_order_acquire) != 0) return;
  if (own_lock_held_since_ == 0) own_lock_held_since_ = now;
  if (++own_lock_held_looks_ < kOwnLockLooks ||
      now - own_lock_held_since_ < std::chrono::nanoseconds(kRescueAfter).count())
    return;
  if (release_lock(own_lock_, polling_call_, 0)) {
    own_lock_watch_ = false;
    core::log().warn(
        "fabric NIC '{}': our own region lock stayed taken for {} ms after a peer process "
        "exited, with no call of ours holding it; released the lock it left taken",
        res_->nic_name, (now - own_lock_held_since_) / 1000000);
  }
}

}  // namespace ferry::fabric

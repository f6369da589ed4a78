// shm peers: a peer process's liveness (pidfd), its region's lock word (a
// sender that dies holding it would stall every other sender), and the rescuer
// thread that releases locks held past their time. The same for tcp peers is
// socket_peers.cpp.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include "core/cpu_relax.h"
#include "core/log.h"
#include "core/stats.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

ProcessWatch::ProcessWatch(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) pidfd_ = int(fd);
#else
  (void)pid;
#endif
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool ProcessWatch::exited() const noexcept {
  if (pidfd_ < 0) return false;
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

ShmPeer::~ShmPeer() {
  if (map != nullptr) ::munmap(map, map_len);
}

int spin_unlocked_value() noexcept {
  static_assert(sizeof(pthread_spinlock_t) == sizeof(int));
  static const int value = [] {
    pthread_spinlock_t l;
    pthread_spin_init(&l, PTHREAD_PROCESS_SHARED);
    int v = 0;
    std::memcpy(&v, const_cast<const void*>(static_cast<volatile void*>(&l)), sizeof(v));
    pthread_spin_destroy(&l);
    return v;
  }();
  return value;
}

pid_t shm_name_pid(std::string_view name) noexcept {
  static constexpr std::string_view kScheme = "fi_shm://";
  if (name.starts_with(kScheme)) name.remove_prefix(kScheme.size());
  long pid = 0;
  size_t i = 0;
  for (; i < name.size() && i < 10 && name[i] >= '0' && name[i] <= '9'; ++i)
    pid = pid * 10 + (name[i] - '0');
  if (i == 0 || i >= name.size() || name[i] != ':' || pid <= 0 || pid > INT32_MAX) return 0;
  return pid_t(pid);
}

namespace {

std::string shm_path(std::string_view name) {
  static constexpr std::string_view kScheme = "fi_shm://";
  if (name.starts_with(kScheme)) name.remove_prefix(kScheme.size());
  return "/dev/shm/" + std::string(name);
}

// The head of a region file, mapped shared (read-write: the rescuer may
// release its lock). Null on failure; *size gets the file's size.
void* map_region_head(const std::string& path, size_t* map_len, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  const size_t len = size_t(::sysconf(_SC_PAGESIZE));
  if (::fstat(fd, &st) == 0 && uint64_t(st.st_size) >= len)
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  *map_len = len;
  *size = uint64_t(st.st_size);
  return p;
}

template <typename T>
T read_at(const void* base, size_t off) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + off, sizeof(v));
  return v;
}

// Whether /proc/<pid>/maps shows `path` mapped (at `start`, when given).
bool maps_region(pid_t pid, const std::string& path, const uintptr_t* start = nullptr) {
  std::ifstream maps(pid == ::getpid() ? std::string("/proc/self/maps")
                                       : fmt::format("/proc/{}/maps", pid));
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos || std::string_view(line).substr(slash) != path) continue;
    if (start == nullptr || uintptr_t(std::strtoull(line.c_str(), nullptr, 16)) == *start)
      return true;
  }
  return false;
}

}  // namespace

void* map_own_shm_region(std::string_view name, uint8_t* version, size_t* len) {
  using namespace shm_layout;
  const std::string path = shm_path(name);
  std::string why;
  void* region = nullptr;
  uint64_t size = 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size < 4096) {
    why = fmt::format("cannot open {}: {}", path, std::strerror(errno));
  } else {
    size = uint64_t(st.st_size);
    region = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED) {
      region = nullptr;
      why = fmt::format("cannot map {}: {}", path, std::strerror(errno));
    }
  }
  if (fd >= 0) ::close(fd);
  const uintptr_t base = region != nullptr ? read_at<uintptr_t>(region, kBaseAddr) : 0;
  if (region == nullptr) {
  } else if (read_at<int>(region, kPid) != ::getpid()) {
    why = fmt::format("pid field {} is not ours ({})", read_at<int>(region, kPid), ::getpid());
  } else if (read_at<uint64_t>(region, kTotalSize) != size) {
    why = fmt::format("size field {} is not the file's size {}",
                      read_at<uint64_t>(region, kTotalSize), size);
  } else if (read_at<int>(region, kLock) != spin_unlocked_value()) {
    why = fmt::format("lock field {} is not an unlocked spinlock", read_at<int>(region, kLock));
  } else if (base == reinterpret_cast<uintptr_t>(region) || !maps_region(::getpid(), path, &base)) {
    why = fmt::format("base address field {:#x} is not where the provider mapped the region", base);
  } else {
    // A fresh endpoint's response queue: empty, a power-of-two ring inside
    // the region.
    const uint64_t q = read_at<uint64_t>(region, kRespQueue);
    const uint64_t n = q + kQueueEntries <= size ? read_at<uint64_t>(region, q + kQueueSize) : 0;
    if (n == 0 || (n & (n - 1)) != 0 || q + kQueueEntries + n * kRespEntry > size ||
        read_at<uint64_t>(region, q + kQueueMask) != n - 1 ||
        read_at<uint64_t>(region, q + kQueueRead) != read_at<uint64_t>(region, q + kQueueWrite))
      why = fmt::format("no empty response queue at offset {}", q);
  }
  if (region != nullptr) *version = read_at<uint8_t>(region, kVersion);
  if (!why.empty()) {
    if (region != nullptr) ::munmap(region, size);
    core::log().info(
        "ferry fabric: shm region {} does not have the layout of libfabric 1.17 ({}): a peer "
        "dying while it holds its region lock can stall this NIC, and its unanswered writes "
        "stall the NIC's later completions",
        path, why);
    return nullptr;
  }
  *len = size;
  return region;
}

void FabricDomain::track_shm_peer(fi_addr_t addr, std::string_view name) {
  auto p = std::make_unique<ShmPeer>();
  p->name = std::string(name);
  p->pid = shm_name_pid(name);
  if (p->pid != 0 && p->pid != ::getpid()) {
    const std::string path = shm_path(name);
    // The pid names the peer only in our pid namespace if that process maps
    // the region; otherwise its liveness is unknown rather than wrong.
    auto watch = std::make_unique<ProcessWatch>(p->pid);
    if (watch->valid() && maps_region(p->pid, path)) p->watch = std::move(watch);
    if (shm_layout_ok_) {
      uint64_t size = 0;
      p->map = map_region_head(path, &p->map_len, &size);
      using namespace shm_layout;
      if (p->map != nullptr && read_at<uint8_t>(p->map, kVersion) == shm_version_ &&
          read_at<int>(p->map, kPid) == p->pid && read_at<uint64_t>(p->map, kTotalSize) == size) {
        p->lock = reinterpret_cast<int*>(static_cast<uint8_t*>(p->map) + kLock);
      }
    }
    if (p->lock != nullptr && p->watch) {
      {
        std::lock_guard lk(rescuer_mu_);
        rescue_peers_.push_back(p.get());
      }
      start_rescuer();
      if (rescuer_wake_fd_ >= 0) ::eventfd_write(rescuer_wake_fd_, 1);  // watch it too
    }
  }
  core::log().debug("fabric NIC '{}': shm peer {} (pid {}): liveness {}, region lock {}",
                    res_->nic_name, p->name, p->pid, p->watch ? "watched" : "unknown",
                    p->lock != nullptr ? "watched" : "not watched");
  // The rescuer may still read a peer it saw in a provider call: replaced
  // entries are kept until the Domain closes.
  if (auto old = shm_peers_.find(addr); old != shm_peers_.end())
    removed_shm_peers_.push_back(std::move(old->second));
  shm_peers_[addr] = std::move(p);
  last_shm_addr_ = FI_ADDR_NOTAVAIL;
  last_shm_peer_ = nullptr;
}

void FabricDomain::unstick_responses(Clock::time_point now) {
  using namespace shm_layout;
  // A region lock left taken by a dead receiver (seen taken 10 ms apart)
  // keeps the provider from finishing even an answered response to it.
  const int unlocked = spin_unlocked_value();
  for (auto& [addr, p] : shm_peers_) {
    if (!p->dead || p->lock == nullptr) continue;
    int held = __atomic_load_n(p->lock, __ATOMIC_ACQUIRE);
    if (held == unlocked) {
      p->lock_held_since = {};
    } else if (p->lock_held_since == Clock::time_point{}) {
      p->lock_held_since = now;
    } else if (now - p->lock_held_since >= std::chrono::milliseconds(10) &&
               __atomic_compare_exchange_n(p->lock, &held, unlocked, false, __ATOMIC_RELEASE,
                                           __ATOMIC_RELAXED)) {
      p->lock_held_since = {};
      core::log().info(
          "fabric NIC '{}': released the region lock peer {} (pid {}) held when it died",
          res_->nic_name, p->name, p->pid);
    }
  }
  auto* region = static_cast<uint8_t*>(own_region_);
  const uint64_t q = read_at<uint64_t>(region, kRespQueue);
  const uint64_t mask = read_at<uint64_t>(region, q + kQueueMask);
  const uint64_t read =
      __atomic_load_n(reinterpret_cast<uint64_t*>(region + q + kQueueRead), __ATOMIC_ACQUIRE);
  const uint64_t write =
      __atomic_load_n(reinterpret_cast<uint64_t*>(region + q + kQueueWrite), __ATOMIC_ACQUIRE);
  size_t answered = 0;
  for (uint64_t i = read; i != write && i - read <= mask; ++i) {
    uint8_t* entry = region + q + kQueueEntries + (i & mask) * kRespEntry;
    auto* status = reinterpret_cast<uint64_t*>(entry + kRespStatus);
    if (__atomic_load_n(status, __ATOMIC_ACQUIRE) != uint64_t(FI_EBUSY)) continue;
    const auto* pending = reinterpret_cast<const uint8_t*>(read_at<uintptr_t>(entry, 0));
    if (pending == nullptr || read_at<uint16_t>(pending, kPendingProto) != kProtoIov) continue;
    OpEntry* op = pool_->from_context(read_at<void*>(pending, kPendingContext));
    if (op == nullptr || op->kind != OpKind::kOrphan) continue;
    // What a receiver writes when its copy failed: the negative error.
    __atomic_store_n(status, uint64_t(-int64_t(FI_ECANCELED)), __ATOMIC_RELEASE);
    ++answered;
  }
  if (answered > 0) {
    // Our progress reads the queue only when signalled, as a peer does
    // after it answers (smr_signal).
    __atomic_exchange_n(reinterpret_cast<int*>(region + kSignal), 1, __ATOMIC_ACQ_REL);
    core::log().debug("fabric NIC '{}': answered {} response(s) a dead peer never will",
                      res_->nic_name, answered);
  }
}

Status FabricDomain::dead_peer_status(const ShmPeer& p, const char* what) const {
  return Status(Code::kUnavailable,
                fmt::format("fabric NIC '{}': {} peer {} (pid {}): its process has exited",
                            res_->nic_name, what, p.name, p.pid));
}

void FabricDomain::start_rescuer() {
  if (rescuer_.joinable()) return;
  rescuer_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  watch_polls_.store(true, std::memory_order_release);
  rescuer_ = std::thread([this] { rescuer_main(); });
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
// own lock every kOwnLockPeriodMs until it is seen free or released.
void FabricDomain::rescuer_main() {
  std::unique_lock lk(rescuer_mu_);
  std::vector<pollfd> fds;
  std::vector<ShmPeer*> watched;
  bool any_exited = false;
  while (!rescuer_stop_) {
    fds.assign(1, pollfd{rescuer_wake_fd_, POLLIN, 0});
    watched.clear();
    for (ShmPeer* p : rescue_peers_) {
      if (p->exit_seen) continue;
      fds.push_back(pollfd{p->watch->fd(), POLLIN, 0});
      watched.push_back(p);
    }
    int timeout = own_lock_watch_ ? kOwnLockPeriodMs : any_exited ? kRescuePeriodMs : -1;
    if (rescuer_wake_fd_ < 0 && (timeout < 0 || timeout > kRescuePeriodMs))
      timeout = kRescuePeriodMs;  // no eventfd: look for new peers and stop now and then
    lk.unlock();
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    lk.lock();
    if (rescuer_stop_) break;
    if (ready > 0 && (fds[0].revents & POLLIN) != 0) {
      eventfd_t v;
      ::eventfd_read(rescuer_wake_fd_, &v);
    }
    for (size_t i = 0; ready > 0 && i < watched.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      watched[i]->exit_seen = true;
      any_exited = true;
      // It may have died inside its post to us, holding our lock.
      if (own_lock_ != nullptr && !own_lock_watch_) {
        own_lock_watch_ = true;
        own_lock_held_since_ = 0;
        own_lock_held_looks_ = 0;
      }
    }
    if (!any_exited) continue;
    const int64_t now = core::now_ns();
    if (const int64_t polling = polling_since_ns_.load(std::memory_order_acquire); polling != 0)
      rescue_poll(polling, now);
    if (own_lock_watch_) watch_own_lock(now);
    const int64_t since = posting_since_ns_.load(std::memory_order_acquire);
    ShmPeer* p = posting_peer_.load(std::memory_order_acquire);
    if (since == 0 || p == nullptr || p->lock == nullptr || !p->watch) continue;
    if (now - since < std::chrono::nanoseconds(kRescueAfter).count()) continue;
    if (!p->watch->exited()) continue;  // a live holder lets go by itself
    // Only while the same call still spins: whoever took the lock since then
    // changed the word, and the exchange fails.
    if (release_lock(p->lock, posting_since_ns_, since)) {
      core::log().warn(
          "fabric NIC '{}': a provider call spun {} ms on the region lock of peer {} (pid {}), "
          "whose process exited holding it; released the lock",
          res_->nic_name, (now - since) / 1000000, p->name, p->pid);
    }
  }
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
// that peer's. The exchange only succeeds on the value seen, and only while
// the same poll still spins.
void FabricDomain::rescue_poll(int64_t since, int64_t now) {
  if (now - since < std::chrono::nanoseconds(kRescueAfter).count()) return;
  const ShmPeer* gone = nullptr;
  for (const ShmPeer* p : rescue_peers_)
    if (p->watch && p->watch->exited()) {
      gone = p;
      break;
    }
  if (gone == nullptr) return;  // every holder is alive and lets go by itself
  auto release = [&](int* lock, const char* whose) {
    if (release_lock(lock, polling_since_ns_, since))
      core::log().warn(
          "fabric NIC '{}': progress spun {} ms on {} while peer {} (pid {}) has exited; "
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
  const int64_t polling = polling_since_ns_.load(std::memory_order_acquire);
  for (int64_t t = now;; t = core::now_ns()) {
    if (__atomic_load_n(own_lock_, __ATOMIC_ACQUIRE) == unlocked) {
      own_lock_watch_ = false;
      return;
    }
    if (t - now >= kOwnLockLookNs) break;
    core::cpu_relax();
  }
  // Our own progress may be the holder: this look tells nothing.
  if (polling != 0 || polling_since_ns_.load(std::memory_order_acquire) != 0) return;
  if (own_lock_held_since_ == 0) own_lock_held_since_ = now;
  if (++own_lock_held_looks_ < kOwnLockLooks ||
      now - own_lock_held_since_ < std::chrono::nanoseconds(kRescueAfter).count())
    return;
  if (release_lock(own_lock_, polling_since_ns_, 0)) {
    own_lock_watch_ = false;
    core::log().warn(
        "fabric NIC '{}': our own region lock stayed taken for {} ms after a peer process "
        "exited, with no call of ours holding it; released the lock it left taken",
        res_->nic_name, (now - own_lock_held_since_) / 1000000);
  }
}

}  // namespace ferry::fabric

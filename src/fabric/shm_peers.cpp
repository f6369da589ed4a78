// shm peers: a peer process's liveness (pidfd), its region's lock word (a
// sender that dies holding it would stall every other sender), and the
// responses a dead peer never gives. The rescuer thread that releases locks
// held past their time is shm_rescuer.cpp; the same for tcp peers is
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
#include "core/log.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

ProcessWatch::ProcessWatch(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) pidfd_.reset(int(fd));
#else
  (void)pid;
#endif
}

bool ProcessWatch::exited() const noexcept {
  if (!pidfd_.valid()) return false;
  pollfd p{pidfd_.get(), POLLIN, 0};
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
  const core::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  const size_t len = size_t(::sysconf(_SC_PAGESIZE));
  if (::fstat(fd.get(), &st) == 0 && uint64_t(st.st_size) >= len)
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
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
  const core::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || st.st_size < 4096) {
    why = fmt::format("cannot open {}: {}", path, std::strerror(errno));
  } else {
    size = uint64_t(st.st_size);
    region = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (region == MAP_FAILED) {
      region = nullptr;
      why = fmt::format("cannot map {}: {}", path, std::strerror(errno));
    }
  }
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
      if (rescuer_wake_fd_.valid()) ::eventfd_write(rescuer_wake_fd_.get(), 1);  // watch it too
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

}  // namespace ferry::fabric

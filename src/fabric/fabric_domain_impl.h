// Private: the libfabric Domain implementation shared by the .cpp files of
// this folder: fabric_domain.cpp (open, teardown), fabric_registration.cpp,
// fabric_peers.cpp, shm_peers.cpp, shm_rescuer.cpp, socket_peers.cpp and
// fabric_datapath.cpp (post / poll).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_rma.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/domain.h"
#include "core/unique_fd.h"
#include "fabric/connect_probe.h"
#include "fabric/fabric_domain.h"
#include "fabric/fabric_handles.h"

namespace ferry::fabric {

inline constexpr uint32_t kFabricApiVersion = FI_VERSION(1, 17);
// Receives kept posted for remote CQ data when the provider has FI_RX_CQ_DATA.
inline constexpr size_t kInternalRecvs = 64;

// Hints shared by discovery and open, so list_fabric_nics() offers exactly the
// domains open_fabric_domain() accepts. nullptr only on allocation failure.
InfoPtr make_hints(const std::string& provider, bool hmem, const std::string& domain_name);
// Exact provider match (no layered fallback) plus the features we rely on.
bool info_usable(const fi_info* info, const std::string& provider) noexcept;
// Names of the domains the provider offers that info_usable() accepts, in
// fi_getinfo order, each once; *ret gets fi_getinfo's result.
std::vector<std::string> usable_domain_names(const std::string& provider, bool hmem, int* ret);
std::string mr_mode_string(uint64_t mr_mode);
// "fabric NIC '<nic>': <call> failed: <fi_strerror> (<ret>)".
Status fi_failure(Code code, const std::string& nic, const char* call, int ret);
inline void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}
// kInvalidArgument when ptr is not memory of `device` (host vs GPU, or another
// GPU); kUnimplemented for GPU memory in a build without CUDA.
Status check_memory_kind(const void* ptr, Device device);

// kOrphan: a write or send to a peer found dead, already failed towards the
// caller; the provider may still hold its context, so it is released only if
// the provider ever completes it.
enum class OpKind : uint8_t { kFree, kWrite, kSend, kRecv, kInternalRecv, kOrphan };

const char* op_kind_name(OpKind kind) noexcept;

// Per-operation context handed to libfabric. Providers with FI_CONTEXT /
// FI_CONTEXT2 own the fi_context2 until the completion, so it must be stable
// memory; using it for every provider also gives one uniform way back from a
// completion to the caller's ctx.
struct OpEntry {
  fi_context2 ctx;  // first member: op_context == this
  uint64_t user_ctx;
  // Receives only: kept so a receive consumed by remote CQ data
  // (FI_RX_CQ_DATA) can be posted again.
  void* buf;
  void* desc;
  uint64_t len;
  uint64_t peer;       // writes and sends: the fi_addr_t they went to
  uint32_t seen_scan;  // the stall scan that first saw it in flight (0: none yet)
  OpKind kind;
};

// Fixed-size free list, allocated once at open: the data path never allocates.
class OpPool {
 public:
  explicit OpPool(size_t capacity);
  OpPool(const OpPool&) = delete;
  OpPool& operator=(const OpPool&) = delete;

  // nullptr when exhausted (back-pressure, not failure).
  // Inline, with from_context and release: one of each per operation.
  OpEntry* acquire(OpKind kind, uint64_t user_ctx) noexcept {
    if (free_count_ == 0) return nullptr;
    OpEntry* e = &entries_[free_[--free_count_]];
    e->user_ctx = user_ctx;
    e->kind = kind;
    e->buf = nullptr;
    e->desc = nullptr;
    e->len = 0;
    e->peer = FI_ADDR_NOTAVAIL;
    e->seen_scan = 0;
    return e;
  }
  void release(OpEntry* entry) noexcept {
    if (entry == nullptr || entry->kind == OpKind::kFree) return;
    entry->kind = OpKind::kFree;
    free_[free_count_++] = static_cast<uint32_t>(entry - entries_.get());
  }
  // Maps an op_context from a completion back to its entry; nullptr when the
  // pointer is not one of ours (e.g. remote-write completions carry none).
  OpEntry* from_context(void* op_context) noexcept {
    const auto p = reinterpret_cast<uintptr_t>(op_context);
    const auto begin = reinterpret_cast<uintptr_t>(entries_.get());
    const uintptr_t end = begin + capacity_ * sizeof(OpEntry);
    if (p < begin || p >= end || (p - begin) % sizeof(OpEntry) != 0) return nullptr;
    return static_cast<OpEntry*>(op_context);
  }
  size_t capacity() const noexcept { return capacity_; }
  size_t in_use() const noexcept { return capacity_ - free_count_; }
  // Entry i (0 <= i < capacity), free or not: for scans off the data path.
  OpEntry* at(size_t i) noexcept { return &entries_[i]; }

 private:
  size_t capacity_;
  std::unique_ptr<OpEntry[]> entries_;
  std::unique_ptr<uint32_t[]> free_;
  size_t free_count_;
};

// Everything libfabric may still reference while a registration or a posted
// operation lives. The Domain closes it in the order libfabric needs
// (FabricDomain::close_all); a FabricMr keeps a reference only so that its
// close and the Domain's never race or run twice, in either order.
struct FabricResources {
  std::string nic_name;
  InfoPtr info;
  std::unique_ptr<OpPool> pool;
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_cq> cq;
  FidPtr<fid_av> av;
  FidPtr<fid_ep> ep;
  uint64_t mr_mode = 0;  // as granted by the provider
  std::atomic<uint64_t> next_key{1};

  // Open registrations, closed by whichever comes first: their FabricMr, or
  // the Domain revoking them all before it closes the endpoint.
  uint64_t add_mr(FidPtr<fid_mr> mr);
  void close_mr(uint64_t id) noexcept;
  // Returns how many were still open; later add_mr calls fail (return 0).
  size_t close_all_mrs() noexcept;

 private:
  std::mutex mr_mu_;
  std::unordered_map<uint64_t, FidPtr<fid_mr>> mrs_;
  uint64_t next_mr_id_ = 1;
  bool mrs_closed_ = false;
};

class FabricMr final : public core::DomainMr {
 public:
  FabricMr(std::shared_ptr<FabricResources> res, uint64_t id) : res_(std::move(res)), id_(id) {}
  ~FabricMr() override { res_->close_mr(id_); }

 private:
  std::shared_ptr<FabricResources> res_;
  uint64_t id_;
};

using Clock = std::chrono::steady_clock;

// Whether a local process has exited, through a pidfd (readable once it has
// exited; immune to pid reuse). Thread-safe: every call asks the kernel.
class ProcessWatch {
 public:
  // valid() is false when the kernel has no pidfd_open or the pid is gone.
  explicit ProcessWatch(pid_t pid);
  bool valid() const noexcept { return pidfd_.valid(); }
  bool exited() const noexcept;
  int fd() const noexcept { return pidfd_.get(); }  // readable once the process has exited

 private:
  core::UniqueFd pidfd_;
};

// A peer reached through the shm provider, a process on this host.
//
// libfabric 1.17's shm sender takes a spinlock in the receiver's shared
// region (pthread_spin_lock in smr_generic_rma / smr_generic_sendmsg) for
// every fi_writemsg and fi_send, and the receiver holds the same lock while
// it copies the data of the commands queued to it (process_vm_readv of whole
// writes, in smr_progress_cmd). A receiver killed during that copy leaves the
// lock taken forever, and the sender's next fi_writemsg spins inside the
// provider for ever. So the Domain maps the first page of the peer's region
// itself (its layout checked against our own region at open) and does not
// call into the provider while the lock is taken; it watches the process
// through a pidfd; and should it be caught spinning anyway (the peer took the
// lock between our look and the provider's, then died), the Domain's rescuer
// thread releases a lock whose owner is dead. What was in flight to a dead
// peer is failed (kOrphan) and its responses answered (unstick_responses).
struct ShmPeer {
  ~ShmPeer();
  std::string name;  // "fi_shm://<pid>:<n>:<m>"
  pid_t pid = 0;
  std::unique_ptr<ProcessWatch> watch;  // null: liveness unknown (or the peer is us)
  int* lock = nullptr;                  // the provider's spinlock in its region, or null
  void* map = nullptr;                  // our mapping of its region's first page
  size_t map_len = 0;
  Clock::time_point last_check{};
  Clock::time_point lock_held_since{};  // dead peers: when its lock was first seen taken
  uint32_t eagain_streak = 0;
  bool dead = false;
  bool exit_seen = false;  // the rescuer's own: it saw the process exit (rescuer_mu_)
};

// A peer reached through the tcp provider (see ConnectProbe): probed when
// writes or sends to it stop completing, and dead for good once nothing
// listens at its address.
struct SocketPeer {
  std::vector<uint8_t> addr;  // its sockaddr, as in its fabric address
  ConnectProbe probe;
  Clock::time_point next_probe{};
  // Since when every post to it was refused with -FI_EAGAIN (epoch: the last
  // one was taken): rxm answers so while it tries to connect.
  Clock::time_point eagain_since{};
  bool dead = false;
};

// The value of an unlocked pthread_spinlock_t (1 on x86-64 glibc, 0 elsewhere).
int spin_unlocked_value() noexcept;

class FabricDomain final : public core::Domain {
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can name Key: a domain is made by it alone.
  explicit FabricDomain(Key) {}
  static std::unique_ptr<core::Domain> open(const core::DomainOptions& options, Status* error);
  ~FabricDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }

  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override;
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override;
  void remove_peer(core::PeerId peer) override;

  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_send_at_post(core::PeerId peer, const void* buf, size_t len) override;
  core::PostResult post_imm_at_post(core::PeerId peer, uint32_t imm, uint64_t remote_addr,
                                    uint64_t rkey) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;

  int wait_fd() override { return wait_fd_; }
  bool can_block() override;

  ShmRescuerCounts rescuer_counts() const;

 private:
  const char* missing_shm_peer(std::span<const uint8_t> raw) const;
  const char* foreign_address(std::span<const uint8_t> raw) const;
  Status post_error(const char* call, ssize_t ret) const;
  // Posts (or re-posts) the receive described by `entry`.
  ssize_t post_recv_entry(OpEntry* entry) noexcept;
  bool post_internal_recvs();
  // Receives consumed by remote CQ data whose re-post would block; retried at
  // the start of the next poll. Writes at most one Completion per hard failure.
  size_t retry_reposts(std::span<core::Completion> out);
  void repost_or_defer(OpEntry* entry);
  // What a poll does besides reading the CQ, while anything is in flight or
  // waits: reposts to retry, liveness and stall checks, orphans to fail.
  size_t upkeep(std::span<core::Completion> out);
  // Turns one successful CQ entry into at most one Completion.
  bool map_completion(const fi_cq_data_entry& e, core::Completion* out);
  // 1: wrote *out, 0: consumed an entry without a Completion, -1: nothing read.
  int map_error(core::Completion* out);

  // --- shm peers (see ShmPeer)
  void track_shm_peer(fi_addr_t addr, std::string_view name);
  ShmPeer* shm_peer(fi_addr_t addr) noexcept {
    if (shm_peers_.empty()) return nullptr;
    if (addr == last_shm_addr_) return last_shm_peer_;
    auto it = shm_peers_.find(addr);
    last_shm_addr_ = addr;
    last_shm_peer_ = it == shm_peers_.end() ? nullptr : it->second.get();
    return last_shm_peer_;
  }
  // Asks whether the peer's process still runs, at most once per `period`;
  // marks it dead (for good) when it has exited.
  void check_shm_peer(ShmPeer& p, Clock::time_point now, Clock::duration period);
  // Whether the provider may be called for this peer now; false with *error
  // set (dead peer) or not (its region lock is taken: back-pressure). *when
  // gets the time it decided at.
  bool shm_peer_postable(ShmPeer& p, uint64_t len, const char* call, Status* error,
                         Clock::time_point* when);
  Status dead_peer_status(const ShmPeer& p, const char* what) const;
  // Whether a post to `peer` may go to the provider now: an shm peer's
  // shm_peer_postable, then any peer known dead (peer_dead). *sp gets the shm
  // record (null for others), *when the time the shm look was made at.
  bool peer_postable(fi_addr_t peer, uint64_t len, const char* call, Status* error, ShmPeer** sp,
                     Clock::time_point* when);
  // Around a provider call that may spin on sp's region lock: makes the call
  // visible to the rescuer; returns whether it did (end_watched_post's input).
  bool begin_watched_post(ShmPeer* sp, Clock::time_point now) noexcept;
  void end_watched_post(bool watched) noexcept;
  // After a post to sp returned `ret`: a post that blocks again and again may
  // be waiting for a dead peer, so it is looked at.
  void note_shm_post(ShmPeer* sp, ssize_t ret);
  // A zero-byte write with an immediate, with no local completion (imm_at_post).
  bool inject_imm(uint32_t imm, fi_addr_t peer, uint64_t remote_addr, uint64_t rkey, ShmPeer* sp,
                  Clock::time_point now, Status* error);

  // --- tcp peers (see SocketPeer; socket_peers.cpp)
  void track_socket_peer(fi_addr_t addr, std::span<const uint8_t> raw);
  SocketPeer* socket_peer(fi_addr_t addr) noexcept {
    auto it = socket_peers_.find(addr);
    return it == socket_peers_.end() ? nullptr : it->second.get();
  }
  // Every kStallScanPeriod while writes or sends are in flight: probes the
  // peers of those seen in flight for two scans running, and collects the
  // answers of probes started earlier.
  void scan_for_stalled_peers(Clock::time_point now);
  void take_probe_answer(SocketPeer& p, ConnectProbe::Answer answer);
  // Before an entry goes (removed or replaced): the counts below.
  void forget_socket_peer(const SocketPeer& p);
  // After a post to `peer` returned `ret`: a peer refusing posts for a while is
  // probed too (the provider may hold nothing of ours for it).
  void note_socket_post(fi_addr_t peer, ssize_t ret);
  Status dead_socket_peer_status(const SocketPeer& p, const char* what) const;
  // Whether `peer` is known dead (shm or tcp); *status then says why.
  bool peer_dead(fi_addr_t peer, const char* what, Status* status) const;
  // Fails the writes and sends still in flight to dead peers (orphaning them).
  size_t fail_orphans(std::span<core::Completion> out);
  // Checks every live shm peer now; orphans (without completions) the
  // writes and sends of those found dead. Teardown only.
  void orphan_dead_peers(Clock::time_point now);
  // Checks the peers while writes are in flight and nothing is posted.
  void check_shm_peers(Clock::time_point now);
  // libfabric 1.17's shm completes our writes in the order of one response
  // queue in our region, and a write whose receiver died is never answered:
  // every later completion, to any peer, would wait behind it. Answers the
  // orphans' entries with an error (the provider then completes them, and
  // the orphans are released), after releasing a region lock their dead
  // receiver left taken (the provider needs it to finish the response).
  void unstick_responses(Clock::time_point now);
  void start_rescuer();
  // Stops and joins the rescuer; the Domain then closes what it watched.
  void stop_rescuer();
  void rescuer_main();
  // The rescuer's part for the poll numbered `call` (polling_call_) still in
  // progress: releases a lock held across looks kRescueAfter apart while a
  // peer process has exited.
  void rescue_poll(int64_t call, int64_t now);
  // The rescuer's part for a post spinning on the region lock of a peer whose
  // process has exited: releases it once the post has spun kRescueAfter.
  void rescue_post(int64_t now);
  // Whether the region lock of a peer the rescuer saw exit is taken (rescuer_mu_).
  bool dead_peer_lock_taken() const;
  // The rescuer's look at our own region lock after a peer process exited:
  // releases it once it has stayed taken across consecutive looks for
  // kRescueAfter with no call of ours into the provider that could hold it.
  void watch_own_lock(int64_t now);
  // Releases `lock` if it is taken and `call` (the start of the provider
  // call the release is for, 0: none in progress) still reads `expected`.
  bool release_lock(int* lock, const std::atomic<int64_t>& call, int64_t expected);

  // --- teardown
  // Revokes remote access, hands posted receives back, and progresses the
  // endpoint until no transfer of ours is in flight and it has been quiet for
  // a while (bounded), so that closing it cancels nothing half-received.
  void quiesce();
  void release_drained(void* op_context);
  void close_all();

  std::shared_ptr<FabricResources> res_;
  // Hot-path copies of res_ members.
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  OpPool* pool_ = nullptr;

  core::DomainInfo info_;
  std::vector<uint8_t> address_;
  size_t peer_addr_len_ = 0;  // bytes the provider may read from an fi_av_insert address
  std::unordered_map<std::string, fi_addr_t> peers_;

  std::unique_ptr<OpEntry*[]> repost_;  // capacity = pool capacity
  size_t repost_count_ = 0;

  int wait_fd_ = -1;
  bool rx_cq_data_ = false;  // FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  // Set once a provider refuses iov_count == 0 for a zero-length write.
  bool zero_len_needs_iov_ = false;
  bool cq_failure_logged_ = false;
  bool rxm_ = false;  // a layered ofi_rxm provider (see quiesce)
  // Writes and sends posted and not yet completed (orphans excluded).
  size_t tx_in_flight_ = 0;

  // shm only.
  bool shm_ = false;
  bool shm_layout_ok_ = false;  // our own region matched the layout we read
  uint8_t shm_version_ = 0;     // its layout version byte
  void* own_region_ = nullptr;  // our mapping of our own region, when shm_layout_ok_
  size_t own_region_len_ = 0;
  size_t orphans_ = 0;  // kOrphan entries not yet released
  Clock::time_point next_unstick_{};
  std::unordered_map<fi_addr_t, std::unique_ptr<ShmPeer>> shm_peers_;
  // Removed or replaced peers, kept until the Domain closes: the rescuer may
  // still be looking at one.
  std::vector<std::unique_ptr<ShmPeer>> removed_shm_peers_;
  fi_addr_t last_shm_addr_ = FI_ADDR_NOTAVAIL;
  ShmPeer* last_shm_peer_ = nullptr;
  bool orphan_scan_ = false;  // a peer died: fail its ops from orphan_pos_ on
  size_t orphan_pos_ = 0;
  Clock::time_point next_peer_check_{};
  // The provider call in progress, for the rescuer: its peer and start.
  const int spin_unlocked_ = spin_unlocked_value();  // a free region lock's word
  std::atomic<ShmPeer*> posting_peer_{nullptr};
  std::atomic<int64_t> posting_since_ns_{0};
  // The fi_cq_read in progress, for the rescuer (set once it runs): a sender
  // that died holding our own region lock, or the lock of its own region,
  // leaves the provider's progress spinning inside it.
  // Each such call has a number of its own (never 0), and 0 stands between
  // calls: a number rather than a start time, so that a poll reads no clock
  // (it runs on every turn of a spinning waiter); the rescuer times how long
  // it sees the same number.
  std::atomic<bool> watch_polls_{false};
  std::atomic<int64_t> polling_call_{0};
  int64_t polls_ = 0;            // the polling thread's count, for polling_call_
  int64_t poll_seen_ = 0;        // rescuer's: the call it last saw in progress,
  int64_t poll_seen_at_ns_ = 0;  // and since when
  int* own_lock_ = nullptr;      // our region's lock, when shm_layout_ok_
  // Every tracked peer, for the rescuer (guarded by rescuer_mu_; entries live
  // until the Domain closes, see removed_shm_peers_).
  std::vector<ShmPeer*> rescue_peers_;
  std::thread rescuer_;
  std::mutex rescuer_mu_;
  // eventfd: a new peer to watch, or stop. Closes with the Domain, after
  // close_all has joined the thread.
  core::UniqueFd rescuer_wake_fd_;
  bool rescuer_stop_ = false;
  // Our own lock, looked at by the rescuer while a peer that exited may have
  // left it taken (guarded by rescuer_mu_): since when it has been seen taken
  // (ns, 0: not yet) and in how many looks.
  bool own_lock_watch_ = false;
  int64_t own_lock_held_since_ = 0;
  uint32_t own_lock_held_looks_ = 0;
  // ShmRescuerCounts, written by the rescuer only.
  std::atomic<uint64_t> rescuer_exits_seen_{0};
  std::atomic<uint64_t> rescuer_timed_wakes_{0};
  std::atomic<uint64_t> rescuer_rests_{0};

  // tcp only (socket_probe_).
  bool socket_probe_ = false;
  std::unordered_map<fi_addr_t, std::unique_ptr<SocketPeer>> socket_peers_;
  size_t dead_socket_peers_ = 0;
  size_t refusing_peers_ = 0;  // live ones with eagain_since set
  uint32_t scan_ = 0;
  Clock::time_point next_stall_scan_{};

  // Write template: invariant fields filled once, per-op fields patched.
  iovec iov_{};
  void* desc_[1] = {nullptr};
  fi_rma_iov rma_iov_{};
  fi_msg_rma msg_{};
};

// libfabric 1.17's layout of the head of an shm region, read from our own
// mappings of regions. map_own_shm_region() verifies it on our own region
// (version, pid, base address, lock, size, response queue) before anything
// relies on it.
namespace shm_layout {
inline constexpr size_t kVersion = 0;     // uint8_t
inline constexpr size_t kPid = 4;         // int
inline constexpr size_t kBaseAddr = 16;   // uintptr_t: the owner's mapping of the region
inline constexpr size_t kLock = 24;       // pthread_spinlock_t
inline constexpr size_t kSignal = 28;     // int: set (1) to make the owner's progress look
inline constexpr size_t kTotalSize = 40;  // size_t: the region's size
inline constexpr size_t kRespQueue = 72;  // size_t: offset of the response queue
// A response queue (ofi_cirque of struct smr_resp): size, size_mask, read and
// write counts, then the entries: the sender's pending-op pointer (msg_id) and
// a status the receiver sets (FI_EBUSY until it has).
inline constexpr size_t kQueueSize = 0, kQueueMask = 8, kQueueRead = 16, kQueueWrite = 24,
                        kQueueEntries = 32, kRespEntry = 16, kRespStatus = 8;
// The sender's pending op (struct smr_tx_entry) a response names: its
// protocol (smr_src_iov == 2) and the caller's context.
inline constexpr size_t kPendingProto = 0x14, kPendingContext = 0x108;
inline constexpr uint16_t kProtoIov = 2;
}  // namespace shm_layout

// The pid in an shm endpoint name "fi_shm://<pid>:...", or 0.
pid_t shm_name_pid(std::string_view name) noexcept;
// Maps our own endpoint's region (shared, read-write) and checks the layout
// above against it; *version gets its version byte. Null (and logs why at
// info) when it does not match.
void* map_own_shm_region(std::string_view name, uint8_t* version, size_t* len);

}  // namespace ferry::fabric

// NVLink Domain: one-sided writes between GPUs of one host through CUDA IPC
// mappings; immediates through the target's shared-memory mailbox. See
// docs/NVLINK.md for the design and why each choice was made.
#include "nvlink/nvlink_domain.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "core/log.h"
#include "cuda/pointer_info.h"
#include "nvlink/nvlink_kernels.h"
#include "nvlink/nvlink_liveness.h"
#include "nvlink/nvlink_shm.h"

namespace ferry::nvlink {

namespace {

// Writes this large go to the copy engines (cudaMemcpyAsync), which reach
// ~395 GB/s on their own and leave the SMs alone; smaller ones are cut into
// <= 32 KiB ops of the next gather launch (or the copy engine for a lone write).
constexpr uint64_t kCopyEngineMin = 4 << 20;
constexpr uint64_t kLoneCopyMax = 256 << 10;
constexpr uint32_t kBatches = 32;  // launches in flight
constexpr uint32_t kStreams = 2;
constexpr uint32_t kMaxBatchOps = 4096;  // ops per launch
// A batch is launched once it is this big, when poll() runs without a post
// since the last poll (the worker has nothing more to add right now), or at
// once when the GPU has nothing else of ours to do (a lone small write should
// not wait for a worker iteration). Under load a launch takes several
// transfers: a launch costs the worker ~4 us, and at 4 KiB pages one launch
// per 1 024-page transfer held the engine to 210 GB/s where 4 096 ops per
// launch reach 280-320 (ferry-nvlink-bench, docs/PERFORMANCE.md).
constexpr uint32_t kFlushOps = kMaxBatchOps;
constexpr uint64_t kFlushBytes = 16 << 20;
// Worker feeding (core::DomainInfo): a launch covers as many pages as the
// worker hands over, so hand over several transfers' worth per iteration.
constexpr uint32_t kPostBudget = 4096;
constexpr uint32_t kMaxOutstanding = 16384;

std::string cuda_msg(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}

// One opened IPC handle. A process may open a given handle only once, so the
// mappings are shared process-wide (several engines, several peers' regions
// in one allocation) and closed when the last user drops it.
struct IpcMapping {
  uint8_t* base = nullptr;
  ~IpcMapping() {
    if (base != nullptr) cudaIpcCloseMemHandle(base);
  }
};

std::shared_ptr<IpcMapping> open_ipc(uint32_t pid, const uint8_t* handle, Status* error) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<IpcMapping>> cache;
  std::string key(reinterpret_cast<const char*>(&pid), sizeof(pid));
  key.append(reinterpret_cast<const char*>(handle), kIpcHandleBytes);
  std::lock_guard lk(mu);
  if (auto it = cache.find(key); it != cache.end())
    if (auto m = it->second.lock()) return m;
  cudaIpcMemHandle_t h;
  static_assert(sizeof(h) == kIpcHandleBytes);
  std::memcpy(&h, handle, sizeof(h));
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("cudaIpcOpenMemHandle of a region of pid {} failed: {}",
                                        pid, cuda_msg(e))));
    return nullptr;
  }
  auto m = std::make_shared<IpcMapping>();
  m->base = static_cast<uint8_t*>(p);
  cache[key] = m;
  return m;
}

struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};

// Registration: unpublishes its IPC handle when destroyed; keeps the segment
// alive so it may outlive the domain (the engine closes MRs after domains
// may already be gone in error paths).
class NvlinkMr final : public core::DomainMr {
 public:
  NvlinkMr(std::shared_ptr<ShmSegment> shm, std::shared_ptr<std::mutex> mu)
      : shm_(std::move(shm)), mu_(std::move(mu)) {}
  ~NvlinkMr() override {
    if (shm_ && rkey != 0) {
      std::lock_guard lk(*mu_);
      shm_->unpublish(rkey);
    }
  }

 private:
  std::shared_ptr<ShmSegment> shm_;
  std::shared_ptr<std::mutex> mu_;
};

class NvlinkDomain final : public core::Domain {
 public:
  static std::unique_ptr<core::Domain> open(const core::DomainOptions& options, Status* error);
  ~NvlinkDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }
  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override;
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override;
  void remove_peer(core::PeerId peer) override;
  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_paged(const core::PagedDesc& pd) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;
  // An idle worker (adaptive polling) blocks on the mailbox's wake socket, but
  // only with no copy of ours in flight: CUDA events have no descriptor, so
  // then it naps and polls them.
  int wait_fd() override { return shm_->wake_fd(); }
  bool can_block() override {
    if (issued_ > 0 || !done_.empty() || inbox_pos_ != inbox_len_ || !sent_.empty()) return false;
    if (const Batch* b = open_batch(); b != nullptr && !b->items.empty()) return false;
    armed_ = true;
    // A message waiting for a receive buffer is no reason to stay awake.
    return shm_->prepare_to_sleep(/*messages_count=*/!recvs_.empty());
  }

 private:
  struct Target {
    std::shared_ptr<IpcMapping> map;  // null for a peer in this process
    uint8_t* base = nullptr;          // our address of the region's byte 0
    uint64_t reg_ptr = 0;             // the owner's address of byte 0
    uint64_t len = 0;
  };
  struct Peer {
    std::string key;
    RawAddress addr;
    std::unique_ptr<ShmSegment> shm;
    bool same_process = false;
    std::unordered_map<uint64_t, Target> targets;
    uint64_t last_rkey = 0;
    Target* last = nullptr;
    std::unique_ptr<PeerLiveness> live;  // null for a peer in this process
  };
  // A run of writes of one transfer (same ctx, peer and immediate): the pages
  // of a paged write become one item, one completion and one mailbox run.
  struct Item {
    uint64_t ctx;
    uint32_t peer;
    uint32_t imm;
    bool has_imm;
    uint32_t count = 1;
    bool same_run(const Item& o) const {
      return ctx == o.ctx && peer == o.peer && imm == o.imm && has_imm == o.has_imm;
    }
  };
  struct Done {
    Item item;
    Status status;
  };
  struct Batch {
    cudaEvent_t event = nullptr;
    CopyOp* ops = nullptr;  // kMaxBatchOps entries of pinned mapped memory
    uint32_t nops = 0;
    uint64_t bytes = 0;
    std::vector<Item> items;
  };

  NvlinkDomain() = default;
  Target* resolve(Peer& p, uint64_t rkey, Status* error);
  Batch* open_batch() {
    return issued_ < kBatches ? &batches_[(head_ + issued_) % kBatches] : nullptr;
  }
  void flush();
  void fail_batch(Batch& b, const Status& s);
  Peer* peer_of(core::PeerId id, Status* error) {
    if (id < peers_.size() && peers_[id]) return peers_[id].get();
    *error = Status(Code::kInvalidArgument,
                    fmt::format("nvlink {}: unknown peer id {}", info_.name, id));
    return nullptr;
  }
  // A peer whose process has exited is refused like one a NIC reports dead.
  Peer* live_peer(core::PeerId id, PeerLiveness::Clock::time_point now, Status* error) {
    Peer* p = peer_of(id, error);
    if (p != nullptr && p->live && !p->live->alive(now)) {
      *error = Status(Code::kUnavailable, fmt::format("nvlink {}: the peer ({}) has exited",
                                                      info_.name, peer_name(*p)));
      return nullptr;
    }
    return p;
  }
  static bool outside(const Target& t, uint64_t addr, uint64_t len) {
    const uint64_t off = addr - t.reg_ptr;
    return addr < t.reg_ptr || off > t.len || len > t.len - off;
  }
  // Ops of at most kMaxOpBytes for one copy; the caller made room (ops_for).
  static void append_ops(Batch& b, uint64_t src, uint64_t dst, uint64_t len) {
    for (uint64_t o = 0; o < len; o += kMaxOpBytes)
      b.ops[b.nops++] = CopyOp{src + o, dst + o, std::min(kMaxOpBytes, len - o)};
  }
  static uint32_t ops_for(uint64_t len) { return uint32_t((len + kMaxOpBytes - 1) / kMaxOpBytes); }
  static void add_item(std::vector<Item>& items, const Item& it) {
    if (!items.empty() && items.back().same_run(it) &&
        items.back().count < UINT32_MAX / 2 - it.count)
      items.back().count += it.count;
    else
      items.push_back(it);
  }
  void add_done(const Item& it, Status st) {
    if (!done_.empty() && st.is_ok() && done_.back().status.is_ok() &&
        done_.back().item.same_run(it) && done_.back().item.count < UINT32_MAX / 2 - it.count)
      done_.back().item.count += it.count;
    else
      done_.push_back({it, std::move(st)});
  }
  std::string peer_name(const Peer& p) const {
    return fmt::format("pid {} cuda:{}", p.addr.pid, p.addr.device);
  }

  int device_ = 0;
  core::DomainInfo info_;
  std::vector<uint8_t> address_;
  RawAddress self_;
  std::shared_ptr<ShmSegment> shm_;
  std::shared_ptr<std::mutex> shm_mu_ = std::make_shared<std::mutex>();
  // Batches alternate between two streams: one launch's tail overlaps the
  // next one's start (1 024 x 4 KiB, kernel alone: 261 GB/s on one stream,
  // 303 on two; ferry-nvlink-probe). Transfers carry no order, so nothing is
  // lost; batches still retire in launch order.
  cudaStream_t streams_[kStreams] = {};
  cudaStream_t stream_of(const Batch& b) const {
    return streams_[size_t(&b - batches_) % kStreams];
  }
  std::unique_ptr<CopyOp, HostFree> ops_mem_;
  Batch batches_[kBatches];
  uint32_t head_ = 0;    // oldest launched batch
  uint32_t issued_ = 0;  // launched, not yet retired
  bool posted_since_poll_ = false;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unordered_map<std::string, core::PeerId> peer_ids_;
  std::deque<Done> done_;  // finished locally; immediates not yet pushed
  // Runs taken from our mailbox but not yet reported (poll's `out` was full).
  std::array<ImmRun, 256> inbox_{};
  size_t inbox_pos_ = 0, inbox_len_ = 0;
  bool armed_ = false;  // prepare_to_sleep ran since the last poll
  // Two-sided messages: sends are copied into the peer's ring at once, so
  // they complete on the next poll; receive buffers wait here in post order.
  struct PostedRecv {
    void* buf;
    size_t len;
    uint64_t ctx;
  };
  std::vector<uint64_t> sent_;
  std::deque<PostedRecv> recvs_;
  // Slots of our rings skipped because their writer died mid-push, as last
  // reported in the log.
  uint64_t lost_runs_seen_ = 0, lost_msgs_seen_ = 0;
  void report_lost();
};

std::unique_ptr<core::Domain> NvlinkDomain::open(const core::DomainOptions& options,
                                                 Status* error) {
  if (options.device.is_host()) {
    set_error(error, Status(Code::kInvalidArgument,
                            "nvlink: the provider serves GPU memory: use a group for a CUDA "
                            "device (GroupConfig{Device::cuda(n)})"));
    return nullptr;
  }
  std::unique_ptr<NvlinkDomain> d(new NvlinkDomain());
  d->device_ = options.device.ordinal;
  cudaError_t e = cudaSetDevice(d->device_);
  if (e != cudaSuccess) {
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("nvlink: cudaSetDevice({}): {}", d->device_, cuda_msg(e))));
    return nullptr;
  }
  if (!local_boot_id(&d->self_.boot_id)) {
    set_error(error, Status(Code::kUnavailable,
                            "nvlink: /proc/sys/kernel/random/boot_id is unreadable; it names the "
                            "host in NVLink addresses"));
    return nullptr;
  }
  std::random_device rd;
  d->self_.pid = uint32_t(::getpid());
  d->self_.device = d->device_;
  d->self_.shm_name = fmt::format("/ferry-nvl-{}-{}-{:08x}", d->self_.pid, options.position, rd());
  Status st;
  std::unique_ptr<ShmSegment> shm =
      ShmSegment::create(d->self_.shm_name, d->self_.pid, d->device_, &st);
  if (!shm) {
    set_error(error, st);
    return nullptr;
  }
  d->shm_ = std::move(shm);
  d->address_ = d->self_.encode();

  for (auto& s : d->streams_)
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* ops = nullptr;
  if (e == cudaSuccess)
    e = cudaHostAlloc(&ops, sizeof(CopyOp) * kMaxBatchOps * kBatches,
                      cudaHostAllocPortable | cudaHostAllocMapped);
  if (e == cudaSuccess) d->ops_mem_.reset(static_cast<CopyOp*>(ops));
  for (uint32_t i = 0; i < kBatches && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&d->batches_[i].event, cudaEventDisableTiming);
    d->batches_[i].ops = d->ops_mem_.get() + size_t(i) * kMaxBatchOps;
    d->batches_[i].items.reserve(kMaxBatchOps);
  }
  d->sent_.reserve(kMsgSlots);
  if (e != cudaSuccess) {
    set_error(error, Status(Code::kUnavailable, fmt::format("nvlink: setting up cuda:{} failed: {}",
                                                            d->device_, cuda_msg(e))));
    return nullptr;
  }
  d->info_.name = fmt::format("nvlink-cuda{}-{}", d->device_, options.position);
  d->info_.provider = "nvlink";
  d->info_.fabric = "nvlink";
  d->info_.max_msg_size = ~0ull;
  d->info_.post_budget = kPostBudget;
  d->info_.max_outstanding = kMaxOutstanding;
  d->info_.native_paged = true;
  d->info_.transport = Transport::kNvlink;
  core::log().info("ferry nvlink: opened {} (segment {})", d->info_.name, d->self_.shm_name);
  set_error(error, Status::ok());
  return d;
}

NvlinkDomain::~NvlinkDomain() {
  // Copies still running write into peers' memory through mappings we are
  // about to close: wait for them.
  cudaSetDevice(device_);
  for (cudaStream_t s : streams_)
    if (s != nullptr) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  for (auto& b : batches_)
    if (b.event != nullptr) cudaEventDestroy(b.event);
  peers_.clear();
}

std::unique_ptr<core::DomainMr> NvlinkDomain::register_mr(void* ptr, size_t len, Device device,
                                                          bool remote, Status* error) {
  if (device.is_host()) {
    if (remote) {
      set_error(error, Status(Code::kInvalidArgument,
                              fmt::format("nvlink: {} registered as host memory: the NVLink "
                                          "domain exports GPU memory only",
                                          ptr)));
      return nullptr;
    }
    // Engine-internal buffers (the send pool) are never written over NVLink.
    set_error(error, Status::ok());
    return std::make_unique<NvlinkMr>(nullptr, nullptr);
  }
  cuda::PointerInfo pi;
  Status st;
  cuda::pointer_info(ptr, &pi, &st);
  if (!st.is_ok()) {
    set_error(error, st);
    return nullptr;
  }
  if (!pi.device || pi.ordinal != device.ordinal) {
    set_error(error, Status(Code::kInvalidArgument,
                            pi.device ? fmt::format("nvlink: {} is memory of cuda:{}, registered "
                                                    "as {}",
                                                    ptr, pi.ordinal, device.to_string())
                                      : fmt::format("nvlink: {} is host memory, registered as {}",
                                                    ptr, device.to_string())));
    return nullptr;
  }
  if (device.ordinal != device_) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink: {} is memory of {}, this domain serves cuda:{}",
                                        ptr, device.to_string(), device_)));
    return nullptr;
  }
  const uint64_t p = reinterpret_cast<uint64_t>(ptr);
  if (p < pi.range_start || p + len > pi.range_start + pi.range_size) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink: [{}, +{}) crosses the end of its CUDA "
                                        "allocation ({} bytes at {:#x})",
                                        ptr, len, pi.range_size, pi.range_start)));
    return nullptr;
  }
  cudaSetDevice(device_);
  cudaIpcMemHandle_t h;
  const cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(pi.range_start));
  if (e != cudaSuccess) {
    cudaGetLastError();
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink: cudaIpcGetMemHandle({:#x}) for {} failed: {} "
                                        "(memory from cudaMallocAsync pools or cuMemCreate cannot "
                                        "be exported this way; use cudaMalloc)",
                                        pi.range_start, ptr, cuda_msg(e))));
    return nullptr;
  }
  uint8_t bytes[kIpcHandleBytes];
  std::memcpy(bytes, &h, sizeof(bytes));
  uint64_t rkey;
  {
    std::lock_guard lk(*shm_mu_);
    rkey = shm_->publish(p, len, p - pi.range_start, bytes);
  }
  if (rkey == 0) {
    set_error(error, Status(Code::kResourceExhausted,
                            fmt::format("nvlink: all {} region slots of {} are in use",
                                        kRegionCapacity, info_.name)));
    return nullptr;
  }
  auto mr = std::make_unique<NvlinkMr>(shm_, shm_mu_);
  mr->rkey = rkey;
  mr->remote_base = p;
  set_error(error, Status::ok());
  return mr;
}

core::PeerId NvlinkDomain::add_peer(std::span<const uint8_t> raw, Status* error) {
  std::string key(reinterpret_cast<const char*>(raw.data()), raw.size());
  if (auto it = peer_ids_.find(key); it != peer_ids_.end()) {
    set_error(error, Status::ok());
    return it->second;
  }
  std::string why;
  auto a = RawAddress::decode(raw, &why);
  if (!a) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink {}: not an NVLink address: {}", info_.name, why)));
    return 0;
  }
  if (a->boot_id != self_.boot_id) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink {}: the peer (pid {}, cuda:{}) is on another host "
                                        "(boot id differs): NVLink reaches GPUs of this host only",
                                        info_.name, a->pid, a->device)));
    return 0;
  }
  auto p = std::make_unique<Peer>();
  if (a->pid != self_.pid) {
    p->live = std::make_unique<PeerLiveness>(pid_t(a->pid));
    if (!p->live->alive()) {
      set_error(error,
                Status(Code::kUnavailable,
                       fmt::format("nvlink {}: peer pid {} no longer exists", info_.name, a->pid)));
      return 0;
    }
  }
  Status st;
  p->shm = ShmSegment::open(a->shm_name, &st);
  if (!p->shm) {
    set_error(error, st);
    return 0;
  }
  if (p->shm->header().pid != a->pid || p->shm->header().device != a->device) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("nvlink {}: segment {} belongs to pid {} cuda:{}, the "
                                        "address names pid {} cuda:{}",
                                        info_.name, a->shm_name, p->shm->header().pid,
                                        p->shm->header().device, a->pid, a->device)));
    return 0;
  }
  p->same_process = a->pid == self_.pid;
  if (p->same_process && a->device != device_) {
    // Another engine of this process: its pointers are ours, but the kernel
    // and the copy engines need peer access to reach them.
    cudaSetDevice(device_);
    const cudaError_t e = cudaDeviceEnablePeerAccess(a->device, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      set_error(error, Status(Code::kUnavailable,
                              fmt::format("nvlink {}: cudaDeviceEnablePeerAccess(cuda:{}): {}",
                                          info_.name, a->device, cuda_msg(e))));
      return 0;
    }
    cudaGetLastError();
  }
  p->key = key;
  p->addr = std::move(*a);
  const core::PeerId id = peers_.size();
  peers_.push_back(std::move(p));
  peer_ids_.emplace(std::move(key), id);
  set_error(error, Status::ok());
  return id;
}

void NvlinkDomain::remove_peer(core::PeerId peer) {
  if (peer >= peers_.size() || !peers_[peer]) return;
  // Copies in flight may still target its mappings.
  for (cudaStream_t s : streams_) cudaStreamSynchronize(s);
  peer_ids_.erase(peers_[peer]->key);
  peers_[peer].reset();
}

NvlinkDomain::Target* NvlinkDomain::resolve(Peer& p, uint64_t rkey, Status* error) {
  // The generation check is one load from the owner's table: a region
  // unregistered since we mapped it is refused, not written.
  const uint32_t slot = uint32_t(rkey);
  const bool live = slot < kRegionCapacity &&
                    p.shm->regions()[slot].gen.load(std::memory_order_acquire) == (rkey >> 32) &&
                    (rkey >> 32) != 0;
  if (!live) {
    if (auto it = p.targets.find(rkey); it != p.targets.end()) {
      if (p.last == &it->second) p.last = nullptr, p.last_rkey = 0;
      p.targets.erase(it);
    }
    *error = Status(Code::kNotFound,
                    fmt::format("nvlink {}: rkey {:#x} is not registered at {} (unregistered, or "
                                "a descriptor of another incarnation)",
                                info_.name, rkey, peer_name(p)));
    return nullptr;
  }
  if (p.last != nullptr && p.last_rkey == rkey) return p.last;
  auto it = p.targets.find(rkey);
  if (it == p.targets.end()) {
    RegionInfo e;
    if (!p.shm->lookup(rkey, &e)) {
      *error = Status(Code::kNotFound, fmt::format("nvlink {}: rkey {:#x} vanished at {}",
                                                   info_.name, rkey, peer_name(p)));
      return nullptr;
    }
    Target t;
    t.reg_ptr = e.ptr;
    t.len = e.len;
    if (p.same_process) {
      t.base = reinterpret_cast<uint8_t*>(e.ptr);
    } else {
      t.map = open_ipc(p.addr.pid, e.handle, error);
      if (!t.map) {
        *error = Status(error->code(), fmt::format("nvlink {}: {} (peer {})", info_.name,
                                                   error->message(), peer_name(p)));
        return nullptr;
      }
      t.base = t.map->base + e.alloc_offset;
    }
    it = p.targets.emplace(rkey, std::move(t)).first;
  }
  p.last_rkey = rkey;
  p.last = &it->second;
  return p.last;
}

core::PostResult NvlinkDomain::post_writes(std::span<const core::WriteDesc> writes) {
  cudaSetDevice(device_);
  posted_since_poll_ = true;
  const auto now = PeerLiveness::Clock::now();
  for (size_t i = 0; i < writes.size(); ++i) {
    const core::WriteDesc& w = writes[i];
    Status err;
    Peer* pp = live_peer(w.peer, now, &err);
    if (pp == nullptr) return {i, err};
    Peer& p = *pp;
    const Item item{w.ctx, uint32_t(w.peer), w.imm, w.has_imm, 1};
    Target* t = resolve(p, w.rkey, &err);
    if (t == nullptr) return {i, err};
    if (outside(*t, w.remote_addr, w.len))
      return {i, Status(Code::kOutOfRange,
                        fmt::format("nvlink {}: write of {} bytes at {:#x} outside the region "
                                    "[{:#x}, +{}) of {}",
                                    info_.name, w.len, w.remote_addr, t->reg_ptr, t->len,
                                    peer_name(p)))};
    if (w.len == 0) {  // immediate only: no data to wait for
      add_done(item, Status::ok());
      continue;
    }
    uint8_t* dst = t->base + (w.remote_addr - t->reg_ptr);
    Batch* b = open_batch();
    if (b == nullptr) return {i, Status::ok()};  // every launch slot in flight
    // A lone write on an idle GPU is a latency question, and the copy engine
    // answers it sooner than a launch (4 KiB: 7.1 vs 11.4 us to the event,
    // ferry-nvlink-probe); several writes are a throughput one, for the kernel.
    const bool lone = i + 1 == writes.size() && issued_ == 0 && b->items.empty();
    if (w.len >= kCopyEngineMin || (lone && w.len <= kLoneCopyMax)) {
      const cudaError_t e = cudaMemcpyAsync(dst, w.src, w.len, cudaMemcpyDefault, stream_of(*b));
      if (e != cudaSuccess) {
        cudaGetLastError();
        return {i, Status(Code::kInternal,
                          fmt::format("nvlink {}: cudaMemcpyAsync of {} bytes to {}: {}",
                                      info_.name, w.len, peer_name(p), cuda_msg(e)))};
      }
    } else {
      if (b->nops + ops_for(w.len) > kMaxBatchOps) {
        flush();
        b = open_batch();
        if (b == nullptr) return {i, Status::ok()};
      }
      append_ops(*b, reinterpret_cast<uint64_t>(w.src), reinterpret_cast<uint64_t>(dst), w.len);
    }
    b->bytes += w.len;
    add_item(b->items, item);
    if (b->nops >= kFlushOps || b->bytes >= kFlushBytes) flush();
  }
  if (issued_ == 0) flush();  // the GPU is idle: waiting would only add latency
  return {writes.size(), Status::ok()};
}

// Pages straight into the batch's op list: per page two index loads, a bounds
// check and one or two CopyOps; the run is one Item however many pages it has.
core::PostResult NvlinkDomain::post_paged(const core::PagedDesc& pd) {
  if (pd.page_len == 0 || pd.page_len >= kCopyEngineMin) return Domain::post_paged(pd);
  cudaSetDevice(device_);
  posted_since_poll_ = true;
  Status err;
  Peer* pp = live_peer(pd.peer, PeerLiveness::Clock::now(), &err);
  if (pp == nullptr) return {0, err};
  Peer& p = *pp;
  Target* t = resolve(p, pd.rkey, &err);
  if (t == nullptr) return {0, err};
  Batch* b = open_batch();
  if (b == nullptr) return {0, Status::ok()};  // every launch slot in flight
  const uint32_t need = ops_for(pd.page_len);
  Item run{pd.ctx, uint32_t(pd.peer), pd.imm, pd.has_imm, 0};
  auto close_run = [&] {
    if (run.count > 0) add_item(b->items, run);
    run.count = 0;
  };
  for (uint32_t k = 0; k < pd.count; ++k) {
    const uint64_t ra = pd.remote_base + uint64_t(pd.dst_idx[k]) * pd.dst_stride;
    if (outside(*t, ra, pd.page_len)) {
      close_run();
      return {
          k, Status(Code::kOutOfRange,
                    fmt::format("nvlink {}: page {} ({} bytes at {:#x}) outside the region "
                                "[{:#x}, +{}) of {}",
                                info_.name, k, pd.page_len, ra, t->reg_ptr, t->len, peer_name(p)))};
    }
    if (b->nops + need > kMaxBatchOps || b->nops >= kFlushOps || b->bytes >= kFlushBytes) {
      close_run();
      flush();
      b = open_batch();
      if (b == nullptr) return {k, Status::ok()};
    }
    append_ops(*b, reinterpret_cast<uint64_t>(pd.src + uint64_t(pd.src_idx[k]) * pd.src_stride),
               reinterpret_cast<uint64_t>(t->base + (ra - t->reg_ptr)), pd.page_len);
    b->bytes += pd.page_len;
    run.count++;
  }
  close_run();
  if (b->nops >= kFlushOps || b->bytes >= kFlushBytes || issued_ == 0) flush();
  return {pd.count, Status::ok()};
}

core::PostResult NvlinkDomain::post_send(core::PeerId peer, const void* buf, size_t len, void*,
                                         uint64_t ctx) {
  Status err;
  Peer* p = live_peer(peer, PeerLiveness::Clock::now(), &err);
  if (p == nullptr) return {0, err};
  if (len > kMsgBytes)
    return {0, Status(Code::kInvalidArgument,
                      fmt::format("nvlink {}: a message of {} bytes to {}: at most {} bytes "
                                  "(send_buffer_size)",
                                  info_.name, len, peer_name(*p), kMsgBytes))};
  if (!p->shm->push_msg(buf, len)) return {0, Status::ok()};  // ring full: retry later
  sent_.push_back(ctx);
  return {1, Status::ok()};
}

core::PostResult NvlinkDomain::post_recv(void* buf, size_t len, void*, uint64_t ctx) {
  recvs_.push_back({buf, len, ctx});
  return {1, Status::ok()};
}

void NvlinkDomain::fail_batch(Batch& b, const Status& s) {
  for (const Item& it : b.items) add_done(it, s);
  b.items.clear();
  b.nops = 0;
  b.bytes = 0;
}

void NvlinkDomain::flush() {
  Batch* b = open_batch();
  if (b == nullptr || b->items.empty()) return;
  cudaError_t e = launch_gather(b->ops, b->nops, stream_of(*b));
  if (e == cudaSuccess) e = cudaEventRecord(b->event, stream_of(*b));
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail_batch(*b, Status(Code::kInternal, fmt::format("nvlink {}: launching {} copies: {}",
                                                       info_.name, b->nops, cuda_msg(e))));
    return;
  }
  ++issued_;
}

size_t NvlinkDomain::poll(std::span<core::Completion> out) {
  if (armed_) {
    armed_ = false;
    shm_->woken();
  }
  if (!posted_since_poll_) {
    if (Batch* b = open_batch(); b != nullptr && !b->items.empty()) {
      cudaSetDevice(device_);
      flush();
    }
  }
  posted_since_poll_ = false;
  while (issued_ > 0) {
    Batch& b = batches_[head_];
    const cudaError_t e = cudaEventQuery(b.event);
    if (e == cudaErrorNotReady) break;
    if (e == cudaSuccess) {
      for (const Item& it : b.items) add_done(it, Status::ok());
      b.items.clear();
      b.nops = 0;
      b.bytes = 0;
    } else {
      cudaGetLastError();
      // The immediates of failed copies are never sent: the target must not
      // count data that did not land.
      fail_batch(b, Status(Code::kInternal,
                           fmt::format("nvlink {}: copy of {} bytes failed on the GPU: {}",
                                       info_.name, b.bytes, cuda_msg(e))));
    }
    head_ = (head_ + 1) % kBatches;
    --issued_;
  }
  size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    Done& d = done_.front();
    if (d.status.is_ok() && d.item.has_imm) {
      Peer* p = d.item.peer < peers_.size() ? peers_[d.item.peer].get() : nullptr;
      if (p != nullptr) {
        // The whole run is one mailbox cell and one completion.
        if (!p->shm->push_run(d.item.imm, d.item.count)) break;  // full: retry next poll
        core::Completion& c = out[n++];
        c = core::Completion{};
        c.kind = core::Completion::Kind::kWrite;
        c.ctx = d.item.ctx;
        c.count = d.item.count;
        done_.pop_front();
        continue;
      }
      d.status = Status(Code::kUnavailable, fmt::format("nvlink {}: peer removed before its "
                                                        "immediate could be delivered",
                                                        info_.name));
    }
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kWrite;
    c.ctx = d.item.ctx;
    c.count = d.item.count;
    c.status = std::move(d.status);
    done_.pop_front();
  }
  size_t k = 0;
  for (; k < sent_.size() && n < out.size(); ++k) {
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kSend;
    c.ctx = sent_[k];
  }
  sent_.erase(sent_.begin(), sent_.begin() + ptrdiff_t(k));
  while (n < out.size() && !recvs_.empty()) {
    const PostedRecv r = recvs_.front();
    const int64_t len = shm_->pop_msg(r.buf, r.len);
    if (len < 0) break;
    recvs_.pop_front();
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kRecv;
    c.ctx = r.ctx;
    c.len = uint64_t(len);
    if (uint64_t(len) > r.len)
      c.status = Status(Code::kOutOfRange,
                        fmt::format("nvlink {}: a message of {} bytes for a receive buffer of {} "
                                    "(truncated)",
                                    info_.name, len, r.len));
  }
  // Incoming runs, equal neighbours folded: the pages of paged writes that
  // arrive together cost one counter update.
  while (n < out.size()) {
    if (inbox_pos_ == inbox_len_) {
      inbox_pos_ = 0;
      inbox_len_ = shm_->pop_runs(std::span(inbox_));
      if (inbox_len_ == 0) break;
    }
    ImmRun r = inbox_[inbox_pos_++];
    if (r.count == 0) continue;  // a run of nothing: only a faulty writer sends one
    while (inbox_pos_ < inbox_len_ && inbox_[inbox_pos_].imm == r.imm && r.count < UINT32_MAX / 2 &&
           inbox_[inbox_pos_].count < UINT32_MAX / 2 - r.count)
      r.count += inbox_[inbox_pos_++].count;
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kRemoteImm;
    c.imm = r.imm;
    c.count = r.count;
  }
  if (shm_->lost_runs() != lost_runs_seen_ || shm_->lost_msgs() != lost_msgs_seen_) report_lost();
  return n;
}

// A writer killed between claiming a slot of our mailbox or message ring and
// publishing it: the slot was skipped (ShmSegment::skip_dead_claim), and what
// it would have carried is gone with the writer.
void NvlinkDomain::report_lost() {
  core::log().warn(
      "ferry nvlink: {}: a writer (pid {}) died while pushing into this domain's segment; "
      "lost so far: {} immediate run(s), {} message(s)",
      info_.name, shm_->last_lost_claimant(), shm_->lost_runs(), shm_->lost_msgs());
  lost_runs_seen_ = shm_->lost_runs();
  lost_msgs_seen_ = shm_->lost_msgs();
}

}  // namespace

std::unique_ptr<core::Domain> open_nvlink_domain(const core::DomainOptions& options,
                                                 Status* error) {
  return NvlinkDomain::open(options, error);
}

}  // namespace ferry::nvlink

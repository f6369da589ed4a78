// NVLink Domain, control path: opening the endpoint (segment, streams,
// pinned op lists), registering GPU memory (CUDA IPC handles published in the
// region table), adding and removing peers, and resolving a peer's rkey to a
// mapping of its region. docs/NVLINK.md gives the design.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include <fmt/format.h>

#include "core/log.h"
#include "cuda/pointer_info.h"
#include "nvlink/nvlink_domain_impl.h"

namespace ferry::nvlink {

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

std::unique_ptr<core::Domain> NvlinkDomain::open(const core::DomainOptions& options,
                                                 Status* error) {
  if (options.device.is_host()) {
    set_error(error, Status(Code::kInvalidArgument,
                            "nvlink: the provider serves GPU memory: use a group for a CUDA "
                            "device (GroupConfig{Device::cuda(n)})"));
    return nullptr;
  }
  auto d = std::make_unique<NvlinkDomain>(Key{});
  d->device_ = options.device.ordinal;
  if (const char* v = std::getenv("FERRY_NVLINK_COPY_ENGINE_MIN"); v != nullptr && *v != 0) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end == v || *end != 0 || n == 0) {
      set_error(error, Status(Code::kInvalidArgument,
                              fmt::format("nvlink: FERRY_NVLINK_COPY_ENGINE_MIN='{}' is no "
                                          "positive byte count",
                                          v)));
      return nullptr;
    }
    d->copy_engine_min_ = n;
  }
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

core::MappedRemote NvlinkDomain::map_remote(core::PeerId peer, uint64_t rkey, uint64_t remote_addr,
                                            size_t len, Status* error) {
  cudaSetDevice(device_);
  Peer* p = live_peer(peer, PeerLiveness::Clock::now(), error);
  if (p == nullptr) return {};
  Target* t = resolve(*p, rkey, error);
  if (t == nullptr) return {};
  if (outside(*t, remote_addr, len)) {
    *error = Status(Code::kOutOfRange,
                    fmt::format("nvlink {}: map_remote of {} bytes at {:#x} outside the region "
                                "[{:#x}, +{}) of {}",
                                info_.name, len, remote_addr, t->reg_ptr, t->len, peer_name(*p)));
    return {};
  }
  *error = Status::ok();
  // The mapping stays open while the caller holds it, even once the region
  // drops out of this domain's table.
  return {t->base + (remote_addr - t->reg_ptr), t->map};
}

std::unique_ptr<core::Domain> open_nvlink_domain(const core::DomainOptions& options,
                                                 Status* error) {
  return NvlinkDomain::open(options, error);
}

}  // namespace ferry::nvlink

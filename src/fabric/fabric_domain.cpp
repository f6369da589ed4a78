// libfabric Domain: open, memory registration, address resolution, teardown
// (shm peers: shm_peers.cpp; tcp peers: socket_peers.cpp; the datapath:
// fabric_datapath.cpp).
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include "core/log.h"
#include "cuda/pointer_info.h"

#include "fabric/fabric_domain.h"
#include "fabric/fabric_domain_impl.h"
#include "fabric/shm_leftovers.h"
#include "fabric/shm_parking.h"

namespace ferry::fabric {

namespace {

// Enough for every provider we open (efa 32 B, tcp sockaddr_in6, shm names);
// fi_getname tells us when it is not.
constexpr size_t kInitialAddrLen = 256;
// The pool bounds outstanding ops; the provider's own queue depth is the
// natural bound, clamped so a provider reporting huge queues does not cost
// megabytes per NIC.
constexpr size_t kMinPoolEntries = 4096;
constexpr size_t kMaxPoolEntries = 16384;

Status fi_failure(Code code, const std::string& nic, const char* call, int ret) {
  return Status(code, fmt::format("fabric NIC '{}': {} failed: {} ({})", nic, call,
                                  fi_strerror(ret < 0 ? -ret : ret), ret));
}

void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}

}  // namespace

const char* op_kind_name(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kWrite:
      return "write";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kInternalRecv:
      return "internal recv";
    case OpKind::kOrphan:
      return "abandoned op";
    case OpKind::kFree:
      break;
  }
  return "unknown op";
}

OpPool::OpPool(size_t capacity)
    : capacity_(capacity),
      entries_(new OpEntry[capacity]()),
      free_(new uint32_t[capacity]),
      free_count_(capacity) {
  // Lowest index on top: recently used entries stay warm in cache.
  for (size_t i = 0; i < capacity; ++i) free_[i] = static_cast<uint32_t>(capacity - 1 - i);
}

OpEntry* OpPool::acquire(OpKind kind, uint64_t user_ctx) noexcept {
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

void OpPool::release(OpEntry* entry) noexcept {
  if (entry == nullptr || entry->kind == OpKind::kFree) return;
  entry->kind = OpKind::kFree;
  free_[free_count_++] = static_cast<uint32_t>(entry - entries_.get());
}

OpEntry* OpPool::from_context(void* op_context) noexcept {
  const auto p = reinterpret_cast<uintptr_t>(op_context);
  const auto begin = reinterpret_cast<uintptr_t>(entries_.get());
  const uintptr_t end = begin + capacity_ * sizeof(OpEntry);
  if (p < begin || p >= end || (p - begin) % sizeof(OpEntry) != 0) return nullptr;
  return reinterpret_cast<OpEntry*>(op_context);
}

std::unique_ptr<core::Domain> open_fabric_domain(const core::DomainOptions& options,
                                                 Status* error) {
  return FabricDomain::open(options, error);
}

std::unique_ptr<core::Domain> FabricDomain::open(const core::DomainOptions& options,
                                                 Status* error) {
  const std::string& provider = options.provider;
  if (provider.empty()) {
    set_error(error, Status(Code::kInvalidArgument, "fabric: no libfabric provider given"));
    return nullptr;
  }
  const bool want_hmem = options.device.kind == Device::Kind::kCuda;
  InfoPtr hints = make_hints(provider, want_hmem, options.nic_name);
  if (!hints) {
    set_error(error, Status(Code::kResourceExhausted, "fabric: fi_allocinfo failed"));
    return nullptr;
  }
  fi_info* raw_list = nullptr;
  int ret = fi_getinfo(kFabricApiVersion, nullptr, nullptr, 0, hints.get(), &raw_list);
  InfoPtr list(ret == 0 ? raw_list : nullptr);
  const std::string wanted = options.nic_name.empty() ? fmt::format("#{}", options.nic_index)
                                                      : fmt::format("'{}'", options.nic_name);
  const char* hmem_note = want_hmem ? " with FI_HMEM" : "";

  // Several entries may describe one domain (e.g. tcp offers IPv4 and IPv6
  // fabrics on "lo"); the first one of a domain wins.
  const fi_info* chosen = nullptr;
  std::vector<std::string> seen;
  for (const fi_info* i = list.get(); i != nullptr; i = i->next) {
    if (!info_usable(i, provider)) continue;
    const std::string name = i->domain_attr->name;
    const bool first_of_domain = std::find(seen.begin(), seen.end(), name) == seen.end();
    if (first_of_domain) seen.push_back(name);
    if (chosen != nullptr) continue;
    if (!options.nic_name.empty()) {
      if (name == options.nic_name) chosen = i;
    } else if (first_of_domain && seen.size() - 1 == options.nic_index) {
      chosen = i;
    }
  }
  if (chosen == nullptr) {
    // The hints name the NIC, so fi_getinfo answers "no data" for a name it
    // does not know: ask again for every domain, to say which ones exist.
    int all_ret = 0;
    std::vector<std::string> offered =
        options.nic_name.empty() ? seen : usable_domain_names(provider, want_hmem, &all_ret);
    if (offered.empty()) {
      const int why = ret != 0 ? ret : all_ret != 0 ? all_ret : -FI_ENODATA;
      set_error(error, Status(Code::kUnavailable,
                              fmt::format("fabric: provider '{}' offers no usable domain{} (RDM, "
                                          "RMA and 4-byte remote CQ data): fi_getinfo failed: "
                                          "{} ({})",
                                          provider, hmem_note, fi_strerror(-why), why)));
      return nullptr;
    }
    set_error(error, Status(Code::kNotFound,
                            fmt::format("fabric: provider '{}' has no domain {}{}; the domains it "
                                        "offers with RDM, RMA and 4-byte remote CQ data are [{}]",
                                        provider, wanted, hmem_note, fmt::join(offered, ", "))));
    return nullptr;
  }

  auto res = std::make_shared<FabricResources>();
  res->info.reset(fi_dupinfo(chosen));
  list.reset();
  if (!res->info) {
    set_error(error, Status(Code::kResourceExhausted, "fabric: fi_dupinfo failed"));
    return nullptr;
  }
  const fi_info* info = res->info.get();
  res->nic_name = info->domain_attr->name;
  res->mr_mode = info->domain_attr->mr_mode;
  // Keys we choose start at a random point: a descriptor kept from a previous
  // run of this process names keys the new run (almost surely) never issues,
  // so a stale writer gets a key error instead of writing into new memory.
  {
    const size_t key_size = info->domain_attr->mr_key_size;
    const int bits = key_size == 0 || key_size >= 8 ? 64 : int(key_size * 8);
    std::random_device rd;
    uint64_t r = (uint64_t(rd()) << 32) ^ rd();
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    // Start in the lower half of the key space so the counter never wraps.
    res->next_key = bits > 24 ? (r & (mask >> 1)) + 1 : 1;
  }
  const std::string& nic = res->nic_name;

  const size_t queue_depth = (info->tx_attr != nullptr ? info->tx_attr->size : 0) +
                             (info->rx_attr != nullptr ? info->rx_attr->size : 0);
  res->pool = std::make_unique<OpPool>(std::clamp(queue_depth, kMinPoolEntries, kMaxPoolEntries));

  fid_fabric* fabric = nullptr;
  ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_fabric", ret));
    return nullptr;
  }
  res->fabric.reset(fabric);

  fid_domain* domain = nullptr;
  ret = fi_domain(res->fabric.get(), res->info.get(), &domain, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_domain", ret));
    return nullptr;
  }
  res->domain.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_FD;
  fid_cq* cq = nullptr;
  ret = fi_cq_open(res->domain.get(), &cq_attr, &cq, nullptr);
  std::string wait_note = "yes";
  if (ret != 0) {
    // A CQ without a wait object still works; the engine just cannot sleep on it.
    wait_note = fmt::format("no (fi_cq_open with FI_WAIT_FD: {})", fi_strerror(-ret));
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(res->domain.get(), &cq_attr, &cq, nullptr);
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_cq_open", ret));
    return nullptr;
  }
  res->cq.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type =
      info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  fid_av* av = nullptr;
  ret = fi_av_open(res->domain.get(), &av_attr, &av, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_av_open", ret));
    return nullptr;
  }
  res->av.reset(av);

  if (res->info->fabric_attr->prov_name != nullptr &&
      std::string_view(res->info->fabric_attr->prov_name) == "shm")
    remove_own_stale_shm_regions();
  fid_ep* ep = nullptr;
  ret = fi_endpoint(res->domain.get(), res->info.get(), &ep, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_endpoint", ret));
    return nullptr;
  }
  res->ep.reset(ep);
  ret = fi_ep_bind(ep, &res->cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_ep_bind(cq)", ret));
    return nullptr;
  }
  ret = fi_ep_bind(ep, &res->av->fid, 0);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_ep_bind(av)", ret));
    return nullptr;
  }
  ret = fi_enable(ep);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_enable", ret));
    return nullptr;
  }

  std::unique_ptr<FabricDomain> d(new FabricDomain());
  d->address_.resize(kInitialAddrLen);
  size_t addrlen = d->address_.size();
  ret = fi_getname(&ep->fid, d->address_.data(), &addrlen);
  if (ret == -FI_ETOOSMALL) {
    d->address_.resize(addrlen);
    ret = fi_getname(&ep->fid, d->address_.data(), &addrlen);
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_getname", ret));
    return nullptr;
  }
  d->address_.resize(addrlen);
  d->peer_addr_len_ = std::max({addrlen, info->src_addrlen, info->dest_addrlen});

  if (cq_attr.wait_obj == FI_WAIT_FD) {
    int fd = -1;
    ret = fi_control(&res->cq->fid, FI_GETWAIT, &fd);
    if (ret == 0 && fd >= 0) {
      d->wait_fd_ = fd;
    } else {
      wait_note = fmt::format("no (fi_control FI_GETWAIT: {})", fi_strerror(-ret));
    }
  }

  d->res_ = std::move(res);
  d->ep_ = d->res_->ep.get();
  d->cq_ = d->res_->cq.get();
  d->pool_ = d->res_->pool.get();
  d->repost_.reset(new OpEntry*[d->pool_->capacity()]);
  d->rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
  if (d->rx_cq_data_ && !d->post_internal_recvs()) {
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("fabric NIC '{}': fi_recv failed while posting receives "
                                        "for remote CQ data (FI_RX_CQ_DATA)",
                                        nic)));
    return nullptr;
  }

  d->msg_.msg_iov = &d->iov_;
  d->msg_.desc = d->desc_;
  d->msg_.iov_count = 1;
  d->msg_.rma_iov = &d->rma_iov_;
  d->msg_.rma_iov_count = 1;

  d->info_.name = nic;
  d->info_.provider = info->fabric_attr->prov_name;
  d->info_.fabric = info->fabric_attr->name != nullptr ? info->fabric_attr->name : "";
  if (info->nic != nullptr && info->nic->link_attr != nullptr) {
    d->info_.link_speed_bps = info->nic->link_attr->speed;
  }
  d->info_.max_msg_size = info->ep_attr != nullptr ? info->ep_attr->max_msg_size : 0;
  d->info_.transport = Transport::kFabric;
  d->info_.any_thread = true;
  d->rxm_ = d->info_.provider.find("ofi_rxm") != std::string::npos;
  d->shm_ = d->info_.provider == "shm";
  d->socket_probe_ = d->info_.provider.starts_with("tcp") && ConnectProbe::is_inet(d->address_);
  if (d->shm_) {
    ShmParking::instance().opened();  // closes through it (close_all)
    const std::string_view own(
        reinterpret_cast<const char*>(d->address_.data()),
        strnlen(reinterpret_cast<const char*>(d->address_.data()), d->address_.size()));
    d->own_region_ = map_own_shm_region(own, &d->shm_version_, &d->own_region_len_);
    d->shm_layout_ok_ = d->own_region_ != nullptr;
    if (d->shm_layout_ok_)
      d->own_lock_ =
          reinterpret_cast<int*>(static_cast<uint8_t*>(d->own_region_) + shm_layout::kLock);
  }

  core::log().info(
      "ferry fabric: opened provider={} fabric={} domain={} mr_mode={} mode={:#x} "
      "cq_data_size={} wait_fd={} ops={}{}",
      d->info_.provider, d->info_.fabric, nic, mr_mode_string(d->res_->mr_mode), info->mode,
      info->domain_attr->cq_data_size, wait_note, d->pool_->capacity(),
      (info->caps & FI_HMEM) != 0 ? " hmem" : "");
  set_error(error, Status::ok());
  return d;
}

FabricDomain::~FabricDomain() {
  close_all();
}

// A host buffer registered as GPU memory (or the reverse) would make the
// provider pick the wrong copy path and fail far from the cause, or corrupt
// memory with cudaMemcpy on a host address: refuse it here, naming both.
Status check_memory_kind(const void* ptr, Device device) {
  int ordinal = -1;
  Status probe;
  const bool on_gpu = cuda::is_device_pointer(ptr, &ordinal, &probe);
  if (device.kind == Device::Kind::kCuda) {
    if (!probe.is_ok()) return probe;  // kUnimplemented without CUDA
    if (!on_gpu)
      return Status(Code::kInvalidArgument,
                    fmt::format("{} is host memory, registered as {}", ptr, device.to_string()));
    if (ordinal != device.ordinal)
      return Status(Code::kInvalidArgument, fmt::format("{} is memory of cuda:{}, registered as {}",
                                                        ptr, ordinal, device.to_string()));
    return Status::ok();
  }
  // Host registrations: without CUDA nothing can be device memory.
  if (probe.is_ok() && on_gpu)
    return Status(Code::kInvalidArgument,
                  fmt::format("{} is GPU memory of cuda:{}, registered as {}", ptr, ordinal,
                              device.to_string()));
  return Status::ok();
}

std::unique_ptr<core::DomainMr> FabricDomain::register_mr(void* ptr, size_t len, Device device,
                                                          bool remote, Status* error) {
  const std::string& nic = res_->nic_name;
  if (ptr == nullptr || len == 0) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_mr_regattr: null pointer or zero "
                                        "length ({} bytes at {})",
                                        nic, len, ptr)));
    return nullptr;
  }
  const bool cuda = device.kind == Device::Kind::kCuda;
  if (Status s = check_memory_kind(ptr, device); !s.is_ok()) {
    set_error(error, Status(s.code(), fmt::format("fabric NIC '{}': {}", nic, s.message())));
    return nullptr;
  }
  if (cuda && (res_->info->caps & FI_HMEM) == 0) {
    set_error(error, Status(Code::kFailedPrecondition,
                            fmt::format("fabric NIC '{}': fi_mr_regattr: CUDA memory on a domain "
                                        "opened without FI_HMEM",
                                        nic)));
    return nullptr;
  }

  iovec iov{ptr, len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV | FI_WRITE | FI_READ;
  if (remote) attr.access |= FI_REMOTE_WRITE | FI_REMOTE_READ;
  // Without FI_MR_PROV_KEY the application picks keys, unique per domain.
  if ((res_->mr_mode & FI_MR_PROV_KEY) == 0) {
    attr.requested_key = res_->next_key.fetch_add(1, std::memory_order_relaxed);
  }
  if (cuda) {
    // DMA-BUF (cuMemGetHandleForAddressRange + FI_MR_DMABUF) would be tried
    // first, but libfabric 1.17 has no FI_MR_DMABUF / struct fi_mr_dmabuf
    // (they arrived in 1.20): the iov with FI_HMEM_CUDA is the only path.
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device.ordinal;
  } else {
    attr.iface = FI_HMEM_SYSTEM;
  }

  fid_mr* raw_mr = nullptr;
  int ret = fi_mr_regattr(res_->domain.get(), &attr, 0, &raw_mr);
  if (ret == -FI_ENOSYS && cuda) {
    // Seen on the H200 with Debian's libfabric 1.17: fi_getinfo grants
    // FI_HMEM, but the library was built without CUDA support.
    set_error(error, Status(Code::kUnimplemented,
                            fmt::format("fabric NIC '{}': fi_mr_regattr(FI_HMEM_CUDA, {} bytes at "
                                        "{}, {}): not implemented: this libfabric was built "
                                        "without CUDA support",
                                        nic, len, ptr, device.to_string())));
    return nullptr;
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_regattr", ret));
    return nullptr;
  }
  FidPtr<fid_mr> mr(raw_mr);
  if ((res_->mr_mode & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(mr.get(), &res_->ep->fid, 0);
    if (ret != 0) {
      set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_bind", ret));
      return nullptr;
    }
    ret = fi_mr_enable(mr.get());
    if (ret != 0) {
      set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_enable", ret));
      return nullptr;
    }
  }
  const uint64_t key = fi_mr_key(mr.get());
  if (key == FI_KEY_NOTAVAIL) {
    // Only FI_MR_RAW providers do this, and we do not ask for raw keys.
    set_error(error,
              Status(Code::kUnimplemented,
                     fmt::format("fabric NIC '{}': fi_mr_key: provider uses raw keys", nic)));
    return nullptr;
  }

  // The descriptor is passed even without FI_MR_LOCAL: with FI_HMEM it is how
  // the provider learns that a buffer is device memory.
  void* desc = fi_mr_desc(mr.get());
  const uint64_t id = res_->add_mr(std::move(mr));
  if (id == 0) {
    set_error(error,
              Status(Code::kFailedPrecondition,
                     fmt::format("fabric NIC '{}': fi_mr_regattr: the domain is closing", nic)));
    return nullptr;
  }
  auto out = std::make_unique<FabricMr>(res_, id);
  out->local_desc = desc;
  out->rkey = key;
  // Without FI_MR_VIRT_ADDR the target addresses are offsets into the region.
  out->remote_base = (res_->mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uint64_t>(ptr) : 0;
  set_error(error, Status::ok());
  return out;
}

namespace {

// Length of the "scheme://" prefix when `a` is a NUL-terminated printable
// URI-style name (shm: "fi_shm://<pid>:..."), else 0.
size_t uri_scheme_len(std::span<const uint8_t> a) {
  const auto nul = std::find(a.begin(), a.end(), uint8_t{0});
  if (nul == a.end()) return 0;
  const std::string_view s(reinterpret_cast<const char*>(a.data()),
                           static_cast<size_t>(nul - a.begin()));
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) return 0;
  const size_t pos = s.find("://");
  return pos == std::string_view::npos || pos == 0 ? 0 : pos + 3;
}

}  // namespace

// Providers do not all validate what fi_av_insert gets (shm takes any string
// as a peer name and fails only on first use), so an address that cannot be
// of our format is refused up front. nullptr when it may be ours.
const char* FabricDomain::foreign_address(std::span<const uint8_t> raw) const {
  const size_t scheme = uri_scheme_len(address_);
  if (scheme != 0) {
    if (uri_scheme_len(raw) != scheme || std::memcmp(raw.data(), address_.data(), scheme) != 0) {
      return "name scheme differs";
    }
    return nullptr;
  }
  // Binary addresses (sockaddr, EFA GID+QPN) have one size per fabric.
  return raw.size() != address_.size() ? "length differs" : nullptr;
}

// The shm provider of libfabric 1.17 maps a peer's region on first use and
// crashes the process when that region is gone. A peer whose region does not
// exist (it exited) is therefore refused before it reaches the provider.
const char* FabricDomain::missing_shm_peer(std::span<const uint8_t> raw) const {
  static constexpr std::string_view kScheme = "fi_shm://";
  const size_t len = strnlen(reinterpret_cast<const char*>(raw.data()), raw.size());
  std::string_view name(reinterpret_cast<const char*>(raw.data()), len);
  if (info_.provider != "shm" || !name.starts_with(kScheme)) return nullptr;
  std::string region(name.substr(kScheme.size()));
  std::string path = "/dev/shm/" + region;
  if (::access(path.c_str(), F_OK) != 0) return "its shared-memory region is gone (peer exited)";
  // Regions are named "<pid>:..."; a killed peer leaves its region behind.
  char* end = nullptr;
  long pid = std::strtol(region.c_str(), &end, 10);
  if (end != region.c_str() && *end == ':' && pid > 0 && ::kill(pid_t(pid), 0) != 0 &&
      errno == ESRCH)
    return "its process no longer exists (peer exited)";
  return nullptr;
}

core::PeerId FabricDomain::add_peer(std::span<const uint8_t> raw, Status* error) {
  const std::string& nic = res_->nic_name;
  if (raw.empty() || raw.size() > NetAddr::kMaxRawSize) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_av_insert: bad address length {}", nic,
                                        raw.size())));
    return 0;
  }
  if (const char* why = foreign_address(raw); why != nullptr) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_av_insert: not a {} address of "
                                        "this NIC's format ({}; {} bytes, ours {})",
                                        nic, info_.provider, why, raw.size(), address_.size())));
    return 0;
  }
  if (const char* gone = missing_shm_peer(raw); gone != nullptr) {
    set_error(
        error,
        Status(
            Code::kUnavailable,
            fmt::format("fabric NIC '{}': peer {}: {}", nic,
                        std::string(reinterpret_cast<const char*>(raw.data()),
                                    strnlen(reinterpret_cast<const char*>(raw.data()), raw.size())),
                        gone)));
    return 0;
  }
  std::string key(reinterpret_cast<const char*>(raw.data()), raw.size());
  if (auto it = peers_.find(key); it != peers_.end()) {
    set_error(error, Status::ok());
    return it->second;
  }
  // fi_av_insert takes no length: the provider reads as many bytes as its
  // address format says. Zero padding keeps a short or foreign address from
  // making it read past our buffer.
  std::vector<uint8_t> buf(std::max(raw.size(), peer_addr_len_), 0);
  std::memcpy(buf.data(), raw.data(), raw.size());
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int ret = fi_av_insert(res_->av.get(), buf.data(), 1, &addr, 0, nullptr);
  if (ret != 1 || addr == FI_ADDR_NOTAVAIL) {
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("fabric NIC '{}': fi_av_insert failed: {} ({})", nic,
                                        ret < 0 ? fi_strerror(-ret) : "address rejected", ret)));
    return 0;
  }
  peers_.emplace(std::move(key), addr);
  if (socket_probe_) track_socket_peer(addr, raw);
  if (shm_) {
    track_shm_peer(
        addr, std::string_view(reinterpret_cast<const char*>(raw.data()),
                               strnlen(reinterpret_cast<const char*>(raw.data()), raw.size())));
  }
  set_error(error, Status::ok());
  return addr;
}

void FabricDomain::remove_peer(core::PeerId peer) {
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->second != peer) continue;
    fi_addr_t addr = peer;
    const int ret = fi_av_remove(res_->av.get(), &addr, 1, 0);
    if (ret != 0) {
      core::log().warn("fabric NIC '{}': fi_av_remove failed: {} ({})", res_->nic_name,
                       fi_strerror(-ret), ret);
    }
    peers_.erase(it);
    if (auto tp = socket_peers_.find(peer); tp != socket_peers_.end()) {
      forget_socket_peer(*tp->second);
      socket_peers_.erase(tp);
    }
    if (auto sp = shm_peers_.find(peer); sp != shm_peers_.end()) {
      removed_shm_peers_.push_back(std::move(sp->second));
      shm_peers_.erase(sp);
      last_shm_addr_ = FI_ADDR_NOTAVAIL;
      last_shm_peer_ = nullptr;
    }
    return;
  }
}

bool FabricDomain::can_block() {
  if (wait_fd_ < 0) return false;
  fid* fids[1] = {&cq_->fid};
  return fi_trywait(res_->fabric.get(), fids, 1) == FI_SUCCESS;
}

// ------------------------------------------------------------ registrations

uint64_t FabricResources::add_mr(FidPtr<fid_mr> mr) {
  std::lock_guard lk(mr_mu_);
  if (mrs_closed_) return 0;  // `mr` closes on return
  const uint64_t id = next_mr_id_++;
  mrs_.emplace(id, std::move(mr));
  return id;
}

void FabricResources::close_mr(uint64_t id) noexcept {
  FidPtr<fid_mr> mr;
  {
    std::lock_guard lk(mr_mu_);
    auto it = mrs_.find(id);
    if (it == mrs_.end()) return;  // the Domain closed it already
    mr = std::move(it->second);
    mrs_.erase(it);
  }
}

size_t FabricResources::close_all_mrs() noexcept {
  std::unordered_map<uint64_t, FidPtr<fid_mr>> mrs;
  {
    std::lock_guard lk(mr_mu_);
    mrs_closed_ = true;
    mrs.swap(mrs_);
  }
  return mrs.size();  // closed here
}

// -------------------------------------------------------------- teardown

// How long an rxm endpoint must stay quiet before it is closed, and the most
// the whole drain may take.
static constexpr auto kRxmQuiet = std::chrono::milliseconds(20);
static constexpr auto kDrainLimit = std::chrono::seconds(2);

void FabricDomain::release_drained(void* op_context) {
  OpEntry* op = pool_->from_context(op_context);
  if (op == nullptr || op->kind == OpKind::kFree) return;
  if ((op->kind == OpKind::kWrite || op->kind == OpKind::kSend) && tx_in_flight_ > 0)
    --tx_in_flight_;
  pool_->release(op);
}

// libfabric 1.17's ofi_rxm crashes in fi_close(ep) when a peer's write with
// remote CQ data is half received: the tcp endpoint of that connection
// reports it cancelled with no operation context, and rxm's
// rxm_handle_comp_error dereferences the null context (SIGSEGV in
// rxm_close_conn, seen when an engine stops while a peer streams writes into
// it). Closing the registrations first makes every later write on a
// connection fail its key check, which shuts that connection down cleanly
// between two writes; progressing until the endpoint is quiet lets the write
// under way finish first. Our own writes are drained too, so that no peer is
// left with half of one of ours.
void FabricDomain::quiesce() {
  const size_t revoked = res_->close_all_mrs();
  if (ep_ == nullptr || cq_ == nullptr) return;
  for (size_t i = 0; i < pool_->capacity(); ++i) {
    OpEntry* op = pool_->at(i);
    if (op->kind == OpKind::kRecv || op->kind == OpKind::kInternalRecv)
      (void)fi_cancel(&ep_->fid, op);
  }
  const Clock::duration quiet = rxm_ ? Clock::duration(kRxmQuiet) : Clock::duration::zero();
  const auto start = Clock::now();
  auto last = start;
  auto next_orphan_check = start;
  size_t drained = 0;
  for (;;) {
    fi_cq_data_entry entries[16];
    const ssize_t ret = fi_cq_read(cq_, entries, 16);
    const auto now = Clock::now();
    if (ret > 0) {
      for (ssize_t i = 0; i < ret; ++i) release_drained(entries[i].op_context);
      drained += size_t(ret);
      last = now;
      continue;
    }
    if (ret == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        release_drained(err.op_context);
        ++drained;
        last = now;
        continue;
      }
    } else if (ret != -FI_EAGAIN) {
      break;
    }
    if (now - start >= kDrainLimit) {
      if (tx_in_flight_ > 0 || rxm_)
        core::log().warn(
            "fabric NIC '{}': closing after {} ms with {} write(s)/send(s) of ours still in "
            "flight",
            res_->nic_name,
            std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(),
            tx_in_flight_);
      break;
    }
    // Dead shm peers never complete what was posted to them.
    if ((shm_ || dead_socket_peers_ > 0) && tx_in_flight_ > 0 && now >= next_orphan_check) {
      orphan_dead_peers(now);
      next_orphan_check = now + std::chrono::milliseconds(100);
    }
    const bool waiting_for_tx = tx_in_flight_ > 0;
    if (!waiting_for_tx && now - last >= quiet) break;
    std::this_thread::yield();
  }
  core::log().debug(
      "fabric NIC '{}': closing: {} registration(s) revoked, {} completion(s) drained",
      res_->nic_name, revoked, drained);
}

void FabricDomain::close_all() {
  {
    std::lock_guard lk(rescuer_mu_);
    rescuer_stop_ = true;
  }
  if (rescuer_wake_fd_ >= 0) ::eventfd_write(rescuer_wake_fd_, 1);
  if (rescuer_.joinable()) rescuer_.join();
  if (rescuer_wake_fd_ >= 0) ::close(rescuer_wake_fd_);
  rescuer_wake_fd_ = -1;
  if (!res_) return;
  quiesce();
  if (shm_) {
    // Another endpoint of this process may still use our region through its
    // own pointer to it (shm_parking.h). res_ is gone after this: a second
    // close_all returns above.
    ep_ = nullptr;
    cq_ = nullptr;
    ShmParking::instance().closed(std::move(res_));
  } else {
    // libfabric's order: the endpoint, then what it was bound to, then the
    // domain's remaining objects, then the domain and the fabric.
    // Registrations went first (quiesce).
    res_->ep.reset();
    ep_ = nullptr;
    res_->av.reset();
    res_->cq.reset();
    cq_ = nullptr;
    res_->domain.reset();
    res_->fabric.reset();
  }
  shm_peers_.clear();
  removed_shm_peers_.clear();
  if (own_region_ != nullptr) ::munmap(own_region_, own_region_len_);
  own_region_ = nullptr;
}

}  // namespace ferry::fabric

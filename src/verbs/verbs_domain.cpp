// verbs Domain control path: open, memory registration, peers, RC QP state
// transitions and the driver of the per-peer handshake machines.
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "verbs/verbs_devinfo.h"
#include "verbs/verbs_domain.h"
#include "verbs/verbs_domain_impl.h"

namespace ferry::verbs {

namespace {

void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}

Status verbs_failure(Code code, const std::string& nic, const char* call, int err) {
  return Status(
      code, fmt::format("verbs NIC '{}': {} failed: {} ({})", nic, call, std::strerror(err), err));
}

const char* mtu_name(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

// GPU memory as a dma-buf, through the CUDA driver API looked up at run time
// so that ferry needs no CUDA at build time. Returns -1 (with *why) when not
// available: no libcuda loaded, a driver without the call, no current
// context; the caller then falls back to ibv_reg_mr (nvidia-peermem).
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

UniqueFd cuda_dmabuf_fd(void* ptr, size_t len, uint64_t* offset, std::string* why) {
  // CUresult cuMemGetHandleForAddressRange(void*, CUdeviceptr, size_t,
  //                                        CUmemRangeHandleType, unsigned long long)
  using Fn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
  constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  static Fn fn = [] {
    // RTLD_NOLOAD: a process that registers CUDA memory has libcuda loaded.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib != nullptr ? reinterpret_cast<Fn>(dlsym(lib, "cuMemGetHandleForAddressRange"))
                          : nullptr;
  }();
  if (fn == nullptr) {
    *why = "libcuda.so.1 not loaded or without cuMemGetHandleForAddressRange";
    return UniqueFd();
  }
  // The range must be host-page aligned; the MR covers the caller's bytes
  // through the offset into the dma-buf.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto p = reinterpret_cast<uint64_t>(ptr);
  const uint64_t base = p & ~(page - 1);
  const uint64_t end = (p + len + page - 1) & ~(page - 1);
  int fd = -1;
  const int ret = fn(&fd, base, end - base, kDmaBufFd, 0);
  if (ret != 0 || fd < 0) {
    *why = fmt::format("cuMemGetHandleForAddressRange returned CUresult {}", ret);
    return UniqueFd();
  }
  *offset = p - base;
  return UniqueFd(fd);
}

}  // namespace

std::unique_ptr<core::Domain> open_verbs_domain(const core::DomainOptions& options, Status* error) {
  return VerbsDomain::open(options, error);
}

std::unique_ptr<core::Domain> VerbsDomain::open(const core::DomainOptions& options, Status* error) {
  int num = 0;
  errno = 0;
  DeviceListPtr list(ibv_get_device_list(&num));
  if (!list || num == 0) {
    // No kernel verbs support (ENOSYS) reads the same to a user: no device.
    const std::string msg =
        list ? "no RDMA device: ibv_get_device_list returned 0 devices"
             : fmt::format("no RDMA device: ibv_get_device_list returned 0 devices ({})",
                           std::strerror(errno != 0 ? errno : ENODEV));
    core::log().warn("ferry verbs: {}", msg);
    set_error(error, Status(Code::kUnavailable, msg));
    return nullptr;
  }

  // Pick the device and its port: by name, else the nic_index-th device that
  // has an active port (FERRY_VERBS_PORT forces the port).
  const int forced_port = env_port();
  auto res = std::make_shared<VerbsResources>();
  int port = 0;
  ibv_port_attr pattr{};
  ibv_device_attr dattr{};
  std::vector<std::string> seen;
  size_t usable = 0;
  for (int i = 0; i < num && !res->ctx; ++i) {
    ibv_device* dev = list.get()[i];
    const std::string name = ibv_get_device_name(dev);
    if (!options.nic_name.empty() && name != options.nic_name) continue;
    ContextPtr ctx(ibv_open_device(dev));
    if (!ctx) {
      core::log().debug("ferry verbs: ibv_open_device({}) failed: {}", name, std::strerror(errno));
      continue;
    }
    if (ibv_query_device(ctx.get(), &dattr) != 0) continue;
    int found = 0;
    for (int p = 1; p <= dattr.phys_port_cnt && found == 0; ++p) {
      if (forced_port > 0 && p != forced_port) continue;
      if (ibv_query_port(ctx.get(), static_cast<uint8_t>(p), &pattr) != 0) continue;
      if (pattr.state == IBV_PORT_ACTIVE) found = p;
    }
    seen.push_back(found != 0 ? name : name + " (no active port)");
    if (found == 0) continue;
    if (options.nic_name.empty() && usable++ != options.nic_index) continue;
    res->nic_name = name;
    res->ctx = std::move(ctx);
    port = found;
  }
  if (!res->ctx) {
    const std::string wanted =
        options.nic_name.empty() ? fmt::format("#{}", options.nic_index) : options.nic_name;
    std::string names;
    for (const auto& s : seen) names += (names.empty() ? "" : ", ") + s;
    set_error(
        error,
        Status(Code::kNotFound,
               fmt::format("verbs: no RDMA device {} with an active port{} "
                           "(devices: [{}])",
                           wanted, forced_port > 0 ? fmt::format(" {}", forced_port) : "", names)));
    return nullptr;
  }
  list.reset();
  const std::string nic = res->nic_name;
  ibv_context* ctx = res->ctx.get();

  std::unique_ptr<VerbsDomain> d(new VerbsDomain());
  d->port_ = static_cast<uint8_t>(port);
  d->ethernet_ = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
  d->mtu_ = pattr.active_mtu;
  d->max_msg_ = pattr.max_msg_sz;

  // GID: never blindly index 0 on RoCE (usually the RoCEv1 link-local GID).
  const auto table = read_gid_table(kSysfsInfiniband, nic, port);
  std::vector<Gid> ips;
  std::set<std::string> ndevs;
  for (const auto& e : table) {
    if (!e.ndev.empty()) ndevs.insert(e.ndev);
  }
  for (const auto& nd : ndevs) {
    const auto g = netdev_gids(nd);
    ips.insert(ips.end(), g.begin(), g.end());
  }
  const GidChoice gc =
      choose_gid(nic, port, table, ips, d->ethernet_, options.gid_index, env_gid_index());
  if (!gc.error.is_ok()) {
    core::log().warn("ferry verbs: {}", gc.error.message());
    set_error(error, gc.error);
    return nullptr;
  }
  const int gid_index = gc.index;
  d->gid_index_ = gid_index;
  ibv_gid gid{};
  errno = 0;
  if (const int ret = ibv_query_gid(ctx, d->port_, gid_index, &gid); ret != 0) {
    set_error(error, verbs_failure(Code::kUnavailable, nic,
                                   fmt::format("ibv_query_gid(port {}, index {} ({}))", port,
                                               gid_index, gc.source)
                                       .c_str(),
                                   ret > 0 ? ret : (errno != 0 ? errno : EINVAL)));
    return nullptr;
  }

  res->pd.reset(ibv_alloc_pd(ctx));
  if (!res->pd) {
    set_error(error, verbs_failure(Code::kUnavailable, nic, "ibv_alloc_pd", errno));
    return nullptr;
  }
  // A thread domain lets the provider drop its locks: the Domain is owned by
  // one worker thread. Optional; without it QPs use the plain PD.
  ibv_td_init_attr td_attr{};
  res->td.reset(ibv_alloc_td(ctx, &td_attr));
  if (res->td) {
    ibv_parent_domain_init_attr pattr_init{};
    pattr_init.pd = res->pd.get();
    pattr_init.td = res->td.get();
    res->parent.reset(ibv_alloc_parent_domain(ctx, &pattr_init));
  }
  const char* td_note = res->parent ? "yes" : "no";
  d->res_ = std::move(res);

  if (Status s = d->open_queues(); !s.is_ok()) {
    set_error(error, std::move(s));
    return nullptr;
  }

  std::random_device rd;
  d->rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  d->local_.incarnation = make_incarnation(d->rng_());
  std::memcpy(d->local_.ud.gid.data(), gid.raw, 16);
  d->local_.ud.lid = pattr.lid;
  d->local_.ud.qpn = d->ud_qp_->qp_num;
  d->local_.ud.qkey = kQKey;
  const auto addr = d->local_.ud.to_bytes();
  d->address_.assign(addr.begin(), addr.end());

  d->info_.name = nic;
  d->info_.provider = "verbs";
  d->info_.fabric = d->ethernet_ ? "RoCE" : "InfiniBand";
  d->info_.link_speed_bps = read_link_speed_bps(kSysfsInfiniband, nic, port);
  d->info_.max_msg_size = d->max_msg_;
  d->info_.transport = Transport::kVerbs;

  core::log().info(
      "ferry verbs: opened {} port {} ({}, lid {}, gid index {} ({}) {}, mtu {}, {} Gb/s), ud "
      "qpn {:#x}, thread domain {}, cq {}, completion channel {}, incarnation {:#x}",
      nic, port, d->info_.fabric, pattr.lid, gid_index, gc.source, d->local_.ud.brief(),
      mtu_name(d->mtu_), d->info_.link_speed_bps / 1'000'000'000, d->local_.ud.qpn, td_note,
      kCqDepth, d->channel_ ? fmt::format("fd {}", d->channel_->fd) : std::string("none"),
      d->local_.incarnation);
  set_error(error, Status::ok());
  return d;
}

Status VerbsDomain::open_queues() {
  const std::string& nic = res_->nic_name;
  ibv_context* ctx = res_->ctx.get();
  // Completion channel for adaptive polling. Optional: without one the
  // worker naps between polls instead of blocking on the fd.
  channel_.reset(ibv_create_comp_channel(ctx));
  if (!channel_) {
    core::log().warn(
        "verbs NIC '{}': ibv_create_comp_channel failed: {}; adaptive polling "
        "naps instead of blocking",
        nic, std::strerror(errno));
  } else if (const int flags = fcntl(channel_->fd, F_GETFL);
             flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    // can_block drains the channel: a blocking ibv_get_cq_event would hang.
    core::log().warn(
        "verbs NIC '{}': cannot make the completion channel non-blocking: {}; "
        "adaptive polling naps instead of blocking",
        nic, std::strerror(errno));
    channel_.reset();
  }
  cq_ = CqPtr(ibv_create_cq(ctx, kCqDepth, nullptr, channel_.get(), 0), CqDeleter{&notify_});
  if (!cq_) return verbs_failure(Code::kUnavailable, nic, "ibv_create_cq", errno);
  // Credits never exceed what we asked for, even if the CQ came out larger.
  tracker_ = std::make_unique<CompletionTracker>(nic, kCqDepth, kCqDepth);

  for (SrqPtr* srq : {&msg_srq_, &rma_srq_}) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = kSrqDepth;
    sa.attr.max_sge = 1;
    srq->reset(ibv_create_srq(res_->qp_pd(), &sa));
    if (!*srq) return verbs_failure(Code::kUnavailable, nic, "ibv_create_srq", errno);
  }

  ibv_qp_init_attr qa{};
  qa.send_cq = cq_.get();
  qa.recv_cq = cq_.get();
  qa.qp_type = IBV_QPT_UD;
  qa.cap.max_send_wr = kUdDepth;
  qa.cap.max_recv_wr = kUdDepth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  ud_qp_.reset(ibv_create_qp(res_->qp_pd(), &qa));
  if (!ud_qp_) return verbs_failure(Code::kUnavailable, nic, "ibv_create_qp(UD)", errno);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port_;
  a.qkey = kQKey;
  int ret =
      ibv_modify_qp(ud_qp_.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  if (ret == 0) {
    a = {};
    a.qp_state = IBV_QPS_RTR;
    ret = ibv_modify_qp(ud_qp_.get(), &a, IBV_QP_STATE);
  }
  if (ret == 0) {
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    ret = ibv_modify_qp(ud_qp_.get(), &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  if (ret != 0) return verbs_failure(Code::kUnavailable, nic, "ibv_modify_qp(UD)", ret);

  const size_t bytes = (kUdRecvs + kUdSends) * kUdBufSize;
  ud_buf_ = std::make_unique<uint8_t[]>(bytes);
  ud_mr_.reset(ibv_reg_mr(res_->pd.get(), ud_buf_.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
  if (!ud_mr_)
    return verbs_failure(Code::kUnavailable, nic, "ibv_reg_mr(handshake buffers)", errno);
  for (uint32_t i = 0; i < kUdSends; ++i) ud_send_free_[ud_send_free_count_++] = kUdRecvs + i;
  for (uint32_t i = 0; i < kUdRecvs; ++i) {
    if (!post_ud_recv(i)) {
      return Status(Code::kUnavailable,
                    fmt::format("verbs NIC '{}': ibv_post_recv(UD) failed at open", nic));
    }
  }
  for (uint32_t i = 0; i < kRmaRecvs; ++i) {
    if (!post_rma_recv(i)) {
      return Status(Code::kUnavailable,
                    fmt::format("verbs NIC '{}': ibv_post_srq_recv(rma) failed at open", nic));
    }
  }
  return {};
}

VerbsDomain::~VerbsDomain() = default;

std::unique_ptr<core::DomainMr> VerbsDomain::register_mr(void* ptr, size_t len, Device device,
                                                         bool remote, Status* error) {
  const std::string& nic = res_->nic_name;
  if (ptr == nullptr || len == 0) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("verbs NIC '{}': ibv_reg_mr: null pointer or zero length "
                                        "({} bytes at {})",
                                        nic, len, ptr)));
    return nullptr;
  }
  // Relaxed ordering lets the PCIe root complex reorder the NIC's writes;
  // without it ConnectX throughput stays under ~200 Gb/s on many hosts. It
  // is an optional flag: devices without it ignore it.
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
  if (remote) access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const bool cuda = device.kind == Device::Kind::kCuda;

  MrPtr mr;
  std::string how = "ibv_reg_mr";
  if (cuda) {
    uint64_t offset = 0;
    std::string why;
    UniqueFd fd = cuda_dmabuf_fd(ptr, len, &offset, &why);
    if (fd.get() >= 0) {
      mr.reset(ibv_reg_dmabuf_mr(res_->pd.get(), offset, len, reinterpret_cast<uint64_t>(ptr),
                                 fd.get(), access));
      if (mr) {
        how = "ibv_reg_dmabuf_mr";
      } else {
        why = fmt::format("ibv_reg_dmabuf_mr: {}", std::strerror(errno));
      }
    }
    if (!mr) {
      core::log().debug(
          "verbs NIC '{}': dma-buf registration of {} unavailable ({}); using "
          "ibv_reg_mr (needs nvidia-peermem)",
          nic, ptr, why);
    }
  }
  if (!mr) mr.reset(ibv_reg_mr(res_->pd.get(), ptr, len, access));
  if (!mr) {
    const int err = errno;
    set_error(
        error,
        Status(Code::kUnavailable,
               fmt::format("verbs NIC '{}': ibv_reg_mr of {} bytes at {} ({}) failed: {} "
                           "({}){}",
                           nic, len, ptr, device.to_string(), std::strerror(err), err,
                           cuda ? "; GPU memory needs dma-buf support or nvidia-peermem" : "")));
    return nullptr;
  }
  core::log().debug("verbs NIC '{}': {} {} bytes at {} lkey {:#x} rkey {:#x}", nic, how, len, ptr,
                    mr->lkey, mr->rkey);
  auto out = std::make_unique<VerbsMr>(res_, std::move(mr), !cuda);
  // Peers address our memory by virtual address (iova = ptr for dma-buf too).
  out->remote_base = reinterpret_cast<uint64_t>(ptr);
  set_error(error, Status::ok());
  return out;
}

// ------------------------------------------------------------------ peers

std::string VerbsDomain::peer_name(core::PeerId id) const {
  return id < peers_.size() ? fmt::format("peer {} ({})", id, peers_[id].ud.brief())
                            : fmt::format("peer {}", id);
}

core::PeerId VerbsDomain::add_peer(std::span<const uint8_t> raw, Status* error) {
  std::string why;
  const auto ud = UdAddress::decode(raw, &why);
  if (!ud) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("verbs NIC '{}': {}", res_->nic_name, why)));
    return 0;
  }
  return find_or_create_peer(*ud, error);
}

core::PeerId VerbsDomain::find_or_create_peer(const UdAddress& ud, Status* error) {
  const auto bytes = ud.to_bytes();
  std::string key(bytes.begin(), bytes.end());
  if (auto it = by_addr_.find(key); it != by_addr_.end()) {
    set_error(error, Status::ok());
    return it->second;
  }
  ibv_ah_attr ah{};
  ah.port_num = port_;
  ah.dlid = ud.lid;
  if (ethernet_) {
    // RoCE is always GRH-routed: the GID carries the IP address.
    ah.is_global = 1;
    std::memcpy(ah.grh.dgid.raw, ud.gid.data(), 16);
    ah.grh.sgid_index = static_cast<uint8_t>(gid_index_);
    ah.grh.hop_limit = 64;
  }
  AhPtr handle(ibv_create_ah(res_->pd.get(), &ah));
  if (!handle) {
    const int err = errno;
    set_error(error, verbs_failure(Code::kUnavailable, res_->nic_name,
                                   fmt::format("ibv_create_ah({})", ud.brief()).c_str(), err));
    return 0;
  }
  Peer p;
  p.ud = ud;
  p.ah = std::move(handle);
  p.live = true;
  p.hs = std::make_unique<HandshakeMachine>(&local_, hs_cfg_);
  const core::PeerId id = peers_.size();
  peers_.push_back(std::move(p));
  by_addr_.emplace(std::move(key), id);
  set_error(error, Status::ok());
  return id;
}

void VerbsDomain::remove_peer(core::PeerId id) {
  if (id >= peers_.size() || !peers_[id].live) return;
  Peer& p = peers_[id];
  if (p.msg_qp != kNoQp) retire_qp(p.msg_qp);
  if (p.rma_qp != kNoQp) retire_qp(p.rma_qp);
  p.msg_qp = p.rma_qp = kNoQp;
  p.live = false;
  p.ah.reset();
  by_addr_.erase(
      std::string(reinterpret_cast<const char*>(p.ud.to_bytes().data()), UdAddress::kSize));
  connecting_ = 0;
  for (const Peer& q : peers_) connecting_ += q.live && q.hs->state() == HsState::kConnecting;
}

// --------------------------------------------------------------- RC QPs

bool VerbsDomain::create_rc_qp(ibv_srq* srq, uint32_t* slot, Status* error) {
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_.get();
  qa.recv_cq = cq_.get();
  qa.srq = srq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = kQpSendDepth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_inline_data = kWantInline;
  QpPtr qp(ibv_create_qp(res_->qp_pd(), &qa));
  if (!qp) {
    // Some devices cannot inline at this depth: inline is an optimisation.
    qa.cap.max_inline_data = 0;
    qp.reset(ibv_create_qp(res_->qp_pd(), &qa));
  }
  if (!qp) {
    *error = verbs_failure(Code::kUnavailable, res_->nic_name, "ibv_create_qp(RC)", errno);
    return false;
  }
  // The call wrote back what the QP really got.
  max_inline_ = qa.cap.max_inline_data;
  chain_.set_max_inline(max_inline_);

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port_;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const int ret = ibv_modify_qp(
      qp.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (ret != 0) {
    *error = verbs_failure(Code::kUnavailable, res_->nic_name, "ibv_modify_qp(RC INIT)", ret);
    return false;
  }
  uint32_t idx = kNoQp;
  for (uint32_t i = 0; i < qps_.size() && idx == kNoQp; ++i) {
    if (!qps_[i].qp && !qps_[i].retired) idx = i;
  }
  if (idx == kNoQp) {
    idx = static_cast<uint32_t>(qps_.size());
    qps_.emplace_back();
  }
  qps_[idx].qp = std::move(qp);
  qps_[idx].outstanding = 0;
  qps_[idx].retired = false;
  *slot = idx;
  return true;
}

void VerbsDomain::retire_qp(uint32_t slot) {
  QpSlot& q = qps_[slot];
  if (!q.qp || q.retired) return;
  if (q.outstanding == 0) {
    q.qp.reset();
    return;
  }
  // ERR flushes every outstanding WR with IBV_WC_WR_FLUSH_ERR, so each
  // transfer still gets its completion; the QP dies once they are polled
  // (destroying it now would let the provider drop those CQEs).
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (const int ret = ibv_modify_qp(q.qp.get(), &a, IBV_QP_STATE); ret != 0) {
    core::log().warn("verbs NIC '{}': ibv_modify_qp(ERR) on retired qp {:#x} failed: {}",
                     res_->nic_name, q.qp->qp_num, std::strerror(ret));
  }
  q.retired = true;
  ++retired_;
}

void VerbsDomain::reap_retired() {
  for (QpSlot& q : qps_) {
    if (q.retired && q.outstanding == 0) {
      q.qp.reset();
      q.retired = false;
      --retired_;
    }
  }
}

bool VerbsDomain::create_endpoint(Peer& p, core::PeerId id, HsClock::time_point now) {
  if (p.msg_qp != kNoQp) retire_qp(p.msg_qp);
  if (p.rma_qp != kNoQp) retire_qp(p.rma_qp);
  p.msg_qp = p.rma_qp = kNoQp;
  p.bound = false;
  Status err;
  if (!create_rc_qp(msg_srq_.get(), &p.msg_qp, &err) ||
      !create_rc_qp(rma_srq_.get(), &p.rma_qp, &err)) {
    if (p.msg_qp != kNoQp) retire_qp(p.msg_qp);
    p.msg_qp = kNoQp;
    p.failure = Status(err.code(), fmt::format("{}: {}", peer_name(id), err.message()));
    core::log().error("{}", p.failure.message());
    return false;
  }
  RcEndpoint rc;
  rc.msg_qpn = qps_[p.msg_qp].qp->qp_num;
  rc.rma_qpn = qps_[p.rma_qp].qp->qp_num;
  // Random starting PSNs: a stale packet of a previous connection between
  // the same QPNs then falls outside the receive window.
  rc.msg_psn = static_cast<uint32_t>(rng_()) & kPsnMask;
  rc.rma_psn = static_cast<uint32_t>(rng_()) & kPsnMask;
  rc.mtu = static_cast<uint8_t>(mtu_);
  p.hs->install_endpoint(rc, next_epoch_++, now);
  p.failure = Status();
  return true;
}

Status VerbsDomain::modify_rc(ibv_qp* qp, bool rma, uint32_t remote_qpn, uint32_t remote_psn,
                              uint32_t local_psn, uint8_t mtu, const UdAddress& peer_ud,
                              bool reset_first) {
  const std::string& nic = res_->nic_name;
  ibv_qp_attr a{};
  int ret = 0;
  if (reset_first) {
    // Only for QPs that never carried work (the machine guarantees it):
    // RESET drops queued WRs without completions.
    a.qp_state = IBV_QPS_RESET;
    ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
    if (ret != 0) return verbs_failure(Code::kUnavailable, nic, "ibv_modify_qp(RC RESET)", ret);
    a = {};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = port_;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ret =
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (ret != 0) return verbs_failure(Code::kUnavailable, nic, "ibv_modify_qp(RC INIT)", ret);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(mtu, mtu_));
  a.dest_qp_num = remote_qpn;
  a.rq_psn = remote_psn;  // the peer starts sending at its own PSN
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms
  a.ah_attr.port_num = port_;
  a.ah_attr.dlid = peer_ud.lid;
  if (ethernet_) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer_ud.gid.data(), 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
    a.ah_attr.grh.hop_limit = 64;
  }
  ret = ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (ret != 0) {
    return verbs_failure(Code::kUnavailable, nic,
                         rma ? "ibv_modify_qp(rma RTR)" : "ibv_modify_qp(msg RTR)", ret);
  }
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  a.retry_cnt = 7;
  a.rnr_retry = 7;       // infinite: a peer short of receives stalls us, it does not fail us
  a.sq_psn = local_psn;  // our own PSN, the one the peer's rq_psn expects
  a.max_rd_atomic = 1;
  ret = ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (ret != 0) {
    return verbs_failure(Code::kUnavailable, nic,
                         rma ? "ibv_modify_qp(rma RTS)" : "ibv_modify_qp(msg RTS)", ret);
  }
  return {};
}

Status VerbsDomain::connect_qps(Peer& p, const HsAction& a) {
  const RcEndpoint& mine = p.hs->local_rc();
  const bool reset = p.bound || a.retarget;
  Status s = modify_rc(qps_[p.msg_qp].qp.get(), false, a.peer_rc.msg_qpn, a.peer_rc.msg_psn,
                       mine.msg_psn, a.peer_rc.mtu, a.peer_ud, reset);
  if (s.is_ok()) {
    s = modify_rc(qps_[p.rma_qp].qp.get(), true, a.peer_rc.rma_qpn, a.peer_rc.rma_psn, mine.rma_psn,
                  a.peer_rc.mtu, a.peer_ud, reset);
  }
  p.bound = true;
  return s;
}

// ------------------------------------------------------------- handshake

void VerbsDomain::run_actions(core::PeerId id, const HsActions& actions) {
  Peer& p = peers_[id];
  for (const HsAction& a : actions) {
    switch (a.kind) {
      case HsAction::Kind::kSend:
        ud_send(p, a.msg);
        break;
      case HsAction::Kind::kConnectQps:
        if (Status s = connect_qps(p, a); !s.is_ok()) {
          // Do not ack an endpoint our QPs could not reach: the peer times out.
          p.failure = Status(s.code(), fmt::format("{}: {}", peer_name(id), s.message()));
          core::log().error("{}", p.failure.message());
          return;
        }
        break;
      case HsAction::Kind::kConnected:
        p.failure = Status();
        core::log().info(
            "verbs NIC '{}': connected to {}: msg qp {:#x}->{:#x}, rma qp "
            "{:#x}->{:#x}, epoch {}",
            res_->nic_name, peer_name(id), p.hs->local_rc().msg_qpn, p.hs->peer_rc().msg_qpn,
            p.hs->local_rc().rma_qpn, p.hs->peer_rc().rma_qpn, p.hs->epoch());
        break;
      case HsAction::Kind::kGiveUp:
        p.failure = Status(Code::kUnavailable,
                           fmt::format("verbs NIC '{}': {} did not complete the RC handshake "
                                       "after {} datagrams (peer down, wrong address or UD "
                                       "traffic lost)",
                                       res_->nic_name, peer_name(id), p.hs->attempts()));
        core::log().warn("{}", p.failure.message());
        break;
    }
  }
}

void VerbsDomain::hs_connect(core::PeerId id, HsClock::time_point now) {
  Peer& p = peers_[id];
  HsActions acts;
  if (p.hs->connect(now, &acts) == HsResult::kNeedEndpoint) {
    if (!create_endpoint(p, id, now)) return;
    acts.clear();
    p.hs->connect(now, &acts);
  }
  run_actions(id, acts);
  connecting_ = 0;
  for (const Peer& q : peers_) connecting_ += q.live && q.hs->state() == HsState::kConnecting;
}

void VerbsDomain::hs_datagram(const HandshakeMsg& m, HsClock::time_point now) {
  Status err;
  const core::PeerId id = find_or_create_peer(m.from, &err);
  if (!err.is_ok()) {
    core::log().warn("verbs NIC '{}': handshake from {} dropped: {}", res_->nic_name,
                     m.from.brief(), err.message());
    return;
  }
  Peer& p = peers_[id];
  HsActions acts;
  HsResult r = p.hs->on_datagram(m, now, &acts);
  if (r == HsResult::kNeedEndpoint) {
    if (!create_endpoint(p, id, now)) return;
    acts.clear();
    r = p.hs->on_datagram(m, now, &acts);
  }
  if (r == HsResult::kStale) {
    core::log().debug("verbs NIC '{}': stale handshake from {} (incarnation {:#x} epoch {})",
                      res_->nic_name, peer_name(id), m.src_incarnation, m.src_epoch);
  }
  run_actions(id, acts);
  connecting_ = 0;
  for (const Peer& q : peers_) connecting_ += q.live && q.hs->state() == HsState::kConnecting;
}

void VerbsDomain::hs_ticks(HsClock::time_point now) {
  for (core::PeerId id = 0; id < peers_.size(); ++id) {
    Peer& p = peers_[id];
    if (!p.live || p.hs->state() != HsState::kConnecting) continue;
    HsActions acts;
    p.hs->tick(now, &acts);
    run_actions(id, acts);
  }
  connecting_ = 0;
  for (const Peer& q : peers_) connecting_ += q.live && q.hs->state() == HsState::kConnecting;
}

}  // namespace ferry::verbs

// verbs Domain: open (device, port, GID, PD/TD, CQ, SRQs, UD QP) and close
// (registrations: verbs_registration.cpp; peers and their handshake:
// verbs_peers.cpp; RC QPs: verbs_rc_qps.cpp; the datapath: verbs_datapath.cpp).
#include <fcntl.h>
#include <infiniband/verbs.h>

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

}  // namespace

Status verbs_failure(Code code, const std::string& nic, const char* call, int err) {
  return Status(
      code, fmt::format("verbs NIC '{}': {} failed: {} ({})", nic, call, std::strerror(err), err));
}

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

  auto d = std::make_unique<VerbsDomain>(Key{});
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

}  // namespace ferry::verbs

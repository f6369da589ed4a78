// verbs Domain RC QPs: creation, the state transitions towards a peer's
// endpoint, and retirement once their last work request has completed.
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/log.h"
#include "verbs/verbs_domain_impl.h"

namespace ferry::verbs {

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

}  // namespace ferry::verbs

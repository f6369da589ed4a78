// verbs Domain data path: post writes / sends / receives, poll the CQ. No
// allocation here except while handling a handshake datagram from a peer
// not seen before (one-off control work that arrives through the CQ).
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/log.h"
#include "verbs/verbs_domain_impl.h"

namespace ferry::verbs {

namespace {

// Credits the engine's work may use: a few stay free for handshake datagrams,
// so a peer saturating the CQ cannot starve connection setup to others.
size_t user_credits(const CqCredits& c) {
  return c.available() > kUdSends ? c.available() - kUdSends : 0;
}

}  // namespace

Status VerbsDomain::post_error(const char* call, int ret) const {
  return Status(Code::kUnavailable, fmt::format("verbs NIC '{}': {} failed: {} ({})",
                                                res_->nic_name, call, std::strerror(ret), ret));
}

VerbsDomain::Peer* VerbsDomain::ready_peer(core::PeerId id, Status* error) {
  if (id >= peers_.size() || !peers_[id].live) {
    *error = Status(Code::kNotFound,
                    fmt::format("verbs NIC '{}': unknown or removed peer {}", res_->nic_name, id));
    return nullptr;
  }
  Peer& p = peers_[id];
  if (p.hs->state() == HsState::kConnected) {
    if (p.failure.is_ok()) return &p;
    *error = p.failure;
    return nullptr;
  }
  // Not connected yet: start or advance the handshake; the caller keeps its
  // work and retries (back-pressure) until the peer is up or has failed.
  hs_connect(id, HsClock::now());
  if (p.hs->state() == HsState::kFailed || (!p.failure.is_ok() && !p.hs->has_endpoint())) {
    *error = p.failure.is_ok()
                 ? Status(Code::kUnavailable, fmt::format("verbs NIC '{}': {} is unreachable",
                                                          res_->nic_name, peer_name(id)))
                 : p.failure;
  }
  return nullptr;
}

core::PostResult VerbsDomain::post_writes(std::span<const core::WriteDesc> writes) {
  core::PostResult result;
  CqCredits& credits = tracker_->credits();
  OpTable& ops = tracker_->ops();
  size_t i = 0;
  while (i < writes.size()) {
    Peer* p = ready_peer(writes[i].peer, &result.error);
    if (p == nullptr) break;
    QpSlot& qp = qps_[p->rma_qp];
    const size_t room = std::min<size_t>(
        {kMaxChain, writes.size() - i, user_credits(credits), kQpSendDepth - qp.outstanding});
    uint64_t ids[kMaxChain];
    size_t k = 0;
    for (; k < room && writes[i + k].peer == writes[i].peer; ++k) {
      if (writes[i + k].len > max_msg_) {
        result.error = Status(Code::kInvalidArgument,
                              fmt::format("verbs NIC '{}': write of {} bytes exceeds the port's "
                                          "max_msg_sz {}",
                                          res_->nic_name, writes[i + k].len, max_msg_));
        break;
      }
      ids[k] = ops.acquire(WrKind::kWrite, writes[i + k].ctx, p->rma_qp);
      if (ids[k] == 0) break;
    }
    if (k == 0) break;  // CQ credits, send queue or slots exhausted: back-pressure
    const size_t n = chain_.build(writes.subspan(i, k), std::span<const uint64_t>(ids, k));
    credits.take(n);
    ibv_send_wr* bad = nullptr;
    const int ret = ibv_post_send(qp.qp.get(), chain_.head(), &bad);
    const size_t accepted = ret == 0 ? n : chain_.accepted(bad);
    if (ret != 0 && bad != nullptr && accepted == 0 && bad != chain_.head()) {
      core::log().error("verbs NIC '{}': ibv_post_send returned a bad_wr outside the chain",
                        res_->nic_name);
    }
    for (size_t j = accepted; j < k; ++j) ops.release(ids[j]);
    credits.give(n - accepted);
    qp.outstanding += static_cast<uint32_t>(accepted);
    result.posted += accepted;
    i += accepted;
    if (ret != 0) {
      // ENOMEM: the send queue is full after all. Anything else is a failure.
      if (ret != ENOMEM) result.error = post_error("ibv_post_send(write)", ret);
      break;
    }
    if (!result.error.is_ok()) break;
  }
  return result;
}

core::PostResult VerbsDomain::post_send(core::PeerId peer, const void* buf, size_t len,
                                        void* local_desc, uint64_t ctx) {
  core::PostResult result;
  Peer* p = ready_peer(peer, &result.error);
  if (p == nullptr) return result;
  if (len > max_msg_) {
    result.error = Status(Code::kInvalidArgument,
                          fmt::format("verbs NIC '{}': send of {} bytes exceeds max_msg_sz {}",
                                      res_->nic_name, len, max_msg_));
    return result;
  }
  QpSlot& qp = qps_[p->msg_qp];
  if (qp.outstanding >= kQpSendDepth || user_credits(tracker_->credits()) == 0) return result;
  tracker_->credits().take(1);
  const uint64_t id = tracker_->ops().acquire(WrKind::kSend, ctx, p->msg_qp);
  if (id == 0) {
    tracker_->credits().give(1);
    return result;
  }
  build_send(&send_wr_, &send_sge_, buf, len, static_cast<const LocalKey*>(local_desc), id,
             max_inline_);
  ibv_send_wr* bad = nullptr;
  const int ret = ibv_post_send(qp.qp.get(), &send_wr_, &bad);
  if (ret == 0) {
    ++qp.outstanding;
    result.posted = 1;
    return result;
  }
  tracker_->ops().release(id);
  tracker_->credits().give(1);
  if (ret != ENOMEM) result.error = post_error("ibv_post_send(send)", ret);
  return result;
}

core::PostResult VerbsDomain::post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) {
  core::PostResult result;
  if (user_credits(tracker_->credits()) == 0) return result;
  tracker_->credits().take(1);
  const uint64_t id = tracker_->ops().acquire(WrKind::kRecv, ctx, 0);
  if (id == 0) {
    tracker_->credits().give(1);
    return result;
  }
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = static_cast<uint32_t>(std::min<size_t>(len, max_msg_));
  sge.lkey = local_desc != nullptr ? static_cast<const LocalKey*>(local_desc)->lkey : 0;
  ibv_recv_wr wr{};
  wr.wr_id = id;
  wr.sg_list = len > 0 ? &sge : nullptr;
  wr.num_sge = len > 0 ? 1 : 0;
  ibv_recv_wr* bad = nullptr;
  const int ret = ibv_post_srq_recv(msg_srq_.get(), &wr, &bad);
  if (ret == 0) {
    result.posted = 1;
    return result;
  }
  tracker_->ops().release(id);
  tracker_->credits().give(1);
  if (ret != ENOMEM) result.error = post_error("ibv_post_srq_recv", ret);
  return result;
}

bool VerbsDomain::post_ud_recv(uint32_t index) {
  if (tracker_->credits().take(1) == 0) return false;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(ud_buf_.get() + index * kUdBufSize);
  sge.length = kUdBufSize;
  sge.lkey = ud_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(WrKind::kUdRecv, 0, index);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(ud_qp_.get(), &wr, &bad) != 0) {
    tracker_->credits().give(1);
    return false;
  }
  return true;
}

bool VerbsDomain::post_rma_recv(uint32_t index) {
  if (tracker_->credits().take(1) == 0) return false;
  // Zero-length: a write-with-imm only needs a receive WR to consume; its
  // data lands through the rkey.
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(WrKind::kRmaRecv, 0, index);
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_srq_recv(rma_srq_.get(), &wr, &bad) != 0) {
    tracker_->credits().give(1);
    return false;
  }
  return true;
}

void VerbsDomain::ud_send(const Peer& p, const HandshakeMsg& m) {
  // Losing a handshake datagram is part of the protocol: with no buffer or
  // credit free, the retransmit timer sends it later.
  if (ud_send_free_count_ == 0 || !p.ah || tracker_->credits().take(1) == 0) return;
  const uint32_t index = ud_send_free_[--ud_send_free_count_];
  uint8_t* buf = ud_buf_.get() + index * kUdBufSize;
  m.encode(std::span<uint8_t, HandshakeMsg::kSize>(buf, HandshakeMsg::kSize));
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(buf);
  sge.length = HandshakeMsg::kSize;
  sge.lkey = ud_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(WrKind::kUdSend, 0, index);
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.ud.ah = p.ah.get();
  wr.wr.ud.remote_qpn = p.ud.qpn;
  wr.wr.ud.remote_qkey = p.ud.qkey;
  ibv_send_wr* bad = nullptr;
  if (const int ret = ibv_post_send(ud_qp_.get(), &wr, &bad); ret != 0) {
    tracker_->credits().give(1);
    ud_send_free_[ud_send_free_count_++] = index;
    core::log().debug("verbs NIC '{}': handshake send to {} failed: {}", res_->nic_name,
                      p.ud.brief(), std::strerror(ret));
  }
}

void VerbsDomain::on_ud_recv(uint32_t index, const ibv_wc& wc) {
  if (wc.byte_len < kGrhSize || wc.byte_len > kUdBufSize) return;
  const uint8_t* buf = ud_buf_.get() + index * kUdBufSize + kGrhSize;
  std::string why;
  const auto m = HandshakeMsg::decode(std::span<const uint8_t>(buf, wc.byte_len - kGrhSize), &why);
  if (!m) {
    core::log().debug("verbs NIC '{}': dropped datagram from qp {:#x}: {}", res_->nic_name,
                      wc.src_qp, why);
    return;
  }
  // The claimed sender must be the QP the NIC says sent it.
  if (m->from.qpn != wc.src_qp) {
    core::log().debug("verbs NIC '{}': dropped handshake claiming qpn {:#x} from qp {:#x}",
                      res_->nic_name, m->from.qpn, wc.src_qp);
    return;
  }
  hs_datagram(*m, HsClock::now());
}

bool VerbsDomain::handle_wc(const ibv_wc& wc, core::Completion* out) {
  const WcOutcome o = tracker_->on_wc(wc, out);
  switch (o.kind) {
    case WrKind::kWrite:
    case WrKind::kSend:
      if (o.slot_found && o.owner < qps_.size() && qps_[o.owner].outstanding > 0) {
        --qps_[o.owner].outstanding;
      }
      break;
    case WrKind::kRmaRecv:
      if (o.repost && !post_rma_recv(o.index)) {
        core::log().warn("verbs NIC '{}': could not re-post immediate receive {}", res_->nic_name,
                         o.index);
      }
      break;
    case WrKind::kUdRecv:
      if (o.ud_payload) on_ud_recv(o.index, wc);
      if (o.repost) post_ud_recv(o.index);
      break;
    case WrKind::kUdSend:
      if (o.index >= kUdRecvs && o.index < kUdRecvs + kUdSends) {
        ud_send_free_[ud_send_free_count_++] = o.index;
      }
      break;
    case WrKind::kRecv:
    case WrKind::kNone:
      break;
  }
  return o.emit;
}

size_t VerbsDomain::poll(std::span<core::Completion> out) {
  if (retired_ > 0) reap_retired();
  if (connecting_ > 0) {
    const auto now = HsClock::now();
    if (now >= next_tick_) {
      hs_ticks(now);
      next_tick_ = now + std::chrono::milliseconds(1);
    }
  }
  size_t n = 0;
  if (stashed_ && !out.empty()) {
    // Taken by can_block; older than anything still in the CQ.
    stashed_ = false;
    if (handle_wc(stashed_wc_, &out[n])) ++n;
  }
  while (n < out.size()) {
    ibv_wc wcs[kPollBatch];
    // Each CQE yields at most one Completion: never take more than fits.
    const int want = static_cast<int>(std::min<size_t>(kPollBatch, out.size() - n));
    const int got = ibv_poll_cq(cq_.get(), want, wcs);
    if (got < 0) {
      if (!cq_failure_logged_) {
        cq_failure_logged_ = true;
        core::log().error("verbs NIC '{}': ibv_poll_cq failed ({})", res_->nic_name, got);
      }
      break;
    }
    for (int i = 0; i < got; ++i) {
      if (handle_wc(wcs[i], &out[n])) ++n;
    }
    if (got < want) break;  // drained
  }
  return n;
}

bool VerbsDomain::can_block() {
  if (!channel_ || stashed_) return false;
  // The raw calls CqNotify sequences (verbs_notify.h).
  struct Ops {
    VerbsDomain& d;
    bool get_event() {
      ibv_cq* cq = nullptr;
      void* cq_ctx = nullptr;
      if (ibv_get_cq_event(d.channel_.get(), &cq, &cq_ctx) == 0) return true;
      if (errno != EAGAIN && errno != EWOULDBLOCK && !d.channel_failure_logged_) {
        d.channel_failure_logged_ = true;
        core::log().warn("verbs NIC '{}': ibv_get_cq_event failed: {}", d.res_->nic_name,
                         std::strerror(errno));
      }
      return false;
    }
    void ack(uint32_t n) { ibv_ack_cq_events(d.cq_.get(), n); }
    int arm() {
      const int ret = ibv_req_notify_cq(d.cq_.get(), 0);
      if (ret != 0 && !d.channel_failure_logged_) {
        d.channel_failure_logged_ = true;
        core::log().warn("verbs NIC '{}': ibv_req_notify_cq failed: {}", d.res_->nic_name,
                         std::strerror(ret));
      }
      return ret;
    }
    bool poll_one() {
      const int got = ibv_poll_cq(d.cq_.get(), 1, &d.stashed_wc_);
      d.stashed_ = got > 0;
      return got != 0;  // an error: do not block, let poll() report it
    }
  };
  Ops ops{*this};
  return notify_.can_block(ops);
}

}  // namespace ferry::verbs

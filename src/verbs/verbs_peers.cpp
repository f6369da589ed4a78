// verbs Domain peers: their address handles, and the driver of their
// handshake machines (verbs_handshake.h), which asks for RC QPs
// (verbs_rc_qps.cpp) and sends datagrams on the UD QP.
#include <infiniband/verbs.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "verbs/verbs_domain_impl.h"

namespace ferry::verbs {

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

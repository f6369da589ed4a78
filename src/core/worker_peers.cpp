// Peers of a worker: resolving addresses per NIC (with restarted and failed
// peers recognised), and peer groups.
#include <fmt/format.h>

#include "core/log.h"
#include "core/worker.h"

namespace ferry::core {

namespace {
// A failed peer fails fast for this long, then the transport may try again.
constexpr auto kDeadPeerCooldown = std::chrono::seconds(1);
}  // namespace

PeerId Worker::resolve(uint8_t nic, const NetAddr& addr, Status* err) {
  auto& n = nics_[nic];
  if (!dead_.empty()) {
    if (auto d = dead_.find(addr); d != dead_.end()) {
      // Fail fast for a while, then let the transport try again: an error
      // may have been transient, and a real loss shows up again at once.
      if (Clock::now() - d->second.since < kDeadPeerCooldown) {
        *err = Status(Code::kUnavailable, fmt::format("peer {} failed earlier: {}", addr.brief(),
                                                      d->second.why.message()));
        return 0;
      }
      dead_.erase(d);
    }
  }
  auto it = n.peers.find(addr);
  if (it != n.peers.end()) return it->second;
  if (addr.transport() != infos_[nic].transport) {
    *err = Status(Code::kInvalidArgument,
                  fmt::format("address {} is not a {} address (NIC {})", addr.brief(),
                              infos_[nic].provider, infos_[nic].name));
    return 0;
  }
  if (n.stale.count(addr)) {
    *err = Status(Code::kAborted,
                  fmt::format("address {} belongs to a previous incarnation of a peer that has "
                              "restarted; use its new address or descriptor",
                              addr.brief()));
    return 0;
  }
  std::string raw(reinterpret_cast<const char*>(addr.raw().data()), addr.raw().size());
  if (auto old = n.latest.find(raw); old != n.latest.end() && !(old->second == addr)) {
    // Same endpoint bytes, new incarnation: the peer restarted. Retire the old
    // entry so nothing resolves to it any more.
    log().info("NIC {}: peer {} restarted (was {}); the old address is now stale", infos_[nic].name,
               addr.brief(), old->second.brief());
    if (auto p = n.peers.find(old->second); p != n.peers.end()) {
      n.domain->remove_peer(p->second);
      stats_.forget_peer(nic, p->second);
      n.peers.erase(p);
    }
    n.stale.insert(old->second);
    stale_epoch_++;
  }
  PeerId id = n.domain->add_peer(addr.raw(), err);
  if (!err->is_ok()) {
    *err = Status(err->code(), fmt::format("peer {} via NIC {}: {}", addr.brief(), infos_[nic].name,
                                           err->message()));
    return 0;
  }
  n.peers.emplace(addr, id);
  n.latest[raw] = addr;
  stats_.peer_resolved(nic, id, addr.brief());
  return id;
}

void Worker::mark_dead(const NetAddr& addr, const Status& why) {
  auto [it, fresh] = dead_.try_emplace(addr, DeadPeer{why, Clock::now()});
  if (fresh)
    log().warn("worker {}: peer {} marked failed: {}", index_, addr.brief(), why.message());
  it->second.since = Clock::now();
}

const std::vector<PeerId>* Worker::group_peers(PeerGroupHandle group, size_t targets, Status* err) {
  if (group >= groups_.size()) {
    *err = Status(Code::kNotFound, fmt::format("peer group {} not found", group));
    return nullptr;
  }
  auto& g = *groups_[group];
  if (g.epoch != stale_epoch_) {
    // A peer restarted since the group was made: refuse groups naming it.
    for (auto& peer : g.addrs)
      for (uint8_t k = 0; k < nics_.size(); ++k)
        if (nics_[k].stale.count(peer[k])) {
          *err = Status(Code::kAborted, fmt::format("peer group {} names {}, a peer that has "
                                                    "restarted; make a new group from its new "
                                                    "descriptor",
                                                    group, peer[k].brief()));
          return nullptr;
        }
    g.epoch = stale_epoch_;
  }
  if (g.addrs.size() != targets) {
    *err = Status(Code::kInvalidArgument,
                  fmt::format("peer group {} has {} peers but the request has {} targets", group,
                              g.addrs.size(), targets));
    return nullptr;
  }
  return &g.peers;
}

MappedRemote Worker::map_remote_wt(const MrDesc& dst, uint64_t offset, size_t len, Status* err) {
  Status last(Code::kUnimplemented, "no NIC of this group");
  const size_t n = std::min(nics_.size(), dst.nics.size());
  for (uint8_t k = 0; k < n; ++k) {
    const auto& nic = dst.nics[k];
    Status e;
    const PeerId peer = resolve(k, nic.addr, &e);
    if (!e.is_ok()) {
      last = std::move(e);
      continue;
    }
    MappedRemote m = nics_[k].domain->map_remote(peer, nic.rkey, nic.base + offset, len, &e);
    if (e.is_ok()) {
      *err = Status::ok();
      return m;
    }
    last = Status(e.code(), fmt::format("NIC {} ({}), peer {}: {}", infos_[k].name,
                                        infos_[k].provider, nic.addr.brief(), e.message()));
  }
  *err = std::move(last);
  return {};
}

PeerGroupHandle Worker::add_peer_group_wt(const std::vector<std::vector<NetAddr>>& peers,
                                          Status* err) {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g]->addrs == peers) return g;
  auto pgp = std::make_unique<PeerGroup>();
  auto& pg = *pgp;
  pg.addrs = peers;
  pg.epoch = stale_epoch_;
  pg.peers.resize(peers.size() * kMaxNics);
  for (size_t t = 0; t < peers.size(); ++t) {
    for (uint8_t k = 0; k < nics_.size(); ++k) {
      pg.peers[t * kMaxNics + k] = resolve(k, peers[t][k], err);
      if (!err->is_ok()) return 0;
    }
  }
  groups_.push_back(std::move(pgp));
  return groups_.size() - 1;
}

}  // namespace ferry::core

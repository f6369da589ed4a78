// tcp peers whose process has gone (see SocketPeer and ConnectProbe).
#include <netinet/in.h>

#include <arpa/inet.h>

#include <fmt/format.h>

#include "core/log.h"
#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

namespace {

// A write or send in flight for two scans running (0.5 to 0.75 s) makes its
// peer suspect; a live peer is asked at most once a second.
constexpr auto kStallScanPeriod = std::chrono::milliseconds(250);
constexpr uint32_t kStallScans = 2;
constexpr auto kProbePeriod = std::chrono::seconds(1);
constexpr auto kProbeTimeout = std::chrono::milliseconds(500);

std::string sockaddr_text(std::span<const uint8_t> raw) {
  sa_family_t family = 0;
  std::memcpy(&family, raw.data(), sizeof(family));
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (family == AF_INET) {
    sockaddr_in in{};
    std::memcpy(&in, raw.data(), sizeof(in));
    ::inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    port = ntohs(in.sin_port);
    return fmt::format("{}:{}", host, port);
  }
  sockaddr_in6 in6{};
  std::memcpy(&in6, raw.data(), sizeof(in6));
  ::inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
  port = ntohs(in6.sin6_port);
  return fmt::format("[{}]:{}", host, port);
}

}  // namespace

void FabricDomain::track_socket_peer(fi_addr_t addr, std::span<const uint8_t> raw) {
  if (!ConnectProbe::is_inet(raw)) return;
  auto p = std::make_unique<SocketPeer>();
  p->addr.assign(raw.begin(), raw.end());
  if (auto old = socket_peers_.find(addr); old != socket_peers_.end())
    forget_socket_peer(*old->second);
  socket_peers_[addr] = std::move(p);
}

void FabricDomain::forget_socket_peer(const SocketPeer& p) {
  if (p.dead && dead_socket_peers_ > 0) --dead_socket_peers_;
  if (p.eagain_since != Clock::time_point{} && refusing_peers_ > 0) --refusing_peers_;
}

void FabricDomain::take_probe_answer(SocketPeer& p, ConnectProbe::Answer answer) {
  if (answer != ConnectProbe::Answer::kRefused || p.dead) return;
  p.dead = true;
  if (p.eagain_since != Clock::time_point{}) {
    p.eagain_since = {};
    if (refusing_peers_ > 0) --refusing_peers_;
  }
  ++dead_socket_peers_;
  orphan_scan_ = true;
  orphan_pos_ = 0;
  core::log().warn(
      "fabric NIC '{}': peer {} refuses connections (nothing listens there: its process has "
      "gone); failing what is in flight to it and refusing further work",
      res_->nic_name, sockaddr_text(p.addr));
}

void FabricDomain::scan_for_stalled_peers(Clock::time_point now) {
  next_stall_scan_ = now + kStallScanPeriod;
  if (++scan_ == 0) scan_ = 1;  // 0 marks an entry not seen yet
  for (auto& [addr, p] : socket_peers_)
    if (p->probe.pending()) take_probe_answer(*p, p->probe.poll(now, kProbeTimeout));
  for (size_t i = 0; i < pool_->capacity(); ++i) {
    OpEntry* op = pool_->at(i);
    if (op->kind != OpKind::kWrite && op->kind != OpKind::kSend) continue;
    if (op->seen_scan == 0) {
      op->seen_scan = scan_;
      continue;
    }
    if (scan_ - op->seen_scan < kStallScans) continue;
    SocketPeer* p = socket_peer(op->peer);
    if (p == nullptr || p->dead || p->probe.pending() || now < p->next_probe) continue;
    p->next_probe = now + kProbePeriod;
    take_probe_answer(*p, p->probe.start(p->addr, now));
  }
}

void FabricDomain::note_socket_post(fi_addr_t peer, ssize_t ret) {
  if (ret != -FI_EAGAIN) {
    // The common case costs one compare: only while some peer refuses posts is
    // the one that took this post looked up (a peer that takes posts is not
    // suspect).
    if (ret == 0 && refusing_peers_ > 0)
      if (SocketPeer* p = socket_peer(peer);
          p != nullptr && p->eagain_since != Clock::time_point{}) {
        p->eagain_since = {};
        --refusing_peers_;
      }
    return;
  }
  SocketPeer* p = socket_peer(peer);
  if (p == nullptr || p->dead) return;
  const auto now = Clock::now();
  if (p->probe.pending()) {
    take_probe_answer(*p, p->probe.poll(now, kProbeTimeout));
    return;
  }
  if (p->eagain_since == Clock::time_point{}) {
    p->eagain_since = now;
    ++refusing_peers_;
    return;
  }
  if (now - p->eagain_since < kStallScans * kStallScanPeriod || now < p->next_probe) return;
  p->next_probe = now + kProbePeriod;
  take_probe_answer(*p, p->probe.start(p->addr, now));
}

Status FabricDomain::dead_socket_peer_status(const SocketPeer& p, const char* what) const {
  return Status(Code::kUnavailable,
                fmt::format("fabric NIC '{}': {} peer {}: it refuses connections (its process "
                            "has gone)",
                            res_->nic_name, what, sockaddr_text(p.addr)));
}

bool FabricDomain::peer_dead(fi_addr_t peer, const char* what, Status* status) const {
  if (!shm_peers_.empty()) {
    auto it = shm_peers_.find(peer);
    if (it != shm_peers_.end() && it->second->dead) {
      if (status != nullptr) *status = dead_peer_status(*it->second, what);
      return true;
    }
  }
  if (dead_socket_peers_ > 0) {
    auto it = socket_peers_.find(peer);
    if (it != socket_peers_.end() && it->second->dead) {
      if (status != nullptr) *status = dead_socket_peer_status(*it->second, what);
      return true;
    }
  }
  return false;
}

}  // namespace ferry::fabric

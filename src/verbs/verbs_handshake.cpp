#include "verbs/verbs_handshake.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace ferry::verbs {

namespace {

// Explicit little-endian: the peer may be another architecture and the
// decoder must never read past what it checked.
class Writer {
 public:
  explicit Writer(uint8_t* p) : p_(p) {}
  void u8(uint8_t v) { *p_++ = v; }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const uint8_t* b, size_t n) {
    std::memcpy(p_, b, n);
    p_ += n;
  }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) *p_++ = static_cast<uint8_t>(v >> (8 * i));
  }
  uint8_t* p_;
};

class Reader {
 public:
  explicit Reader(const uint8_t* p) : p_(p) {}
  uint8_t u8() { return *p_++; }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  void bytes(uint8_t* b, size_t n) {
    std::memcpy(b, p_, n);
    p_ += n;
  }

 private:
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(*p_++) << (8 * i);
    return v;
  }
  const uint8_t* p_;
};

void encode_ud(Writer& w, const UdAddress& a) {
  w.bytes(a.gid.data(), a.gid.size());
  w.u16(a.lid);
  w.u32(a.qpn);
  w.u32(a.qkey);
}

UdAddress decode_ud(Reader& r) {
  UdAddress a;
  r.bytes(a.gid.data(), a.gid.size());
  a.lid = r.u16();
  a.qpn = r.u32();
  a.qkey = r.u32();
  return a;
}

bool fail(std::string* why, std::string text) {
  if (why != nullptr) *why = std::move(text);
  return false;
}

}  // namespace

// ------------------------------------------------------------- UdAddress

void UdAddress::encode(std::span<uint8_t, kSize> out) const noexcept {
  Writer w(out.data());
  encode_ud(w, *this);
}

std::array<uint8_t, UdAddress::kSize> UdAddress::to_bytes() const noexcept {
  std::array<uint8_t, kSize> b{};
  encode(b);
  return b;
}

std::optional<UdAddress> UdAddress::decode(std::span<const uint8_t> in, std::string* why) {
  if (in.size() != kSize) {
    fail(why, fmt::format("verbs address must be {} bytes (GID, LID, QPN, QKey), got {}", kSize,
                          in.size()));
    return std::nullopt;
  }
  Reader r(in.data());
  UdAddress a = decode_ud(r);
  if (a.qpn == 0 || a.qpn > kQpnMask) {
    fail(why, fmt::format("verbs address has invalid UD QPN {:#x}", a.qpn));
    return std::nullopt;
  }
  return a;
}

std::string UdAddress::brief() const {
  // The interface ID (last 8 bytes) tells hosts apart; with RoCEv2 IPv4 GIDs
  // the last 4 bytes are the IP address.
  return fmt::format("gid ..{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}/lid {}/qpn {:#x}", gid[10],
                     gid[11], gid[12], gid[13], gid[14], gid[15], lid, qpn);
}

// ----------------------------------------------------------- HandshakeMsg

void HandshakeMsg::encode(std::span<uint8_t, kSize> out) const noexcept {
  Writer w(out.data());
  w.u32(kMagic);
  w.u8(kVersion);
  w.u8(flags);
  w.u16(0);
  w.u64(src_incarnation);
  w.u32(src_epoch);
  w.u64(dst_incarnation);
  w.u32(dst_epoch);
  encode_ud(w, from);
  w.u32(rc.msg_qpn);
  w.u32(rc.msg_psn);
  w.u32(rc.rma_qpn);
  w.u32(rc.rma_psn);
  w.u8(rc.mtu);
}

std::optional<HandshakeMsg> HandshakeMsg::decode(std::span<const uint8_t> in, std::string* why) {
  if (in.size() < kSize) {
    fail(why, fmt::format("handshake datagram too short: {} < {} bytes", in.size(), kSize));
    return std::nullopt;
  }
  Reader r(in.data());
  if (const uint32_t magic = r.u32(); magic != kMagic) {
    fail(why, fmt::format("handshake datagram has bad magic {:#010x}", magic));
    return std::nullopt;
  }
  if (const uint8_t version = r.u8(); version != kVersion) {
    fail(why, fmt::format("handshake version {} not supported (this build speaks {})", version,
                          kVersion));
    return std::nullopt;
  }
  HandshakeMsg m;
  m.flags = r.u8();
  (void)r.u16();  // reserved
  m.src_incarnation = r.u64();
  m.src_epoch = r.u32();
  m.dst_incarnation = r.u64();
  m.dst_epoch = r.u32();
  m.from = decode_ud(r);
  m.rc.msg_qpn = r.u32();
  m.rc.msg_psn = r.u32();
  m.rc.rma_qpn = r.u32();
  m.rc.rma_psn = r.u32();
  m.rc.mtu = r.u8();

  if ((m.flags & ~kKnownFlags) != 0) {
    fail(why, fmt::format("handshake has unknown flags {:#x}", m.flags));
    return std::nullopt;
  }
  if (m.src_incarnation == 0 || m.src_epoch == 0) {
    fail(why, "handshake without sender incarnation or epoch");
    return std::nullopt;
  }
  // The ack fields are all-or-nothing, and "connected" implies an ack.
  const bool has_dst = m.dst_incarnation != 0 || m.dst_epoch != 0;
  if (m.ack() != has_dst || (m.ack() && (m.dst_incarnation == 0 || m.dst_epoch == 0)) ||
      (m.connected() && !m.ack())) {
    fail(why, fmt::format("handshake ack fields inconsistent (flags {:#x})", m.flags));
    return std::nullopt;
  }
  const auto qpn_ok = [](uint32_t q) { return q != 0 && q <= kQpnMask; };
  if (!qpn_ok(m.from.qpn) || !qpn_ok(m.rc.msg_qpn) || !qpn_ok(m.rc.rma_qpn)) {
    fail(why, fmt::format("handshake has invalid QPN (ud {:#x}, msg {:#x}, rma {:#x})", m.from.qpn,
                          m.rc.msg_qpn, m.rc.rma_qpn));
    return std::nullopt;
  }
  if (m.rc.msg_psn > kPsnMask || m.rc.rma_psn > kPsnMask) {
    fail(why, fmt::format("handshake PSN out of 24-bit range (msg {:#x}, rma {:#x})", m.rc.msg_psn,
                          m.rc.rma_psn));
    return std::nullopt;
  }
  if (m.rc.mtu < 1 || m.rc.mtu > 5) {
    fail(why, fmt::format("handshake MTU code {} outside 1..5", m.rc.mtu));
    return std::nullopt;
  }
  return m;
}

// ------------------------------------------------------------- machine

uint64_t make_incarnation(uint64_t random_bits) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const uint64_t v = (static_cast<uint64_t>(ns) & ~uint64_t{0xFFFF}) | (random_bits & 0xFFFF);
  return v == 0 ? 1 : v;
}

const char* hs_state_name(HsState s) noexcept {
  switch (s) {
    case HsState::kIdle:
      return "idle";
    case HsState::kConnecting:
      return "connecting";
    case HsState::kConnected:
      return "connected";
    case HsState::kFailed:
      return "failed";
  }
  return "?";
}

HandshakeMsg HandshakeMachine::make_msg() const {
  HandshakeMsg m;
  m.src_incarnation = local_->incarnation;
  m.src_epoch = epoch_;
  m.from = local_->ud;
  m.rc = rc_;
  if (peer_applied_) {
    m.flags |= HandshakeMsg::kFlagAck;
    m.dst_incarnation = peer_inc_;
    m.dst_epoch = peer_epoch_;
    if (state_ == HsState::kConnected) m.flags |= HandshakeMsg::kFlagConnected;
  }
  return m;
}

void HandshakeMachine::send(HsActions* out) const {
  HsAction a;
  a.kind = HsAction::Kind::kSend;
  a.msg = make_msg();
  out->push(a);
}

void HandshakeMachine::schedule_first(HsClock::time_point now) {
  state_ = HsState::kConnecting;
  attempts_ = 0;
  rto_ = cfg_.initial_rto;
  next_retx_ = now;
}

void HandshakeMachine::install_endpoint(const RcEndpoint& rc, uint32_t epoch,
                                        HsClock::time_point now) {
  rc_ = rc;
  epoch_ = epoch;
  used_ = false;
  peer_applied_ = false;
  peer_acked_ = false;
  schedule_first(now);
}

HsResult HandshakeMachine::connect(HsClock::time_point now, HsActions* out) {
  if (epoch_ == 0) return HsResult::kNeedEndpoint;
  if (state_ == HsState::kFailed) {
    if (now - failed_at_ < cfg_.retry_cooldown) return HsResult::kOk;
    schedule_first(now);
  }
  tick(now, out);
  return HsResult::kOk;
}

void HandshakeMachine::tick(HsClock::time_point now, HsActions* out) {
  if (state_ != HsState::kConnecting || now < next_retx_) return;
  if (attempts_ >= cfg_.max_attempts) {
    state_ = HsState::kFailed;
    failed_at_ = now;
    HsAction a;
    a.kind = HsAction::Kind::kGiveUp;
    out->push(a);
    return;
  }
  send(out);
  ++attempts_;
  next_retx_ = now + rto_;
  rto_ = std::min(rto_ * 2, cfg_.max_rto);
}

HsResult HandshakeMachine::on_datagram(const HandshakeMsg& m, HsClock::time_point now,
                                       HsActions* out) {
  // Addressed to an earlier life of this domain.
  if (m.dst_incarnation != 0 && m.dst_incarnation != local_->incarnation) return HsResult::kStale;
  // Reordered behind a newer incarnation or endpoint of the peer.
  if (peer_inc_ != 0) {
    if (m.src_incarnation < peer_inc_) return HsResult::kStale;
    if (m.src_incarnation == peer_inc_ && m.src_epoch < peer_epoch_) return HsResult::kStale;
  }
  const bool changed = m.src_incarnation != peer_inc_ || m.src_epoch != peer_epoch_;
  if (epoch_ == 0) return HsResult::kNeedEndpoint;
  // Our QPs are bound to a peer endpoint that no longer exists and may hold
  // posted work: they cannot be re-targeted without losing completions.
  if (changed && peer_applied_ && used_) return HsResult::kNeedEndpoint;

  bool learned = false;
  if (!peer_applied_ || changed) {
    HsAction a;
    a.kind = HsAction::Kind::kConnectQps;
    a.retarget = peer_applied_;
    a.peer_rc = m.rc;
    a.peer_ud = m.from;
    out->push(a);
    // An ack from a previous endpoint of the peer says nothing about its
    // current QPs.
    if (changed) peer_acked_ = false;
    peer_inc_ = m.src_incarnation;
    peer_epoch_ = m.src_epoch;
    peer_rc_ = m.rc;
    peer_ud_ = m.from;
    peer_applied_ = true;
    learned = true;
  }
  if (m.ack() && m.dst_incarnation == local_->incarnation && m.dst_epoch == epoch_) {
    peer_acked_ = true;
  }
  if (state_ == HsState::kFailed) {
    // The peer is alive after all: start over with a fresh retry budget.
    schedule_first(now);
    next_retx_ = now + rto_;
  }
  if (state_ == HsState::kConnecting && peer_applied_ && peer_acked_) {
    state_ = HsState::kConnected;
    used_ = true;
    HsAction a;
    a.kind = HsAction::Kind::kConnected;
    out->push(a);
  }
  // Reply when the peer lacks something we have: our current endpoint, our
  // ack of its endpoint, or the news that we are connected. A message that
  // already says all of that gets no reply, which ends the exchange.
  const bool peer_lacks_endpoint = !m.ack() || m.dst_epoch != epoch_;
  const bool peer_lacks_connected = state_ == HsState::kConnected && !m.connected();
  if (learned || peer_lacks_endpoint || peer_lacks_connected) {
    send(out);
    // A reply sent when the timer is due anyway counts as that transmission
    // (a passive side installs its endpoint with the timer due now).
    if (state_ == HsState::kConnecting && now >= next_retx_) {
      ++attempts_;
      next_retx_ = now + rto_;
      rto_ = std::min(rto_ * 2, cfg_.max_rto);
    }
  }
  return HsResult::kOk;
}

}  // namespace ferry::verbs

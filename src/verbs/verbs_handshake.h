// Per-peer RC connection handshake carried over the UD QP: wire format and a
// pure state machine (no verbs calls; events in, actions out), so that loss,
// duplication, reordering, simultaneous connects and peer restarts can be
// tested without a NIC.
//
// Protocol summary (docs/VERBS.md has the long form):
//  - Each side owns an *endpoint*: its two RC QPs (msg, rma) with their QPNs
//    and random 24-bit starting PSNs, tagged with an epoch taken from a
//    domain-wide counter (never reused within one incarnation).
//  - A message carries the sender's incarnation, epoch and endpoint, plus
//    (flag kAck) the receiver's incarnation and epoch that the sender has
//    applied to its QPs, plus (flag kConnected) whether the sender considers
//    the connection up.
//  - Connected = we applied the peer's endpoint to our QPs AND the peer acked
//    our current epoch (so its QPs are at least RTR before we post).
//  - Until then the message is retransmitted with exponential backoff; after
//    max_attempts the peer is marked failed.
//  - Higher incarnation = restarted peer; higher epoch = the peer replaced its
//    QPs. Lower values are stale datagrams and are dropped. A connection whose
//    QPs have carried traffic is never re-targeted in place: it asks for a
//    fresh endpoint (the driver retires the old QPs through the error state so
//    their work requests complete with flush errors).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ferry::verbs {

using HsClock = std::chrono::steady_clock;

inline constexpr uint32_t kPsnMask = 0xFFFFFF;  // PSNs and QPNs are 24-bit on the wire
inline constexpr uint32_t kQpnMask = 0xFFFFFF;

// The raw address a verbs domain publishes: its UD QP.
//   GID(16) | LID(u16 LE) | QPN(u32 LE) | QKey(u32 LE)  = 26 bytes
struct UdAddress {
  static constexpr size_t kSize = 26;
  std::array<uint8_t, 16> gid{};
  uint16_t lid = 0;
  uint32_t qpn = 0;
  uint32_t qkey = 0;

  void encode(std::span<uint8_t, kSize> out) const noexcept;
  std::array<uint8_t, kSize> to_bytes() const noexcept;
  // Strict: exact size and a 24-bit QPN; `why` names what is wrong.
  static std::optional<UdAddress> decode(std::span<const uint8_t> in, std::string* why);
  std::string brief() const;  // "gid fe80::…/lid 3/qpn 0x1a2b" for messages
  bool operator==(const UdAddress&) const = default;
};

// One side's half of the two RC connections to a peer.
struct RcEndpoint {
  uint32_t msg_qpn = 0;
  uint32_t msg_psn = 0;
  uint32_t rma_qpn = 0;
  uint32_t rma_psn = 0;
  uint8_t mtu = 0;  // ibv_mtu value 1..5 (256..4096 bytes); path MTU = min of both sides
  bool operator==(const RcEndpoint&) const = default;
};

struct HandshakeMsg {
  static constexpr uint32_t kMagic = 0x48595246;  // "FRYH" little-endian
  static constexpr uint8_t kVersion = 1;
  // magic 4 | version 1 | flags 1 | reserved 2 | src inc 8 | src epoch 4 |
  // dst inc 8 | dst epoch 4 | from UD 26 | msg qpn 4 | msg psn 4 |
  // rma qpn 4 | rma psn 4 | mtu 1
  static constexpr size_t kSize = 4 + 1 + 1 + 2 + 8 + 4 + 8 + 4 + UdAddress::kSize + 16 + 1;
  static constexpr uint8_t kFlagAck = 1;        // dst_* valid: sender applied that endpoint
  static constexpr uint8_t kFlagConnected = 2;  // sender has our ack: it needs no reply
  static constexpr uint8_t kKnownFlags = kFlagAck | kFlagConnected;

  uint8_t flags = 0;
  uint64_t src_incarnation = 0;
  uint32_t src_epoch = 0;
  uint64_t dst_incarnation = 0;
  uint32_t dst_epoch = 0;
  UdAddress from;
  RcEndpoint rc;

  bool ack() const { return (flags & kFlagAck) != 0; }
  bool connected() const { return (flags & kFlagConnected) != 0; }

  void encode(std::span<uint8_t, kSize> out) const noexcept;
  // Never trusts the bytes: size, magic, version, flag bits, 24-bit QPNs and
  // PSNs, MTU range and non-zero identities are all checked. Longer input is
  // accepted (a later minor revision may append fields).
  static std::optional<HandshakeMsg> decode(std::span<const uint8_t> in, std::string* why);
};

struct HandshakeConfig {
  HsClock::duration initial_rto = std::chrono::milliseconds(50);
  HsClock::duration max_rto = std::chrono::seconds(2);
  // Datagrams sent by the retransmit timer before giving up (the first send
  // counts). Defaults: ~11 s in all.
  uint32_t max_attempts = 10;
  // A failed peer is not retried by a post sooner than this after the failure
  // (a datagram from it revives it at once).
  HsClock::duration retry_cooldown = std::chrono::seconds(1);
};

// What the local domain is: shared by all its peers' machines.
struct LocalIdentity {
  uint64_t incarnation = 0;  // non-zero; larger = later (see make_incarnation)
  UdAddress ud;
};

// Time-ordered, so that a restarted process is recognisably newer even when
// its datagrams are reordered with its predecessor's: wall-clock nanoseconds
// with the low 16 bits random (two opens within 65 us of each other still
// differ, and ordering across restarts only needs millisecond resolution).
uint64_t make_incarnation(uint64_t random_bits);

enum class HsState : uint8_t { kIdle, kConnecting, kConnected, kFailed };
const char* hs_state_name(HsState s) noexcept;

struct HsAction {
  enum class Kind : uint8_t {
    kSend,        // send `msg` to the peer's UD address
    kConnectQps,  // bring our QPs to RTS towards `peer_rc` (retarget: RESET them first)
    kConnected,   // the peer is usable: ops held back for it may be posted
    kGiveUp,      // handshake failed: fail what waits for this peer
  };
  Kind kind = Kind::kSend;
  bool retarget = false;
  HandshakeMsg msg;    // kSend
  RcEndpoint peer_rc;  // kConnectQps
  UdAddress peer_ud;   // kConnectQps
};

// Fixed capacity: one event never produces more than this many actions, and
// the datapath (poll) must not allocate.
class HsActions {
 public:
  static constexpr size_t kCapacity = 4;
  void push(const HsAction& a) noexcept {
    if (n_ < kCapacity) items_[n_++] = a;
  }
  size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  const HsAction& operator[](size_t i) const noexcept { return items_[i]; }
  const HsAction* begin() const noexcept { return items_.data(); }
  const HsAction* end() const noexcept { return items_.data() + n_; }
  void clear() noexcept { n_ = 0; }

 private:
  std::array<HsAction, kCapacity> items_{};
  size_t n_ = 0;
};

// Result of an event. kNeedEndpoint: the machine cannot proceed without a
// fresh local endpoint (none yet, or the current one is bound to a peer
// incarnation/epoch that is gone and has carried traffic). The driver then
// retires the current QPs (if any), creates new ones, calls
// install_endpoint() and delivers the same event again.
enum class HsResult : uint8_t { kOk, kNeedEndpoint, kStale };

class HandshakeMachine {
 public:
  HandshakeMachine(const LocalIdentity* local, HandshakeConfig config)
      : local_(local), cfg_(config) {}

  // The user wants to use the peer (first post, or a post after a failure).
  HsResult connect(HsClock::time_point now, HsActions* out);
  // A decoded datagram from this peer arrived.
  HsResult on_datagram(const HandshakeMsg& m, HsClock::time_point now, HsActions* out);
  // Retransmission / give-up timer.
  void tick(HsClock::time_point now, HsActions* out);

  // A fresh endpoint (new QPs in RESET/INIT, new PSNs, a new epoch). Resets
  // what we know about the peer's acks; keeps the highest peer incarnation
  // and epoch seen, so stale datagrams stay stale.
  void install_endpoint(const RcEndpoint& rc, uint32_t epoch, HsClock::time_point now);

  HsState state() const noexcept { return state_; }
  bool has_endpoint() const noexcept { return epoch_ != 0; }
  const RcEndpoint& local_rc() const noexcept { return rc_; }
  uint32_t epoch() const noexcept { return epoch_; }
  // The peer's endpoint our QPs are connected to (valid when peer_applied()).
  const RcEndpoint& peer_rc() const noexcept { return peer_rc_; }
  bool peer_applied() const noexcept { return peer_applied_; }
  uint64_t peer_incarnation() const noexcept { return peer_inc_; }
  uint32_t attempts() const noexcept { return attempts_; }
  HsClock::time_point next_timer() const noexcept { return next_retx_; }

 private:
  HandshakeMsg make_msg() const;
  void send(HsActions* out) const;
  void schedule_first(HsClock::time_point now);

  const LocalIdentity* local_;
  HandshakeConfig cfg_;
  HsState state_ = HsState::kIdle;

  RcEndpoint rc_;
  uint32_t epoch_ = 0;  // 0 = no endpoint yet
  // The current endpoint was Connected: its QPs may have carried work
  // requests, so it must not be re-targeted in place.
  bool used_ = false;

  uint64_t peer_inc_ = 0;    // highest seen
  uint32_t peer_epoch_ = 0;  // highest seen within peer_inc_
  RcEndpoint peer_rc_;
  UdAddress peer_ud_;
  bool peer_applied_ = false;  // peer_rc_ applied to the current endpoint
  bool peer_acked_ = false;    // peer applied our current epoch

  uint32_t attempts_ = 0;
  HsClock::duration rto_{};
  HsClock::time_point next_retx_{};
  HsClock::time_point failed_at_{};
};

}  // namespace ferry::verbs

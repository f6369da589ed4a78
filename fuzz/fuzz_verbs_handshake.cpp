// Fuzzes the verbs domain's handshake decoders (src/verbs/verbs_handshake.h):
// UdAddress::decode (the raw address a verbs domain publishes, read from peers'
// descriptors) and HandshakeMsg::decode (every datagram on the UD QP), and feeds
// what decodes into a HandshakeMachine.
//
// Input: the first byte selects what the rest is. Properties:
//  - UdAddress::decode accepts exactly 26 bytes with a QPN in 1..2^24-1, re-encodes
//    to the input, and says why when it refuses (with or without a `why`);
//  - HandshakeMsg::decode accepts exactly what an independent check of the documented
//    format accepts (size >= kSize; magic, version, known flags, non-zero identities,
//    all-or-nothing ack fields, connected => ack, 24-bit QPNs (non-zero) and PSNs, MTU
//    1..5); trailing bytes are ignored; encode(decode(x)) == x but for the reserved
//    bytes; decode(encode(m)) == m;
//  - a HandshakeMachine driven by decoded datagrams, ticks, connects and fresh endpoints
//    never produces more actions per event than HsActions holds, only sends messages
//    that decode, only connects QPs to endpoints it received, and is Connected only
//    with the peer's endpoint applied.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "verbs/verbs_handshake.h"

using namespace ferry::verbs;

namespace {

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// Independent reading of the documented wire format; true when it is valid.
bool ref_valid(std::span<const uint8_t> in) {
  if (in.size() < HandshakeMsg::kSize) return false;
  const uint8_t* p = in.data();
  if (le(p, 4) != HandshakeMsg::kMagic || p[4] != HandshakeMsg::kVersion) return false;
  uint8_t flags = p[5];
  uint64_t src_inc = le(p + 8, 8), dst_inc = le(p + 20, 8);
  uint32_t src_epoch = uint32_t(le(p + 16, 4)), dst_epoch = uint32_t(le(p + 28, 4));
  const uint8_t* ud = p + 32;
  uint32_t ud_qpn = uint32_t(le(ud + 18, 4));
  const uint8_t* rc = ud + UdAddress::kSize;
  uint32_t msg_qpn = uint32_t(le(rc, 4)), msg_psn = uint32_t(le(rc + 4, 4));
  uint32_t rma_qpn = uint32_t(le(rc + 8, 4)), rma_psn = uint32_t(le(rc + 12, 4));
  uint8_t mtu = rc[16];
  bool ack = flags & HandshakeMsg::kFlagAck, connected = flags & HandshakeMsg::kFlagConnected;
  if (flags & ~HandshakeMsg::kKnownFlags) return false;
  if (src_inc == 0 || src_epoch == 0) return false;
  if (ack ? (dst_inc == 0 || dst_epoch == 0) : (dst_inc != 0 || dst_epoch != 0)) return false;
  if (connected && !ack) return false;
  auto qpn_ok = [](uint32_t q) { return q != 0 && q <= kQpnMask; };
  if (!qpn_ok(ud_qpn) || !qpn_ok(msg_qpn) || !qpn_ok(rma_qpn)) return false;
  if (msg_psn > kPsnMask || rma_psn > kPsnMask) return false;
  return mtu >= 1 && mtu <= 5;
}

bool same(const HandshakeMsg& a, const HandshakeMsg& b) {
  return a.flags == b.flags && a.src_incarnation == b.src_incarnation &&
         a.src_epoch == b.src_epoch && a.dst_incarnation == b.dst_incarnation &&
         a.dst_epoch == b.dst_epoch && a.from == b.from && a.rc == b.rc;
}

std::vector<uint8_t> encode(const HandshakeMsg& m) {
  std::vector<uint8_t> b(HandshakeMsg::kSize);
  m.encode(std::span<uint8_t, HandshakeMsg::kSize>(b.data(), HandshakeMsg::kSize));
  return b;
}

void check_ud(std::span<const uint8_t> in) {
  std::string why;
  auto a = UdAddress::decode(in, &why);
  auto b = UdAddress::decode(in, nullptr);
  FUZZ_CHECK(a.has_value() == b.has_value());
  bool valid = in.size() == UdAddress::kSize && le(in.data() + 18, 4) != 0 &&
               le(in.data() + 18, 4) <= kQpnMask;
  FUZZ_CHECK(a.has_value() == valid);
  if (!a) {
    FUZZ_CHECK(!why.empty());
    return;
  }
  FUZZ_CHECK(*a == *b);
  auto enc = a->to_bytes();
  FUZZ_CHECK(std::equal(enc.begin(), enc.end(), in.begin(), in.end()));
  FUZZ_CHECK(!a->brief().empty());
}

std::optional<HandshakeMsg> check_msg(std::span<const uint8_t> in) {
  std::string why;
  auto m = HandshakeMsg::decode(in, &why);
  auto n = HandshakeMsg::decode(in, nullptr);
  FUZZ_CHECK(m.has_value() == n.has_value());
  FUZZ_CHECK(m.has_value() == ref_valid(in));
  if (!m) {
    FUZZ_CHECK(!why.empty());
    return std::nullopt;
  }
  FUZZ_CHECK(same(*m, *n));
  // Canonical but for the reserved bytes; trailing bytes ignored.
  auto enc = encode(*m);
  std::vector<uint8_t> want(in.begin(), in.begin() + HandshakeMsg::kSize);
  want[6] = want[7] = 0;
  FUZZ_CHECK(enc == want);
  auto again = HandshakeMsg::decode(enc, nullptr);
  FUZZ_CHECK(again && same(*again, *m));
  FUZZ_CHECK(UdAddress::decode(m->from.to_bytes(), nullptr).has_value());
  return m;
}

RcEndpoint consume_endpoint(FuzzedDataProvider& fdp) {
  RcEndpoint rc;
  rc.msg_qpn = fdp.ConsumeIntegralInRange<uint32_t>(1, kQpnMask);
  rc.msg_psn = fdp.ConsumeIntegralInRange<uint32_t>(0, kPsnMask);
  rc.rma_qpn = fdp.ConsumeIntegralInRange<uint32_t>(1, kQpnMask);
  rc.rma_psn = fdp.ConsumeIntegralInRange<uint32_t>(0, kPsnMask);
  rc.mtu = fdp.ConsumeIntegralInRange<uint8_t>(1, 5);
  return rc;
}

// Drives one machine with events chosen by the input.
void drive_machine(FuzzedDataProvider& fdp) {
  LocalIdentity local;
  local.incarnation = fdp.ConsumeIntegralInRange<uint64_t>(1, 4);
  local.ud.qpn = fdp.ConsumeIntegralInRange<uint32_t>(1, kQpnMask);
  HandshakeConfig cfg;
  cfg.max_attempts = fdp.ConsumeIntegralInRange<uint32_t>(1, 12);
  HandshakeMachine hm(&local, cfg);
  HsClock::time_point now{};
  uint32_t next_epoch = 1;
  std::vector<RcEndpoint> received;  // endpoints the peer has announced

  for (int step = 0; step < 64 && fdp.remaining_bytes() > 0; ++step) {
    HsActions out;
    switch (fdp.ConsumeIntegralInRange<int>(0, 4)) {
      case 0:  // a fresh local endpoint
        hm.install_endpoint(consume_endpoint(fdp), next_epoch++, now);
        FUZZ_CHECK(hm.state() == HsState::kConnecting && !hm.peer_applied());
        break;
      case 1:
        hm.connect(now, &out);
        break;
      case 2:
        now += std::chrono::milliseconds(fdp.ConsumeIntegralInRange<int>(0, 5000));
        hm.tick(now, &out);
        break;
      default: {  // a datagram from the peer, small identities so they collide
        HandshakeMsg m;
        m.src_incarnation = fdp.ConsumeIntegralInRange<uint64_t>(1, 3);
        m.src_epoch = fdp.ConsumeIntegralInRange<uint32_t>(1, 3);
        if (fdp.ConsumeBool()) {
          m.flags |= HandshakeMsg::kFlagAck;
          m.dst_incarnation =
              fdp.ConsumeBool() ? local.incarnation : fdp.ConsumeIntegralInRange<uint64_t>(1, 4);
          m.dst_epoch = fdp.ConsumeIntegralInRange<uint32_t>(1, next_epoch);
          if (fdp.ConsumeBool()) m.flags |= HandshakeMsg::kFlagConnected;
        }
        m.from.qpn = fdp.ConsumeIntegralInRange<uint32_t>(1, kQpnMask);
        m.rc = consume_endpoint(fdp);
        // Through the wire, as the driver does.
        auto dec = HandshakeMsg::decode(encode(m), nullptr);
        FUZZ_CHECK(dec.has_value());
        received.push_back(dec->rc);
        hm.on_datagram(*dec, now, &out);
        break;
      }
    }
    // HsActions drops what exceeds its capacity: an event must stay below it.
    FUZZ_CHECK(out.size() < HsActions::kCapacity);
    for (const auto& a : out) {
      if (a.kind == HsAction::Kind::kSend) {
        auto d = HandshakeMsg::decode(encode(a.msg), nullptr);
        FUZZ_CHECK(d.has_value());  // the peer must accept what we send
        FUZZ_CHECK(a.msg.src_incarnation == local.incarnation && a.msg.src_epoch == hm.epoch());
        FUZZ_CHECK(a.msg.rc == hm.local_rc());
      } else if (a.kind == HsAction::Kind::kConnectQps) {
        FUZZ_CHECK(std::find(received.begin(), received.end(), a.peer_rc) != received.end());
      }
    }
    if (hm.state() == HsState::kConnected) FUZZ_CHECK(hm.peer_applied() && hm.has_endpoint());
    FUZZ_CHECK(std::string(hs_state_name(hm.state())) != "?");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const uint8_t> rest(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      check_ud(rest);
      break;
    case 1:
      check_msg(rest);
      break;
    default: {
      FuzzedDataProvider fdp(rest.data(), rest.size());
      drive_machine(fdp);
      break;
    }
  }
  return 0;
}

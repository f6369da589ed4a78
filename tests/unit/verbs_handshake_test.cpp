// The RC handshake state machine driven against itself through a simulated
// UD network that loses, duplicates, delays and reorders datagrams. Every
// datagram goes through encode/decode, as on the wire.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "verbs/verbs_handshake.h"

namespace ferry::verbs {
namespace {

using namespace std::chrono_literals;
using Clock = HsClock;

HandshakeMsg sample_msg() {
  HandshakeMsg m;
  m.flags = HandshakeMsg::kFlagAck | HandshakeMsg::kFlagConnected;
  m.src_incarnation = 0x1122334455667788;
  m.src_epoch = 7;
  m.dst_incarnation = 0x99aabbccddeeff01;
  m.dst_epoch = 3;
  for (int i = 0; i < 16; ++i) m.from.gid[i] = static_cast<uint8_t>(i * 17);
  m.from.lid = 0x1234;
  m.from.qpn = 0xabcdef;
  m.from.qkey = 0x46525259;
  m.rc = {0x000101, 0xfffffe, 0x000202, 0x123456, 5};
  return m;
}

std::array<uint8_t, HandshakeMsg::kSize> bytes_of(const HandshakeMsg& m) {
  std::array<uint8_t, HandshakeMsg::kSize> b{};
  m.encode(b);
  return b;
}

TEST(VerbsHandshakeCodec, RoundTrip) {
  const HandshakeMsg m = sample_msg();
  const auto b = bytes_of(m);
  std::string why;
  const auto d = HandshakeMsg::decode(b, &why);
  ASSERT_TRUE(d) << why;
  EXPECT_EQ(d->flags, m.flags);
  EXPECT_EQ(d->src_incarnation, m.src_incarnation);
  EXPECT_EQ(d->src_epoch, m.src_epoch);
  EXPECT_EQ(d->dst_incarnation, m.dst_incarnation);
  EXPECT_EQ(d->dst_epoch, m.dst_epoch);
  EXPECT_EQ(d->from, m.from);
  EXPECT_EQ(d->rc, m.rc);
  // Little-endian on the wire whatever the host.
  EXPECT_EQ(b[0], 0x46);
  EXPECT_EQ(b[4], HandshakeMsg::kVersion);
  // A later minor revision may append fields.
  std::vector<uint8_t> longer(b.begin(), b.end());
  longer.resize(longer.size() + 9, 0xee);
  EXPECT_TRUE(HandshakeMsg::decode(longer, &why)) << why;
}

TEST(VerbsHandshakeCodec, RejectsEveryTruncation) {
  const auto b = bytes_of(sample_msg());
  for (size_t n = 0; n < b.size(); ++n) {
    std::string why;
    EXPECT_FALSE(HandshakeMsg::decode(std::span<const uint8_t>(b.data(), n), &why)) << n;
    EXPECT_FALSE(why.empty());
  }
}

TEST(VerbsHandshakeCodec, RejectsInvalidFields) {
  struct Case {
    const char* name;
    void (*mutate)(HandshakeMsg&);
  };
  const Case cases[] = {
      {"unknown flag", [](HandshakeMsg& m) { m.flags |= 0x80; }},
      {"connected without ack",
       [](HandshakeMsg& m) {
         m.flags = HandshakeMsg::kFlagConnected;
         m.dst_incarnation = 0;
         m.dst_epoch = 0;
       }},
      {"ack without dst", [](HandshakeMsg& m) { m.dst_epoch = 0; }},
      {"dst without ack", [](HandshakeMsg& m) { m.flags = 0; }},
      {"zero incarnation", [](HandshakeMsg& m) { m.src_incarnation = 0; }},
      {"zero epoch", [](HandshakeMsg& m) { m.src_epoch = 0; }},
      {"25-bit psn", [](HandshakeMsg& m) { m.rc.msg_psn = 0x1000000; }},
      {"25-bit rma psn", [](HandshakeMsg& m) { m.rc.rma_psn = 0xffffffff; }},
      {"zero qpn", [](HandshakeMsg& m) { m.rc.rma_qpn = 0; }},
      {"25-bit qpn", [](HandshakeMsg& m) { m.rc.msg_qpn = 0x1000000; }},
      {"zero ud qpn", [](HandshakeMsg& m) { m.from.qpn = 0; }},
      {"mtu 0", [](HandshakeMsg& m) { m.rc.mtu = 0; }},
      {"mtu 6", [](HandshakeMsg& m) { m.rc.mtu = 6; }},
  };
  for (const auto& c : cases) {
    HandshakeMsg m = sample_msg();
    c.mutate(m);
    std::string why;
    EXPECT_FALSE(HandshakeMsg::decode(bytes_of(m), &why)) << c.name;
    EXPECT_FALSE(why.empty()) << c.name;
  }
  auto b = bytes_of(sample_msg());
  b[0] ^= 1;
  EXPECT_FALSE(HandshakeMsg::decode(b, nullptr)) << "magic";
  b = bytes_of(sample_msg());
  b[4] = 2;
  std::string why;
  EXPECT_FALSE(HandshakeMsg::decode(b, &why)) << "version";
  EXPECT_NE(why.find("version"), std::string::npos);
}

TEST(VerbsHandshakeCodec, GarbageNeverDecodesToInvalidValues) {
  std::mt19937_64 rng(42);
  const auto good = bytes_of(sample_msg());
  size_t accepted = 0;
  for (int t = 0; t < 200000; ++t) {
    std::vector<uint8_t> b(good.begin(), good.end());
    if (t % 2 == 0) {
      // Random bit flips of a valid message.
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f)
        b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    } else {
      b.resize(rng() % (HandshakeMsg::kSize + 8));
      for (auto& x : b) x = static_cast<uint8_t>(rng());
    }
    const auto d = HandshakeMsg::decode(b, nullptr);
    if (!d) continue;
    ++accepted;
    EXPECT_LE(d->rc.msg_psn, kPsnMask);
    EXPECT_LE(d->rc.rma_psn, kPsnMask);
    EXPECT_GE(d->rc.mtu, 1);
    EXPECT_LE(d->rc.mtu, 5);
    EXPECT_NE(d->src_incarnation, 0u);
    EXPECT_EQ(d->ack(), d->dst_incarnation != 0);
  }
  EXPECT_GT(accepted, 0u);  // flips in free fields (GIDs, qkey) stay valid
}

TEST(VerbsUdAddress, RoundTripAndValidation) {
  UdAddress a;
  a.gid[15] = 9;
  a.lid = 77;
  a.qpn = 0x123;
  a.qkey = 0xdeadbeef;
  const auto b = a.to_bytes();
  ASSERT_EQ(b.size(), 26u);
  std::string why;
  const auto d = UdAddress::decode(b, &why);
  ASSERT_TRUE(d) << why;
  EXPECT_EQ(*d, a);
  EXPECT_FALSE(UdAddress::decode(std::span<const uint8_t>(b.data(), 25), &why));
  std::vector<uint8_t> longer(b.begin(), b.end());
  longer.push_back(0);
  EXPECT_FALSE(UdAddress::decode(longer, &why));
  a.qpn = 0;
  EXPECT_FALSE(UdAddress::decode(a.to_bytes(), &why));
  a.qpn = 0x1000000;
  EXPECT_FALSE(UdAddress::decode(a.to_bytes(), &why));
}

// ------------------------------------------------------------- simulation

struct NetConfig {
  double loss = 0;
  double dup = 0;
  Clock::duration max_delay = 1ms;
};

struct Node {
  LocalIdentity id;
  std::unique_ptr<HandshakeMachine> hs;
  uint32_t next_epoch = 1;
  // What the driver did, as a NIC would see it.
  std::optional<RcEndpoint> applied;  // the remote endpoint our QPs point to
  RcEndpoint local;
  int endpoints = 0;
  int connect_qps = 0;
  int retargets = 0;
  int connected = 0;
  int give_ups = 0;
  int sends = 0;
  int stale = 0;
};

class Sim {
 public:
  Sim(uint64_t seed, NetConfig net, HandshakeConfig cfg) : rng_(seed), net_(net), cfg_(cfg) {
    for (int i = 0; i < 2; ++i) reset_node(i, 1000 + static_cast<uint64_t>(i));
  }

  // A fresh process at the same UD address would get a new QPN; any
  // identity with a larger incarnation will do for the machine.
  void reset_node(int i, uint64_t incarnation) {
    auto n = std::make_unique<Node>();
    n->id.incarnation = incarnation;
    n->id.ud.qpn = 0x100 + static_cast<uint32_t>(i) + static_cast<uint32_t>(incarnation % 1000) * 2;
    n->id.ud.gid[15] = static_cast<uint8_t>(i + 1);
    n->id.ud.qkey = 0x46525259;
    n->hs = std::make_unique<HandshakeMachine>(&n->id, cfg_);
    nodes_[i] = std::move(n);
  }

  Node& node(int i) { return *nodes_[i]; }
  Clock::time_point now() const { return now_; }
  size_t in_flight() const { return pkts_.size(); }
  void set_net(NetConfig n) { net_ = n; }

  void connect(int i) {
    HsActions a;
    if (node(i).hs->connect(now_, &a) == HsResult::kNeedEndpoint) {
      install(i);
      a.clear();
      ASSERT_EQ(node(i).hs->connect(now_, &a), HsResult::kOk);
    }
    apply(i, a);
  }

  // Runs until `until` or until `done()` holds; events in time order.
  template <typename Done>
  void run_until(Clock::time_point until, Done done) {
    while (now_ < until && !done()) {
      Clock::time_point next = until;
      for (const auto& p : pkts_) next = std::min(next, p.at);
      for (int i = 0; i < 2; ++i) {
        if (node(i).hs->state() == HsState::kConnecting) {
          next = std::min(next, node(i).hs->next_timer());
        }
      }
      now_ = std::max(now_, next);
      deliver_due();
      for (int i = 0; i < 2; ++i) {
        HsActions a;
        node(i).hs->tick(now_, &a);
        apply(i, a);
      }
    }
  }
  void run_for(Clock::duration d) {
    run_until(now_ + d, [] { return false; });
  }

  bool both_connected() {
    return node(0).hs->state() == HsState::kConnected && node(1).hs->state() == HsState::kConnected;
  }

  // Connected on both sides, each side's QPs pointing at the other's
  // current QPNs and PSNs.
  void expect_matched() {
    for (int i = 0; i < 2; ++i) {
      Node& me = node(i);
      Node& other = node(1 - i);
      ASSERT_EQ(me.hs->state(), HsState::kConnected) << "node " << i;
      ASSERT_TRUE(me.applied.has_value());
      EXPECT_EQ(*me.applied, other.local) << "node " << i;
      EXPECT_EQ(me.hs->peer_rc(), other.hs->local_rc());
      EXPECT_EQ(me.hs->local_rc(), me.local);
      EXPECT_LE(me.local.msg_psn, kPsnMask);
      EXPECT_LE(me.local.rma_psn, kPsnMask);
    }
  }

  // Inject a raw datagram (e.g. a stale one captured earlier).
  void inject(int dst, const std::array<uint8_t, HandshakeMsg::kSize>& b, Clock::duration delay) {
    pkts_.push_back({now_ + delay, dst, b, seq_++});
  }
  std::vector<std::array<uint8_t, HandshakeMsg::kSize>> sent_by[2];
  size_t lost = 0;
  size_t duplicated = 0;
  size_t reordered = 0;  // delivered before a datagram sent earlier to the same node

 private:
  struct Pkt {
    Clock::time_point at;
    int dst;
    std::array<uint8_t, HandshakeMsg::kSize> bytes;
    uint64_t seq;
  };

  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  void install(int i) {
    Node& n = node(i);
    RcEndpoint rc;
    rc.msg_qpn = 1 + static_cast<uint32_t>(rng_() % kQpnMask);
    rc.rma_qpn = 1 + static_cast<uint32_t>(rng_() % kQpnMask);
    rc.msg_psn = static_cast<uint32_t>(rng_()) & kPsnMask;
    rc.rma_psn = static_cast<uint32_t>(rng_()) & kPsnMask;
    rc.mtu = 3 + static_cast<uint8_t>(rng_() % 3);
    n.hs->install_endpoint(rc, n.next_epoch++, now_);
    n.local = rc;
    n.applied.reset();
    ++n.endpoints;
  }

  void apply(int i, const HsActions& acts) {
    Node& n = node(i);
    for (const HsAction& a : acts) {
      switch (a.kind) {
        case HsAction::Kind::kSend: {
          ++n.sends;
          const auto b = bytes_of(a.msg);
          sent_by[i].push_back(b);
          if (uniform() < net_.loss) {
            ++lost;
            break;
          }
          const int copies = uniform() < net_.dup ? 2 : 1;
          duplicated += copies - 1;
          for (int c = 0; c < copies; ++c) {
            const auto delay =
                std::chrono::duration_cast<Clock::duration>(net_.max_delay * uniform());
            pkts_.push_back({now_ + delay, 1 - i, b, seq_++});
          }
          break;
        }
        case HsAction::Kind::kConnectQps:
          ASSERT_TRUE(!n.applied || a.retarget) << "re-targeted without RESET";
          n.applied = a.peer_rc;
          ++n.connect_qps;
          n.retargets += a.retarget;
          break;
        case HsAction::Kind::kConnected: {
          ++n.connected;
          // Safety: we only post once the peer's QPs point at ours.
          const Node& other = node(1 - i);
          ASSERT_TRUE(other.applied.has_value()) << "node " << i << " connected too early";
          EXPECT_EQ(*other.applied, n.local) << "node " << i << " connected too early";
          ASSERT_TRUE(n.applied.has_value());
          EXPECT_EQ(*n.applied, other.local);
          break;
        }
        case HsAction::Kind::kGiveUp:
          ++n.give_ups;
          break;
      }
    }
  }

  void deliver_due() {
    // Ties broken by a random key: same-instant datagrams arrive in any order.
    std::vector<Pkt> due;
    for (size_t k = 0; k < pkts_.size();) {
      if (pkts_[k].at <= now_) {
        due.push_back(pkts_[k]);
        pkts_[k] = pkts_.back();
        pkts_.pop_back();
      } else {
        ++k;
      }
    }
    std::shuffle(due.begin(), due.end(), rng_);
    for (const Pkt& p : due) {
      if (p.seq < last_seq_[p.dst]) ++reordered;
      last_seq_[p.dst] = std::max(last_seq_[p.dst], p.seq);
      std::string why;
      const auto m = HandshakeMsg::decode(p.bytes, &why);
      ASSERT_TRUE(m) << why;
      Node& n = node(p.dst);
      HsActions a;
      HsResult r = n.hs->on_datagram(*m, now_, &a);
      if (r == HsResult::kNeedEndpoint) {
        install(p.dst);
        a.clear();
        r = n.hs->on_datagram(*m, now_, &a);
        ASSERT_NE(r, HsResult::kNeedEndpoint);
      }
      n.stale += r == HsResult::kStale;
      apply(p.dst, a);
    }
  }

  std::mt19937_64 rng_;
  NetConfig net_;
  HandshakeConfig cfg_;
  std::array<std::unique_ptr<Node>, 2> nodes_;
  std::vector<Pkt> pkts_;
  uint64_t seq_ = 0;
  uint64_t last_seq_[2] = {0, 0};
  Clock::time_point now_{};
};

HandshakeConfig patient() {
  HandshakeConfig c;
  c.initial_rto = 10ms;
  c.max_rto = 200ms;
  c.max_attempts = 60;
  return c;
}

TEST(VerbsHandshake, ActiveToPassiveWithoutLoss) {
  Sim sim(1, {}, patient());
  sim.connect(0);
  sim.run_for(1s);
  sim.expect_matched();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(sim.node(i).connected, 1);
    EXPECT_EQ(sim.node(i).endpoints, 1);
    EXPECT_EQ(sim.node(i).connect_qps, 1);
  }
  // Three datagrams: hello, hello+ack, ack+connected; then silence.
  EXPECT_EQ(sim.node(0).sends + sim.node(1).sends, 3);
  EXPECT_EQ(sim.in_flight(), 0u);
}

TEST(VerbsHandshake, SimultaneousConnect) {
  Sim sim(2, {0, 0, 1ms}, patient());
  sim.connect(0);
  sim.connect(1);
  sim.run_for(1s);
  sim.expect_matched();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(sim.node(i).connected, 1);
    EXPECT_EQ(sim.node(i).endpoints, 1) << "each side keeps the QPs it created";
    EXPECT_EQ(sim.node(i).connect_qps, 1);
  }
  EXPECT_EQ(sim.in_flight(), 0u);
}

// Thousands of seeded trials over a network that loses, duplicates and
// reorders; either side (or both) initiates, at random times.
TEST(VerbsHandshake, LossyNetworkTrials) {
  std::mt19937_64 meta(20261130);
  int max_sends = 0;
  size_t sends = 0, lost = 0, duplicated = 0, reordered = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    NetConfig net;
    net.loss = std::uniform_real_distribution<double>(0, 0.5)(meta);
    net.dup = std::uniform_real_distribution<double>(0, 0.4)(meta);
    net.max_delay = std::chrono::microseconds(1 + meta() % 40000);
    Sim sim(meta(), net, patient());
    const int who = static_cast<int>(meta() % 3);  // 0, 1 or both
    if (who != 1) sim.connect(0);
    sim.run_for(std::chrono::microseconds(meta() % 30000));
    if (who != 0) sim.connect(1);
    sim.run_until(sim.now() + 120s, [&] { return sim.both_connected(); });
    ASSERT_TRUE(sim.both_connected())
        << "loss " << net.loss << " states " << hs_state_name(sim.node(0).hs->state()) << "/"
        << hs_state_name(sim.node(1).hs->state());
    // Late duplicates and retransmits must not disturb a connection.
    sim.set_net({0, net.dup, net.max_delay});
    sim.run_for(5s);
    sim.expect_matched();
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(sim.node(i).connected, 1) << "node " << i;
      ASSERT_EQ(sim.node(i).endpoints, 1) << "node " << i;
      ASSERT_EQ(sim.node(i).connect_qps, 1) << "node " << i;
      ASSERT_EQ(sim.node(i).give_ups, 0);
    }
    ASSERT_EQ(sim.in_flight(), 0u) << "the exchange must end";
    max_sends = std::max(max_sends, sim.node(0).sends + sim.node(1).sends);
    sends += static_cast<size_t>(sim.node(0).sends + sim.node(1).sends);
    lost += sim.lost;
    duplicated += sim.duplicated;
    reordered += sim.reordered;
  }
  // The network really was hostile (guards against a vacuous simulation).
  EXPECT_GT(lost, 3000u);
  EXPECT_GT(duplicated, 1000u);
  EXPECT_GT(reordered, 1000u);
  EXPECT_GT(sends, 3u * 3000u);
  EXPECT_LT(max_sends, 200);
  RecordProperty("max_datagrams_per_connect", max_sends);
  RecordProperty("datagrams", static_cast<int>(sends));
  RecordProperty("lost", static_cast<int>(lost));
  RecordProperty("reordered", static_cast<int>(reordered));
}

TEST(VerbsHandshake, PeerRestartWithNewIncarnation) {
  std::mt19937_64 meta(99);
  for (int trial = 0; trial < 500; ++trial) {
    SCOPED_TRACE(testing::Message() << "trial " << trial);
    NetConfig net{std::uniform_real_distribution<double>(0, 0.3)(meta),
                  std::uniform_real_distribution<double>(0, 0.3)(meta),
                  std::chrono::microseconds(1 + meta() % 20000)};
    Sim sim(meta(), net, patient());
    sim.connect(0);
    sim.run_until(sim.now() + 60s, [&] { return sim.both_connected(); });
    ASSERT_TRUE(sim.both_connected());
    const RcEndpoint a_before = sim.node(0).local;
    const auto old_b = sim.sent_by[1];  // datagrams of the dead process

    // Node 1 restarts (larger incarnation, fresh machine, fresh epochs).
    sim.reset_node(1, 5000 + static_cast<uint64_t>(trial));
    // Its predecessor's datagrams are still in the network, reordered.
    for (const auto& b : old_b) sim.inject(0, b, std::chrono::microseconds(meta() % 50000));
    if (meta() % 2 == 0) {
      sim.connect(1);
    } else {
      sim.connect(0);  // node 0 still thinks it is connected: nothing happens
      sim.connect(1);
    }
    sim.run_until(sim.now() + 60s, [&] { return sim.both_connected(); });
    ASSERT_TRUE(sim.both_connected());
    sim.set_net({0, 0, net.max_delay});
    sim.run_for(5s);
    sim.expect_matched();
    // The survivor replaced its QPs exactly once (the old ones carried
    // traffic and must not be re-targeted), and connected twice in all.
    EXPECT_EQ(sim.node(0).endpoints, 2);
    EXPECT_EQ(sim.node(0).connected, 2);
    EXPECT_NE(sim.node(0).local, a_before);
    EXPECT_EQ(sim.node(1).connected, 1);
    EXPECT_EQ(sim.node(0).hs->peer_incarnation(), 5000u + static_cast<uint64_t>(trial));
  }
}

TEST(VerbsHandshake, StaleDatagramsOfTheOldIncarnationAreDropped) {
  Sim sim(5, {}, patient());
  sim.connect(0);
  sim.run_for(1s);
  ASSERT_TRUE(sim.both_connected());
  const auto old_b = sim.sent_by[1];
  sim.reset_node(1, 9000);
  sim.connect(1);
  sim.run_for(1s);
  sim.expect_matched();
  const int stale_before = sim.node(0).stale;
  for (const auto& b : old_b) sim.inject(0, b, 1ms);
  sim.run_for(1s);
  EXPECT_EQ(sim.node(0).stale - stale_before, static_cast<int>(old_b.size()));
  sim.expect_matched();
  EXPECT_EQ(sim.node(0).connected, 2);
}

TEST(VerbsHandshake, DatagramsToAnEarlierLifeOfUsAreDropped) {
  Sim sim(6, {}, patient());
  sim.connect(0);
  sim.run_for(1s);
  ASSERT_TRUE(sim.both_connected());
  // Everything node 1 sent acked node 0's incarnation 1000. A restarted
  // node 0 (incarnation 2000) must not apply those acks.
  const auto to_old_a = sim.sent_by[1];
  sim.reset_node(0, 2000);
  int stale = 0;
  for (const auto& b : to_old_a) {
    const auto m = HandshakeMsg::decode(b, nullptr);
    ASSERT_TRUE(m);
    if (!m->ack()) continue;
    HsActions a;
    HsResult r = sim.node(0).hs->on_datagram(*m, sim.now(), &a);
    if (r == HsResult::kNeedEndpoint) {
      sim.node(0).hs->install_endpoint({1, 2, 3, 4, 3}, 1, sim.now());
      r = sim.node(0).hs->on_datagram(*m, sim.now(), &a);
    }
    stale += r == HsResult::kStale;
  }
  EXPECT_GT(stale, 0);
}

TEST(VerbsHandshake, GivesUpAfterMaxAttemptsThenRetriesAfterCooldown) {
  HandshakeConfig cfg;
  cfg.initial_rto = 50ms;
  cfg.max_rto = 2s;
  cfg.max_attempts = 10;
  cfg.retry_cooldown = 1s;
  Sim sim(7, {1.0, 0, 1ms}, cfg);  // every datagram lost
  const auto t0 = sim.now();
  sim.connect(0);
  sim.run_until(t0 + 60s, [&] { return sim.node(0).give_ups > 0; });
  EXPECT_EQ(sim.node(0).give_ups, 1);
  EXPECT_EQ(sim.node(0).sends, 10);
  EXPECT_EQ(sim.node(0).hs->state(), HsState::kFailed);
  // 50+100+...+1600 ms, then 2 s caps: 3.15 s + 4 * 2 s.
  EXPECT_EQ(sim.now() - t0, 11150ms);
  sim.run_for(100ms);
  EXPECT_EQ(sim.node(0).give_ups, 1) << "gives up once";

  // Within the cooldown a post does not restart the handshake.
  sim.connect(0);
  EXPECT_EQ(sim.node(0).hs->state(), HsState::kFailed);
  EXPECT_EQ(sim.node(0).sends, 10);
  sim.run_for(1s);
  sim.connect(0);
  EXPECT_EQ(sim.node(0).hs->state(), HsState::kConnecting);
  EXPECT_EQ(sim.node(0).sends, 11);
  EXPECT_EQ(sim.node(0).endpoints, 1) << "QPs that never carried work are kept";

  // The peer comes up: the same endpoint connects.
  sim.set_net({});
  sim.run_until(sim.now() + 10s, [&] { return sim.both_connected(); });
  sim.expect_matched();
  EXPECT_EQ(sim.node(0).connected, 1);
}

TEST(VerbsHandshake, DatagramRevivesAFailedPeer) {
  HandshakeConfig cfg = patient();
  cfg.max_attempts = 3;
  cfg.retry_cooldown = 1h;
  Sim sim(8, {1.0, 0, 1ms}, cfg);
  sim.connect(0);
  sim.run_for(10s);
  ASSERT_EQ(sim.node(0).hs->state(), HsState::kFailed);
  sim.set_net({});
  sim.connect(1);  // the peer starts late
  sim.run_for(1s);
  sim.expect_matched();
}

}  // namespace
}  // namespace ferry::verbs

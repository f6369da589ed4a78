// Multi-NIC groups: the same scenario over 1, 2 and 4 NICs per group on
// loopback, and across simulated hosts with two real interfaces each.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>

#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/netns.h"
#include "support/process.h"
#include "support/region_server.h"
#include "support/scenario.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::Channel;
using test::Peer;

constexpr uint64_t kRegion = 8 << 20;
constexpr int kReceivers = 3;

class MultiNicTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(MultiNicTest, EveryOperationAndRouteDeliversExactBytesAndImmediates) {
  auto [provider, nics] = GetParam();
  auto cfg = test::config_for(provider, nics);
  std::vector<std::unique_ptr<Peer>> rx;
  std::vector<Channel*> chans;
  for (int i = 0; i < kReceivers; ++i) {
    rx.push_back(
        std::make_unique<Peer>([&](Channel& ch) { return test::serve_region(ch, cfg, kRegion); }));
    chans.push_back(&rx.back()->channel());
  }
  std::string failures = test::run_scenario(chans, cfg, kRegion);
  EXPECT_EQ(failures, "");
  for (auto& p : rx) EXPECT_EQ(p->wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Loopback, MultiNicTest,
                         ::testing::Combine(::testing::Values("tcp", "shm"),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "nic";
                         });

// Four hosts (network namespaces), two NICs each on two separate bridges.
class NetnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ready_ = test::netns_up(kReceivers + 1); }
  static void TearDownTestSuite() { test::netns_down(); }
  static inline bool ready_ = false;
};

EngineConfig rail_config() {
  EngineConfig c;
  c.provider = "tcp;ofi_rxm";
  c.groups[0].nic_names = {"rail0", "rail1"};
  c.default_deadline = 30s;
  return c;
}

TEST_F(NetnsTest, TwoRailsPerHostCarryAFairShareAndEveryByteArrives) {
  if (!ready_) GTEST_SKIP() << "network namespaces unavailable (needs root and iproute2)";
  auto cfg = rail_config();
  std::vector<std::unique_ptr<Peer>> rx;
  for (int i = 0; i < kReceivers; ++i) {
    rx.push_back(std::make_unique<Peer>([&, i](Channel& ch) {
      if (!test::enter_netns("ferry-h" + std::to_string(i + 1))) return 20;
      return test::serve_region(ch, cfg, kRegion);
    }));
  }
  std::vector<Channel*> chans;
  for (auto& p : rx) chans.push_back(&p->channel());
  // The sender lives in ferry-h0 and inherits the receivers' channels.
  Peer sender([&](Channel& up) {
    if (!test::enter_netns("ferry-h0")) return 20;
    uint64_t r0 = test::tx_bytes("rail0"), r1 = test::tx_bytes("rail1");
    test::ScenarioStats stats;
    std::string failures = test::run_scenario(chans, cfg, kRegion, &stats);
    uint64_t d0 = test::tx_bytes("rail0") - r0, d1 = test::tx_bytes("rail1") - r1;
    up.send(failures);
    up.send(std::to_string(d0) + " " + std::to_string(d1) + " " + std::to_string(stats.bytes));
    return 0;
  });
  auto failures = sender.channel().recv_str(600s);
  auto counters = sender.channel().recv_str(60s);
  ASSERT_TRUE(failures && counters);
  EXPECT_EQ(*failures, "");
  unsigned long long d0 = 0, d1 = 0, payload = 0;
  std::sscanf(counters->c_str(), "%llu %llu %llu", &d0, &d1, &payload);
  // Wire bytes include headers and acknowledgements: at least the payload.
  EXPECT_GE(d0 + d1, payload);
  // Fair share: each rail carried at least 30% of what both carried.
  EXPECT_GE(d0 * 10, (d0 + d1) * 3) << "rail0 " << d0 << " rail1 " << d1;
  EXPECT_GE(d1 * 10, (d0 + d1) * 3) << "rail0 " << d0 << " rail1 " << d1;
  RecordProperty("rail0_tx_bytes", std::to_string(d0));
  RecordProperty("rail1_tx_bytes", std::to_string(d1));
  std::printf("sender tx bytes: rail0 %llu, rail1 %llu, payload %llu\n", d0, d1, payload);
  EXPECT_EQ(sender.wait(), 0);
  for (auto& p : rx) EXPECT_EQ(p->wait(), 0);
}

// A NIC of a peer goes down mid-traffic: writes over that rail end within the
// deadline with an error, writes over the other rail keep working.
TEST_F(NetnsTest, PeerNicDownFailsItsRailWithinTheDeadlineAndSparesTheOther) {
  if (!ready_) GTEST_SKIP() << "network namespaces unavailable (needs root and iproute2)";
  auto cfg = rail_config();
  cfg.default_deadline = 4s;
  Peer rx([&](Channel& ch) {
    if (!test::enter_netns("ferry-h1")) return 20;
    return test::serve_region(ch, cfg, kRegion);
  });
  Peer tx([&](Channel& up) {
    if (!test::enter_netns("ferry-h0")) return 20;
    auto desc = MrDesc::from_bytes(rx.channel().recv(60s).value());
    TransferEngine e(cfg);
    test::Buffer src(kRegion);
    test::fill_pattern(src.get(), kRegion, 5);
    auto [h, mine] = e.reg_mr(src.get(), kRegion);
    // Both rails work first.
    for (uint8_t nic : {0, 1}) {
      std::atomic<bool> done{false}, failed{false};
      e.submit_single_write(4096, 1, h, 0, desc, 0, OnDone::flag(done, &failed),
                            WriteRoute::pinned(nic));
      if (!test::wait_until([&] { return done.load(); }, 20s) || failed) return 21;
    }
    up.send(std::string("rails ok"));
    if (up.recv_str(60s).value_or("") != "down") return 22;
    // rail0 of the peer is down now.
    auto t0 = std::chrono::steady_clock::now();
    std::atomic<uint64_t> d0{0}, e0{0}, d1{0}, e1{0};
    for (int i = 0; i < 16; ++i) {
      e.submit_single_write(64 << 10, 2, h, 0, desc, 0, OnDone::counter(d0, &e0),
                            WriteRoute::pinned(0));
      e.submit_single_write(64 << 10, 3, h, 0, desc, 0, OnDone::counter(d1, &e1),
                            WriteRoute::pinned(1));
    }
    bool ended = test::wait_until([&] { return d0.load() == 16 && d1.load() == 16; }, 30s);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    up.send(std::to_string(ended) + " " + std::to_string(e0.load()) + " " +
            std::to_string(e1.load()) + " " + std::to_string(secs));
    return 0;
  });
  ASSERT_EQ(tx.channel().recv_str(120s).value_or("?"), "rails ok");
  ASSERT_EQ(test::ask(rx.channel(), "counter 3"), "ok");
  ASSERT_EQ(std::system("ip -n ferry-h1 link set rail0 down"), 0);
  tx.channel().send(std::string("down"));
  auto result = tx.channel().recv_str(120s).value_or("? ? ? ?");
  int ended = 0;
  unsigned long e0 = 0, e1 = 0;
  double secs = 0;
  std::sscanf(result.c_str(), "%d %lu %lu %lf", &ended, &e0, &e1, &secs);
  EXPECT_EQ(ended, 1) << result;
  // A write the kernel already took into its socket buffer completes locally
  // (local completion is not delivery); the rest fail at the deadline.
  EXPECT_GE(e0, 8u) << "writes over the downed rail must fail: " << result;
  EXPECT_EQ(e1, 0u) << "writes over the other rail must succeed: " << result;
  EXPECT_LT(secs, 4.0 + 3.0) << "every write must end within the deadline";
  EXPECT_EQ(test::ask(rx.channel(), "count 3 16"), "ok 0") << "the other rail delivered everything";
  test::ask(rx.channel(), "quit");
  EXPECT_EQ(tx.wait(), 0);
  EXPECT_EQ(rx.wait(), 0);
  ASSERT_EQ(std::system("ip -n ferry-h1 link set rail0 up"), 0);
}

}  // namespace
}  // namespace ferry

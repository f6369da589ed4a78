// Two engines in two processes over real libfabric providers (tcp;ofi_rxm on
// loopback and shm): every byte and every immediate is checked.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <unordered_map>

#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::ask;
using test::Buffer;
using test::Channel;
using test::check_cmd;
using test::Peer;
using test::serve_region;

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  EngineConfig config(size_t nics = 1) const { return test::config_for(GetParam(), nics); }
};

TEST_P(EngineTest, SingleWritesOfEverySizeLandByteForByte) {
  constexpr size_t kRegion = (64 << 20) + 8192;
  auto cfg = config();
  Peer peer([&](Channel& ch) { return serve_region(ch, cfg, kRegion); });
  auto desc = MrDesc::from_bytes(peer.channel().recv().value());
  TransferEngine e(cfg);
  Buffer src(kRegion);
  auto [h, d] = e.reg_mr(src.get(), kRegion);
  ASSERT_EQ(ask(peer.channel(), "counter 7"), "ok");

  std::mt19937_64 rng(42);
  std::vector<uint64_t> sizes = {1, 7, 4096, 65536, 1 << 20, 64 << 20};
  for (int i = 0; i < 8; ++i) sizes.push_back(1 + rng() % (4 << 20));
  uint64_t seed = 1;
  for (uint64_t len : sizes) {
    // The 1-byte and 64 MiB writes end exactly at the region's last byte.
    uint64_t dst_off = (len == 1 || len == (64 << 20)) ? kRegion - len : rng() % (kRegion - len);
    uint64_t src_off = rng() % (kRegion - len + 1);
    test::fill_pattern(src.get() + src_off, len, seed);
    std::atomic<bool> done{false}, failed{false};
    e.submit_single_write(len, 7, h, src_off, desc, dst_off, OnDone::flag(done, &failed));
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 60s)) << "len " << len;
    ASSERT_FALSE(failed.load()) << "len " << len;
    uint64_t imms = ImmPlan::single_write(len, WriteRoute{}, 1);
    ASSERT_EQ(imms, 1u);
    EXPECT_EQ(ask(peer.channel(), "count 7 1"), "ok 0") << "len " << len;
    EXPECT_EQ(ask(peer.channel(), check_cmd(dst_off, len, seed)), "ok") << "len " << len;
    ++seed;
  }
  ask(peer.channel(), "quit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(EngineTest, ZeroByteImmediatesAreCountedExactly) {
  auto cfg = config();
  Peer peer([&](Channel& ch) { return serve_region(ch, cfg, 4096); });
  auto desc = MrDesc::from_bytes(peer.channel().recv().value());
  TransferEngine e(cfg);
  ASSERT_EQ(ask(peer.channel(), "counter 99"), "ok");
  std::atomic<uint64_t> done{0}, errors{0};
  for (int i = 0; i < 50; ++i) e.submit_imm(99, desc, OnDone::counter(done, &errors));
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 50; }));
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(ask(peer.channel(), "count 99 50"), "ok 0");
  ask(peer.channel(), "quit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(EngineTest, ExpectedImmCountFiresOncePerCountAndCarriesSurplus) {
  auto cfg = config();
  Peer peer([&](Channel& ch) { return serve_region(ch, cfg, 4096); });
  auto desc = MrDesc::from_bytes(peer.channel().recv().value());
  TransferEngine e(cfg);
  ASSERT_EQ(ask(peer.channel(), "expect 5 5"), "ok");
  std::atomic<uint64_t> done{0};
  for (int i = 0; i < 17; ++i) e.submit_imm(5, desc, OnDone::counter(done));
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 17; }));
  // 17 arrivals: fired 3 times, 2 carried over.
  EXPECT_EQ(ask(peer.channel(), "fires 5 3"), "fired 3");
  for (int i = 0; i < 3; ++i) e.submit_imm(5, desc, OnDone::counter(done));
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 20; }));
  EXPECT_EQ(ask(peer.channel(), "fires 5 4"), "fired 4");
  ask(peer.channel(), "quit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(EngineTest, CallbacksCountersAndFlagsAllSignalCompletion) {
  auto cfg = config();
  Peer peer([&](Channel& ch) { return serve_region(ch, cfg, 1 << 20); });
  auto desc = MrDesc::from_bytes(peer.channel().recv().value());
  TransferEngine e(cfg);
  Buffer src(1 << 20);
  auto [h, d] = e.reg_mr(src.get(), src.len);
  test::fill_pattern(src.get(), src.len, 3);
  // Remote visibility is signalled by immediates only: count them before
  // checking bytes (a sender's completion says nothing about the far side).
  ASSERT_EQ(ask(peer.channel(), "counter 9"), "ok");
  std::atomic<int> callbacks{0};
  std::atomic<uint64_t> done{0}, errors{0};
  std::atomic<bool> flag{false};
  e.submit_single_write(4096, 9, h, 0, desc, 0, [&](const Status& s) {
    if (s.is_ok()) callbacks.fetch_add(1);
  });
  e.submit_single_write(4096, 9, h, 4096, desc, 4096, OnDone::counter(done, &errors));
  e.submit_single_write(8192, 9, h, 8192, desc, 8192, OnDone::flag(flag));
  ASSERT_TRUE(
      test::wait_until([&] { return callbacks.load() == 1 && done.load() == 1 && flag.load(); }));
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(ask(peer.channel(), "count 9 3"), "ok 0");
  EXPECT_EQ(ask(peer.channel(), check_cmd(0, 16384, 3)), "ok");
  ask(peer.channel(), "quit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(EngineTest, PagedWritesLandAtTheirPages) {
  constexpr uint64_t kPage = 4096, kStride = kPage + 128, kPages = 300;
  auto cfg = config();
  Peer peer([&](Channel& ch) { return serve_region(ch, cfg, kStride * kPages); });
  auto desc = MrDesc::from_bytes(peer.channel().recv().value());
  TransferEngine e(cfg);
  Buffer src(kStride * kPages);
  auto [h, d] = e.reg_mr(src.get(), src.len);
  // Source page i holds pattern seed i; it goes to destination page perm[i].
  std::vector<uint32_t> perm(kPages), ident(kPages);
  for (uint32_t i = 0; i < kPages; ++i) perm[i] = ident[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  for (uint32_t i = 0; i < kPages; ++i)
    test::fill_pattern(src.get() + i * kStride, kPage, 1000 + i);
  ASSERT_EQ(ask(peer.channel(), "counter 11"), "ok");
  std::atomic<bool> done{false}, failed{false};
  e.submit_paged_writes(kPage, 11, h, Pages{ident, kStride, 0}, desc, Pages{perm, kStride, 0},
                        OnDone::flag(done, &failed));
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }));
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(ask(peer.channel(), "count 11 " + std::to_string(kPages)), "ok 0");
  for (uint32_t i = 0; i < kPages; ++i)
    ASSERT_EQ(ask(peer.channel(), check_cmd(perm[i] * kStride, kPage, 1000 + i)), "ok") << i;
  ask(peer.channel(), "quit");
  EXPECT_EQ(peer.wait(), 0);
}

TEST_P(EngineTest, SendRecvRoundTripsManyMessagesInFlight) {
  constexpr int kMessages = 300;
  constexpr size_t kMaxLen = 20000;  // larger than a page
  auto cfg = config();
  // Echo peer: every message starts with the sender's address (hex, NUL-terminated).
  Peer peer([&](Channel& ch) {
    TransferEngine e(cfg);
    std::atomic<int> echoed{0};
    e.submit_recvs(kMaxLen + 512, 64, [&](std::span<const uint8_t> m) {
      auto nul = std::find(m.begin(), m.end(), uint8_t(0));
      auto back = NetAddr::from_hex(std::string(m.begin(), nul));
      e.submit_send(back, m, [&](const Status& s) {
        if (s.is_ok()) echoed.fetch_add(1);
      });
    });
    ch.send(e.main_address().to_hex());
    test::wait_until([&] { return echoed.load() == kMessages; }, 60s);
    ch.recv_str(60s);
    return echoed.load() == kMessages ? 0 : 5;
  });
  auto peer_addr = NetAddr::from_hex(peer.channel().recv_str().value());
  TransferEngine e(cfg);
  std::string me = e.main_address().to_hex();
  std::atomic<int> good{0}, bad{0};
  e.submit_recvs(kMaxLen + 512, 64, [&](std::span<const uint8_t> m) {
    size_t head = me.size() + 1;
    uint64_t seed;
    std::memcpy(&seed, m.data() + head, 8);
    bool ok = test::check_pattern(m.data() + head + 8, m.size() - head - 8, seed) < 0;
    (ok ? good : bad).fetch_add(1);
  });
  std::mt19937 rng(5);
  for (int i = 0; i < kMessages; ++i) {
    size_t len = 8 + rng() % kMaxLen;
    std::vector<uint8_t> msg(me.begin(), me.end());
    msg.push_back(0);
    uint64_t seed = i;
    msg.insert(msg.end(), reinterpret_cast<uint8_t*>(&seed), reinterpret_cast<uint8_t*>(&seed) + 8);
    size_t at = msg.size();
    msg.resize(at + len);
    test::fill_pattern(msg.data() + at, len, seed);
    e.submit_send(peer_addr, msg, OnDone::none());
  }
  ASSERT_TRUE(test::wait_until([&] { return good.load() + bad.load() == kMessages; }, 60s))
      << good.load() << " good, " << bad.load() << " bad";
  EXPECT_EQ(bad.load(), 0);
  peer.channel().send(std::string("quit"));
  EXPECT_EQ(peer.wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, EngineTest,
                         ::testing::ValuesIn(test::providers({"tcp", "shm"})),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

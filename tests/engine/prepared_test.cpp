// Prepared transfers (TransferEngine::prepare_*, submit(prepared, ...)):
// the same shape posted many times lands the same bytes as the unprepared
// request, with each submit's own immediate; a prepared transfer whose region
// or peer went away fails with a typed error.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/tsan.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::code_of;
using test::region;
using test::Region;

class PreparedTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    auto [provider, nics] = GetParam();
    e_ = std::make_unique<TransferEngine>(test::config_for(provider, nics));
  }
  // Waits for the transfer and for `n` arrivals on `c`.
  void expect_done(ImmCounter& c, int64_t n, std::atomic<bool>& done, std::atomic<bool>& failed) {
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 30s));
    ASSERT_FALSE(failed.load());
    ASSERT_TRUE(c.wait(n, 30s).is_ok()) << c.value() << " of " << n;
  }
  std::unique_ptr<TransferEngine> e_;
};

TEST_P(PreparedTest, PagedWritesRepeatedWithTheirOwnImmediatesLandEveryPage) {
  constexpr uint64_t kPage = 4096;
  constexpr uint32_t kPages = 128;
  Region src = region(*e_, kPage * kPages, 3), dst = region(*e_, kPage * kPages * 2, 0);
  Pages sp, dp;
  for (uint32_t i = 0; i < kPages; ++i) {
    sp.indices.push_back(kPages - 1 - i);
    dp.indices.push_back(2 * i + 1);
  }
  sp.stride = dp.stride = kPage;
  PreparedTransfer p = e_->prepare_paged_writes(kPage, src.h, sp, dst.d, dp);
  ASSERT_TRUE(p.valid());
  for (uint32_t round = 0; round < 5; ++round) {
    std::memset(dst.buf.data(), 0, dst.buf.size());
    const uint32_t imm = 100 + round;
    ImmCounter c = e_->imm_counter(imm);
    std::atomic<bool> done{false}, failed{false};
    e_->submit(p, imm, OnDone::flag(done, &failed));
    expect_done(c, kPages, done, failed);
    for (uint32_t i = 0; i < kPages; ++i)
      ASSERT_EQ(std::memcmp(dst.buf.data() + dp.indices[i] * kPage,
                            src.buf.data() + sp.indices[i] * kPage, kPage),
                0)
          << "round " << round << " page " << i;
    EXPECT_EQ(dst.buf[0], 0) << "page 0 is no target";
  }
}

TEST_P(PreparedTest, SingleWriteAndScatterRepeat) {
  Region src = region(*e_, 1 << 20, 9), dst = region(*e_, 1 << 20, 0);
  PreparedTransfer single = e_->prepare_single_write(1 << 19, src.h, 4096, dst.d, 8192);
  PreparedTransfer scatter = e_->prepare_scatter(
      std::nullopt, src.h,
      {ScatterDst{1000, 0, dst.d, 700000}, ScatterDst{3000, 5000, dst.d, 900000}});
  ImmCounter c7 = e_->imm_counter(7);
  for (int round = 0; round < 3; ++round) {
    std::atomic<bool> d1{false}, f1{false}, d2{false}, f2{false};
    e_->submit(single, std::nullopt, OnDone::flag(d1, &f1));
    e_->submit(scatter, 7, OnDone::flag(d2, &f2));
    ASSERT_TRUE(test::wait_until([&] { return d1.load() && d2.load(); }, 30s));
    ASSERT_FALSE(f1.load() || f2.load());
    ASSERT_TRUE(c7.wait(2, 30s).is_ok());
    // The single write carries no immediate: its local completion says nothing
    // about the target, and the scatter's immediates may overtake its bytes.
    // Nothing orders these reads after its landing: NIC memory accesses
    // (support/tsan.h).
    EXPECT_TRUE(test::wait_until(
        [&] {
          test::NicMemoryAccess scope;
          return std::memcmp(dst.buf.data() + 8192, src.buf.data() + 4096, 1 << 19) == 0;
        },
        30s));
    EXPECT_EQ(std::memcmp(dst.buf.data() + 700000, src.buf.data(), 1000), 0);
    EXPECT_EQ(std::memcmp(dst.buf.data() + 900000, src.buf.data() + 5000, 3000), 0);
  }
}

TEST_P(PreparedTest, PrepareChecksWhatSubmitChecks) {
  Region src = region(*e_, 4096, 1), dst = region(*e_, 4096, 0);
  EXPECT_EQ(code_of([&] { e_->prepare_single_write(4097, src.h, 0, dst.d, 0); }),
            Code::kOutOfRange);
  EXPECT_EQ(code_of([&] {
              e_->prepare_paged_writes(1024, src.h, Pages{{0, 4}, 1024, 0}, dst.d,
                                       Pages{{0, 1}, 1024, 0});
            }),
            Code::kOutOfRange);
  EXPECT_EQ(code_of([&] { e_->submit(PreparedTransfer{}, 1, {}); }), Code::kInvalidArgument);
}

TEST_P(PreparedTest, AnUnregisteredSourceFailsTyped) {
  Region src = region(*e_, 4096, 1), dst = region(*e_, 4096, 0);
  PreparedTransfer p = e_->prepare_single_write(64, src.h, 0, dst.d, 0);
  e_->unreg_mr(src.h);
  EXPECT_EQ(code_of([&] { e_->submit(p, 1, {}); }), Code::kFailedPrecondition);
}

// A prepared transfer that outlives its engine (registered, and unregistered
// first) is dropped afterwards without touching closed NICs (ASan checks).
TEST_P(PreparedTest, APreparedTransferMayOutliveItsEngine) {
  Region src = region(*e_, 4096, 1), gone = region(*e_, 4096, 2), dst = region(*e_, 4096, 0);
  PreparedTransfer live = e_->prepare_single_write(64, src.h, 0, dst.d, 0);
  PreparedTransfer retired = e_->prepare_single_write(64, gone.h, 0, dst.d, 0);
  e_->unreg_mr(gone.h);
  e_.reset();
  EXPECT_TRUE(live.valid());
  live = PreparedTransfer{};
  retired = PreparedTransfer{};
  EXPECT_FALSE(live.valid());
}

INSTANTIATE_TEST_SUITE_P(Providers, PreparedTest,
                         ::testing::Combine(::testing::Values("fake", "tcp", "shm"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "nic";
                         });

TEST(PreparedPeers, APeerThatWentAwayFailsUnavailable) {
  TransferEngine e(test::config_for("fake"));
  Region src = region(e, 4096, 1);
  PreparedTransfer p;
  {
    TransferEngine peer(test::config_for("fake"));
    std::vector<uint8_t> mem(4096);
    MrDesc d = peer.reg_mr(mem.data(), mem.size()).second;
    p = e.prepare_single_write(64, src.h, 0, d, 0);
    std::atomic<bool> done{false}, failed{false};
    e.submit(p, 1, OnDone::flag(done, &failed));
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 20s));
    ASSERT_FALSE(failed.load());
  }
  std::atomic<bool> done{false};
  Status got;
  e.submit(p, 1, [&](const Status& s) {
    got = s;
    done = true;
  });
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 20s));
  EXPECT_EQ(got.code(), Code::kUnavailable) << got.to_string();
}

TEST(PreparedPeers, APreparedTransferOfAnotherEngineIsRefused) {
  TransferEngine a(test::config_for("fake")), b(test::config_for("fake"));
  Region src = region(a, 4096, 1), dst = region(a, 4096, 0);
  PreparedTransfer p = a.prepare_single_write(64, src.h, 0, dst.d, 0);
  EXPECT_EQ(code_of([&] { b.submit(p, 1, {}); }), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry

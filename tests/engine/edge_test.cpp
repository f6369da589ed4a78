// Edge cases of one-sided operations, each against a real provider; the
// engine writes into its own registered memory through its own NICs.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>

#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::Buffer;

class EdgeTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    auto [provider, nics] = GetParam();
    nics_ = nics;
    e_ = std::make_unique<TransferEngine>(test::config_for(provider, nics));
  }
  struct Region {
    Buffer buf;
    MrHandle h;
    MrDesc d;
  };
  Region region(size_t len, uint64_t seed) {
    Region r{Buffer(len), {}, {}};
    if (seed) test::fill_pattern(r.buf.get(), len, seed);
    std::tie(r.h, r.d) = e_->reg_mr(r.buf.get(), len);
    return r;
  }
  // Submits through `submit`, waits for the transfer and for `imms` arrivals.
  template <typename F>
  void run(uint32_t imm, uint64_t imms, F submit) {
    auto counter = e_->imm_counter(imm);
    std::atomic<bool> done{false}, failed{false};
    submit(OnDone::flag(done, &failed));
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 60s));
    ASSERT_FALSE(failed.load());
    ASSERT_TRUE(counter.wait(imms, 30s).is_ok()) << "have " << counter.value() << " of " << imms;
    EXPECT_EQ(counter.value(), 0) << "extra immediates";
  }
  int nics_ = 1;
  std::unique_ptr<TransferEngine> e_;
};

TEST_P(EdgeTest, PageAtTheVeryEndOfTheRegionLands) {
  constexpr uint64_t kPage = 4096, kLen = 10 * kPage + 100;
  auto src = region(kLen, 5), dst = region(kLen, 0);
  // Destination page 9 at offset 100 ends exactly at the last byte.
  run(1, 1, [&](OnDone d) {
    e_->submit_paged_writes(kPage, 1, src.h, Pages{{3}, kPage, 0}, dst.d, Pages{{9}, kPage, 100},
                            std::move(d));
  });
  EXPECT_EQ(std::memcmp(dst.buf.get() + kLen - kPage, src.buf.get() + 3 * kPage, kPage), 0);
}

TEST_P(EdgeTest, SinglePageRequestDeliversOneImmediate) {
  auto src = region(8192, 6), dst = region(8192, 0);
  run(2, 1, [&](OnDone d) {
    e_->submit_paged_writes(8192, 2, src.h, Pages{{0}, 8192, 0}, dst.d, Pages{{0}, 8192, 0},
                            std::move(d));
  });
  EXPECT_EQ(std::memcmp(dst.buf.get(), src.buf.get(), 8192), 0);
}

TEST_P(EdgeTest, HundredThousandPagesLandWithOneImmediateEach) {
  constexpr uint32_t kPages = 100000;
  constexpr uint64_t kPage = 64;
  auto src = region(kPages * kPage, 7), dst = region(kPages * kPage, 0);
  std::vector<uint32_t> idx(kPages);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<uint32_t> rev(idx.rbegin(), idx.rend());
  run(3, kPages, [&](OnDone d) {
    e_->submit_paged_writes(kPage, 3, src.h, Pages{idx, kPage, 0}, dst.d, Pages{rev, kPage, 0},
                            std::move(d));
  });
  for (uint32_t i = 0; i < kPages; ++i)
    ASSERT_EQ(std::memcmp(dst.buf.get() + rev[i] * kPage, src.buf.get() + i * kPage, kPage), 0)
        << i;
}

TEST_P(EdgeTest, ZeroLengthWritesDeliverOneImmediateAndTouchNothing) {
  auto src = region(4096, 8), dst = region(4096, 0);
  run(4, ImmPlan::single_write(0, WriteRoute::split(), nics_),
      [&](OnDone d) { e_->submit_single_write(0, 4, src.h, 4096, dst.d, 4096, std::move(d)); });
  run(4, 1, [&](OnDone d) {
    e_->submit_paged_writes(0, 4, src.h, Pages{{0}, 0, 0}, dst.d, Pages{{0}, 0, 4096},
                            std::move(d));
  });
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(dst.buf.get()[i], 0);
}

// Duplicate destination pages are legal: each write lands and carries its
// immediate; with no ordering the page ends up holding one of the sources.
// With identical sources the outcome is exact.
TEST_P(EdgeTest, DuplicateDestinationPagesEachCountAndLandOneSource) {
  auto src = region(4 * 4096, 0), dst = region(4096, 0);
  for (int p = 0; p < 4; ++p) test::fill_pattern(src.buf.get() + p * 4096, 4096, 9);
  run(5, 4, [&](OnDone d) {
    e_->submit_paged_writes(4096, 5, src.h, Pages{{0, 1, 2, 3}, 4096, 0}, dst.d,
                            Pages{{0, 0, 0, 0}, 4096, 0}, std::move(d));
  });
  EXPECT_LT(test::check_pattern(dst.buf.get(), 4096, 9), 0);
}

TEST_P(EdgeTest, EmptyRequestsCompleteAtOnceAndDeliverNothing) {
  auto src = region(4096, 1);
  run(6, 0, [&](OnDone d) {
    e_->submit_paged_writes(4096, 6, src.h, Pages{}, src.d, Pages{}, std::move(d));
  });
  run(6, 0, [&](OnDone d) { e_->submit_scatter(std::nullopt, std::move(d), 6, src.h, {}); });
  run(6, 0, [&](OnDone d) { e_->submit_barrier(std::nullopt, std::move(d), 6, {}); });
}

TEST_P(EdgeTest, DescriptorFromAPeerWithAnotherNicCountIsRejectedBeforePosting) {
  auto [provider, nics] = GetParam();
  TransferEngine other(test::config_for(provider, nics == 1 ? 2 : 1));
  std::vector<uint8_t> mem(4096);
  auto theirs = other.reg_mr(mem.data(), mem.size()).second;
  auto src = region(4096, 1);
  auto counter = e_->imm_counter(7);
  try {
    e_->submit_single_write(8, 7, src.h, 0, theirs, 0, {});
    FAIL() << "accepted a descriptor with " << theirs.nics.size() << " NICs";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Code::kFailedPrecondition);
    EXPECT_NE(std::string(err.what()).find("NICs"), std::string::npos);
  }
  EXPECT_THROW(e_->submit_scatter(std::nullopt, {}, 7, src.h, {ScatterDst{8, 0, theirs, 0}}),
               Error);
  EXPECT_THROW(e_->add_peer_group(std::vector<MrDesc>{theirs}), Error);
  EXPECT_EQ(counter.value(), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, EdgeTest,
                         ::testing::Combine(::testing::Values("tcp", "shm", "fake"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "nic";
                         });

}  // namespace
}  // namespace ferry

// Randomised requests of every kind against a reference model of the target
// memory. Requests in one batch target disjoint bytes (there is no ordering
// between them, so overlapping writes would have no defined result); after
// each batch the real memory must equal the model and every immediate count
// must be exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>

#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"
#include "support/tsan.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::Buffer;

constexpr uint64_t kRegion = 4 << 20;
constexpr int kBatch = 12;
constexpr uint32_t kImmBase = 300;

struct Model {
  std::vector<uint8_t> mem = std::vector<uint8_t>(kRegion, 0);
  std::array<uint64_t, 4> imms{};  // expected arrivals per immediate kImmBase + i
};

class PropertyTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(PropertyTest, RandomRequestsMatchTheReferenceModel) {
  auto [provider, nics] = GetParam();
  const int requests = std::getenv("FERRY_PROPERTY_REQUESTS")
                           ? std::atoi(std::getenv("FERRY_PROPERTY_REQUESTS"))
                           : 1500;
  TransferEngine e(test::config_for(provider, nics));
  Buffer src(kRegion), dst(kRegion);
  std::mt19937_64 rng(1234 + nics);
  for (uint64_t i = 0; i < kRegion; ++i) src.get()[i] = uint8_t(rng());
  auto [sh, sd] = e.reg_mr(src.get(), kRegion);
  auto [dh, dd] = e.reg_mr(dst.get(), kRegion);
  std::array<ImmCounter, 4> counters;
  for (int i = 0; i < 4; ++i) counters[i] = e.imm_counter(kImmBase + i);
  Model model;
  auto group = e.add_peer_group(std::vector<MrDesc>{dd, dd, dd});

  std::atomic<uint64_t> done{0}, errors{0};
  uint64_t submitted = 0, mismatches = 0;
  const uint64_t slot = kRegion / kBatch;  // each request of a batch owns one slot of dst
  auto rand_imm = [&]() -> std::optional<uint32_t> {
    uint32_t r = rng() % 5;
    return r == 4 ? std::nullopt : std::optional<uint32_t>(kImmBase + r);
  };
  auto count = [&](std::optional<uint32_t> imm, uint64_t n) {
    if (imm) model.imms[*imm - kImmBase] += n;
  };
  auto apply = [&](uint64_t d, uint64_t s, uint64_t len) {
    std::memcpy(model.mem.data() + d, src.get() + s, len);
  };

  for (int done_requests = 0; done_requests < requests;) {
    for (int b = 0; b < kBatch && done_requests < requests; ++b, ++done_requests) {
      const uint64_t base = b * slot;
      auto imm = rand_imm();
      auto on_done = OnDone::counter(done, &errors);
      switch (rng() % 6) {
        case 0:
        case 1: {  // single write, random route, sometimes zero bytes
          uint64_t len = rng() % 8 == 0 ? 0 : 1 + rng() % slot;
          uint64_t d = base + rng() % (slot - len + 1), s = rng() % (kRegion - len + 1);
          WriteRoute route;
          switch (rng() % 3) {
            case 0:
              route = WriteRoute::split(0, 1 + rng() % (64 << 10));
              break;
            case 1:
              route = WriteRoute::pinned(rng() % nics);
              break;
            default:
              route = WriteRoute::round_robin();
              break;
          }
          e.submit_single_write(len, imm, sh, s, dd, d, std::move(on_done), route);
          apply(d, s, len);
          count(imm, ImmPlan::single_write(len, route, nics));
          break;
        }
        case 2:
        case 3: {  // paged: distinct destination pages inside the slot
          uint64_t page = 1 + rng() % 8192, stride = page + rng() % 256;
          uint32_t fit = (slot - page) / stride + 1, n = rng() % std::min<uint32_t>(fit, 64);
          std::vector<uint32_t> didx(fit), sidx(n);
          std::iota(didx.begin(), didx.end(), 0);
          std::shuffle(didx.begin(), didx.end(), rng);
          didx.resize(n);
          uint32_t smax = (kRegion - page) / stride;
          for (auto& x : sidx) x = rng() % (smax + 1);
          for (uint32_t i = 0; i < n; ++i) apply(base + didx[i] * stride, sidx[i] * stride, page);
          e.submit_paged_writes(page, imm, sh, Pages{sidx, stride, 0}, dd,
                                Pages{didx, stride, base}, std::move(on_done));
          count(imm, ImmPlan::paged_writes(n));
          break;
        }
        case 4: {  // scatter to three "peers" (all this engine), disjoint thirds of the slot
          GroupRoute route = rng() % 3 == 0   ? GroupRoute::pinned(rng() % nics)
                             : rng() % 2 == 0 ? GroupRoute::shard_bytes()
                                              : GroupRoute::shard_peers();
          std::vector<ScatterDst> dsts;
          uint64_t third = slot / 3;
          for (int t = 0; t < 3; ++t) {
            uint64_t len = rng() % third, d = base + t * third + rng() % (third - len + 1);
            uint64_t s = rng() % (kRegion - len + 1);
            dsts.push_back({len, s, dd, d});
            apply(d, s, len);
            count(imm, ImmPlan::scatter_target(len, route, nics));
          }
          bool use_group = rng() % 2;
          e.submit_scatter(use_group ? std::optional(group) : std::nullopt, std::move(on_done), imm,
                           sh, std::move(dsts), route);
          break;
        }
        case 5: {  // barrier to three "peers"
          uint32_t imm_b = imm.value_or(kImmBase);
          e.submit_barrier(
              group, std::move(on_done), imm_b, {dd, dd, dd},
              rng() % 2 ? GroupRoute::shard_peers() : GroupRoute::pinned(rng() % nics));
          count(imm_b, 3 * ImmPlan::barrier_target());
          break;
        }
      }
      ++submitted;
    }
    ASSERT_TRUE(test::wait_until([&] { return done.load() == submitted; }, 60s))
        << done.load() << " of " << submitted << " done";
    ASSERT_EQ(errors.load(), 0u);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(counters[i].wait(model.imms[i], 30s).is_ok())
          << "imm " << kImmBase + i << " expected " << model.imms[i] << " got "
          << counters[i].value();
      model.imms[i] = 0;
      ASSERT_EQ(counters[i].value(), 0) << "extra immediates for " << kImmBase + i;
    }
    // A sender's completion says nothing about remote visibility: bytes of
    // writes without an immediate may still be landing, so wait (bounded).
    // Nothing orders these reads after such writes: under TSan they are
    // NIC memory accesses (support/tsan.h).
    auto dst_matches = [&] {
      test::NicMemoryAccess scope;
      return std::memcmp(dst.get(), model.mem.data(), kRegion) == 0;
    };
    if (!test::wait_until(dst_matches, 10s)) {
      ++mismatches;
      test::NicMemoryAccess scope;
      auto [a, b] = std::mismatch(dst.get(), dst.get() + kRegion, model.mem.data());
      FAIL() << "memory differs from the model after " << submitted << " requests, first at "
             << (a - dst.get()) << " (slot " << (a - dst.get()) / slot << ")";
    }
  }
  RecordProperty("requests", std::to_string(submitted));
}

INSTANTIATE_TEST_SUITE_P(
    Providers, PropertyTest,
    ::testing::Combine(::testing::ValuesIn(test::providers({"tcp", "shm", "fake"})),
                       ::testing::Values(1, 2, 4)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "nic";
    });

}  // namespace
}  // namespace ferry

#include "core/sharding.h"

#include <gtest/gtest.h>

#include <random>

#include "ferry/engine.h"

namespace ferry::core {
namespace {

// Reassembles what a plan covers and checks every byte exactly once.
void expect_covers(uint64_t len, const ShardPlan& p) {
  uint64_t covered = 0;
  for (uint32_t i = 0; i < p.num_shards; ++i)
    for (uint32_t k = p.shards[i].begin; k < p.shards[i].end; ++k) {
      EXPECT_EQ(p.split.piece_offset(k), covered);
      covered += p.split.piece_len(k, len);
      if (len > 0) EXPECT_GT(p.split.piece_len(k, len), 0u) << "empty piece " << k;
    }
  EXPECT_EQ(covered, len);
}

TEST(Sharding, SplitWriteCoversEveryByteWithNoEmptyPieces) {
  std::mt19937_64 rng(1);
  for (uint32_t nics : {1u, 2u, 4u})
    for (int i = 0; i < 2000; ++i) {
      uint64_t len = rng() % (i < 1000 ? 100000 : (1ull << 34));  // also above 4 GiB
      uint32_t rr = rng() % 7;
      auto p = plan_single(len, WriteRoute::split(0, 1 + rng() % 300000), nics, rr);
      expect_covers(len, p);
      EXPECT_LE(p.split.count, nics);
      EXPECT_EQ(p.total_writes, p.split.count);
    }
}

TEST(Sharding, SplitPiecesUseTheNicTheirDestinationKeyComesFrom) {
  uint32_t rr = 3;
  auto p = plan_single(16 << 20, WriteRoute::split(), 4, rr);
  ASSERT_EQ(p.num_shards, 4u);
  // Piece k on NIC (3 + k) % 4: all four NICs, each once.
  for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(p.shards[k].nic, (3 + k) % 4);
  EXPECT_EQ(rr, 7u);
}

TEST(Sharding, PinnedAndRoundRobinKeepTheWholeWriteOnOneNic) {
  uint32_t rr = 0;
  auto p = plan_single(1 << 20, WriteRoute::pinned(2), 4, rr);
  ASSERT_EQ(p.num_shards, 1u);
  EXPECT_EQ(p.shards[0].nic, 2);
  for (uint32_t i = 0; i < 8; ++i) {
    auto q = plan_single(100, WriteRoute::round_robin(), 4, rr);
    EXPECT_EQ(q.shards[0].nic, i % 4);
  }
}

TEST(Sharding, SmallWritesAreNotSplitBelowMinPiece) {
  uint32_t rr = 0;
  EXPECT_EQ(plan_single(1000, WriteRoute::split(), 4, rr).total_writes, 1u);
  EXPECT_EQ(plan_single(0, WriteRoute::split(), 4, rr).total_writes, 1u);
  EXPECT_EQ(ImmPlan::single_write(1 << 20, WriteRoute::split(), 4), 4u);
  EXPECT_EQ(ImmPlan::single_write(1 << 20, WriteRoute::split(2), 4), 2u);
}

TEST(Sharding, RunsAreContiguousBalancedAndCoverAllUnits) {
  for (uint32_t nics : {1u, 2u, 4u})
    for (uint32_t units : {0u, 1u, 2u, 3u, 5u, 100u, 100001u}) {
      uint32_t rr = 1;
      auto p = plan_runs(units, nics, rr);
      uint32_t next = 0;
      for (uint32_t i = 0; i < p.num_shards; ++i) {
        EXPECT_EQ(p.shards[i].begin, next);
        next = p.shards[i].end;
        EXPECT_LE(p.shards[i].end - p.shards[i].begin, units / std::min(units, nics) + 1);
      }
      EXPECT_EQ(next, units);
      EXPECT_EQ(p.total_writes, units);
    }
}

TEST(Sharding, ShardBytesScatterCountsOneImmPerNonEmptyPiece) {
  EXPECT_EQ(ImmPlan::scatter_target(0, GroupRoute::shard_bytes(), 4), 1u);
  EXPECT_EQ(ImmPlan::scatter_target(100, GroupRoute::shard_bytes(), 4), 1u);
  EXPECT_EQ(ImmPlan::scatter_target(1 << 20, GroupRoute::shard_bytes(), 4), 4u);
  EXPECT_EQ(ImmPlan::scatter_target(1 << 20, GroupRoute::shard_peers(), 4), 1u);
  // No remainder is dropped, also above 4 GiB.
  uint64_t len = (5ull << 30) + 3;
  auto s = split_bytes(len, 4, kMinScatterPiece);
  uint64_t sum = 0;
  for (uint32_t k = 0; k < s.count; ++k) sum += s.piece_len(k, len);
  EXPECT_EQ(sum, len);
}

}  // namespace
}  // namespace ferry::core

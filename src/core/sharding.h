// How requests are cut into writes and placed on a group's NICs. Pure
// functions: both the worker (to post) and ImmPlan (to tell receivers how many
// immediates to expect) use them, so the two can never disagree.
#pragma once

#include <array>
#include <cstdint>

#include "ferry/types.h"

namespace ferry::core {

inline constexpr size_t kMaxNics = 4;
// Bytes below which a scatter target is not split over NICs (ShardBytes).
inline constexpr uint64_t kMinScatterPiece = 64 << 10;
// Piece boundaries of split writes are aligned to this.
inline constexpr uint64_t kPieceAlign = 4096;

// `count` pieces of `base` bytes (the last one shorter); count >= 1, and
// every piece is non-empty unless len == 0 (then one zero-length piece).
struct Split {
  uint64_t base = 0;
  uint32_t count = 1;
  uint64_t piece_offset(uint32_t k) const { return base * k; }
  uint64_t piece_len(uint32_t k, uint64_t len) const {
    uint64_t off = base * k;
    return off >= len ? 0 : std::min(base, len - off);
  }
};
Split split_bytes(uint64_t len, uint32_t max_pieces, uint64_t min_piece);

// A run of units (pieces, pages or targets) [begin, end) posted on one NIC.
// `part` selects which byte share of each unit (ShardBytes scatter only).
struct Shard {
  uint8_t nic = 0;
  uint8_t part = 0;
  uint32_t begin = 0;
  uint32_t end = 0;
};

struct ShardPlan {
  std::array<Shard, kMaxNics> shards{};
  uint32_t num_shards = 0;
  uint64_t total_writes = 0;  // = immediates the receiver gets when imm is set
  Split split;                // single writes: how the bytes were cut
  void add(Shard s) { shards[num_shards++] = s; }
};

// `rr` is the group's rotation cursor; it is advanced by what was used.
ShardPlan plan_single(uint64_t len, const WriteRoute& route, uint32_t nics, uint32_t& rr);
ShardPlan plan_runs(uint32_t units, uint32_t nics, uint32_t& rr);  // paged, barrier, shard-peers
ShardPlan plan_pinned(uint32_t units, uint8_t nic);
// ShardBytes scatter: one shard per NIC over all targets; part = NIC order.
ShardPlan plan_shard_bytes(uint32_t targets, uint32_t nics);

}  // namespace ferry::core

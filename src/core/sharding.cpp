#include "core/sharding.h"

#include <algorithm>

#include "ferry/engine.h"

namespace ferry::core {

namespace {
uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}
}  // namespace

Split split_bytes(uint64_t len, uint32_t max_pieces, uint64_t min_piece) {
  Split s;
  if (len == 0 || max_pieces <= 1) {
    s.base = len;
    s.count = 1;
    return s;
  }
  uint64_t want =
      std::clamp<uint64_t>(div_up(len, std::max<uint64_t>(min_piece, 1)), 1, max_pieces);
  uint64_t base = div_up(len, want);
  if (want > 1) base = div_up(base, kPieceAlign) * kPieceAlign;
  // Aligning may leave trailing pieces empty: recount so none is.
  s.base = std::max<uint64_t>(base, 1);
  s.count = static_cast<uint32_t>(div_up(len, s.base));
  return s;
}

ShardPlan plan_single(uint64_t len, const WriteRoute& route, uint32_t nics, uint32_t& rr) {
  ShardPlan p;
  switch (route.kind) {
    case WriteRoute::Kind::kPinned:
      p.split = split_bytes(len, 1, 0);
      p.add({route.nic, 0, 0, 1});
      break;
    case WriteRoute::Kind::kRoundRobin:
      p.split = split_bytes(len, 1, 0);
      p.add({static_cast<uint8_t>(rr++ % nics), 0, 0, 1});
      break;
    case WriteRoute::Kind::kSplit: {
      uint32_t max = route.max_shards == 0 ? nics : std::min<uint32_t>(route.max_shards, nics);
      p.split = split_bytes(len, max, route.min_piece);
      uint32_t start = rr;
      rr += p.split.count;
      // Piece k goes to NIC (start + k) % nics: each piece on its own NIC, and
      // the destination key is taken from that same NIC's entry.
      for (uint32_t k = 0; k < p.split.count; ++k)
        p.add({static_cast<uint8_t>((start + k) % nics), 0, k, k + 1});
      break;
    }
  }
  p.total_writes = p.split.count;
  return p;
}

ShardPlan plan_runs(uint32_t units, uint32_t nics, uint32_t& rr) {
  ShardPlan p;
  p.total_writes = units;
  if (units == 0) return p;
  uint32_t used = std::min(units, nics);
  uint32_t start = rr;
  rr += used;
  // Contiguous runs whose sizes differ by at most one.
  uint32_t q = units / used, r = units % used, begin = 0;
  for (uint32_t c = 0; c < used; ++c) {
    uint32_t n = q + (c < r ? 1 : 0);
    p.add({static_cast<uint8_t>((start + c) % nics), 0, begin, begin + n});
    begin += n;
  }
  return p;
}

ShardPlan plan_pinned(uint32_t units, uint8_t nic) {
  ShardPlan p;
  p.total_writes = units;
  if (units > 0) p.add({nic, 0, 0, units});
  return p;
}

ShardPlan plan_shard_bytes(uint32_t targets, uint32_t nics) {
  ShardPlan p;
  if (targets == 0) return p;
  for (uint32_t n = 0; n < nics; ++n)
    p.add({static_cast<uint8_t>(n), static_cast<uint8_t>(n), 0, targets});
  return p;  // total_writes is summed per target by the caller (ImmPlan::scatter_target)
}

}  // namespace ferry::core

namespace ferry {

uint64_t ImmPlan::single_write(uint64_t len, const WriteRoute& route, size_t nics) {
  uint32_t rr = 0;
  return core::plan_single(len, route, static_cast<uint32_t>(nics), rr).total_writes;
}

uint64_t ImmPlan::scatter_target(uint64_t len, const GroupRoute& route, size_t nics) {
  if (route.kind != GroupRoute::Kind::kShardBytes) return 1;
  return core::split_bytes(len, static_cast<uint32_t>(nics), core::kMinScatterPiece).count;
}

}  // namespace ferry

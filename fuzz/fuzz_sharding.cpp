// Fuzzes the sharding functions of src/core/sharding.h: how single writes are cut
// into pieces and how pages, scatter targets and barrier targets are spread over
// a group's NICs. Both the worker (to post) and ImmPlan (to tell receivers how
// many immediates to expect) use them, so a wrong answer here is a lost byte, a
// double write, or a receiver waiting forever.
//
// (This stands in for fuzzing the page-list bounds check of submit_paged_writes,
// which is a lambda inside TransferEngine and reachable only with a running engine.)
//
// Inputs are arbitrary lengths, NIC counts (1, 2, 4: what a group may have), routes,
// min_piece, max_shards and rotation cursors (including ones about to wrap). Properties:
//  - split_bytes: count >= 1, count <= max(max_pieces, 1); the pieces cover every byte of
//    [0, len) exactly once, in order; no piece is empty unless len == 0 (then one
//    zero-length piece); a multi-piece split has kPieceAlign-aligned boundaries;
//    a length <= min_piece is never split;
//  - plan_single: one shard per piece, on NIC (cursor + k) % nics, every piece on its own
//    NIC, pinned and round-robin writes whole on one NIC; total_writes == pieces ==
//    ImmPlan::single_write; the cursor advances by the NICs used;
//  - plan_runs: contiguous non-empty runs covering [0, units), sizes within one of each
//    other, at most one per NIC, total_writes == units == ImmPlan::paged_writes;
//  - plan_pinned / plan_shard_bytes and ImmPlan::scatter_target agree with the pieces the
//    worker posts per target (parts below split_bytes(len, nics, kMinScatterPiece).count).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/sharding.h"
#include "ferry/engine.h"
#include "fuzz_check.h"

using namespace ferry;
using namespace ferry::core;
__extension__ typedef unsigned __int128 u128;

namespace {

uint64_t div_up(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

// Every byte of [0, len) exactly once, in order, no empty piece unless len == 0.
void check_split(const Split& s, uint64_t len, uint32_t max_pieces, uint64_t min_piece) {
  FUZZ_CHECK(s.count >= 1);
  FUZZ_CHECK(s.count <= std::max<uint32_t>(max_pieces, 1));
  if (len == 0) {
    FUZZ_CHECK(s.count == 1 && s.piece_len(0, len) == 0 && s.piece_offset(0) == 0);
    return;
  }
  FUZZ_CHECK(s.base >= 1);
  if (len <= std::max<uint64_t>(min_piece, 1)) FUZZ_CHECK(s.count == 1);
  if (s.count > 1) FUZZ_CHECK(s.base % kPieceAlign == 0);
  // Arithmetic form (the count may be large): count - 1 full pieces then a
  // non-empty last piece of at most base bytes, ending exactly at len.
  u128 before_last = u128(s.base) * (s.count - 1);
  FUZZ_CHECK(before_last < len);
  FUZZ_CHECK(u128(len) - before_last <= s.base);
  FUZZ_CHECK(s.piece_offset(s.count - 1) == uint64_t(before_last));
  FUZZ_CHECK(s.piece_len(s.count - 1, len) == len - uint64_t(before_last));
  FUZZ_CHECK(s.piece_len(0, len) == std::min(s.base, len));
  // Piece by piece, through the accessors the worker uses, when there are few.
  if (s.count <= 64) {
    uint64_t covered = 0;
    for (uint32_t k = 0; k < s.count; ++k) {
      FUZZ_CHECK(s.piece_offset(k) == covered);
      uint64_t pl = s.piece_len(k, len);
      FUZZ_CHECK(pl > 0);
      covered += pl;
    }
    FUZZ_CHECK(covered == len);
  }
}

// At most one shard per NIC, each on a NIC of the group.
void check_distinct_nics(const ShardPlan& p, uint32_t nics) {
  std::array<bool, kMaxNics> used{};
  FUZZ_CHECK(p.num_shards <= nics);
  for (uint32_t i = 0; i < p.num_shards; ++i) {
    FUZZ_CHECK(p.shards[i].nic < nics);
    FUZZ_CHECK(!used[p.shards[i].nic]);
    used[p.shards[i].nic] = true;
  }
}

uint64_t consume_len(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return fdp.ConsumeIntegralInRange<uint64_t>(0, 4 * kPieceAlign);
    case 1:
      return fdp.ConsumeIntegralInRange<uint64_t>(0, 64ull << 20);
    case 2:
      return UINT64_MAX - fdp.ConsumeIntegralInRange<uint64_t>(0, 1 << 20);
    default:
      return fdp.ConsumeIntegral<uint64_t>();
  }
}

uint32_t consume_rr(FuzzedDataProvider& fdp) {
  return fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint32_t>(0, 16)
                           : UINT32_MAX - fdp.ConsumeIntegralInRange<uint32_t>(0, 8);
}

void fuzz_single(FuzzedDataProvider& fdp, uint32_t nics) {
  uint64_t len = consume_len(fdp);
  uint32_t rr0 = consume_rr(fdp), rr = rr0;
  WriteRoute route;
  switch (fdp.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      // The engine rejects max_shards > nics; plan_single clamps, so try both.
      uint8_t max_shards = fdp.ConsumeIntegral<uint8_t>();
      uint64_t min_piece = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint64_t>(0, 1 << 20)
                                             : fdp.ConsumeIntegral<uint64_t>();
      route = WriteRoute::split(max_shards, min_piece);
      break;
    }
    case 1:
      route = WriteRoute::pinned(fdp.ConsumeIntegralInRange<uint8_t>(0, nics - 1));
      break;
    default:
      route = WriteRoute::round_robin();
      break;
  }
  ShardPlan p = plan_single(len, route, nics, rr);
  check_split(p.split, len, route.kind == WriteRoute::Kind::kSplit ? nics : 1, route.min_piece);
  FUZZ_CHECK(p.total_writes == p.split.count);
  FUZZ_CHECK(ImmPlan::single_write(len, route, nics) == p.total_writes);
  check_distinct_nics(p, nics);
  switch (route.kind) {
    case WriteRoute::Kind::kSplit: {
      uint32_t max = route.max_shards == 0 ? nics : std::min<uint32_t>(route.max_shards, nics);
      FUZZ_CHECK(p.split.count <= max);
      FUZZ_CHECK(p.split.count == split_bytes(len, max, route.min_piece).count);
      FUZZ_CHECK(p.num_shards == p.split.count);
      for (uint32_t k = 0; k < p.num_shards; ++k) {
        FUZZ_CHECK(p.shards[k].begin == k && p.shards[k].end == k + 1);
        FUZZ_CHECK(p.shards[k].nic == (rr0 + k) % nics);
      }
      FUZZ_CHECK(rr == rr0 + p.split.count);
      break;
    }
    case WriteRoute::Kind::kPinned:
      FUZZ_CHECK(p.num_shards == 1 && p.shards[0].nic == route.nic);
      FUZZ_CHECK(p.shards[0].begin == 0 && p.shards[0].end == 1 && p.split.count == 1);
      FUZZ_CHECK(rr == rr0);
      break;
    case WriteRoute::Kind::kRoundRobin:
      FUZZ_CHECK(p.num_shards == 1 && p.shards[0].nic == rr0 % nics);
      FUZZ_CHECK(p.shards[0].begin == 0 && p.shards[0].end == 1 && p.split.count == 1);
      FUZZ_CHECK(rr == rr0 + 1);
      break;
  }
}

void fuzz_runs(FuzzedDataProvider& fdp, uint32_t nics) {
  uint32_t units = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint32_t>(0, 9)
                                     : fdp.ConsumeIntegral<uint32_t>();
  uint32_t rr0 = consume_rr(fdp), rr = rr0;
  ShardPlan p = plan_runs(units, nics, rr);
  FUZZ_CHECK(p.total_writes == units);
  FUZZ_CHECK(ImmPlan::paged_writes(units) == p.total_writes);
  check_distinct_nics(p, nics);
  if (units == 0) {
    FUZZ_CHECK(p.num_shards == 0 && rr == rr0);
    return;
  }
  uint32_t used = std::min(units, nics);
  FUZZ_CHECK(p.num_shards == used);
  FUZZ_CHECK(rr == rr0 + used);
  uint32_t next = 0, lo = UINT32_MAX, hi = 0;
  for (uint32_t c = 0; c < p.num_shards; ++c) {
    const Shard& s = p.shards[c];
    FUZZ_CHECK(s.begin == next && s.end > s.begin);
    FUZZ_CHECK(s.nic == (rr0 + c) % nics && s.part == 0);
    lo = std::min(lo, s.end - s.begin);
    hi = std::max(hi, s.end - s.begin);
    next = s.end;
  }
  FUZZ_CHECK(next == units);
  FUZZ_CHECK(hi - lo <= 1);

  ShardPlan q = plan_pinned(units, uint8_t(rr0 % nics));
  FUZZ_CHECK(q.num_shards == 1 && q.total_writes == units);
  FUZZ_CHECK(q.shards[0].begin == 0 && q.shards[0].end == units && q.shards[0].nic == rr0 % nics);
}

// ShardBytes scatter: NIC n carries part n of every target; the worker skips parts
// at or past the target's piece count. Immediates per target must match.
void fuzz_scatter(FuzzedDataProvider& fdp, uint32_t nics) {
  uint32_t targets = fdp.ConsumeIntegralInRange<uint32_t>(0, 8);
  ShardPlan p = plan_shard_bytes(targets, nics);
  if (targets == 0) {
    FUZZ_CHECK(p.num_shards == 0);
    return;
  }
  FUZZ_CHECK(p.num_shards == nics);
  for (uint32_t n = 0; n < nics; ++n) {
    FUZZ_CHECK(p.shards[n].nic == n && p.shards[n].part == n);
    FUZZ_CHECK(p.shards[n].begin == 0 && p.shards[n].end == targets);
  }
  for (uint32_t t = 0; t < targets && fdp.remaining_bytes() > 0; ++t) {
    uint64_t len = consume_len(fdp);
    Split s = split_bytes(len, nics, kMinScatterPiece);
    check_split(s, len, nics, kMinScatterPiece);
    uint64_t posted = 0, bytes = 0;
    for (uint32_t n = 0; n < p.num_shards; ++n) {
      if (p.shards[n].part >= s.count) continue;  // as Worker::fill_writes
      ++posted;
      FUZZ_CHECK(s.piece_offset(p.shards[n].part) == bytes);
      bytes += s.piece_len(p.shards[n].part, len);
    }
    FUZZ_CHECK(bytes == len);
    FUZZ_CHECK(ImmPlan::scatter_target(len, GroupRoute::shard_bytes(), nics) == posted);
    FUZZ_CHECK(ImmPlan::scatter_target(len, GroupRoute::shard_peers(), nics) == 1);
    FUZZ_CHECK(ImmPlan::scatter_target(len, GroupRoute::pinned(0), nics) == 1);
  }
}

// split_bytes on its own, outside the engine's domain too: any max_pieces.
void fuzz_split(FuzzedDataProvider& fdp) {
  uint64_t len = consume_len(fdp);
  uint32_t max_pieces = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint32_t>(0, 8)
                                          : fdp.ConsumeIntegral<uint32_t>();
  uint64_t min_piece = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint64_t>(0, 1 << 20)
                                         : fdp.ConsumeIntegral<uint64_t>();
  Split s = split_bytes(len, max_pieces, min_piece);
  check_split(s, len, max_pieces, min_piece);
  if (len > 0 && max_pieces > 1) FUZZ_CHECK(s.count == div_up(len, s.base));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  // Several operations per input, so one input can mix plans on one cursor.
  for (int op = 0; op < 8 && fdp.remaining_bytes() > 0; ++op) {
    static constexpr uint32_t kNics[] = {1, 2, 4};  // what Worker::open_nics accepts
    uint32_t nics = kNics[fdp.ConsumeIntegralInRange<int>(0, 2)];
    switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        fuzz_single(fdp, nics);
        break;
      case 1:
        fuzz_runs(fdp, nics);
        break;
      case 2:
        fuzz_scatter(fdp, nics);
        break;
      default:
        fuzz_split(fdp);
        break;
    }
  }
  return 0;
}

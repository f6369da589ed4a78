#include "model.h"

#include <numeric>
#include <random>

namespace ferry::soak {

std::vector<Xfer> gen_round(uint64_t seed, int s, uint64_t r, uint32_t count) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(s) << 48) ^
                      (r * 0xBF58476D1CE4E5B9ull));
  uint64_t cursor[kProcs] = {};
  int others[2], k = 0;
  for (int p = 0; p < kProcs; ++p)
    if (p != s) others[k++] = p;
  auto reserve = [&](int peer, uint64_t len, uint64_t* off) {
    uint64_t o = cursor[peer] + rng() % 32;  // the gap must stay poisoned
    if (o + len > kArea) return false;
    *off = o;
    cursor[peer] = o + len;
    return true;
  };
  auto size = [&](bool big_ok) -> uint64_t {
    uint32_t x = rng() % 1000;
    if (x < 30) return 0;
    if (x < 400) return 1 + rng() % 64;
    if (x < 900) return 65 + rng() % 4032;
    if (x < 985 || !big_ok) return 4097 + rng() % (60 << 10);
    return (64 << 10) + rng() % (448 << 10);
  };
  auto src_for = [&](uint64_t len) { return rng() % (kSrcLen - len + 1); };
  std::vector<Xfer> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Xfer x;
    x.seq = uint32_t(r * count + i);
    x.imm = imm_of(s, x.seq);
    uint32_t pick = rng() % 100;
    x.kind = pick < 34   ? Kind::kSingle
             : pick < 52 ? Kind::kPaged
             : pick < 68 ? Kind::kScatter
             : pick < 76 ? Kind::kBarrier
             : pick < 84 ? Kind::kImm
                         : Kind::kSend;
    x.has_imm = !(x.kind <= Kind::kScatter && rng() % 10 == 0);
    bool fits = true;
    switch (x.kind) {
      case Kind::kSingle: {
        Target t{others[rng() % 2], {}, 0};
        Seg g;
        g.len = size(true);
        g.src = src_for(g.len);
        fits = reserve(t.peer, g.len, &g.dst);
        switch (rng() % 3) {
          case 0: {
            static constexpr uint64_t kPieces[] = {1, 4096, 64 << 10, 256 << 10};
            x.wroute = WriteRoute::split(rng() % 3, kPieces[rng() % 4]);
            break;
          }
          case 1:
            x.wroute = WriteRoute::pinned(rng() % kNics);
            break;
          default:
            x.wroute = WriteRoute::round_robin();
            break;
        }
        t.imms = ImmPlan::single_write(g.len, x.wroute, kNics);
        t.segs.push_back(g);
        x.targets.push_back(std::move(t));
        break;
      }
      case Kind::kPaged: {
        Target t{others[rng() % 2], {}, 0};
        x.page_len = rng() % 10 < 7 ? 1 + rng() % 512 : 513 + rng() % 3584;
        x.stride = x.page_len + rng() % 64;
        uint32_t n = rng() % 40 == 0 ? 0 : 1 + rng() % 24, span = std::max<uint32_t>(1, 2 * n);
        fits = reserve(t.peer, (span - 1) * x.stride + x.page_len, &x.page_base);
        std::vector<uint32_t> all(span);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        x.didx.assign(all.begin(), all.begin() + n);
        uint64_t smax = (kSrcLen - x.page_len) / x.stride;
        for (uint32_t j = 0; j < n; ++j) {
          x.sidx.push_back(rng() % (smax + 1));
          t.segs.push_back({x.page_base + x.didx[j] * x.stride, x.sidx[j] * x.stride, x.page_len});
        }
        t.imms = ImmPlan::paged_writes(n);
        x.targets.push_back(std::move(t));
        break;
      }
      case Kind::kScatter: {
        uint32_t g = rng() % 3;
        x.groute = g == 0   ? GroupRoute::shard_peers()
                   : g == 1 ? GroupRoute::shard_bytes()
                            : GroupRoute::pinned(rng() % kNics);
        x.use_group = rng() % 10 < 6;
        size_t nt = x.use_group ? 2 : 1 + rng() % 3;
        for (size_t j = 0; j < nt && fits; ++j) {
          Target t{x.use_group ? others[j] : others[rng() % 2], {}, 0};
          Seg sg;
          sg.len = size(x.groute.kind == GroupRoute::Kind::kShardBytes);
          sg.src = src_for(sg.len);
          fits = reserve(t.peer, sg.len, &sg.dst);
          t.imms = ImmPlan::scatter_target(sg.len, x.groute, kNics);
          t.segs.push_back(sg);
          x.targets.push_back(std::move(t));
        }
        break;
      }
      case Kind::kBarrier: {
        uint32_t g = rng() % 3;
        x.groute = g == 0   ? GroupRoute::shard_peers()
                   : g == 1 ? GroupRoute::shard_bytes()
                            : GroupRoute::pinned(rng() % kNics);
        x.use_group = rng() % 10 < 7;
        size_t nt = x.use_group ? 2 : 1 + rng() % 3;
        for (size_t j = 0; j < nt; ++j)
          x.targets.push_back({x.use_group ? others[j] : others[rng() % 2], {}, 1});
        break;
      }
      case Kind::kImm:
        x.wroute = rng() % 2 ? WriteRoute::pinned(rng() % kNics) : WriteRoute::round_robin();
        x.targets.push_back({others[rng() % 2], {}, 1});
        break;
      case Kind::kSend:
        x.has_imm = false;
        x.msg_len = 16 + rng() % (kRecvLen - 15);
        x.targets.push_back({others[rng() % 2], {}, 0});
        break;
      case Kind::kCount:
        break;
    }
    if (!fits) break;  // the area is full: the round ends here, on both sides
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace ferry::soak

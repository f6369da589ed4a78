// The MoE layout against a model that moves every (token, k) pair the slow
// way: each source builds its send layout by sorting, writes its private and
// overflow rows into a simulated receive buffer (overflow packed by walking
// the sources, not through Routes::overflow_offset), and the receiver reads
// the rows ReceivePlan::for_each_row names. Every pair must arrive exactly
// once, in its expert's padded block, and map back to its own combine row.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "ferry/status.h"
#include "moe/plan_view.h"
#include "moe/proxy.h"
#include "moe/routing.h"

namespace ferry::moe {
namespace {

struct Pair {
  uint32_t src, token, k, expert;
  bool operator==(const Pair&) const = default;
};
constexpr Pair kEmpty{~0u, ~0u, ~0u, ~0u};

enum class Shape { kUniform, kOneExpert, kSkewed, kEmptyRanks, kOneToken, kFull };

// indices[s][t][k] for every source.
std::vector<std::vector<std::vector<uint32_t>>> route(std::mt19937_64& rng, const Geometry& g,
                                                      Shape shape) {
  std::vector<std::vector<std::vector<uint32_t>>> idx(g.world);
  const uint32_t E = g.num_experts, K = g.experts_per_token;
  for (uint32_t s = 0; s < g.world; ++s) {
    uint32_t n = static_cast<uint32_t>(rng() % (g.max_tokens + 1));
    if (shape == Shape::kOneToken) n = 1;
    if (shape == Shape::kFull) n = g.max_tokens;
    if (shape == Shape::kEmptyRanks && s % 2 == 0) n = 0;
    idx[s].resize(n);
    for (auto& tok : idx[s]) {
      std::vector<uint32_t> pick;
      while (pick.size() < K) {
        uint32_t e;
        if (shape == Shape::kOneExpert)
          e = static_cast<uint32_t>(pick.size());  // every token: experts 0..K-1
        else if (shape == Shape::kSkewed)
          e = static_cast<uint32_t>(rng() %
                                    std::min<uint32_t>(E, std::max<uint32_t>(K, E / 8 + 1)));
        else
          e = static_cast<uint32_t>(rng() % E);
        if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
      }
      tok = pick;
    }
  }
  return idx;
}

void check(const Geometry& g0, const std::vector<std::vector<std::vector<uint32_t>>>& idx) {
  const uint32_t N = g0.world, E = g0.num_experts, L = g0.local_experts(),
                 P = g0.max_private_tokens;
  // Send layouts: pairs sorted by expert, stable in (token, k) order.
  std::vector<std::vector<Pair>> layout(N);
  std::vector<uint32_t> counts(size_t{N} * E, 0);
  for (uint32_t s = 0; s < N; ++s) {
    for (uint32_t t = 0; t < idx[s].size(); ++t)
      for (uint32_t k = 0; k < idx[s][t].size(); ++k) {
        layout[s].push_back({s, t, k, idx[s][t][k]});
        counts[size_t{s} * E + idx[s][t][k]]++;
      }
    std::stable_sort(layout[s].begin(), layout[s].end(),
                     [](const Pair& a, const Pair& b) { return a.expert < b.expert; });
  }
  for (uint32_t d = 0; d < N; ++d) {
    Geometry g = g0;
    g.rank = d;
    Routes routes(g, counts);
    ASSERT_TRUE(routes.fits(d));
    // The model's receive buffer: private rows, then overflow packed in source order.
    std::vector<Pair> recv(g.recv_rows(), kEmpty);
    uint64_t packed = uint64_t{N} * P;
    uint32_t remote_writes = 0;
    for (uint32_t s = 0; s < N; ++s) {
      std::vector<Pair> to_d;
      for (const Pair& p : layout[s])
        if (p.expert / L == d) to_d.push_back(p);
      ASSERT_EQ(routes.rows(s, d), to_d.size());
      if (!to_d.empty()) {
        ASSERT_EQ(layout[s][routes.base(s, d)], to_d[0]);  // contiguous from base
      }
      if (s == d) continue;
      const bool remote = g.node_of(s) != g.node_of(d);
      if (remote) remote_writes += 2;  // private and overflow, empty or not
      for (uint32_t j = 0; j < to_d.size(); ++j) {
        uint64_t row;
        if (j < P)
          row = uint64_t{s} * P + j;
        else if (remote)
          row = packed++;
        else
          continue;  // same node: pulled from the source's send buffer
        ASSERT_LT(row, recv.size());
        ASSERT_EQ(recv[row], kEmpty) << "row " << row << " written twice";
        recv[row] = to_d[j];
      }
    }
    EXPECT_EQ(expected_imms(g).dispatch, remote_writes);
    EXPECT_EQ(expected_imms(g).combine, g.world - g.node_size);
    EXPECT_EQ(expected_imms(g).route, g.world - 1);

    ReceivePlan plan = ReceivePlan::make(routes);
    ASSERT_LE(plan.out_rows, g.max_out_rows());
    std::vector<Pair> out(g.max_out_rows(), kEmpty);
    std::map<std::tuple<uint32_t, uint32_t, uint32_t>, int> seen;
    std::vector<uint32_t> send_slots(routes.received(d), 0);
    // The kernels' view of the same plan, from the words the proxy writes.
    std::vector<uint32_t> words(plan_words(g));
    write_plan(plan, g, words.data());
    const PlanView v = PlanView::of(words.data(), N, L, d, g.node_size, P);
    std::vector<uint32_t> item_pre(size_t{L} * N + 1), stream_pre(size_t{N} * L), ovf(N);
    derive(v, item_pre.data(), stream_pre.data(), ovf.data());
    ASSERT_EQ(item_pre.back(), routes.received(d));
    uint32_t item = 0;
    plan.for_each_row(routes, [&](const ReceivePlan::Row& r) {
      const RowLoc loc = locate(v, item_pre.data(), stream_pre.data(), ovf.data(), item++);
      ASSERT_EQ(loc.out_row, r.out_row);
      ASSERT_EQ(loc.src, r.src);
      ASSERT_EQ(loc.from, static_cast<uint32_t>(r.from));
      ASSERT_EQ(loc.read_row, r.read_row);
      ASSERT_EQ(loc.combine_row, r.combine_row);
      ASSERT_EQ(loc.send_row, plan.combine_send_offset[r.src] + r.stream_index);
      Pair p;
      switch (r.from) {
        case Source::kOwnSend:
          ASSERT_EQ(r.src, d);
          p = layout[d][r.read_row];
          break;
        case Source::kPeerSend:
          ASSERT_TRUE(g.same_node(r.src, d));
          ASSERT_GE(r.stream_index, P);
          p = layout[r.src][r.read_row];
          break;
        case Source::kRecv:
          ASSERT_LT(r.read_row, recv.size());
          p = recv[r.read_row];
          break;
      }
      ASSERT_NE(p, kEmpty) << "row read before anything was written";
      ASSERT_EQ(p.src, r.src);
      ASSERT_EQ(p.expert / L, d);
      const uint32_t l = p.expert % L;
      ASSERT_GE(r.out_row, plan.expert_offset[l]);
      ASSERT_LT(r.out_row, plan.expert_offset[l] + plan.expert_total[l]);
      ASSERT_EQ(out[r.out_row], kEmpty);
      out[r.out_row] = p;
      // Combine: the row returns to where it came from in src's layout.
      ASSERT_EQ(layout[r.src][r.combine_row], p);
      const uint64_t cs = plan.combine_send_offset[r.src] + r.stream_index;
      ASSERT_LT(cs, send_slots.size());
      ASSERT_EQ(send_slots[cs]++, 0u);
      seen[{p.src, p.token, p.k}]++;
    });
    // Exactly the pairs routed to d's experts, once each.
    size_t expected = 0;
    for (uint32_t s = 0; s < N; ++s)
      for (const Pair& p : layout[s])
        if (p.expert / L == d) {
          ++expected;
          ASSERT_EQ((seen[{p.src, p.token, p.k}]), 1);
        }
    ASSERT_EQ(seen.size(), expected);
    for (uint32_t l = 0; l < L; ++l) {
      ASSERT_EQ(plan.expert_offset[l] % g.expert_padding, 0u);
      uint32_t total = 0;
      for (uint32_t s = 0; s < N; ++s) total += counts[size_t{s} * E + d * L + l];
      ASSERT_EQ(plan.expert_total[l], total);
    }
  }
}

TEST(MoeRouting, ThousandsOfRandomRoutingsMatchTheModel) {
  std::mt19937_64 rng(18);
  const Shape shapes[] = {Shape::kUniform,    Shape::kOneExpert, Shape::kSkewed,
                          Shape::kEmptyRanks, Shape::kOneToken,  Shape::kFull};
  int cases = 0;
  for (int i = 0; i < 3000; ++i) {
    const uint32_t worlds[] = {1, 2, 4, 8};
    const uint32_t N = worlds[rng() % 4];
    const uint32_t nodes[] = {1, 2, 4, 8};
    uint32_t S = nodes[rng() % 4];
    while (N % S) S /= 2;
    const uint32_t L = 1 + static_cast<uint32_t>(rng() % 8);
    const uint32_t E = N * L;
    const uint32_t K = 1 + static_cast<uint32_t>(rng() % std::min<uint32_t>(8, E));
    const uint32_t T = 1 + static_cast<uint32_t>(rng() % 24);
    const uint32_t pads[] = {1, 1, 4, 16};
    const uint32_t pad = pads[rng() % 4];
    const uint32_t P = static_cast<uint32_t>(rng() % (T * K + 1));
    Geometry g = Geometry::make(N, 0, S, E, K, T, pad, P);
    check(g, route(rng, g, shapes[i % 6]));
    if (HasFatalFailure()) FAIL() << "case " << i << " N=" << N << " S=" << S << " E=" << E;
    ++cases;
  }
  EXPECT_EQ(cases, 3000);
}

TEST(MoeRouting, MaxTokensLargeGeometry) {
  // 4096 tokens, 256 experts, top-8 on 4 ranks: the prefill shape.
  std::mt19937_64 rng(7);
  for (uint32_t S : {1u, 2u, 4u}) {
    Geometry g = Geometry::make(4, 0, S, 256, 8, 4096, 16, 64);
    check(g, route(rng, g, Shape::kFull));
    check(g, route(rng, g, Shape::kOneExpert));
  }
}

TEST(MoeRouting, SizesAndValidation) {
  Geometry g = Geometry::make(4, 1, 2, 256, 8, 128, 16, 40);
  EXPECT_EQ(g.local_experts(), 64u);
  EXPECT_EQ(g.shared_rows(), 4u * 128 * 8);
  EXPECT_EQ(g.recv_rows(), 4u * 40 + 4 * 128 * 8);
  EXPECT_EQ(g.max_out_rows(), (4u * 128 * 8 + 64 * 15) / 16 * 16);
  // L = 1 bounds a rank's rows by N*T, not N*T*K.
  Geometry one = Geometry::make(8, 0, 8, 8, 4, 10, 1, 0);
  EXPECT_EQ(one.shared_rows(), 80u);
  EXPECT_EQ(dispatch_stride(7168, 1, 56), 7168u + 224);
  EXPECT_EQ(dispatch_stride(7, 2, 1), 16u + 16);
  EXPECT_EQ(combine_stride(7168, 2), 14336u);
  EXPECT_EQ(imm_of(0, ImmKind::kRoute), 0xF0000000u);
  EXPECT_EQ(imm_of(5, ImmKind::kBarrier), 0xF0000053u);
  EXPECT_THROW(imm_of(1u << 24, ImmKind::kRoute), Error);
  auto code = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return Code::kOk;
  };
  EXPECT_EQ(code([] { Geometry::make(3, 0, 2, 6, 1, 1, 1, 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code([] { Geometry::make(4, 0, 1, 6, 1, 1, 1, 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code([] { Geometry::make(2, 0, 1, 1024, 1, 1, 1, 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code([] { Geometry::make(2, 0, 1, 16, 9, 1, 1, 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code([] { Geometry::make(2, 0, 1, 16, 2, 4097, 1, 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code([] { Geometry::make(2, 2, 1, 16, 2, 1, 1, 0); }), Code::kInvalidArgument);
  EXPECT_GE(default_max_private_tokens(64, 256, 8, 128), 16u);
}

TEST(MoeRouting, DuplicateExpertsDoNotFit) {
  // A token naming the same expert K times on every rank overfills a rank
  // with L = 1: fits() says so, so nothing is written past the buffers.
  Geometry g = Geometry::make(2, 0, 1, 2, 4, 8, 1, 0);
  std::vector<uint32_t> counts = {32, 0, 32, 0};  // everything to expert 0
  Routes r(g, counts);
  EXPECT_FALSE(r.fits(0));
  EXPECT_TRUE(r.fits(1));
}

}  // namespace
}  // namespace ferry::moe

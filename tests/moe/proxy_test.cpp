// The proxy's protocol over real engines, with host threads standing in for
// the four kernels (same plan words, same PlanView arithmetic as the CUDA
// code). All ranks live in this process: the fake NIC or tcp;ofi_rxm on lo
// carries routes, private/overflow rounds, combine and barriers; the
// "NVLink" pushes and pulls of same-node ranks are memcpy between the ranks'
// buffers. Every iteration re-routes, and every dispatched row and combined
// token is checked against a reference computed from the inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ferry/engine.h"
#include "moe/plan_view.h"
#include "moe/proxy.h"
#include "moe/routing.h"
#include "support/engine_config.h"
#include "support/text_file.h"

namespace ferry::moe {
namespace {

using namespace std::chrono_literals;
constexpr uint32_t kHidden = 4;  // floats per row: D = C = 16 bytes
constexpr uint64_t kRow = kHidden * 4;

template <typename T>
T ld(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_acquire);
}
template <typename T>
void st(T* p, std::type_identity_t<T> v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
}

struct Buf {
  std::vector<uint8_t> mem;
  MrHandle h;
  MrDesc d;
  void reg(TransferEngine& e, size_t bytes) {
    mem.assign(std::max<size_t>(bytes, 64), 0);
    std::tie(h, d) = e.reg_mr(mem.data(), mem.size());
  }
  float* f(uint64_t row) { return reinterpret_cast<float*>(mem.data() + row * kRow); }
};

struct Rank {
  Geometry g;
  std::unique_ptr<TransferEngine> engine;
  Buf routes, send, recv, csend, crecv;
  uint64_t progress = 0;
  uint32_t plan_epoch = 0, tx_ready = 0, error = 0;
  std::vector<uint32_t> plan;
  uint32_t ds[8] = {}, cs[8] = {};  // written by same-node peers
  ImmCounter dispatch_imms, combine_imms;
  std::unique_ptr<Proxy> proxy;
  // This iteration's inputs and outputs.
  std::vector<std::vector<uint32_t>> idx;
  std::vector<std::vector<float>> w;
  std::vector<uint32_t> pos;  // (t, k) -> row of the send layout
  std::vector<float> out_x;
  std::vector<uint32_t> out_tokens;
};

float token_value(uint32_t src, uint32_t t, uint32_t h) {
  return src * 1000.f + t + h * 0.25f;
}

class World {
 public:
  World(const std::string& provider, uint32_t N, uint32_t S, uint32_t E, uint32_t K, uint32_t T,
        uint32_t pad, uint32_t P, std::chrono::milliseconds deadline,
        const std::string& faults_on_last = "", const std::string& trace_first = "")
      : ranks_(N) {
    for (uint32_t r = 0; r < N; ++r) {
      Rank& k = ranks_[r];
      k.g = Geometry::make(N, r, S, E, K, T, pad, P);
      EngineConfig c = test::config_for(provider);
      if (r == N - 1 && !faults_on_last.empty()) c.fault_injection = faults_on_last;
      if (r == 0) c.trace_file = trace_first;
      k.engine = std::make_unique<TransferEngine>(c);
      k.routes.reg(*k.engine, size_t{N} * E * 4);
      k.send.reg(*k.engine, k.g.combine_rows() * kRow);
      k.recv.reg(*k.engine, k.g.recv_rows() * kRow);
      k.csend.reg(*k.engine, k.g.shared_rows() * kRow);
      k.crecv.reg(*k.engine, k.g.combine_rows() * kRow);
      k.plan.assign(plan_words(k.g), 0);
      k.dispatch_imms = k.engine->imm_counter(imm_of(7, ImmKind::kDispatch));
      k.combine_imms = k.engine->imm_counter(imm_of(7, ImmKind::kCombine));
    }
    std::vector<ProxyPeer> peers;
    for (Rank& k : ranks_) peers.push_back({k.routes.d, k.recv.d, k.crecv.d});
    for (Rank& k : ranks_) {
      ProxyConfig pc{k.g, 7, deadline, 50us};
      ProxyWords words{&k.progress, k.plan.data(), &k.plan_epoch, &k.tx_ready, &k.error};
      ProxyBuffers bufs{k.routes.h, reinterpret_cast<const uint32_t*>(k.routes.mem.data()),
                        k.send.h,   kRow,
                        k.csend.h,  kRow};
      k.proxy = std::make_unique<Proxy>(*k.engine, pc, words, bufs, peers);
    }
  }
  ~World() {
    for (Rank& k : ranks_) k.proxy->stop();
  }
  Rank& operator[](size_t i) { return ranks_[i]; }
  size_t size() const { return ranks_.size(); }

  // Waits like a kernel: until ready, the proxy's error word, or the deadline.
  template <typename F>
  static bool spin(Rank& k, F ready) {
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (!ready()) {
      if (ld(&k.error) != 0 || std::chrono::steady_clock::now() > end) return false;
      std::this_thread::yield();
    }
    return true;
  }

  bool dispatch_send(uint32_t me, uint32_t e) {
    Rank& k = ranks_[me];
    const Geometry& g = k.g;
    if (!spin(k, [&] { return ld(&k.tx_ready) >= e - 1; })) return false;
    const uint32_t E = g.num_experts, K = g.experts_per_token, L = g.local_experts();
    std::vector<uint32_t> cnt(E, 0);
    for (auto& tok : k.idx)
      for (uint32_t x : tok) cnt[x]++;
    std::vector<uint32_t> off(E + 1, 0);
    for (uint32_t x = 0; x < E; ++x) off[x + 1] = off[x] + cnt[x];
    std::vector<uint32_t> fill(off.begin(), off.end() - 1);
    k.pos.assign(k.idx.size() * K, 0);
    uint32_t* row = reinterpret_cast<uint32_t*>(k.routes.mem.data()) + size_t{me} * E;
    for (uint32_t x = 0; x < E; ++x) st(&row[x], cnt[x]);
    st(&k.progress, 4ull * e - 3);
    k.proxy->notify();
    for (uint32_t t = 0; t < k.idx.size(); ++t)
      for (uint32_t j = 0; j < K; ++j) {
        const uint32_t p = fill[k.idx[t][j]]++;
        k.pos[t * K + j] = p;
        for (uint32_t h = 0; h < kHidden; ++h) k.send.f(p)[h] = token_value(me, t, h);
      }
    st(&k.progress, 4ull * e - 2);
    k.proxy->notify();
    // Push the first P rows of every same-node destination into its private rows.
    for (uint32_t d = 0; d < g.world; ++d) {
      if (d == me || !g.same_node(d, me)) continue;
      const uint32_t b = off[d * L], n = off[(d + 1) * L] - b;
      for (uint32_t q = 0; q < std::min(n, g.max_private_tokens); ++q)
        std::memcpy(ranks_[d].recv.f(uint64_t{me} * g.max_private_tokens + q), k.send.f(b + q),
                    kRow);
      st(&ranks_[d].ds[g.local_index(me)], e);
    }
    return true;
  }

  bool dispatch_recv(uint32_t me, uint32_t e) {
    Rank& k = ranks_[me];
    const Geometry& g = k.g;
    const uint32_t N = g.world, L = g.local_experts();
    if (!spin(k, [&] { return ld(&k.plan_epoch) >= e; })) return false;
    for (uint32_t s = 0; s < N; ++s)
      if (s != me && g.same_node(s, me) &&
          !spin(k, [&] { return ld(&k.ds[g.local_index(s)]) >= e; }))
        return false;
    const int64_t want = expected_imms(g).dispatch;
    if (want && !spin(k, [&] { return k.dispatch_imms.try_consume(want); })) return false;
    const PlanView v = PlanView::of(k.plan.data(), N, L, me, g.node_size, g.max_private_tokens);
    std::vector<uint32_t> item_pre(L * N + 1), stream_pre(N * L), ovf(N);
    derive(v, item_pre.data(), stream_pre.data(), ovf.data());
    k.out_x.assign(g.max_out_rows() * kHidden, -1.f);
    for (uint32_t i = 0; i < item_pre.back(); ++i) {
      const RowLoc r = locate(v, item_pre.data(), stream_pre.data(), ovf.data(), i);
      const float* src = r.from == kFromOwnSend    ? k.send.f(r.read_row)
                         : r.from == kFromPeerSend ? ranks_[r.src].send.f(r.read_row)
                                                   : k.recv.f(r.read_row);
      std::memcpy(&k.out_x[size_t{r.out_row} * kHidden], src, kRow);
    }
    k.out_tokens.assign(v.etot, v.etot + L);
    return true;
  }

  // expert_y = x * (global expert + 1).
  bool combine_send(uint32_t me, uint32_t e) {
    Rank& k = ranks_[me];
    const Geometry& g = k.g;
    const uint32_t N = g.world, L = g.local_experts();
    const PlanView v = PlanView::of(k.plan.data(), N, L, me, g.node_size, g.max_private_tokens);
    std::vector<uint32_t> item_pre(L * N + 1), stream_pre(N * L), ovf(N);
    derive(v, item_pre.data(), stream_pre.data(), ovf.data());
    auto y = [&](const RowLoc& r, float* dst) {
      uint32_t l = 0;
      while (!(r.out_row >= v.eoff[l] && r.out_row < v.eoff[l] + v.etot[l])) ++l;
      for (uint32_t h = 0; h < kHidden; ++h)
        dst[h] = k.out_x[size_t{r.out_row} * kHidden + h] * float(me * L + l + 1);
    };
    for (uint32_t pass = 0; pass < 2; ++pass) {
      for (uint32_t i = 0; i < item_pre.back(); ++i) {
        const RowLoc r = locate(v, item_pre.data(), stream_pre.data(), ovf.data(), i);
        const bool remote = !g.same_node(r.src, me);
        if (pass == 0 && remote) y(r, k.csend.f(r.send_row));
        if (pass == 1 && !remote) y(r, ranks_[r.src].crecv.f(r.combine_row));
      }
      if (pass == 0) {
        st(&k.progress, 4ull * e - 1);
        k.proxy->notify();
      }
    }
    for (uint32_t s = 0; s < N; ++s)
      if (s != me && g.same_node(s, me)) st(&ranks_[s].cs[g.local_index(me)], e);
    return true;
  }

  bool combine_recv(uint32_t me, uint32_t e) {
    Rank& k = ranks_[me];
    const Geometry& g = k.g;
    const int64_t want = expected_imms(g).combine;
    if (want && !spin(k, [&] { return k.combine_imms.try_consume(want); })) return false;
    for (uint32_t s = 0; s < g.world; ++s)
      if (s != me && g.same_node(s, me) &&
          !spin(k, [&] { return ld(&k.cs[g.local_index(s)]) >= e; }))
        return false;
    const uint32_t K = g.experts_per_token;
    for (uint32_t t = 0; t < k.idx.size(); ++t)
      for (uint32_t h = 0; h < kHidden; ++h) {
        float acc = 0.f, ref = 0.f;
        for (uint32_t j = 0; j < K; ++j) {
          acc += k.w[t][j] * k.crecv.f(k.pos[t * K + j])[h];
          ref += k.w[t][j] * (token_value(me, t, h) * float(k.idx[t][j] + 1));
        }
        if (acc != ref) {
          ADD_FAILURE() << "rank " << me << " token " << t << " h " << h << ": " << acc
                        << " != " << ref;
          return false;
        }
      }
    st(&k.progress, 4ull * e);
    k.proxy->notify();
    return true;
  }

  // Checks rank me's dispatch output against the inputs of every rank.
  void check_dispatch(uint32_t me) {
    Rank& k = ranks_[me];
    const Geometry& g = k.g;
    const uint32_t L = g.local_experts();
    const PlanView v =
        PlanView::of(k.plan.data(), g.world, L, me, g.node_size, g.max_private_tokens);
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<std::pair<uint32_t, uint32_t>> want, got;
      for (uint32_t s = 0; s < g.world; ++s)
        for (uint32_t t = 0; t < ranks_[s].idx.size(); ++t)
          for (uint32_t x : ranks_[s].idx[t])
            if (x == me * L + l) want.push_back({s, t});
      ASSERT_EQ(k.out_tokens[l], want.size());
      for (uint32_t r = v.eoff[l]; r < v.eoff[l] + v.etot[l]; ++r) {
        const float* x = &k.out_x[size_t{r} * kHidden];
        const uint32_t s = static_cast<uint32_t>(x[0] / 1000.f);
        const uint32_t t = static_cast<uint32_t>(x[0] - s * 1000.f);
        for (uint32_t h = 0; h < kHidden; ++h) ASSERT_EQ(x[h], token_value(s, t, h));
        got.push_back({s, t});
      }
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, want) << "rank " << me << " expert " << l;
    }
  }

  void route(std::mt19937_64& rng, bool all_to_one) {
    for (Rank& k : ranks_) {
      const Geometry& g = k.g;
      const uint32_t n = static_cast<uint32_t>(rng() % (g.max_tokens + 1));
      k.idx.assign(n, {});
      k.w.assign(n, {});
      for (uint32_t t = 0; t < n; ++t) {
        while (k.idx[t].size() < g.experts_per_token) {
          uint32_t x = all_to_one ? static_cast<uint32_t>(k.idx[t].size())
                                  : static_cast<uint32_t>(rng() % g.num_experts);
          if (std::find(k.idx[t].begin(), k.idx[t].end(), x) == k.idx[t].end())
            k.idx[t].push_back(x);
        }
        for (uint32_t j = 0; j < g.experts_per_token; ++j) k.w[t].push_back(float(rng() % 8) / 8.f);
      }
    }
  }

  // One iteration on every rank at once (one thread per rank, as one GPU each).
  bool iterate(uint32_t e) {
    std::vector<std::thread> th;
    std::atomic<int> failed{0};
    for (uint32_t r = 0; r < ranks_.size(); ++r)
      th.emplace_back([&, r] {
        if (!dispatch_send(r, e) || !dispatch_recv(r, e)) {
          failed++;
          return;
        }
        // combine_send of a rank needs no peer: but the check needs every
        // rank's inputs, which are fixed for the iteration.
        if (!combine_send(r, e) || !combine_recv(r, e)) failed++;
      });
    for (auto& t : th) t.join();
    return failed == 0;
  }

 private:
  std::vector<Rank> ranks_;
};

struct Case {
  const char* provider;
  uint32_t N, S, E, K, T, pad, P;
  int iterations;
};

class MoeProxy : public ::testing::TestWithParam<Case> {};

TEST_P(MoeProxy, EveryIterationDispatchesAndCombinesExactly) {
  const Case c = GetParam();
  World w(c.provider, c.N, c.S, c.E, c.K, c.T, c.pad, c.P, 10s);
  std::mt19937_64 rng(c.N * 131 + c.S * 7 + c.P);
  for (int e = 1; e <= c.iterations; ++e) {
    w.route(rng, e % 5 == 0);
    ASSERT_TRUE(w.iterate(e)) << "iteration " << e << ": " << w[0].proxy->status().to_string();
    for (uint32_t r = 0; r < c.N; ++r) {
      w.check_dispatch(r);
      if (HasFatalFailure()) return;
    }
  }
  for (uint32_t r = 0; r < c.N; ++r) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (w[r].proxy->epochs_done() < uint64_t(c.iterations) &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
    EXPECT_EQ(w[r].proxy->epochs_done(), uint64_t(c.iterations));
    EXPECT_TRUE(w[r].proxy->status().is_ok()) << w[r].proxy->status().to_string();
    EXPECT_EQ(w[r].proxy->stats().signal_to_first_post.size(), size_t(c.iterations));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, MoeProxy,
    ::testing::Values(Case{"fake", 2, 1, 8, 2, 16, 1, 4, 30},    // one node per rank
                      Case{"fake", 4, 1, 16, 4, 12, 16, 2, 20},  // tiny private: overflow
                      Case{"fake", 4, 2, 16, 4, 12, 4, 3, 20},   // two nodes of two
                      Case{"fake", 4, 4, 32, 8, 8, 1, 5, 20},    // one NVLink node
                      Case{"fake", 2, 1, 4, 2, 1, 1, 0, 20},     // 1 token, no private rows
                      Case{"tcp", 4, 2, 16, 3, 16, 16, 4, 6}),   // tcp;ofi_rxm on lo
    [](const auto& i) {
      const Case& c = i.param;
      return std::string(c.provider) + "_N" + std::to_string(c.N) + "_S" + std::to_string(c.S) +
             "_P" + std::to_string(c.P) + "_T" + std::to_string(c.T);
    });

// With a trace, every iteration puts its phases on the rank's track: dispatch
// (routes row seen -> overflow round posted), the routes exchange inside it,
// combine (combine send buffer ready -> combine received) and the release
// (barrier -> buffers free again).
TEST(MoeProxyTrace, EveryIterationWritesItsPhasesOnTheRanksTrack) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ferry_moe_trace_" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  constexpr int kIterations = 5;
  {
    World w("fake", 2, 1, 8, 2, 16, 1, 4, 10s, "", path.string());
    std::mt19937_64 rng(5);
    for (int e = 1; e <= kIterations; ++e) {
      w.route(rng, false);
      ASSERT_TRUE(w.iterate(e)) << "iteration " << e;
    }
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (w[0].proxy->epochs_done() < kIterations && std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
    ASSERT_EQ(w[0].proxy->epochs_done(), uint64_t(kIterations));
    for (uint32_t r = 0; r < w.size(); ++r) w[r].proxy->stop();
    w[0].engine->stop();  // writes the trace
  }
  const std::string j = test::read_text(path);
  ASSERT_FALSE(j.empty()) << path;
  for (const char* phase : {"moe dispatch", "moe routes exchange", "moe combine", "moe release"})
    EXPECT_EQ(test::occurrences(j, std::string("\"name\":\"") + phase + "\""), size_t(kIterations))
        << phase;
  EXPECT_EQ(test::occurrences(j, "\"name\":\"moe rank 0 instance 7\""), 1u) << "the track is named";
  EXPECT_EQ(test::occurrences(j, "moe rank 1"), 0u) << "rank 1's engine writes no trace";
  std::filesystem::remove(path);
}

TEST(MoeProxyFailure, SilentPeerIsDeadlineExceededWithinTheDeadline) {
  // Rank 1's kernels never run: rank 0's proxy posts its routes and then
  // waits for rank 1's, which never come; the wait is bounded.
  World w("fake", 2, 1, 4, 1, 4, 1, 2, 300ms);
  std::mt19937_64 rng(3);
  w.route(rng, false);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(w.dispatch_send(0, 1));
  EXPECT_FALSE(w.dispatch_recv(0, 1));  // gives up on the error word, not on its own timer
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(w[0].proxy->status().code(), Code::kDeadlineExceeded)
      << w[0].proxy->status().to_string();
  EXPECT_EQ(ld(&w[0].error), static_cast<uint32_t>(Code::kDeadlineExceeded));
  EXPECT_LT(took, 5s);
  EXPECT_GE(took, 250ms);
}

TEST(MoeProxyFailure, FailedTransfersSurfaceAsTypedErrorsOnBothSides) {
  // Every write of rank 1 fails locally (injected): rank 1's proxy reports the
  // transfer error at the end of the iteration; rank 0 then waits for a
  // barrier that never comes and reports kDeadlineExceeded. Nobody hangs.
  World w("fake", 2, 1, 4, 2, 8, 1, 2, 2s, "seed=1,fail=1");
  std::mt19937_64 rng(5);
  w.route(rng, false);
  EXPECT_FALSE(w.iterate(1) && w.iterate(2));
  for (uint32_t r = 0; r < 2; ++r) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (w[r].proxy->status().is_ok() && std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
  }
  const Status s0 = w[0].proxy->status(), s1 = w[1].proxy->status();
  EXPECT_FALSE(s1.is_ok());
  EXPECT_NE(s1.code(), Code::kDeadlineExceeded) << s1.to_string();  // the transfer's own error
  EXPECT_EQ(s0.code(), Code::kDeadlineExceeded) << s0.to_string();
  EXPECT_NE(ld(&w[0].error), 0u);
  EXPECT_NE(ld(&w[1].error), 0u);
}

TEST(MoeProxyFailure, CountsThatDoNotFitAreInvalidArgument) {
  // A token naming one expert K times: the receiver's buffers cannot hold it;
  // the proxy refuses before any overflow write is posted.
  World w("fake", 2, 1, 2, 4, 8, 1, 0, 2s);
  for (uint32_t r = 0; r < 2; ++r) {
    w[r].idx.assign(8, std::vector<uint32_t>(4, 0));
    w[r].w.assign(8, std::vector<float>(4, 0.25f));
  }
  EXPECT_FALSE(w.iterate(1));
  EXPECT_EQ(w[0].proxy->status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::moe

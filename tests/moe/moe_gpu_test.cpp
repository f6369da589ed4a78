// ferry::moe::AllToAll through the C++ API on one GPU, one rank (the kernels,
// the proxy and the engine's watcher in one process; the multi-rank runs are
// tests/python/moe). SKIPPED without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "ferry/moe.h"
#include "support/engine_config.h"

namespace ferry::moe {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
T* dev(size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  return p;
}

TEST(MoeGpu, OneRankDispatchCombineEveryIterationAgainstTheHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t E = 8, K = 2, T = 64, H = 64, pad = 4;
  TransferEngine engine(test::config_for("fake"));
  AllToAllConfig c;
  c.max_num_tokens = T;
  c.num_experts = E;
  c.experts_per_token = K;
  c.hidden = H;
  c.in_dtype = DType::kF32;
  c.out_dtype = DType::kF32;
  c.expert_padding = pad;
  c.instance = 3;
  c.deadline = std::chrono::seconds(10);
  AllToAll a2a(engine, c);
  a2a.connect({a2a.local_info()});
  const uint64_t rows = a2a.sizes().out_rows;
  float *x = dev<float>(T * H), *out_x = dev<float>(rows * H), *y = dev<float>(rows * H),
        *out = dev<float>(T * H), *w = dev<float>(T * K);
  int32_t *idx = dev<int32_t>(T * K), *num = dev<int32_t>(E);
  std::mt19937 rng(1);
  for (int it = 0; it < 20; ++it) {
    const uint32_t n = rng() % (T + 1);
    std::vector<float> hx(n * H), hw(n * K);
    std::vector<int32_t> hi(n * K);
    for (auto& v : hx) v = float(rng() % 1000) / 8.f;
    for (auto& v : hw) v = float(rng() % 4) / 4.f;
    for (uint32_t t = 0; t < n; ++t) {
      hi[t * K] = rng() % E;
      do hi[t * K + 1] = rng() % E;
      while (hi[t * K + 1] == hi[t * K]);
    }
    cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(idx, hi.data(), hi.size() * 4, cudaMemcpyHostToDevice);
    DispatchArgs d;
    d.out_expert_num_tokens = num;
    d.out_expert_x = out_x;
    d.out_x_stride = H * 4;
    d.x = x;
    d.x_stride = H * 4;
    d.indices = idx;
    d.indices_stride = K;
    d.num_tokens = n;
    a2a.dispatch(d, true, true, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> hn(E);
    std::vector<float> ho(rows * H);
    cudaMemcpy(hn.data(), num, E * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ho.data(), out_x, ho.size() * 4, cudaMemcpyDeviceToHost);
    // Every expert block holds exactly the tokens routed to it; y = x * (e+1).
    std::vector<float> hy(rows * H, 0.f);
    uint64_t off = 0;
    for (uint32_t e = 0; e < E; ++e) {
      std::multiset<std::vector<float>> want, got;
      for (uint32_t t = 0; t < n; ++t)
        for (uint32_t k = 0; k < K; ++k)
          if (hi[t * K + k] == int32_t(e))
            want.insert({hx.begin() + t * H, hx.begin() + (t + 1) * H});
      ASSERT_EQ(hn[e], int32_t(want.size())) << "iteration " << it << " expert " << e;
      for (int32_t r = 0; r < hn[e]; ++r) {
        got.insert({ho.begin() + (off + r) * H, ho.begin() + (off + r + 1) * H});
        for (uint32_t h = 0; h < H; ++h)
          hy[(off + r) * H + h] = ho[(off + r) * H + h] * float(e + 1);
      }
      ASSERT_EQ(got, want) << "iteration " << it << " expert " << e;
      off += (hn[e] + pad - 1) / pad * pad;
    }
    cudaMemcpy(y, hy.data(), hy.size() * 4, cudaMemcpyHostToDevice);
    CombineArgs cb;
    cb.out_tokens = out;
    cb.out_stride = H * 4;
    cb.weights = w;
    cb.weights_stride = K;
    cb.expert_y = y;
    cb.y_stride = H * 4;
    a2a.combine(cb, true, true, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> hc(n * H);
    cudaMemcpy(hc.data(), out, hc.size() * 4, cudaMemcpyDeviceToHost);
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t h = 0; h < H; ++h) {
        float ref = 0.f;
        for (uint32_t k = 0; k < K; ++k)
          ref += hw[t * K + k] * (hx[t * H + h] * float(hi[t * K + k] + 1));
        ASSERT_FLOAT_EQ(hc[t * H + h], ref) << "iteration " << it << " token " << t;
      }
    ASSERT_TRUE(a2a.status().is_ok()) << a2a.status().to_string();
  }
  // An expert id outside [0, E): the kernel refuses, the next call says so.
  std::vector<int32_t> bad(2 * K, int32_t(E + 5));
  cudaMemcpy(idx, bad.data(), bad.size() * 4, cudaMemcpyHostToDevice);
  DispatchArgs d;
  d.out_expert_num_tokens = num;
  d.out_expert_x = out_x;
  d.out_x_stride = H * 4;
  d.x = x;
  d.x_stride = H * 4;
  d.indices = idx;
  d.indices_stride = K;
  d.num_tokens = 2;
  a2a.dispatch(d, true, false, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  try {
    a2a.dispatch(d, true, false, nullptr);
    FAIL() << "a bad expert id went unnoticed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument) << e.what();
  }
  a2a.destroy();
  for (void* p : {(void*)x, (void*)out_x, (void*)y, (void*)out, (void*)w, (void*)idx, (void*)num})
    cudaFree(p);
}

}  // namespace
}  // namespace ferry::moe

// The inner loop of the NVLink copy kernels (the domain's gather kernel, and
// the designs and baselines measured against it in tests/nvlink).
#pragma once

#include <cstdint>

namespace ferry::nvlink {

// Copies 16-byte words first, first + Stride, ... (below n) from s to d, with
// Unroll loads in flight per thread before the stores: NVLink latency is
// hidden by parallelism, not by the single-thread pipeline.
template <int Unroll, int Stride>
__device__ __forceinline__ void copy_words(const uint4* s, uint4* d, uint64_t n, uint64_t first) {
  uint64_t i = first;
  for (; i + (Unroll - 1) * Stride < n; i += Unroll * Stride) {
    uint4 v[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) v[u] = s[i + u * Stride];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) d[i + u * Stride] = v[u];
  }
  for (; i < n; i += Stride) d[i] = s[i];
}

}  // namespace ferry::nvlink

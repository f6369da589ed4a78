// A hand-written page gather, no engine: one warp per page, page index lists
// in memory the device reads, 16-byte loads eight deep. The baseline of
// ferry-nvlink-bench's paged points and one of ferry-nvlink-probe's designs.
#pragma once

#include <cstdint>

namespace ferry::nvtest {

__global__ void __launch_bounds__(256)
    gather_pages(const char* src, char* dst, uint64_t page, const uint32_t* sidx,
                 const uint32_t* didx, uint32_t n) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t nw = (gridDim.x * blockDim.x) >> 5;
  for (uint32_t k = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; k < n; k += nw) {
    const uint4* s = reinterpret_cast<const uint4*>(src + sidx[k] * page);
    uint4* d = reinterpret_cast<uint4*>(dst + didx[k] * page);
    const uint64_t m = page / 16;
    uint64_t i = lane;
    for (; i + 7 * 32 < m; i += 8 * 32) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = s[i + u * 32];
#pragma unroll
      for (int u = 0; u < 8; ++u) d[i + u * 32] = v[u];
    }
    for (; i < m; i += 32) d[i] = s[i];
  }
}

}  // namespace ferry::nvtest

// A hand-written page gather, no engine: one warp per page, page index lists
// in memory the device reads, 16-byte loads eight deep. The baseline of
// ferry-nvlink-bench's paged points and one of ferry-nvlink-probe's designs,
// and the random page lists both measure with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "nvlink/copy_words.cuh"

namespace ferry::nvtest {

// n distinct destination slots, then n distinct source slots, of `slots`.
inline void random_pages(std::mt19937_64& rng, uint32_t slots, uint32_t n,
                         std::vector<uint32_t>& sidx, std::vector<uint32_t>& didx) {
  std::vector<uint32_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  didx.assign(all.begin(), all.begin() + n);
  std::shuffle(all.begin(), all.end(), rng);
  sidx.assign(all.begin(), all.begin() + n);
}

__global__ void __launch_bounds__(256)
    gather_pages(const char* src, char* dst, uint64_t page, const uint32_t* sidx,
                 const uint32_t* didx, uint32_t n) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t nw = (gridDim.x * blockDim.x) >> 5;
  for (uint32_t k = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; k < n; k += nw) {
    nvlink::copy_words<8, 32>(reinterpret_cast<const uint4*>(src + sidx[k] * page),
                              reinterpret_cast<uint4*>(dst + didx[k] * page), page / 16, lane);
  }
}

}  // namespace ferry::nvtest

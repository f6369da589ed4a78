// The gather kernel of the NVLink domain, callable from plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::nvlink {

// One copy of the gather kernel: at most kMaxOpBytes, so one block per op
// keeps every SM busy (several blocks each) whatever the page size.
struct CopyOp {
  uint64_t src;
  uint64_t dst;
  uint64_t len;
};
inline constexpr uint64_t kMaxOpBytes = 32 << 10;

// Copies ops[0..n) (ops in memory the device can read: mapped pinned host)
// with one block per op on `stream`.
cudaError_t launch_gather(const CopyOp* ops, uint32_t n, cudaStream_t stream);

}  // namespace ferry::nvlink

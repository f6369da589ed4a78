// Gather kernel: every page of a batch of paged writes (or scatter slices) in
// one launch instead of one copy-engine command per page, which costs ~2.5 us
// each (docs/NVLINK.md, BASELINES.md: 24 GB/s vs 360 GB/s at 64 KiB).
#include "nvlink/nvlink_kernels.h"

#include "nvlink/copy_words.cuh"

namespace ferry::nvlink {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads) gather_kernel(const CopyOp* ops) {
  __shared__ CopyOp op;
  // The op list is in pinned host memory: one PCIe read per block, not per warp.
  if (threadIdx.x == 0) op = ops[blockIdx.x];
  __syncthreads();
  const char* src = reinterpret_cast<const char*>(op.src);
  char* dst = reinterpret_cast<char*>(op.dst);
  const uint64_t len = op.len;
  if (((op.src | op.dst | len) & 15) == 0) {
    copy_words<kUnroll, kThreads>(reinterpret_cast<const uint4*>(src),
                                  reinterpret_cast<uint4*>(dst), len / 16, threadIdx.x);
  } else {
    // Unaligned pages (offsets or lengths not multiples of 16): correct, slower.
    for (uint64_t i = threadIdx.x; i < len; i += kThreads) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t launch_gather(const CopyOp* ops, uint32_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  gather_kernel<<<n, kThreads, 0, stream>>>(ops);
  return cudaGetLastError();
}

}  // namespace ferry::nvlink

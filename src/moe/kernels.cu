// The four MoE kernels (docs/MOE.md). Each is a cooperative launch over every
// SM; all state lives in the workspace, the mapped words and the buffers, so
// a captured graph replays them with new routes. Ordering, in short:
//  * kernel -> proxy: block-wide barrier, grid barrier (each block fences at
//    system scope before arriving), then a release store of the watcher word:
//    the proxy's acquire load of the word orders its reads (routes row) and
//    its NIC posts (send buffers) after the kernel's writes.
//  * proxy -> kernel: the proxy writes the plan, then release-stores
//    plan_epoch; the kernel's ld.acquire.sys of plan_epoch orders its plan
//    reads after it.
//  * NIC -> kernel: the engine stores the generation of a GPU-visible counter
//    after the last counted immediate's data landed (docs/GPU.md); the kernel
//    acquires the flag before it reads the receive buffers.
//  * peer -> kernel (NVLink): a peer's rows are pushed, its blocks fence at
//    system scope and pass a grid barrier, then one thread release-stores the
//    iteration into our sync word; we acquire it before reading.
//  * buffer reuse: iteration e writes only after tx_ready >= e-1, which the
//    proxy stores after every transfer of e-1 finished and a barrier with
//    every rank, which each proxy enters after its combine_recv of e-1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/kernels.h"
#include "moe/plan_view.h"

namespace ferry::moe {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_release64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Waits until *w >= v (wrap-safe), giving up on the proxy's error word or the
// timeout; `what` names the wait in the error word (1 + what).
__device__ bool wait_ge(const KernelParams& p, const uint32_t* w, uint32_t v, uint32_t what) {
  const long long start = clock64();
  for (;;) {
    if (static_cast<int32_t>(ld_acquire(w) - v) >= 0) return true;
    if (ld_acquire(p.proxy_error) != 0) return false;
    if (static_cast<uint64_t>(clock64() - start) > p.timeout_cycles) {
      atomicCAS(p.kernel_error, 0u, 1u + what);
      __threadfence_system();
      return false;
    }
  }
}

// Grid-wide barrier (cooperative launch: every block is resident). Each block
// fences at system scope before arriving, so what any block wrote (to peers
// over NVLink, to mapped host memory) is visible before anyone passes.
__device__ void grid_sync(Workspace* ws) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile uint32_t* gen = &ws->bar_gen;
    const uint32_t g = *gen;
    __threadfence_system();
    if (atomicAdd(&ws->bar_count, 1u) == gridDim.x - 1) {
      ws->bar_count = 0;
      __threadfence();
      atomicAdd(&ws->bar_gen, 1u);
    } else {
      while (*gen == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ bool aborted(Workspace* ws) {
  return *reinterpret_cast<volatile uint32_t*>(&ws->abort) != 0;
}

// One warp copies `bytes`: 16-byte vectors when both ends allow, else bytes.
__device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  const int lane = threadIdx.x & 31;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
    const int4* s = reinterpret_cast<const int4*>(src);
    int4* d = reinterpret_cast<int4*>(dst);
    const uint64_t n = bytes / 16;
    for (uint64_t i = lane; i < n; i += 32) d[i] = s[i];
  } else {
    for (uint64_t i = lane; i < bytes; i += 32) dst[i] = src[i];
  }
}

__device__ __forceinline__ uint64_t round16(uint64_t v) {
  return (v + 15) / 16 * 16;
}

struct SmemPlan {
  uint32_t words[kMaxExperts + 2 * kMaxExperts + 2 * kMaxExperts];
  uint32_t item_pre[kMaxExperts + 1];
  uint32_t stream_pre[kMaxExperts];
  uint32_t ovf[kMaxExperts];
};

__device__ __forceinline__ uint32_t plan_size(const KernelParams& p) {
  return p.N * p.L + 2 * p.N + 2 * p.L;
}

// Every block keeps the plan in shared memory (a few KiB), from the copy
// dispatch_recv staged in the workspace.
__device__ PlanView load_plan(const KernelParams& p, SmemPlan& sp) {
  const uint32_t n = plan_size(p);
  // Volatile: rewritten every iteration (no stale L1 line).
  const volatile uint32_t* plan = p.ws->plan;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) sp.words[i] = plan[i];
  __syncthreads();
  const PlanView v = PlanView::of(sp.words, p.N, p.L, p.me, p.S, p.P);
  if (threadIdx.x == 0) derive(v, sp.item_pre, sp.stream_pre, sp.ovf);
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_send(KernelParams p, DispatchSendArgs a) {
  Workspace* ws = p.ws;
  const uint32_t e = ws->epoch + 1;
  __shared__ uint32_t cnt[kMaxExperts];
  __shared__ uint32_t bad;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      bad = 0;
      if (ld_acquire(p.proxy_error) != 0 || *reinterpret_cast<volatile uint32_t*>(p.kernel_error) ||
          !wait_ge(p, p.tx_ready, e - 1, 0))
        ws->abort = 1;
      uint32_t n = a.num_tokens;
      if (a.bound_m) n = min(static_cast<uint32_t>(max(*a.bound_m, 0)), p.T);
      ws->num_tokens = n;
    }
    for (uint32_t x = threadIdx.x; x < p.E; x += blockDim.x) cnt[x] = 0;
    __syncthreads();
    const uint32_t pairs = ws->num_tokens * p.K;
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      const int32_t x = a.idx[(i / p.K) * a.idx_stride + i % p.K];
      if (x < 0 || static_cast<uint32_t>(x) >= p.E) {
        bad = 1;
        ws->token_pos[i] = 0;
        continue;
      }
      ws->token_pos[i] = atomicAdd(&cnt[x], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t acc = 0;
      for (uint32_t x = 0; x < p.E; ++x) {
        ws->expert_off[x] = acc;
        acc += cnt[x];
      }
      ws->expert_off[p.E] = acc;
      if (bad) {
        atomicCAS(p.kernel_error, 0u, 100u);  // an expert id outside [0, E)
        ws->abort = 1;
      }
    }
    __syncthreads();
    for (uint32_t x = threadIdx.x; x < p.E; x += blockDim.x) p.routes_row[x] = cnt[x];
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      const int32_t x = a.idx[(i / p.K) * a.idx_stride + i % p.K];
      if (x >= 0 && static_cast<uint32_t>(x) < p.E) ws->token_pos[i] += ws->expert_off[x];
    }
    __syncthreads();
    if (threadIdx.x == 0 && !ws->abort) {
      __threadfence_system();
      st_release64(p.progress, 4ull * e - 3);
    }
  }
  grid_sync(ws);
  if (aborted(ws)) return;

  const uint32_t pairs = ws->num_tokens * p.K;
  const uint32_t warp = blockIdx.x * kWarps + threadIdx.x / 32, nwarps = gridDim.x * kWarps;
  const uint64_t xbytes = uint64_t{p.H} * p.in_size, sbytes = uint64_t{p.hs} * 4;
  for (uint32_t i = warp; i < pairs; i += nwarps) {
    const uint32_t t = i / p.K;
    uint8_t* row = p.send + ws->token_pos[i] * p.D;
    warp_copy(row, a.x + t * a.x_stride, xbytes);
    if (sbytes)
      warp_copy(row + round16(xbytes),
                reinterpret_cast<const uint8_t*>(a.x_scale + t * a.xs_stride), sbytes);
  }
  grid_sync(ws);
  if (blockIdx.x == 0 && threadIdx.x == 0) st_release64(p.progress, 4ull * e - 2);
  if (p.S > 1) {
    // Same-node destinations: the first P rows of each go straight into its
    // private rows over NVLink, after the host was told (its RDMA is in flight).
    const uint32_t node0 = p.me / p.S * p.S;
    for (uint32_t i = warp; i < pairs; i += nwarps) {
      const int32_t x = a.idx[(i / p.K) * a.idx_stride + i % p.K];
      const uint32_t d = static_cast<uint32_t>(x) / p.L;
      if (d == p.me || d / p.S != p.me / p.S) continue;
      const uint32_t pos = ws->token_pos[i], q = pos - ws->expert_off[d * p.L];
      if (q >= p.P) continue;
      warp_copy(p.peer_recv[d - node0] + (uint64_t{p.me} * p.P + q) * p.D, p.send + pos * p.D,
                round16(xbytes) + sbytes);
    }
    grid_sync(ws);
    if (blockIdx.x == 0 && threadIdx.x < p.S && node0 + threadIdx.x != p.me)
      st_release(p.peer_sync[threadIdx.x] + kSyncDs + (p.me - node0), e);
  }
}

__global__ void __launch_bounds__(kThreads, 1) dispatch_recv(KernelParams p, DispatchRecvArgs a) {
  Workspace* ws = p.ws;
  const uint32_t e = ws->epoch + 1;
  const uint32_t node0 = p.me / p.S * p.S;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      bool ok = wait_ge(p, p.plan_epoch, e, 1);
      for (uint32_t i = 0; ok && i < p.S; ++i)
        if (node0 + i != p.me) ok = wait_ge(p, p.sync + kSyncDs + i, e, 2);
      if (!ok) ws->abort = 1;
    }
    __syncthreads();
    // Ordered after plan_epoch's acquire by the barrier; volatile: the proxy
    // rewrites the words every iteration.
    const volatile uint32_t* plan = p.plan;
    volatile uint32_t* staged = ws->plan;
    const uint32_t n = plan_size(p);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) staged[i] = plan[i];
  }
  grid_sync(ws);
  if (aborted(ws)) return;
  __shared__ SmemPlan sp;
  const PlanView v = load_plan(p, sp);
  const uint32_t total = sp.item_pre[p.L * p.N];
  const uint32_t warp = blockIdx.x * kWarps + threadIdx.x / 32, nwarps = gridDim.x * kWarps;
  const uint64_t xbytes = uint64_t{p.H} * p.in_size, sbytes = uint64_t{p.hs} * 4;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      if (!p.disp_flag) break;
      // Rows of remote nodes: after the NIC's counter says they all landed.
      __shared__ bool ok;
      if (threadIdx.x == 0) ok = wait_ge(p, p.disp_flag, e, 3);
      __syncthreads();
      if (!ok) return;
    }
    for (uint32_t i = warp; i < total; i += nwarps) {
      const RowLoc r = locate(v, sp.item_pre, sp.stream_pre, sp.ovf, i);
      const bool remote = !v.same_node(r.src, p.me);
      if (remote != (pass == 1)) continue;
      const uint8_t* src = r.from == kFromOwnSend    ? p.send + r.read_row * p.D
                           : r.from == kFromPeerSend ? p.peer_send[r.src - node0] + r.read_row * p.D
                                                     : p.recv + r.read_row * p.D;
      warp_copy(a.out_x + r.out_row * a.ox_stride, src, xbytes);
      if (sbytes)
        warp_copy(reinterpret_cast<uint8_t*>(a.out_scale + r.out_row * a.os_stride),
                  src + round16(xbytes), sbytes);
    }
  }
  if (blockIdx.x == 0)
    for (uint32_t l = threadIdx.x; l < p.L; l += blockDim.x)
      a.out_num[l] = static_cast<int32_t>(v.etot[l]);
}

__global__ void __launch_bounds__(kThreads, 1)
    combine_send(KernelParams p, const uint8_t* y, uint64_t y_stride) {
  Workspace* ws = p.ws;
  const uint32_t e = ws->epoch + 1;
  const uint32_t node0 = p.me / p.S * p.S;
  __shared__ SmemPlan sp;
  const PlanView v = load_plan(p, sp);
  const uint32_t total = sp.item_pre[p.L * p.N];
  const uint32_t warp = blockIdx.x * kWarps + threadIdx.x / 32, nwarps = gridDim.x * kWarps;
  const uint64_t ybytes = uint64_t{p.H} * (p.out_bf16 ? 2 : 4);
  // Rows for remote nodes first (into the send buffer the NIC reads), tell
  // the proxy, then push same-node rows over NVLink while the NIC works.
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t i = warp; i < total; i += nwarps) {
      const RowLoc r = locate(v, sp.item_pre, sp.stream_pre, sp.ovf, i);
      const bool remote = !v.same_node(r.src, p.me);
      if (remote != (pass == 0)) continue;
      uint8_t* dst = remote          ? p.csend + r.send_row * p.C
                     : r.src == p.me ? p.crecv + r.combine_row * p.C
                                     : p.peer_crecv[r.src - node0] + r.combine_row * p.C;
      warp_copy(dst, y + r.out_row * y_stride, ybytes);
    }
    grid_sync(ws);
    if (pass == 0 && blockIdx.x == 0 && threadIdx.x == 0) st_release64(p.progress, 4ull * e - 1);
  }
  if (blockIdx.x == 0 && threadIdx.x < p.S && node0 + threadIdx.x != p.me)
    st_release(p.peer_sync[threadIdx.x] + kSyncCs + (p.me - node0), e);
}

__device__ __forceinline__ float load_out(const uint8_t* row, uint32_t h, bool bf16) {
  if (bf16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[h]);
  return reinterpret_cast<const float*>(row)[h];
}

__global__ void __launch_bounds__(kThreads, 1)
    combine_recv(KernelParams p, uint8_t* out, uint64_t out_stride, const float* w,
                 uint64_t w_stride, bool accumulate) {
  Workspace* ws = p.ws;
  const uint32_t e = ws->epoch + 1;
  const uint32_t node0 = p.me / p.S * p.S;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    bool ok = !p.comb_flag || wait_ge(p, p.comb_flag, e, 4);
    for (uint32_t i = 0; ok && i < p.S; ++i)
      if (node0 + i != p.me) ok = wait_ge(p, p.sync + kSyncCs + i, e, 5);
    if (!ok) ws->abort = 1;
  }
  grid_sync(ws);
  if (aborted(ws)) return;
  const uint32_t n = ws->num_tokens;
  const bool bf16 = p.out_bf16 != 0;
  // Fixed order over k in fp32: the same inputs give the same bits.
  const uint32_t per_token = (p.H + 1) / 2;  // two elements per thread step
  const uint64_t work = uint64_t{n} * per_token;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < work; i += gridDim.x * blockDim.x) {
    const uint32_t t = static_cast<uint32_t>(i / per_token),
                   h = static_cast<uint32_t>(i % per_token) * 2;
    float acc0 = 0.f, acc1 = 0.f;
    uint8_t* orow = out + t * out_stride;
    const bool two = h + 1 < p.H;
    if (accumulate) {
      acc0 = load_out(orow, h, bf16);
      if (two) acc1 = load_out(orow, h + 1, bf16);
    }
    for (uint32_t k = 0; k < p.K; ++k) {
      const float wk = w[t * w_stride + k];
      const uint8_t* row = p.crecv + ws->token_pos[t * p.K + k] * p.C;
      acc0 += wk * load_out(row, h, bf16);
      if (two) acc1 += wk * load_out(row, h + 1, bf16);
    }
    if (bf16) {
      reinterpret_cast<__nv_bfloat16*>(orow)[h] = __float2bfloat16(acc0);
      if (two) reinterpret_cast<__nv_bfloat16*>(orow)[h + 1] = __float2bfloat16(acc1);
    } else {
      reinterpret_cast<float*>(orow)[h] = acc0;
      if (two) reinterpret_cast<float*>(orow)[h + 1] = acc1;
    }
  }
  grid_sync(ws);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    ws->epoch = e;
    __threadfence_system();
    st_release64(p.progress, 4ull * e);
  }
}

template <typename... Args>
int launch(void (*k)(Args...), const KernelParams& p, void* stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return static_cast<int>(cudaLaunchKernelEx(&cfg, k, args...));
}

}  // namespace

int launch_dispatch_send(const KernelParams& p, const DispatchSendArgs& a, void* stream) {
  return launch(dispatch_send, p, stream, p, a);
}
int launch_dispatch_recv(const KernelParams& p, const DispatchRecvArgs& a, void* stream) {
  return launch(dispatch_recv, p, stream, p, a);
}
int launch_combine_send(const KernelParams& p, const uint8_t* y, uint64_t y_stride, void* stream) {
  return launch(combine_send, p, stream, p, y, y_stride);
}
int launch_combine_recv(const KernelParams& p, uint8_t* out, uint64_t out_stride, const float* w,
                        uint64_t w_stride, bool accumulate, void* stream) {
  return launch(combine_recv, p, stream, p, out, out_stride, w, w_stride, accumulate);
}

}  // namespace ferry::moe

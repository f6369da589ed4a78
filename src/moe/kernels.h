// Launchers of the four MoE kernels (kernels.cu). Plain C++ types only, so
// context.cpp needs no CUDA headers beyond the runtime's.
#pragma once

#include <cstdint>

namespace ferry::moe {

inline constexpr uint32_t kMaxNode = 8;
inline constexpr uint32_t kMaxExperts = 512;
inline constexpr uint32_t kMaxPairs = 4096 * 8;

// Device workspace (cudaMalloc, zeroed once): survives across iterations and
// graph replays, so nothing per iteration comes from the host.
struct Workspace {
  uint32_t epoch;  // last finished iteration; combine_recv advances it
  uint32_t abort;
  uint32_t bar_count, bar_gen;
  uint32_t num_tokens;
  uint32_t pad_[3];
  uint32_t expert_off[kMaxExperts + 1];
  uint32_t token_pos[kMaxPairs];
  // The plan, staged from mapped host memory by dispatch_recv's block 0: the
  // other blocks (and combine_send) read it from device memory instead of
  // each issuing its own PCIe reads.
  uint32_t plan[3 * kMaxExperts + 2 * kMaxExperts];
};

// Own sync words (device, IPC-mapped by node peers): ds[i] / cs[i] = the last
// iteration node-local rank i finished pushing dispatch / combine rows here.
inline constexpr uint32_t kSyncDs = 0, kSyncCs = kMaxNode;

struct KernelParams {
  uint32_t N, me, S, E, L, K, T, P, H, hs;
  uint32_t in_size, out_bf16;
  uint64_t D, C;  // buffer row strides
  uint8_t *send, *recv, *csend, *crecv;
  uint8_t* peer_send[kMaxNode];
  uint8_t* peer_recv[kMaxNode];
  uint8_t* peer_crecv[kMaxNode];
  uint32_t* peer_sync[kMaxNode];
  uint32_t* sync;
  uint32_t* routes_row;  // mapped host: this rank's row of the routes matrix
  uint64_t* progress;    // watcher word
  const uint32_t* plan;
  const uint32_t* plan_epoch;
  const uint32_t* tx_ready;
  const uint32_t* proxy_error;
  uint32_t* kernel_error;     // mapped host: 1 + which wait gave up
  const uint32_t* disp_flag;  // GPU-visible counters (null: no remote nodes)
  const uint32_t* comb_flag;
  Workspace* ws;
  uint64_t timeout_cycles;
  int blocks;
};

struct DispatchSendArgs {
  const uint8_t* x;
  uint64_t x_stride;
  const float* x_scale;
  uint64_t xs_stride;
  const int32_t* idx;
  uint64_t idx_stride;
  uint32_t num_tokens;
  const int32_t* bound_m;
};

struct DispatchRecvArgs {
  int32_t* out_num;
  uint8_t* out_x;
  uint64_t ox_stride;
  float* out_scale;
  uint64_t os_stride;
};

// Each returns the cudaError_t of the launch as an int.
int launch_dispatch_send(const KernelParams& p, const DispatchSendArgs& a, void* stream);
int launch_dispatch_recv(const KernelParams& p, const DispatchRecvArgs& a, void* stream);
int launch_combine_send(const KernelParams& p, const uint8_t* y, uint64_t y_stride, void* stream);
int launch_combine_recv(const KernelParams& p, uint8_t* out, uint64_t out_stride, const float* w,
                        uint64_t w_stride, bool accumulate, void* stream);

}  // namespace ferry::moe

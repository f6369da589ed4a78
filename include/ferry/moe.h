// MoE dispatch and combine on the TransferEngine (docs/MOE.md): split
// send/recv kernels, a host proxy that issues the engine calls, NVLink pushes
// between ranks of one node. The C++ face of ferry.moe.AllToAll.
//
//   ferry::moe::AllToAll a2a(engine, cfg);      // allocates, registers
//   auto mine = a2a.local_info();               // exchange with every rank
//   a2a.connect(all_infos);                     // in rank order
//   a2a.dispatch(d, true, true, stream);        // raw device pointers
//   ... grouped GEMM on the expert-major rows ...
//   a2a.combine(c, true, true, stream);
//
// Each iteration runs dispatch send, dispatch recv, combine send, combine
// recv in this order on one stream (do_send / do_recv split them into
// separate calls for micro-batching); all four can be captured in a CUDA graph
// and replayed with new routes. A failed or timed-out transfer, or a kernel
// wait that gave up, makes the next call throw ferry::Error with its code.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry::moe {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF8E4M3 = 2 };
size_t dtype_size(DType t);

struct AllToAllConfig {
  uint32_t max_num_tokens = 128;    // per rank, <= 4096
  uint32_t num_experts = 8;         // <= 512, a multiple of world_size
  uint32_t experts_per_token = 1;   // <= 8, distinct per token
  uint32_t hidden = 128;            // <= 8192
  uint32_t hidden_scale = 0;        // fp32 block scales per token (0: none)
  DType in_dtype = DType::kBF16;    // dispatched payload
  DType out_dtype = DType::kBF16;   // expert output and combine result (f32 or bf16)
  uint32_t expert_padding = 1;      // expert blocks of the output start at multiples of it
  uint32_t max_private_tokens = 0;  // per source; 0: 1.2x an even share
  uint32_t rank = 0, world_size = 1;
  uint32_t node_size = 1;  // ranks sharing NVLink (CUDA IPC), consecutive ranks
  // Immediates 0xF0000000 | instance << 4 | kind; unique per engine.
  uint32_t instance = 0;
  int device = 0;
  // RDMA buffers in pinned host memory, for providers that cannot register
  // GPU memory (tcp, shm). Needs node_size == 1.
  bool host_buffers = false;
  // Bound of every wait inside an iteration, proxy and kernels alike.
  std::chrono::milliseconds deadline{10'000};
};

struct BufferSizes {
  uint64_t out_rows;         // rows out_expert_x (and expert_y) must have
  uint64_t dispatch_stride;  // bytes per buffered dispatch row
  uint64_t combine_stride;
  uint64_t recv_rows;  // private + shared receive rows
  uint64_t bytes;      // device (or host) memory this rank allocates
  uint32_t max_private_tokens;
};
BufferSizes buffer_size_hint(const AllToAllConfig& cfg);

struct DispatchArgs {
  int32_t* out_expert_num_tokens = nullptr;  // [L] device
  void* out_expert_x = nullptr;              // [out_rows, hidden] in_dtype
  uint64_t out_x_stride = 0;                 // bytes between rows
  float* out_expert_x_scale = nullptr;       // [out_rows, hidden_scale] or null
  uint64_t out_scale_stride = 0;             // elements between rows
  const void* x = nullptr;                   // [num_tokens, hidden] in_dtype
  uint64_t x_stride = 0;
  const float* x_scale = nullptr;
  uint64_t x_scale_stride = 0;
  const int32_t* indices = nullptr;  // [num_tokens, k] expert ids
  uint64_t indices_stride = 0;       // elements between tokens
  uint32_t num_tokens = 0;
  const int32_t* bound_m = nullptr;  // device: overrides num_tokens (graphs)
};

struct CombineArgs {
  void* out_tokens = nullptr;  // [num_tokens, hidden] out_dtype
  uint64_t out_stride = 0;
  const float* weights = nullptr;  // [num_tokens, k]
  uint64_t weights_stride = 0;
  const void* expert_y = nullptr;  // [out_rows, hidden] out_dtype
  uint64_t y_stride = 0;
  bool accumulate = false;
};

struct ProxyLatency {
  std::vector<uint64_t> signal_to_first_post_ns;
  std::vector<uint64_t> routes_to_second_post_ns;
};

class AllToAll {
 public:
  AllToAll(TransferEngine& engine, AllToAllConfig cfg);
  ~AllToAll();
  AllToAll(const AllToAll&) = delete;
  AllToAll& operator=(const AllToAll&) = delete;

  const AllToAllConfig& config() const;
  BufferSizes sizes() const;
  // Descriptors, addresses and IPC handles of this rank, for every other.
  std::vector<uint8_t> local_info() const;
  // Everyone's local_info, in rank order; starts the proxy.
  void connect(const std::vector<std::vector<uint8_t>>& infos);
  // stream: a cudaStream_t (0: the legacy default stream).
  void dispatch(const DispatchArgs& a, bool do_send, bool do_recv, void* stream);
  void combine(const CombineArgs& a, bool do_send, bool do_recv, void* stream);
  // The first failure of the proxy or the kernels (OK if none).
  Status status() const;
  ProxyLatency proxy_latency() const;
  // Stops the proxy and frees everything; collective (peers map this rank's
  // memory): call it on every rank after a barrier. Idempotent.
  void destroy();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::moe

// GPU memory for ferry-bench --gpu: each side's region as host pages or as
// cudaMalloc'd memory, the pattern fill and check through a host copy, and
// the CUDA baseline of the nvlink provider (cudaMemcpyAsync per write into the
// peer's region mapped by CUDA IPC). Built without CUDA, a GPU region throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/types.h"
#include "plan.h"

namespace ferry_bench {

// Whether this ferry-bench was built with the CUDA runtime.
bool gpu_built();
// GPUs visible (0 without CUDA or without a driver). Initialises CUDA: call
// it after the fork only.
int gpu_count();

class Region {
 public:
  // `len` bytes, zeroed: host pages when gpu < 0, else on GPU `gpu`.
  Region(uint64_t len, int gpu);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint8_t* data() const { return p_; }
  uint64_t size() const { return len_; }
  bool on_gpu() const { return gpu_ >= 0; }
  ferry::Device device() const {
    return on_gpu() ? ferry::Device::cuda(gpu_) : ferry::Device::host();
  }

  // The first `len` bytes: zero, the source pattern of `seed`, or checked
  // against what a run of `reqs` requests of `l` wrote (check_writes).
  void zero(uint64_t len);
  void fill(uint64_t len, uint64_t seed);
  std::string check(const Layout& l, uint64_t reqs, uint64_t seed);
  // A CUDA IPC handle of the whole region (GPU regions only).
  std::vector<uint8_t> ipc_handle() const;

 private:
  uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
  int gpu_ = -1;
  std::vector<uint8_t> host_;  // GPU regions: the host copy fill and check go through
};

// The nvlink provider's baseline: the peer's region opened from its IPC
// handle; every write one cudaMemcpyAsync, requests dealt round robin over a
// few streams, a request done when the event recorded after its copies has
// completed.
class PeerCopier {
 public:
  PeerCopier(int gpu, const std::vector<uint8_t>& peer_handle, size_t slots);
  ~PeerCopier();
  PeerCopier(const PeerCopier&) = delete;
  PeerCopier& operator=(const PeerCopier&) = delete;

  void begin(uint32_t slot, uint64_t req);  // request `req` takes window slot `slot`
  void copy(uint32_t slot, uint64_t dst_off, const uint8_t* src, uint64_t len);
  void close(uint32_t slot);  // after the slot's last copy
  bool done(uint32_t slot);   // throws on a CUDA error

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ferry_bench

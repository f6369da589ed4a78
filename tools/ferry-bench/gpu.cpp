#include "gpu.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#ifdef FERRY_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace ferry_bench {

namespace {

#ifdef FERRY_BENCH_CUDA
void cuda_check(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw std::runtime_error(
        fmt::format("{} failed: {} ({})", call, cudaGetErrorString(e), int(e)));
}
#else
[[noreturn]] void no_cuda() {
  throw std::runtime_error("ferry-bench was built without CUDA: --gpu is unavailable");
}
#endif

// Streams the CUDA baseline spreads its window over: copies of different
// requests may overlap on the copy engines, as the engine's may.
constexpr size_t kBaselineStreams = 4;

}  // namespace

bool gpu_built() {
#ifdef FERRY_BENCH_CUDA
  return true;
#else
  return false;
#endif
}

int gpu_count() {
#ifdef FERRY_BENCH_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

Region::Region(uint64_t len, int gpu) : len_(len), gpu_(gpu) {
  if (gpu < 0) {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the region failed");
    p_ = static_cast<uint8_t*>(p);
    // Touch every page now so no point pays page faults (or reads the zero page).
    std::memset(p_, 0, len);
    return;
  }
#ifdef FERRY_BENCH_CUDA
  cuda_check(cudaSetDevice(gpu), "cudaSetDevice");
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, len), "cudaMalloc");
  p_ = static_cast<uint8_t*>(p);
  host_.resize(len);
  zero(len);
#else
  no_cuda();
#endif
}

Region::~Region() {
  if (p_ == nullptr) return;
  if (gpu_ < 0) {
    ::munmap(p_, len_);
    return;
  }
#ifdef FERRY_BENCH_CUDA
  cudaFree(p_);
#endif
}

void Region::zero(uint64_t len) {
  if (gpu_ < 0) {
    std::memset(p_, 0, len);
    return;
  }
#ifdef FERRY_BENCH_CUDA
  cuda_check(cudaMemset(p_, 0, len), "cudaMemset");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

void Region::fill(uint64_t len, uint64_t seed) {
  if (gpu_ < 0) {
    fill_pattern(p_, len, seed);
    return;
  }
#ifdef FERRY_BENCH_CUDA
  fill_pattern(host_.data(), len, seed);
  cuda_check(cudaMemcpy(p_, host_.data(), len, cudaMemcpyHostToDevice), "cudaMemcpy(to GPU)");
#endif
}

std::string Region::check(const Layout& l, uint64_t reqs, uint64_t seed) {
  if (gpu_ < 0) return check_writes(l, p_, reqs, seed);
#ifdef FERRY_BENCH_CUDA
  cuda_check(cudaMemcpy(host_.data(), p_, l.data, cudaMemcpyDeviceToHost), "cudaMemcpy(to host)");
  return check_writes(l, host_.data(), reqs, seed);
#else
  no_cuda();
#endif
}

std::vector<uint8_t> Region::ipc_handle() const {
#ifdef FERRY_BENCH_CUDA
  if (gpu_ < 0) throw std::runtime_error("a host region has no CUDA IPC handle");
  cudaIpcMemHandle_t h;
  cuda_check(cudaIpcGetMemHandle(&h, p_), "cudaIpcGetMemHandle");
  const auto* b = reinterpret_cast<const uint8_t*>(&h);
  return {b, b + sizeof(h)};
#else
  no_cuda();
#endif
}

#ifdef FERRY_BENCH_CUDA
struct PeerCopier::State {
  uint8_t* peer = nullptr;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  std::vector<cudaStream_t> stream_of;  // per slot, its request's stream
  ~State() {
    for (auto e : events) cudaEventDestroy(e);
    for (auto s : streams) cudaStreamDestroy(s);
    if (peer != nullptr) cudaIpcCloseMemHandle(peer);
  }
};

PeerCopier::PeerCopier(int gpu, const std::vector<uint8_t>& peer_handle, size_t slots)
    : s_(std::make_unique<State>()) {
  cudaIpcMemHandle_t h;
  if (peer_handle.size() != sizeof(h)) throw std::runtime_error("bad CUDA IPC handle size");
  std::memcpy(&h, peer_handle.data(), sizeof(h));
  cuda_check(cudaSetDevice(gpu), "cudaSetDevice");
  void* p = nullptr;
  cuda_check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  s_->peer = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < std::min(slots, kBaselineStreams); ++i) {
    cudaStream_t st;
    cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    s_->streams.push_back(st);
  }
  for (size_t i = 0; i < slots; ++i) {
    cudaEvent_t ev;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    s_->events.push_back(ev);
  }
  s_->stream_of.assign(slots, s_->streams[0]);
}

PeerCopier::~PeerCopier() = default;

void PeerCopier::begin(uint32_t slot, uint64_t req) {
  s_->stream_of[slot] = s_->streams[req % s_->streams.size()];
}

void PeerCopier::copy(uint32_t slot, uint64_t dst_off, const uint8_t* src, uint64_t len) {
  cuda_check(
      cudaMemcpyAsync(s_->peer + dst_off, src, len, cudaMemcpyDeviceToDevice, s_->stream_of[slot]),
      "cudaMemcpyAsync");
}

void PeerCopier::close(uint32_t slot) {
  cuda_check(cudaEventRecord(s_->events[slot], s_->stream_of[slot]), "cudaEventRecord");
}

bool PeerCopier::done(uint32_t slot) {
  cudaError_t e = cudaEventQuery(s_->events[slot]);
  if (e == cudaErrorNotReady) return false;
  cuda_check(e, "cudaEventQuery");
  return true;
}
#else
struct PeerCopier::State {};
PeerCopier::PeerCopier(int, const std::vector<uint8_t>&, size_t) {
  no_cuda();
}
PeerCopier::~PeerCopier() = default;
void PeerCopier::begin(uint32_t, uint64_t) {
  no_cuda();
}
void PeerCopier::copy(uint32_t, uint64_t, const uint8_t*, uint64_t) {
  no_cuda();
}
void PeerCopier::close(uint32_t) {
  no_cuda();
}
bool PeerCopier::done(uint32_t) {
  no_cuda();
}
#endif

}  // namespace ferry_bench

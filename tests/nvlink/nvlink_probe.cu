// ferry-nvlink-probe: copy-kernel designs for the NVLink domain measured side
// by side on GPU 0 -> GPU 1 (peer access, one process), without the engine.
// It separates what the GPU can do from what the domain's CPU side adds
// (docs/PERFORMANCE.md, "NVLink domain").
//   ferry-nvlink-probe [--out FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gather_pages.cuh"
#include "nvlink/nvlink_kernels.h"

namespace {

using ferry::nvlink::CopyOp;
using Clock = std::chrono::steady_clock;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

std::vector<std::string> report;
void say(const char* fmt, double a = 0, double b = 0, double c = 0) {
  char line[512];
  std::snprintf(line, sizeof line, fmt, a, b, c);
  std::printf("%s\n", line);
  report.push_back(line);
}

// Block per op, op read by thread 0 (the shape of the first domain kernel).
__global__ void __launch_bounds__(256) k_block(const CopyOp* ops) {
  __shared__ CopyOp op;
  if (threadIdx.x == 0) op = ops[blockIdx.x];
  __syncthreads();
  ferry::nvlink::copy_words<4, 256>(reinterpret_cast<const uint4*>(op.src),
                                    reinterpret_cast<uint4*>(op.dst), op.len / 16, threadIdx.x);
}

// One op by value (no read of an op list), then a flag in mapped host memory
// once every block is done: the shape of "the kernel delivers the immediate".
__device__ unsigned int g_arrived;
__global__ void k_flag(CopyOp op, volatile unsigned long long* flag, unsigned long long value) {
  const uint4* s = reinterpret_cast<const uint4*>(op.src);
  uint4* d = reinterpret_cast<uint4*>(op.dst);
  const uint64_t n = op.len / 16;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    d[i] = s[i];
  if (flag == nullptr) return;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (atomicAdd(&g_arrived, 1) == gridDim.x - 1) {
      g_arrived = 0;
      __threadfence_system();
      *flag = value;
    }
  }
}

struct Bufs {
  char* src = nullptr;  // GPU 0
  char* dst = nullptr;  // GPU 1
  size_t len = 0;
};

double gbs(uint64_t bytes, Clock::duration d) {
  return double(bytes) / std::chrono::duration<double>(d).count() / 1e9;
}

void throughput(const Bufs& b) {
  constexpr uint32_t kPages = 1024;
  constexpr int kIters = 100, kBatches = 32;
  std::mt19937_64 rng(1);
  for (uint64_t page : {4096ull, 65536ull}) {
    const uint32_t slots = uint32_t(std::min<uint64_t>(b.len / page, 16384));
    const uint32_t per_page =
        uint32_t((page + ferry::nvlink::kMaxOpBytes - 1) / ferry::nvlink::kMaxOpBytes);
    const uint32_t nops = kPages * per_page;
    CopyOp* hops;
    CK(cudaHostAlloc(&hops, sizeof(CopyOp) * nops * kBatches, cudaHostAllocMapped));
    uint32_t* hidx;
    CK(cudaHostAlloc(&hidx, sizeof(uint32_t) * 2 * kPages * kBatches, cudaHostAllocMapped));
    CopyOp* dops;
    CK(cudaMalloc(&dops, sizeof(CopyOp) * nops * kBatches));
    for (int k = 0; k < kBatches; ++k) {
      std::vector<uint32_t> s, d;
      ferry::nvtest::random_pages(rng, slots, kPages, s, d);
      uint32_t j = 0;
      for (uint32_t p = 0; p < kPages; ++p)
        for (uint64_t o = 0; o < page; o += ferry::nvlink::kMaxOpBytes)
          hops[size_t(k) * nops + j++] =
              CopyOp{uint64_t(b.src + s[p] * page + o), uint64_t(b.dst + d[p] * page + o),
                     std::min<uint64_t>(ferry::nvlink::kMaxOpBytes, page - o)};
      std::memcpy(hidx + size_t(k) * 2 * kPages, s.data(), kPages * 4);
      std::memcpy(hidx + size_t(k) * 2 * kPages + kPages, d.data(), kPages * 4);
    }
    CK(cudaMemcpy(dops, hops, sizeof(CopyOp) * nops * kBatches, cudaMemcpyHostToDevice));
    cudaStream_t st[2];
    CK(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    const uint64_t bytes = page * kPages * kIters;
    auto run = [&](const char* name, int streams, auto launch) {
      launch(0, st[0]);
      CK(cudaDeviceSynchronize());
      auto t0 = Clock::now();
      for (int i = 0; i < kIters; ++i) launch(i % kBatches, st[i % streams]);
      CK(cudaDeviceSynchronize());
      const double r = gbs(bytes, Clock::now() - t0);
      char line[256];
      std::snprintf(line, sizeof line, "paged 1024 x %3llu KiB, %-44s %%6.1f GB/s",
                    (unsigned long long)(page >> 10), name);
      say(line, r);
    };
    for (int streams : {1, 2}) {
      const std::string sfx = streams == 1 ? ", 1 stream" : ", 2 streams";
      run(("ops in host memory, block per op (domain)" + sfx).c_str(), streams,
          [&](int k, cudaStream_t s) {
            CK(ferry::nvlink::launch_gather(hops + size_t(k) * nops, nops, s));
          });
      run(("ops in device memory, block per op" + sfx).c_str(), streams,
          [&](int k, cudaStream_t s) {
            CK(ferry::nvlink::launch_gather(dops + size_t(k) * nops, nops, s));
          });
      run(("ops in host memory, k_block" + sfx).c_str(), streams,
          [&](int k, cudaStream_t s) { k_block<<<nops, 256, 0, s>>>(hops + size_t(k) * nops); });
      for (uint32_t grid : {264u, 528u, 1056u}) {
        const std::string n = "index lists, warp per page, grid " + std::to_string(grid) + sfx;
        run(n.c_str(), streams, [&](int k, cudaStream_t s) {
          const uint32_t* ix = hidx + size_t(k) * 2 * kPages;
          ferry::nvtest::gather_pages<<<grid, 256, 0, s>>>(b.src, b.dst, page, ix, ix + kPages,
                                                           kPages);
        });
      }
    }
    CK(cudaStreamDestroy(st[0]));
    CK(cudaStreamDestroy(st[1]));
    CK(cudaFreeHost(hops));
    CK(cudaFreeHost(hidx));
    CK(cudaFree(dops));
  }
}

void latency(const Bufs& b) {
  constexpr int kN = 3000;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CopyOp* hop;
  CK(cudaHostAlloc(&hop, sizeof(CopyOp), cudaHostAllocMapped));
  *hop = CopyOp{uint64_t(b.src), uint64_t(b.dst), 4096};
  unsigned long long* flag;
  CK(cudaHostAlloc(&flag, 8, cudaHostAllocMapped));
  *flag = 0;
  auto pct = [](std::vector<double>& us, double q) {
    std::sort(us.begin(), us.end());
    return us[size_t(q * (us.size() - 1))];
  };
  auto measure = [&](const char* name, auto one) {
    std::vector<double> us;
    for (int i = 0; i < kN; ++i) {
      auto t0 = Clock::now();
      one(i);
      if (i >= 200)
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    char line[256];
    std::snprintf(line, sizeof line, "latency 4 KiB, %-52s p50 %%.2f us, p99 %%.2f us", name);
    const double p50 = pct(us, 0.5), p99 = pct(us, 0.99);
    say(line, p50, p99);
  };
  auto spin_event = [&] {
    while (cudaEventQuery(ev) == cudaErrorNotReady) {
    }
  };
  measure("domain kernel, op in host memory, event query", [&](int) {
    CK(ferry::nvlink::launch_gather(hop, 1, s));
    CK(cudaEventRecord(ev, s));
    spin_event();
  });
  const CopyOp op{uint64_t(b.src), uint64_t(b.dst), 4096};
  for (int grid : {1, 2}) {
    const std::string g = ", grid " + std::to_string(grid);
    measure(("op by value, event query" + g).c_str(), [&](int) {
      k_flag<<<grid, 256, 0, s>>>(op, nullptr, 0);
      CK(cudaEventRecord(ev, s));
      spin_event();
    });
    measure(("op by value, flag stored by the kernel" + g).c_str(), [&](int i) {
      const unsigned long long v = (unsigned long long)(i + 1) * 4 + grid;
      k_flag<<<grid, 256, 0, s>>>(op, flag, v);
      while (*reinterpret_cast<volatile unsigned long long*>(flag) != v) {
      }
    });
  }
  measure("cudaMemcpyAsync (copy engine), event query", [&](int) {
    CK(cudaMemcpyAsync(b.dst, b.src, 4096, cudaMemcpyDefault, s));
    CK(cudaEventRecord(ev, s));
    spin_event();
  });
  // Launch cost alone (CPU time of the call).
  {
    std::vector<double> us;
    for (int i = 0; i < kN; ++i) {
      auto t0 = Clock::now();
      k_flag<<<1, 256, 0, s>>>(op, nullptr, 0);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      CK(cudaStreamSynchronize(s));
    }
    const double p50 = pct(us, 0.5);
    say("launch call alone (CPU time of <<<>>>): p50 %.2f us", p50);
    us.clear();
    for (int i = 0; i < kN; ++i) {
      CK(cudaEventRecord(ev, s));
      CK(cudaStreamSynchronize(s));
      auto t0 = Clock::now();
      cudaEventQuery(ev);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    say("cudaEventQuery of a completed event: p50 %.2f us", pct(us, 0.5));
  }
  CK(cudaFreeHost(hop));
  CK(cudaFreeHost(flag));
  CK(cudaEventDestroy(ev));
  CK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--out") out = argv[i + 1];
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    std::printf("ferry-nvlink-probe: needs two GPUs\n");
    return 2;
  }
  Bufs b;
  b.len = 320ull << 20;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&b.dst, b.len));
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&b.src, b.len));
  CK(cudaMemset(b.src, 1, b.len));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  throughput(b);
  latency(b);
  if (!out.empty()) {
    std::ofstream f(out);
    for (auto& l : report) f << l << "\n";
  }
  return 0;
}

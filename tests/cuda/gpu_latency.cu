// ferry-gpu-latency: watcher and GPU-flag latencies on a real GPU
// (docs/PERFORMANCE.md, "UVM watcher and GPU counter").
//
//   ferry-gpu-latency [--watcher-cpu N] [--helper-cpu N] [--out FILE]
//
// Four round trips, each with a single clock so no clock offset enters:
//  raw-gpu   kernel stores a word, a plain host thread answers, kernel sees the
//            answer (GPU clock): the floor under a watcher;
//  watcher   the same through ferry: a CUDA graph of kernels signal_watcher(),
//            the watcher callback answers (GPU clock);
//  raw-host  host stores a word, a spinning kernel answers (host clock): the
//            floor under a flag;
//  flag      the NIC worker's code (ImmTable::on_arrival) sets a GPU flag, a
//            kernel spinning in wait_flag() answers (host clock).
// One-way estimates subtract half of the matching floor (the answer leg is the
// same path in both) and are also given as plain halves.
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/imm_table.h"
#include "ferry/device.cuh"
#include "ferry/engine.h"
#include "gpu_config.h"
#include "support/thread_cpu.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}
#define CK(x) check((x), #x)

struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct DevFree {
  void operator()(void* p) const { cudaFree(p); }
};
template <typename T>
std::unique_ptr<T, HostFree> mapped(size_t n) {
  void* p = nullptr;
  CK(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(p, 0, n * sizeof(T));
  return std::unique_ptr<T, HostFree>(static_cast<T*>(p));
}
template <typename T>
std::unique_ptr<T, DevFree> device_array(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  CK(cudaMemset(p, 0, n * sizeof(T)));
  return std::unique_ptr<T, DevFree>(static_cast<T*>(p));
}

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

uint64_t hload(const uint64_t* p) {
  return std::atomic_ref<const uint64_t>(*p).load(std::memory_order_acquire);
}
void hstore(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void st_rel(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// printf-style: fmt 9's headers do not compile under nvcc in C++20 mode.
template <typename... A>
std::string F(const char* f, const A&... a) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, a...);
  return buf;
}

constexpr uint64_t kSpinLimitNs = 2'000'000'000;  // a lost answer ends the run, not the GPU

// Smallest step of %globaltimer seen: its resolution on this GPU.
__global__ void timer_resolution(uint64_t* out) {
  uint64_t best = ~0ull, prev = gtime();
  for (int i = 0; i < 100000; ++i) {
    uint64_t t = gtime();
    if (t != prev) {
      best = min(best, t - prev);
      prev = t;
    }
  }
  *out = best;
}

__global__ void raw_gpu_initiated(uint64_t* ping, const uint64_t* pong, uint64_t* rtt, int n) {
  for (int i = 1; i <= n; ++i) {
    uint64_t t0 = gtime();
    st_rel(ping, i);
    while (ferry::device::load_acquire_sys(pong) != uint64_t(i))
      if (gtime() - t0 > kSpinLimitNs) return;
    rtt[i] = gtime() - t0;
  }
}

__global__ void watcher_node(uint64_t* seq, uint64_t* w, const uint64_t* answer, uint64_t* rtt) {
  uint64_t v = ++*seq;
  uint64_t t0 = gtime();
  ferry::device::signal_watcher(w, v);
  while (ferry::device::load_acquire_sys(answer) != v)
    if (gtime() - t0 > kSpinLimitNs) return;
  rtt[v] = gtime() - t0;
}

__global__ void raw_host_initiated(const uint64_t* ping, uint64_t* pong, int n) {
  for (int i = 1; i <= n; ++i) {
    uint64_t t0 = gtime();
    while (ferry::device::load_acquire_sys(ping) != uint64_t(i))
      if (gtime() - t0 > kSpinLimitNs) return;
    st_rel(pong, i);
  }
}

__global__ void flag_waiter(const uint32_t* flag, uint64_t* pong, int n) {
  for (int i = 1; i <= n; ++i) {
    if (!ferry::device::wait_flag(flag, uint32_t(i), 4'000'000'000ull)) return;
    st_rel(pong, i);
  }
}

struct Stats {
  std::string name;
  std::vector<double> us;
  double q(double p) const {
    if (us.empty()) return 0;
    return us[std::min(us.size() - 1, size_t(p * double(us.size())))];
  }
  std::string line() const {
    return F("%-38s n=%-6zu p50 %6.2f  p90 %6.2f  p99 %6.2f  p99.9 %7.2f  max %8.2f us",
             name.c_str(), us.size(), q(0.5), q(0.9), q(0.99), q(0.999),
             us.empty() ? 0.0 : us.back());
  }
};

Stats make_stats(std::string name, std::vector<double> v, size_t skip) {
  if (v.size() > skip) v.erase(v.begin(), v.begin() + long(skip));
  std::sort(v.begin(), v.end());
  return Stats{std::move(name), std::move(v)};
}

}  // namespace

int main(int argc, char** argv) {
  int watcher_cpu = 2, helper_cpu = 4;
  std::string out;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--watcher-cpu") watcher_cpu = std::atoi(argv[i + 1]);
    if (a == "--helper-cpu") helper_cpu = std::atoi(argv[i + 1]);
    if (a == "--out") out = argv[i + 1];
  }
  if (int(std::thread::hardware_concurrency()) <= std::max(watcher_cpu, helper_cpu))
    watcher_cpu = helper_cpu = -1;
  std::vector<std::string> report;
  auto say = [&](const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
    report.push_back(s);
  };
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  say(F("device: %s (sm_%d%d), driver API %d, runtime %d, watcher cpu %d, helper cpu %d",
        static_cast<const char*>(prop.name), prop.major, prop.minor, driver, runtime, watcher_cpu,
        helper_cpu));
  cudaStream_t stream_raw = nullptr;
  CK(cudaStreamCreateWithFlags(&stream_raw, cudaStreamNonBlocking));
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, void (*)(cudaStream_t)> stream(
      stream_raw, [](cudaStream_t s) { cudaStreamDestroy(s); });
  cudaStream_t s = stream.get();

  {
    auto res = device_array<uint64_t>(1);
    timer_resolution<<<1, 1, 0, s>>>(res.get());
    uint64_t r = 0;
    CK(cudaMemcpyAsync(&r, res.get(), 8, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    say(F("globaltimer resolution: %llu ns", (unsigned long long)r));
  }

  constexpr int kN = 20000;
  constexpr size_t kWarm = 500;
  auto words = mapped<uint64_t>(64);  // ping at [0], pong at [8], answer at [16]: own lines
  uint64_t* ping = words.get();
  uint64_t* pong = words.get() + 8;
  uint64_t* answer = words.get() + 16;

  // --- raw-gpu
  Stats raw_gpu = [&] {
    auto rtt = device_array<uint64_t>(kN + 1);
    std::atomic<bool> stop{false};
    std::memset(words.get(), 0, 64 * 8);
    std::thread helper([&] {
      pin(helper_cpu);
      uint64_t last = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        uint64_t v = hload(ping);
        if (v != last) hstore(pong, last = v);
      }
    });
    raw_gpu_initiated<<<1, 1, 0, s>>>(ping, pong, rtt.get(), kN);
    CK(cudaStreamSynchronize(s));
    stop = true;
    helper.join();
    std::vector<uint64_t> h(kN + 1);
    CK(cudaMemcpy(h.data(), rtt.get(), h.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<double> us;
    for (int i = 1; i <= kN; ++i) us.push_back(double(h[i]) / 1000.0);
    return make_stats("raw-gpu  RTT (GPU->CPU->GPU)", us, kWarm);
  }();
  say(raw_gpu.line());

  // --- watcher, under a CUDA graph
  ferry::EngineConfig cfg = ferry::test::gpu_test_config();
  cfg.watcher_cpu = watcher_cpu;
  ferry::TransferEngine engine(cfg);
  constexpr int kNodes = 100, kReplays = kN / kNodes;
  constexpr uint64_t kStop = ~0ull;
  std::atomic<uint64_t> callbacks{0};
  uint64_t* w = engine.alloc_uvm_watcher([&](uint64_t, uint64_t n) {
    hstore(answer, n);  // first thing: the kernel is waiting
    callbacks.fetch_add(1, std::memory_order_relaxed);
    return n != kStop;
  });
  Stats watcher;
  {
    auto seq = device_array<uint64_t>(1);
    auto rtt = device_array<uint64_t>(uint64_t(kNodes) * kReplays + 1);
    cudaGraph_t g = nullptr;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kNodes; ++i) watcher_node<<<1, 1, 0, s>>>(seq.get(), w, answer, rtt.get());
    CK(cudaStreamEndCapture(s, &g));
    std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, void (*)(cudaGraph_t)> graph(
        g, [](cudaGraph_t x) { cudaGraphDestroy(x); });
    cudaGraphExec_t ge = nullptr;
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, void (*)(cudaGraphExec_t)> exec(
        ge, [](cudaGraphExec_t x) { cudaGraphExecDestroy(x); });
    auto t0 = Clock::now();
    for (int r = 0; r < kReplays; ++r) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<uint64_t> h(uint64_t(kNodes) * kReplays + 1);
    CK(cudaMemcpy(h.data(), rtt.get(), h.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<double> us;
    size_t lost = 0;
    for (size_t i = 1; i < h.size(); ++i) {
      if (h[i] == 0)
        ++lost;
      else
        us.push_back(double(h[i]) / 1000.0);
    }
    watcher = make_stats("watcher  RTT (graph kernel->cb->GPU)", us, kWarm);
    say(watcher.line());
    say(F("watcher: %d graph replays x %d kernels in %.3f s, %llu callbacks, %zu lost", kReplays,
          kNodes, secs, (unsigned long long)callbacks.load(), lost));
  }
  // Watcher thread CPU: armed (spinning, no kernel), then released (sleeping).
  pid_t tid = ferry::test::find_thread("ferry-watcher");
  double c0 = ferry::test::thread_cpu_seconds(tid);
  std::this_thread::sleep_for(1s);
  double armed_cpu = ferry::test::thread_cpu_seconds(tid) - c0;
  hstore(w, kStop);  // UVA: the device address of pinned host memory is its host address
  std::this_thread::sleep_for(100ms);
  c0 = ferry::test::thread_cpu_seconds(tid);
  std::this_thread::sleep_for(1s);
  double idle_cpu = ferry::test::thread_cpu_seconds(tid) - c0;
  say(
      F("watcher thread (tid %d) CPU over 1 s: %.2f s with 1 watcher armed, %.3f s "
        "with none armed",
        int(tid), armed_cpu, idle_cpu));

  // --- raw-host
  std::memset(words.get(), 0, 64 * 8);
  Stats raw_host;
  {
    pin(helper_cpu);
    raw_host_initiated<<<1, 1, 0, s>>>(ping, pong, kN);
    std::vector<double> us;
    for (int i = 1; i <= kN; ++i) {
      auto t0 = Clock::now();
      hstore(ping, i);
      while (hload(pong) != uint64_t(i))
        if (Clock::now() - t0 > 2s) break;
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    CK(cudaStreamSynchronize(s));
    raw_host = make_stats("raw-host RTT (CPU->GPU->CPU)", us, kWarm);
    say(raw_host.line());
  }

  // --- flag: the worker's ImmTable code sets a GPU flag a kernel waits on
  Stats flag;
  {
    auto flags = mapped<uint32_t>(16);
    ferry::core::ImmTable table(nullptr);
    table.expect_gpu_flag(42, 1, flags.get(), nullptr);
    std::memset(words.get(), 0, 64 * 8);
    flag_waiter<<<1, 1, 0, s>>>(flags.get(), pong, kN);
    std::vector<double> us;
    for (int i = 1; i <= kN; ++i) {
      auto t0 = Clock::now();
      table.on_arrival(42);
      while (hload(pong) != uint64_t(i))
        if (Clock::now() - t0 > 2s) break;
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    CK(cudaStreamSynchronize(s));
    flag = make_stats("flag     RTT (on_arrival->kernel->CPU)", us, kWarm);
    say(flag.line());
  }

  say("one-way estimates (RTT minus half the matching floor's p50 | RTT / 2):");
  say(F("  watcher GPU store -> callback entry: p50 %.2f | %.2f us, p99 %.2f | %.2f us",
        watcher.q(0.5) - raw_gpu.q(0.5) / 2, watcher.q(0.5) / 2,
        watcher.q(0.99) - raw_gpu.q(0.5) / 2, watcher.q(0.99) / 2));
  say(F("  flag on_arrival -> kernel observes:  p50 %.2f | %.2f us, p99 %.2f | %.2f us",
        flag.q(0.5) - raw_host.q(0.5) / 2, flag.q(0.5) / 2, flag.q(0.99) - raw_host.q(0.5) / 2,
        flag.q(0.99) / 2));
  if (!out.empty()) {
    if (FILE* f = std::fopen(out.c_str(), "w")) {
      for (auto& l : report) std::fprintf(f, "%s\n", l.c_str());
      std::fclose(f);
    }
  }
  return 0;
}

// ferry-chain: the GPU -> host proxy -> engine -> peer GPU signalling chain
// that MoE dispatch and layer-wise KV transfer ride on, end to end, beside a
// raw relay floor measured in the same run (docs/PERFORMANCE.md, "Chain").
//
//   ferry-chain [--provider nvlink|shm] [--op imm|write4k] [--gpu N]
//               [--gpu-b N] [--iters N] [--poll busy|adaptive]
//               [--watch-on thread|worker] [--out FILE]
//
// --watch-on worker: the watcher words are polled by the engine's worker and
// its callbacks run there (WatchOn::kWorker), so a submission goes out in the
// same turn instead of crossing from the watcher thread to the worker.
//
// Two processes, A and B, both on GPU N. One round trip i:
//   A's kernel stores i into a UVM watcher word -> A's watcher callback
//   posts submit_imm (or a 4 KiB submit_single_write with the immediate) to B
//   -> B's worker counts it and stores the generation into B's
//   imm_counter_gpu flag -> B's spinning kernel sees i and stores i into B's
//   watcher word -> B's callback posts back the same way -> A's flag releases
//   A's kernel, which takes the round trip on the GPU clock.
// The floor: the same kernels and words, but a plain host thread per process
// relays through a shared page (no engine, no transport): A's thread sees A's
// word and publishes i, B's thread sees it and stores B's flag, and back.
// Host-clock stamps (CLOCK_MONOTONIC, one clock for both processes) give the
// forward leg A callback -> B callback and the cost of the submit call.
// With --op write4k a second floor moves the same 4 KiB per hop the plain way
// before it publishes: nvlink, a cudaMemcpyAsync into the peer's GPU buffer
// (CUDA IPC) and a spin on its event; shm, a memcpy into a shared page. The
// engine's write is then compared with the copy it needs, not only with a
// relay that moves no data.
// Two processes' kernels on one GPU do not run at the same time unless MPS
// serves both: each hop then waits for the GPU's time slice (about 2.2 ms on
// an H200), floor and engine alike. Run it under MPS, or with A and B on two
// GPUs (--gpu-b), to see the engine.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "ferry/device.cuh"
#include "ferry/engine.h"
#include "forked_pair.h"

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

struct Options {
  std::string provider = "nvlink", op = "imm", poll = "busy", watch_on = "thread", out;
  int gpu = 0, gpu_b = -1, iters = 5000;  // gpu_b: B's GPU (-1: the same as A's)
};

constexpr int kWarm = 200;
constexpr uint32_t kPing = 101, kPong = 102;
constexpr uint64_t kSpinLimitNs = 2'000'000'000;

// What both processes share (MAP_SHARED before the fork).
struct Shared {
  alignas(64) std::atomic<uint64_t> a2b{0};
  alignas(64) std::atomic<uint64_t> b2a{0};
  alignas(64) std::atomic<int> abort{0};
  static constexpr int kMax = 100'000;
  int64_t a_cb[kMax + 1], a_sub[kMax + 1], b_cb[kMax + 1];
  alignas(4096) uint8_t a2b_data[4096], b2a_data[4096];  // the copying floor over shm
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A: store i, wait until the flag reaches i, take the time.
__global__ void pinger(uint64_t* word, const uint32_t* flag, uint64_t* rtt, int n) {
  for (int i = 1; i <= n; ++i) {
    const uint64_t t0 = gtime();
    ferry::device::signal_watcher(word, uint64_t(i));
    while (int32_t(ferry::device::load_acquire_sys(flag) - uint32_t(i)) < 0)
      if (gtime() - t0 > kSpinLimitNs) return;
    rtt[i] = gtime() - t0;
  }
}

// B: wait until the flag reaches i, store i.
__global__ void ponger(uint64_t* word, const uint32_t* flag, int n) {
  for (int i = 1; i <= n; ++i) {
    const uint64_t t0 = gtime();
    while (int32_t(ferry::device::load_acquire_sys(flag) - uint32_t(i)) < 0)
      if (gtime() - t0 > kSpinLimitNs) return;
    ferry::device::signal_watcher(word, uint64_t(i));
  }
}

uint64_t hload(const uint64_t* p) {
  return std::atomic_ref<const uint64_t>(*p).load(std::memory_order_acquire);
}
void hstore32(uint32_t* p, uint32_t v) {
  std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
}

// Mapped, pinned host words: [0] watcher word (own line), [8] flag.
struct Words {
  uint64_t* p = nullptr;
  Words() {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&p), 4096, cudaHostAllocMapped));
    std::memset(p, 0, 4096);
  }
  ~Words() { cudaFreeHost(p); }
  uint64_t* word() { return p; }
  uint32_t* flag() { return reinterpret_cast<uint32_t*>(p + 8); }
};

void send_all(int fd, const void* b, size_t n) {
  const char* c = static_cast<const char*>(b);
  while (n > 0) {
    ssize_t r = ::write(fd, c, n);
    if (r <= 0) std::exit(3);
    c += r;
    n -= size_t(r);
  }
}
void recv_all(int fd, void* b, size_t n) {
  char* c = static_cast<char*>(b);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) std::exit(3);
    c += r;
    n -= size_t(r);
  }
}
void send_blob(int fd, const std::vector<uint8_t>& v) {
  uint64_t n = v.size();
  send_all(fd, &n, 8);
  send_all(fd, v.data(), n);
}
std::vector<uint8_t> recv_blob(int fd) {
  uint64_t n = 0;
  recv_all(fd, &n, 8);
  std::vector<uint8_t> v(n);
  recv_all(fd, v.data(), n);
  return v;
}
void sync_point(int fd) {
  char c = 1;
  send_all(fd, &c, 1);
  recv_all(fd, &c, 1);
}

struct Q {
  std::vector<double> v;
  explicit Q(std::vector<double> x) : v(std::move(x)) { std::sort(v.begin(), v.end()); }
  double at(double q) const {
    return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))];
  }
};

// Round trips of A's kernel in µs, warm-up dropped.
std::vector<double> rtts(const std::vector<uint64_t>& ns, int n) {
  std::vector<double> us;
  for (int i = kWarm + 1; i <= n; ++i)
    if (ns[i] != 0) us.push_back(double(ns[i]) / 1000.0);
  return us;
}

// ----------------------------------------------------------------- floor

// How the copying floor moves 4 KiB to the peer before it publishes a hop
// (nullptr: the plain floor, no data).
struct FloorCopy {
  virtual ~FloorCopy() = default;
  virtual void copy() = 0;
};

// GPU to the peer's GPU buffer through CUDA IPC: the copy engine, as the
// NVLink domain uses for a lone write, and a spin on its event.
struct GpuCopy : FloorCopy {
  void* src = nullptr;
  void* mine = nullptr;  // what the peer copies into
  void* dst = nullptr;   // the peer's buffer, opened here
  cudaStream_t s = nullptr;
  cudaEvent_t ev = nullptr;
  GpuCopy(int fd) {
    CK(cudaMalloc(&src, 4096));
    CK(cudaMalloc(&mine, 4096));
    CK(cudaMemset(src, 7, 4096));
    cudaIpcMemHandle_t h{};
    CK(cudaIpcGetMemHandle(&h, mine));
    send_all(fd, &h, sizeof(h));
    recv_all(fd, &h, sizeof(h));
    CK(cudaIpcOpenMemHandle(&dst, h, cudaIpcMemLazyEnablePeerAccess));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  ~GpuCopy() override {
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
    cudaIpcCloseMemHandle(dst);
    cudaFree(mine);
    cudaFree(src);
  }
  void copy() override {
    CK(cudaMemcpyAsync(dst, src, 4096, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(ev, s));
    while (cudaEventQuery(ev) == cudaErrorNotReady) {
    }
  }
};

// Host memory into a page both processes map, as libfabric shm copies.
struct HostCopy : FloorCopy {
  uint8_t src[4096];
  uint8_t* dst;
  HostCopy(Shared* sh, bool is_a) : dst(is_a ? sh->a2b_data : sh->b2a_data) {
    std::memset(src, 7, sizeof(src));
  }
  void copy() override { std::memcpy(dst, src, sizeof(src)); }
};

// Each process' relay thread: its own word -> the shared page -> the peer's
// flag, and the peer's word back into its own flag.
void relay(Shared* sh, Words& w, bool is_a, int n, FloorCopy* data) {
  std::atomic<uint64_t>& out = is_a ? sh->a2b : sh->b2a;
  std::atomic<uint64_t>& in = is_a ? sh->b2a : sh->a2b;
  uint64_t sent = 0, got = 0;
  const auto limit = Clock::now() + 60s;
  while ((sent < uint64_t(n) || got < uint64_t(n)) && Clock::now() < limit &&
         sh->abort.load() == 0) {
    uint64_t v = hload(w.word());
    if (v != sent) {
      (is_a ? sh->a_cb : sh->b_cb)[v] = now_ns();
      if (data != nullptr) data->copy();
      out.store(sent = v, std::memory_order_release);
    }
    uint64_t r = in.load(std::memory_order_acquire);
    if (r != got) hstore32(w.flag(), uint32_t(got = r));
  }
}

// ----------------------------------------------------------------- ferry

ferry::EngineConfig config(const Options& o) {
  ferry::EngineConfig c;
  c.provider = o.provider;
  if (o.provider == "nvlink") {
    c.groups[0].device = ferry::Device::cuda(o.gpu);
  } else {
    c.groups[0].nic_names = {o.provider};
  }
  c.groups[0].insist = true;
  c.poll_mode = o.poll == "busy" ? ferry::PollMode::kBusy : ferry::PollMode::kAdaptive;
  c.default_deadline = 60s;
  return c;
}

struct Region {
  void* p = nullptr;
  bool gpu = false;
  Region(bool on_gpu, size_t len) : gpu(on_gpu) {
    if (gpu)
      CK(cudaMalloc(&p, len));
    else
      p = std::aligned_alloc(4096, len);
  }
  ~Region() {
    if (gpu)
      cudaFree(p);
    else
      std::free(p);
  }
};

// Runs one side of the ferry chain; A returns its kernel's round trips.
std::vector<uint64_t> ferry_side(const Options& o, Shared* sh, int fd, bool is_a) {
  const int n = o.iters;
  ferry::TransferEngine e(config(o));
  const bool gpu_mem = o.provider == "nvlink";
  Region reg(gpu_mem, 1 << 20);
  auto [h, mine] =
      e.reg_mr(reg.p, 1 << 20, gpu_mem ? ferry::Device::cuda(o.gpu) : ferry::Device::host());
  uint32_t* flag = e.imm_counter_gpu(is_a ? kPong : kPing, 1);
  send_blob(fd, mine.to_bytes());
  const ferry::MrDesc peer = ferry::MrDesc::from_bytes(recv_blob(fd));
  const uint32_t send_imm = is_a ? kPing : kPong;
  const bool write = o.op == "write4k";
  std::atomic<int64_t> failures{0};
  uint64_t* word = e.alloc_uvm_watcher(
      [&](uint64_t, uint64_t v) {
        if (v == 0 || v > uint64_t(Shared::kMax)) return true;
        (is_a ? sh->a_cb : sh->b_cb)[v] = now_ns();
        try {
          if (write)
            e.submit_single_write(4096, send_imm, h, 0, peer, 0, ferry::OnDone::none());
          else
            e.submit_imm(send_imm, peer, ferry::OnDone::none());
        } catch (const std::exception& ex) {
          failures++;
          std::fprintf(stderr, "submit failed: %s\n", ex.what());
        }
        if (is_a) sh->a_sub[v] = now_ns();
        return v < uint64_t(n);
      },
      o.watch_on == "worker" ? ferry::WatchOn::kWorker : ferry::WatchOn::kWatcherThread);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t* rtt = nullptr;
  CK(cudaMalloc(&rtt, (n + 1) * 8));
  CK(cudaMemset(rtt, 0, (n + 1) * 8));
  sync_point(fd);  // both engines and watchers up
  if (is_a)
    pinger<<<1, 1, 0, s>>>(word, flag, rtt, n);
  else
    ponger<<<1, 1, 0, s>>>(word, flag, n);
  CK(cudaStreamSynchronize(s));
  std::vector<uint64_t> out(n + 1);
  CK(cudaMemcpy(out.data(), rtt, (n + 1) * 8, cudaMemcpyDeviceToHost));
  cudaFree(rtt);
  cudaStreamDestroy(s);
  sync_point(fd);  // neither engine stops while the other still posts to it
  if (failures.load() > 0)
    std::fprintf(stderr, "%lld submits failed\n", (long long)failures.load());
  return out;
}

std::vector<uint64_t> floor_side(const Options& o, Shared* sh, int fd, bool is_a, bool copying) {
  const int n = o.iters;
  Words w;
  std::unique_ptr<FloorCopy> data;
  if (copying && o.provider == "nvlink")
    data = std::make_unique<GpuCopy>(fd);
  else if (copying)
    data = std::make_unique<HostCopy>(sh, is_a);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t* rtt = nullptr;
  CK(cudaMalloc(&rtt, (n + 1) * 8));
  CK(cudaMemset(rtt, 0, (n + 1) * 8));
  sync_point(fd);
  std::thread t([&] { relay(sh, w, is_a, n, data.get()); });
  if (is_a)
    pinger<<<1, 1, 0, s>>>(w.word(), w.flag(), rtt, n);
  else
    ponger<<<1, 1, 0, s>>>(w.word(), w.flag(), n);
  CK(cudaStreamSynchronize(s));
  t.join();
  std::vector<uint64_t> out(n + 1);
  CK(cudaMemcpy(out.data(), rtt, (n + 1) * 8, cudaMemcpyDeviceToHost));
  cudaFree(rtt);
  cudaStreamDestroy(s);
  sync_point(fd);
  sh->a2b = 0;
  sh->b2a = 0;
  return out;
}

// Forward leg (A callback -> B callback) and A's submit call, µs.
void legs(const Shared* sh, int n, bool with_submit, std::vector<double>* fwd,
          std::vector<double>* sub) {
  for (int i = kWarm + 1; i <= n; ++i) {
    if (sh->a_cb[i] && sh->b_cb[i]) fwd->push_back(double(sh->b_cb[i] - sh->a_cb[i]) / 1000.0);
    if (with_submit && sh->a_sub[i]) sub->push_back(double(sh->a_sub[i] - sh->a_cb[i]) / 1000.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--provider")
      o.provider = v;
    else if (a == "--op")
      o.op = v;
    else if (a == "--gpu")
      o.gpu = std::atoi(v.c_str());
    else if (a == "--gpu-b")
      o.gpu_b = std::atoi(v.c_str());
    else if (a == "--watch-on" && (v == "thread" || v == "worker"))
      o.watch_on = v;
    else if (a == "--iters")
      o.iters = std::min(std::atoi(v.c_str()), Shared::kMax);
    else if (a == "--poll")
      o.poll = v;
    else if (a == "--out")
      o.out = v;
    else {
      std::fprintf(stderr, "ferry-chain: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  auto* sh = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return 2;
  new (sh) Shared();
  ferry::tools::SocketPair sp;
  if (!sp.make()) return 2;
  const pid_t child = ::fork();
  if (child < 0) return 2;
  const bool is_a = child != 0;
  // Each process keeps its own end: a side that leaves sees the other's
  // reads end instead of blocking on an end it still holds itself.
  (is_a ? sp.b : sp.a).reset();
  const int fd = (is_a ? sp.a : sp.b).get();
  if (!is_a && o.gpu_b >= 0) o.gpu = o.gpu_b;
  // CUDA starts after the fork, in each process.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= o.gpu) {
    if (is_a) std::fprintf(stderr, "ferry-chain: no GPU %d, skipped\n", o.gpu);
    if (is_a) ::waitpid(child, nullptr, 0);
    return 77;
  }
  CK(cudaSetDevice(o.gpu));

  std::vector<uint64_t> floor_ns = floor_side(o, sh, fd, is_a, false);
  std::vector<double> floor_fwd, none, copy_fwd;
  if (is_a) {  // B waits at the sync point below: the stamps are A's to read and clear
    legs(sh, o.iters, false, &floor_fwd, &none);
    std::memset(sh->a_cb, 0, sizeof(sh->a_cb));
    std::memset(sh->b_cb, 0, sizeof(sh->b_cb));
  }
  sync_point(fd);
  const bool writes = o.op == "write4k";
  std::vector<uint64_t> copy_ns;
  if (writes) {
    copy_ns = floor_side(o, sh, fd, is_a, true);
    if (is_a) {
      legs(sh, o.iters, false, &copy_fwd, &none);
      std::memset(sh->a_cb, 0, sizeof(sh->a_cb));
      std::memset(sh->b_cb, 0, sizeof(sh->b_cb));
    }
    sync_point(fd);
  }
  std::vector<uint64_t> ferry_ns = ferry_side(o, sh, fd, is_a);
  if (!is_a) return 0;
  int status = 0;
  ::waitpid(child, &status, 0);

  std::vector<double> fwd, sub;
  legs(sh, o.iters, true, &fwd, &sub);
  const Q fl(rtts(floor_ns, o.iters)), fe(rtts(ferry_ns, o.iters));
  const Q flf(floor_fwd), fef(fwd), fes(sub);
  char buf[2048];
  std::snprintf(
      buf, sizeof(buf),
      "ferry-chain provider=%s op=%s poll=%s watch-on=%s gpu=%d iters=%d (warm-up %d dropped)\n"
      "round trip (A's kernel, GPU clock)   floor: n=%zu p50 %.2f p99 %.2f us | ferry: n=%zu "
      "p50 %.2f p99 %.2f us | ratio p50 %.2f, ferry p99/p50 %.2f\n"
      "forward leg A callback -> B callback floor: p50 %.2f p99 %.2f us | ferry: p50 %.2f "
      "p99 %.2f us\n"
      "A's submit call (callback entry -> return): p50 %.2f p99 %.2f us\n"
      "rest of the round trip (kernel store -> A callback, B callback -> A kernel), p50 "
      "difference: floor %.2f us, ferry %.2f us\n",
      o.provider.c_str(), o.op.c_str(), o.poll.c_str(), o.watch_on.c_str(), o.gpu, o.iters, kWarm,
      fl.v.size(), fl.at(0.5), fl.at(0.99), fe.v.size(), fe.at(0.5), fe.at(0.99),
      fl.at(0.5) > 0 ? fe.at(0.5) / fl.at(0.5) : 0.0,
      fe.at(0.5) > 0 ? fe.at(0.99) / fe.at(0.5) : 0.0, flf.at(0.5), flf.at(0.99), fef.at(0.5),
      fef.at(0.99), fes.at(0.5), fes.at(0.99), fl.at(0.5) - flf.at(0.5), fe.at(0.5) - fef.at(0.5));
  if (writes) {
    const Q fc(rtts(copy_ns, o.iters)), fcf(copy_fwd);
    const size_t used = std::strlen(buf);
    std::snprintf(buf + used, sizeof(buf) - used,
                  "floor moving the same 4 KiB per hop (%s): round trip n=%zu p50 %.2f p99 %.2f "
                  "us, forward leg p50 %.2f p99 %.2f us | ferry / this floor: p50 %.2f\n",
                  o.provider == "nvlink" ? "cudaMemcpyAsync to the peer's GPU + event" : "memcpy",
                  fc.v.size(), fc.at(0.5), fc.at(0.99), fcf.at(0.5), fcf.at(0.99),
                  fc.at(0.5) > 0 ? fe.at(0.5) / fc.at(0.5) : 0.0);
  }
  std::fputs(buf, stdout);
  if (!o.out.empty())
    if (FILE* f = std::fopen(o.out.c_str(), "a")) {
      std::fputs(buf, f);
      std::fclose(f);
    }
  const bool complete = fe.v.size() + kWarm == size_t(o.iters) &&
                        fl.v.size() + kWarm == size_t(o.iters) &&
                        (!writes || rtts(copy_ns, o.iters).size() + kWarm == size_t(o.iters));
  if (!complete) std::fprintf(stderr, "ferry-chain: some round trips were lost\n");
  return complete && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

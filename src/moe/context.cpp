// ferry::moe::AllToAll with CUDA: memory, registration, the exchange of
// descriptors and IPC handles, the proxy, and the kernel launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "ferry/moe.h"
#include "moe/kernels.h"
#include "moe/proxy.h"
#include "moe/routing.h"
#include "moe/sizes.h"

namespace ferry::moe {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(Code::kInternal, std::string("moe: ") + what + ": " + cudaGetErrorString(e));
}

uint64_t align(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// Little-endian byte codec for local_info.
struct Writer {
  std::vector<uint8_t> b;
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void bytes(std::span<const uint8_t> s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
};
struct Reader {
  std::span<const uint8_t> b;
  size_t at = 0;
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{b[at + i]} << (8 * i);
    at += 8;
    return v;
  }
  std::span<const uint8_t> bytes() {
    const uint64_t n = u64();
    need(n);
    auto s = b.subspan(at, n);
    at += n;
    return s;
  }
  void need(uint64_t n) {
    if (at + n > b.size()) throw Error(Code::kInvalidArgument, "moe: truncated peer info");
  }
};

constexpr uint64_t kMagic = 0x6d6f652d66727931ull;  // "moe-fry1"

}  // namespace

struct AllToAll::Impl {
  TransferEngine& engine;
  AllToAllConfig cfg;
  Geometry g;
  BufferSizes sizes;
  // Layout of the one block peers map: sync | send | recv | csend | crecv.
  uint64_t off_send = 4096, off_recv = 0, off_csend = 0, off_crecv = 0;
  uint8_t* block = nullptr;
  uint32_t* routes = nullptr;  // mapped host, N x E
  uint32_t* words = nullptr;   // mapped host: plan, then the flags
  uint32_t *plan_epoch = nullptr, *tx_ready = nullptr, *proxy_error = nullptr,
           *kernel_error = nullptr;
  Workspace* ws = nullptr;
  MrHandle h_routes, h_send, h_recv, h_csend, h_crecv;
  MrDesc d_routes, d_recv, d_crecv;
  std::vector<void*> opened;  // peers' mapped blocks
  uint64_t* progress = nullptr;
  // What the watcher callback reaches. Shared with the callback, which the
  // engine's watcher thread may run after this object is gone: it finds the
  // proxy cleared and releases the word.
  struct Wake {
    std::mutex mu;
    Proxy* proxy = nullptr;
    bool done = false;
  };
  std::shared_ptr<Wake> wake = std::make_shared<Wake>();
  std::unique_ptr<Proxy> proxy;
  KernelParams kp{};
  bool connected = false, destroyed = false;

  Impl(TransferEngine& e, AllToAllConfig c) : engine(e), cfg(c) {
    sizes = buffer_size_hint(cfg);
    g = geometry_of(cfg, nullptr);
    if (cfg.host_buffers && cfg.node_size != 1)
      throw Error(Code::kInvalidArgument,
                  "moe: host_buffers needs node_size 1 (no IPC for host memory)");
    if (cfg.node_size > kMaxNode) throw Error(Code::kInvalidArgument, "moe: node_size above 8");
    if (cfg.hidden_scale > 1024)
      throw Error(Code::kInvalidArgument, "moe: hidden_scale above 1024");
    check(cudaSetDevice(cfg.device), "cudaSetDevice");
    const uint64_t D = sizes.dispatch_stride, C = sizes.combine_stride;
    off_recv = off_send + align(g.combine_rows() * D, 4096);
    off_csend = off_recv + align(g.recv_rows() * D, 4096);
    off_crecv = off_csend + align(g.shared_rows() * C, 4096);
    const uint64_t total = off_crecv + align(g.combine_rows() * C, 4096);
    if (cfg.host_buffers)
      check(cudaHostAlloc(&block, total, cudaHostAllocMapped | cudaHostAllocPortable),
            "cudaHostAlloc");
    else
      check(cudaMalloc(&block, total), "cudaMalloc");
    if (cfg.host_buffers)
      std::memset(block, 0, 4096);
    else
      check(cudaMemset(block, 0, 4096), "cudaMemset");
    check(cudaHostAlloc(&routes, size_t{g.world} * g.num_experts * 4,
                        cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc routes");
    std::memset(routes, 0, size_t{g.world} * g.num_experts * 4);
    const size_t nwords = plan_words(g) + 64;
    check(cudaHostAlloc(&words, nwords * 4, cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc words");
    std::memset(words, 0, nwords * 4);
    // Each flag on its own cache line after the plan.
    const size_t f = (plan_words(g) + 15) / 16 * 16;
    plan_epoch = words + f;
    tx_ready = words + f + 16;
    proxy_error = words + f + 32;
    kernel_error = words + f + 48;
    check(cudaMalloc(&ws, sizeof(Workspace)), "cudaMalloc workspace");
    check(cudaMemset(ws, 0, sizeof(Workspace)), "cudaMemset workspace");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const Device dev = cfg.host_buffers ? Device::host() : Device::cuda(cfg.device);
    std::tie(h_routes, d_routes) = engine.reg_mr(routes, size_t{g.world} * g.num_experts * 4);
    // One NVLink node: payloads never touch the engine, only routes and barriers.
    if (g.remote_ranks() == 0) return;
    h_send = engine.reg_mr(block + off_send, off_recv - off_send, dev).first;
    std::tie(h_recv, d_recv) = engine.reg_mr(block + off_recv, off_csend - off_recv, dev);
    h_csend = engine.reg_mr(block + off_csend, off_crecv - off_csend, dev).first;
    std::tie(h_crecv, d_crecv) = engine.reg_mr(block + off_crecv, total - off_crecv, dev);
  }

  ~Impl() { release(); }

  void release() {
    if (destroyed) return;
    destroyed = true;
    if (proxy) proxy->stop();
    {
      std::lock_guard lk(wake->mu);
      wake->proxy = nullptr;
      wake->done = true;
    }
    // Move the word once more: the callback runs, sees `done` and releases it
    // (an armed word keeps the watcher thread spinning).
    if (progress) std::atomic_ref<uint64_t>(*progress).fetch_add(1, std::memory_order_release);
    proxy.reset();
    try {
      for (MrHandle h : {h_routes, h_send, h_recv, h_csend, h_crecv})
        if (h.ptr) engine.unreg_mr(h);
      if (kp.disp_flag) engine.remove_imm_count(imm_of(cfg.instance, ImmKind::kDispatch));
      if (kp.comb_flag) engine.remove_imm_count(imm_of(cfg.instance, ImmKind::kCombine));
    } catch (const Error&) {
      // A stopped engine has released everything already.
    }
    for (void* p : opened) cudaIpcCloseMemHandle(p);
    opened.clear();
    if (block) cfg.host_buffers ? cudaFreeHost(block) : cudaFree(block);
    if (routes) cudaFreeHost(routes);
    if (words) cudaFreeHost(words);
    if (ws) cudaFree(ws);
    block = nullptr;
    routes = nullptr;
    words = nullptr;
    ws = nullptr;
  }

  std::vector<uint8_t> local_info() const {
    Writer w;
    w.u64(kMagic);
    w.u64(cfg.rank);
    w.u64(sizes.dispatch_stride);
    w.bytes(d_routes.to_bytes());
    w.bytes(h_recv.ptr ? d_recv.to_bytes() : std::vector<uint8_t>{});
    w.bytes(h_crecv.ptr ? d_crecv.to_bytes() : std::vector<uint8_t>{});
    cudaIpcMemHandle_t ipc{};
    if (!cfg.host_buffers && cfg.node_size > 1)
      check(cudaIpcGetMemHandle(&ipc, block), "cudaIpcGetMemHandle");
    w.bytes({reinterpret_cast<const uint8_t*>(&ipc), sizeof(ipc)});
    return w.b;
  }

  void connect(const std::vector<std::vector<uint8_t>>& infos) {
    if (connected) throw Error(Code::kFailedPrecondition, "moe: connect called twice");
    if (infos.size() != g.world)
      throw Error(Code::kInvalidArgument, "moe: " + std::to_string(infos.size()) +
                                              " infos for a world of " + std::to_string(g.world));
    std::vector<ProxyPeer> peers(g.world);
    kp = {};
    const uint32_t node0 = g.rank / g.node_size * g.node_size;
    for (uint32_t r = 0; r < g.world; ++r) {
      Reader rd{infos[r]};
      if (rd.u64() != kMagic) throw Error(Code::kInvalidArgument, "moe: peer info of another kind");
      if (rd.u64() != r) throw Error(Code::kInvalidArgument, "moe: infos out of rank order");
      if (rd.u64() != sizes.dispatch_stride)
        throw Error(Code::kInvalidArgument,
                    "moe: rank " + std::to_string(r) + " has another geometry");
      peers[r].routes = MrDesc::from_bytes(rd.bytes());
      auto recv = rd.bytes(), crecv = rd.bytes();
      if (!recv.empty()) peers[r].recv = MrDesc::from_bytes(recv);
      if (!crecv.empty()) peers[r].combine_recv = MrDesc::from_bytes(crecv);
      auto ipc = rd.bytes();
      if (!g.same_node(r, g.rank)) continue;
      uint8_t* base = block;
      if (r != g.rank) {
        cudaIpcMemHandle_t h;
        if (ipc.size() != sizeof(h)) throw Error(Code::kInvalidArgument, "moe: bad IPC handle");
        std::memcpy(&h, ipc.data(), sizeof(h));
        void* p = nullptr;
        check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
        opened.push_back(p);
        base = static_cast<uint8_t*>(p);
      }
      const uint32_t i = r - node0;
      kp.peer_sync[i] = reinterpret_cast<uint32_t*>(base);
      kp.peer_send[i] = base + off_send;
      kp.peer_recv[i] = base + off_recv;
      kp.peer_crecv[i] = base + off_crecv;
    }
    progress = engine.alloc_uvm_watcher([w = wake](uint64_t, uint64_t) {
      std::lock_guard lk(w->mu);
      if (w->proxy) w->proxy->notify();
      return !w->done;
    });
    const ExpectedImms imms = expected_imms(g);
    if (imms.dispatch) {
      kp.disp_flag =
          engine.imm_counter_gpu(imm_of(cfg.instance, ImmKind::kDispatch), imms.dispatch);
      kp.comb_flag = engine.imm_counter_gpu(imm_of(cfg.instance, ImmKind::kCombine), imms.combine);
    }
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cfg.device), "SM count");
    kp.N = g.world;
    kp.me = g.rank;
    kp.S = g.node_size;
    kp.E = g.num_experts;
    kp.L = g.local_experts();
    kp.K = g.experts_per_token;
    kp.T = g.max_tokens;
    kp.P = g.max_private_tokens;
    kp.H = cfg.hidden;
    kp.hs = cfg.hidden_scale;
    kp.in_size = static_cast<uint32_t>(dtype_size(cfg.in_dtype));
    kp.out_bf16 = cfg.out_dtype == DType::kBF16;
    kp.D = sizes.dispatch_stride;
    kp.C = sizes.combine_stride;
    kp.send = block + off_send;
    kp.recv = block + off_recv;
    kp.csend = block + off_csend;
    kp.crecv = block + off_crecv;
    kp.sync = reinterpret_cast<uint32_t*>(block);
    kp.routes_row = routes + size_t{g.rank} * g.num_experts;
    kp.progress = progress;
    kp.plan = words;
    kp.plan_epoch = plan_epoch;
    kp.tx_ready = tx_ready;
    kp.proxy_error = proxy_error;
    kp.kernel_error = kernel_error;
    kp.ws = ws;
    // clock64 counts SM cycles; 2 GHz is an upper bound of today's clocks.
    kp.timeout_cycles = static_cast<uint64_t>(cfg.deadline.count()) * 2'000'000ull;
    kp.blocks = sms;
    ProxyConfig pc{g, cfg.instance, cfg.deadline, std::chrono::microseconds(200)};
    ProxyWords pw{progress, words, plan_epoch, tx_ready, proxy_error};
    ProxyBuffers pb{h_routes, routes, h_send, sizes.dispatch_stride, h_csend, sizes.combine_stride};
    proxy = std::make_unique<Proxy>(engine, pc, pw, pb, std::move(peers));
    {
      std::lock_guard lk(wake->mu);
      wake->proxy = proxy.get();
    }
    connected = true;
  }

  Status status() const {
    if (proxy) {
      Status s = proxy->status();
      if (!s.is_ok()) return s;
    }
    const uint32_t k = kernel_error ? std::atomic_ref<uint32_t>(*kernel_error).load() : 0;
    if (k == 100) return {Code::kInvalidArgument, "moe: an expert index outside [0, num_experts)"};
    if (k != 0) {
      static const char* what[] = {
          "tx_ready",           "routes plan",        "NVLink dispatch flag", "dispatch immediates",
          "combine immediates", "NVLink combine flag"};
      return {Code::kDeadlineExceeded,
              std::string("moe: a kernel gave up waiting for ") + (k - 1 < 6 ? what[k - 1] : "?")};
    }
    return {};
  }

  void ready() const {
    if (!connected || destroyed)
      throw Error(Code::kFailedPrecondition, destroyed ? "moe: destroyed" : "moe: not connected");
    if (Status s = status(); !s.is_ok()) throw Error(s);
  }
};

AllToAll::AllToAll(TransferEngine& engine, AllToAllConfig cfg)
    : impl_(std::make_unique<Impl>(engine, cfg)) {}
AllToAll::~AllToAll() = default;
const AllToAllConfig& AllToAll::config() const {
  return impl_->cfg;
}
BufferSizes AllToAll::sizes() const {
  return impl_->sizes;
}
std::vector<uint8_t> AllToAll::local_info() const {
  return impl_->local_info();
}
void AllToAll::connect(const std::vector<std::vector<uint8_t>>& infos) {
  impl_->connect(infos);
}
Status AllToAll::status() const {
  return impl_->status();
}
void AllToAll::destroy() {
  impl_->release();
}

ProxyLatency AllToAll::proxy_latency() const {
  ProxyLatency l;
  if (impl_->proxy) {
    ProxyStats s = impl_->proxy->stats();
    l.signal_to_first_post_ns = std::move(s.signal_to_first_post);
    l.routes_to_second_post_ns = std::move(s.routes_to_second_post);
  }
  return l;
}

void AllToAll::dispatch(const DispatchArgs& a, bool do_send, bool do_recv, void* stream) {
  impl_->ready();
  const KernelParams& p = impl_->kp;
  if (a.num_tokens > p.T)
    throw Error(Code::kInvalidArgument,
                "moe: " + std::to_string(a.num_tokens) + " tokens, more than max_num_tokens");
  if (do_send) {
    DispatchSendArgs s{static_cast<const uint8_t*>(a.x),
                       a.x_stride,
                       a.x_scale,
                       a.x_scale_stride,
                       a.indices,
                       a.indices_stride,
                       a.num_tokens,
                       a.bound_m};
    check(static_cast<cudaError_t>(launch_dispatch_send(p, s, stream)), "dispatch_send launch");
  }
  if (do_recv) {
    DispatchRecvArgs r{a.out_expert_num_tokens, static_cast<uint8_t*>(a.out_expert_x),
                       a.out_x_stride, a.out_expert_x_scale, a.out_scale_stride};
    check(static_cast<cudaError_t>(launch_dispatch_recv(p, r, stream)), "dispatch_recv launch");
  }
}

void AllToAll::combine(const CombineArgs& a, bool do_send, bool do_recv, void* stream) {
  impl_->ready();
  const KernelParams& p = impl_->kp;
  if (do_send)
    check(static_cast<cudaError_t>(
              launch_combine_send(p, static_cast<const uint8_t*>(a.expert_y), a.y_stride, stream)),
          "combine_send launch");
  if (do_recv)
    check(static_cast<cudaError_t>(launch_combine_recv(p, static_cast<uint8_t*>(a.out_tokens),
                                                       a.out_stride, a.weights, a.weights_stride,
                                                       a.accumulate, stream)),
          "combine_recv launch");
}

}  // namespace ferry::moe

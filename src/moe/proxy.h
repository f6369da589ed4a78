// The host proxy of one MoE all-to-all rank (docs/MOE.md "Protocol"): a
// thread that follows the kernels' progress word and issues the engine calls
// of each iteration. It only ever talks to the GPU side through the words in
// ProxyWords, so tests drive it with host memory standing in for the device.
//
// Iteration e (epochs start at 1). The kernels store into `progress`:
//   4e-3  dispatch_send wrote this rank's per-expert counts (routes row)
//   4e-2  dispatch_send filled the send buffer
//   4e-1  combine_send filled the combine send buffer
//   4e    combine_recv finished reading
// and the proxy answers:
//   routes row scattered to every other rank (imm kRoute)
//   private round to every remote-node rank (imm kDispatch, empty included)
//   after N-1 routes rows arrived: plan words, then *plan_epoch = e, then the
//     overflow round (imm kDispatch, empty included: two per peer, always)
//   combine scatter to every remote-node rank (imm kCombine, empty included)
//   every own transfer done, then a barrier with every other rank, then
//     *tx_ready = e (the kernels of e+1 may overwrite the buffers)
// Any failure (transfer error, deadline, counts that do not fit) is sticky:
// status() returns it, *error receives its code, and the thread ends.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "moe/routing.h"

namespace ferry::moe {

struct ProxyWords {
  const uint64_t* progress = nullptr;  // kernels -> proxy
  uint32_t* plan = nullptr;            // plan_words(g) words, proxy -> kernels
  uint32_t* plan_epoch = nullptr;
  uint32_t* tx_ready = nullptr;
  uint32_t* error = nullptr;  // 0, or the ferry::Code of the proxy's failure
};

// The plan the kernels read, as words: cnt[N*L], src_base[N],
// combine_send_offset[N], expert_offset[L], expert_total[L].
size_t plan_words(const Geometry& g);
void write_plan(const ReceivePlan& p, const Geometry& g, uint32_t* words);

struct ProxyPeer {
  MrDesc routes, recv, combine_recv;
};

struct ProxyBuffers {
  MrHandle routes;  // N x E u32, host; this rank's row is written by the kernels
  const uint32_t* routes_ptr = nullptr;
  MrHandle send;
  uint64_t dispatch_stride = 0;
  MrHandle combine_send;
  uint64_t combine_stride = 0;
};

struct ProxyConfig {
  Geometry geometry;
  uint32_t instance = 0;
  // Bound of every wait inside an iteration (network and kernels alike). The
  // wait for an iteration to begin is unbounded: the model decides when.
  std::chrono::milliseconds deadline{10'000};
  // Spin this long before sleeping between checks (latency against a core).
  std::chrono::microseconds spin{200};
};

// Latencies of the last iterations, nanoseconds.
struct ProxyStats {
  std::vector<uint64_t> signal_to_first_post;   // progress 4e-3 seen -> routes posted
  std::vector<uint64_t> routes_to_second_post;  // last routes row counted -> overflow posted
  uint64_t epochs = 0;
};

class Proxy {
 public:
  Proxy(TransferEngine& engine, ProxyConfig cfg, ProxyWords words, ProxyBuffers bufs,
        std::vector<ProxyPeer> peers);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Wakes the thread (from a watcher callback): the progress word changed.
  void notify();
  // Ends the thread; waits inside it return kCancelled. Idempotent.
  void stop();
  Status status() const;
  uint64_t epochs_done() const { return epochs_.load(std::memory_order_acquire); }
  ProxyStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  template <typename Ready>
  Status wait(Ready&& ready, bool bounded, const char* what);
  Status wait_progress(uint64_t value, bool bounded, const char* what);
  Status wait_imms(ImmCounter& c, int64_t n, const char* what);
  Status wait_transfers(const char* what);
  Status step(uint32_t e);
  void post_scatter(ImmKind kind, std::optional<PeerGroupHandle> group, MrHandle src,
                    std::vector<ScatterDst> dsts);
  void fail(Status s);
  void run();
  OnDone on_done();
  // A span of this iteration on the rank's track of the engine's trace.
  void span(const char* name, Clock::time_point from, Clock::time_point to);

  TransferEngine& engine_;
  ProxyConfig cfg_;
  ProxyWords words_;
  ProxyBuffers bufs_;
  std::vector<ProxyPeer> peers_;
  std::vector<uint32_t> others_, remotes_;  // ranks, in rank order
  std::optional<PeerGroupHandle> others_group_, remotes_group_;
  ImmCounter route_imms_, barrier_imms_;
  std::vector<uint32_t> routes_copy_;
  bool tracing_ = false;  // the engine writes a trace: spans per phase
  std::string track_;     // "moe rank R" (instance I when not 0)

  // Shared with the transfers' OnDone callbacks, which may run after the
  // proxy is gone (a transfer still in flight when it stopped).
  struct Tx {
    std::atomic<uint64_t> done{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    Status status;  // first failed transfer, guarded by mu
  };
  std::shared_ptr<Tx> tx_ = std::make_shared<Tx>();
  std::atomic<uint64_t> issued_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> epochs_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status status_;     // guarded by mu_
  ProxyStats stats_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::moe

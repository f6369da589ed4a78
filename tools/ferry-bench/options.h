// Options of a ferry-bench run and the helpers both processes and both
// implementations share: the immediate values of each role, the raw
// baseline's queue depth, pinning, CPU time, and the engine configuration of
// a point.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "plan.h"

namespace ferry_bench {

using Clock = std::chrono::steady_clock;

// Immediate values: one per role so no arrival is ever miscounted.
inline constexpr uint32_t kImmData = 1;    // data writes, barriers
inline constexpr uint32_t kImmPing = 2;    // client -> server, counter responder
inline constexpr uint32_t kImmPingCb = 3;  // client -> server, callback responder
inline constexpr uint32_t kImmPong = 9;    // server -> client
inline constexpr size_t kFerryRecvs = 64;  // receive buffers posted by each side (send/recv)
// For arrivals to land after the initiator is done.
inline constexpr std::chrono::seconds kSettleTimeout{20};
// The engine's per-NIC cap on posted, uncompleted writes and writes per post call
// for libfabric NICs (core::DomainInfo::max_outstanding, kPostsPerCall in
// src/core/worker.cpp): the raw baseline gets the same queue depth.
inline constexpr size_t kRawMaxOutstanding = 1024;
inline constexpr size_t kRawPostBatch = 64;

struct Options {
  std::string provider = "tcp;ofi_rxm";
  int nics = 1;
  std::vector<std::string> nic_names;
  std::vector<int> gpu;  // empty = host memory, else {client GPU, server GPU}
  int window = 32;
  std::string poll = "adaptive";
  std::vector<int> cpu = {-1, -1, -1};
  std::vector<int> server_cpu = {-1, -1, -1};
  std::string json;
  std::string trace_dir;
  bool verify = false;
  bool quick = false;
  bool no_raw = false;
  bool wake = false;        // print each side's wake-up counts per point (stderr)
  bool raw_relay = false;   // imm baseline through a NIC thread per side (raw_relay.h)
  bool raw_inject = false;  // the raw immediates as fi_inject_writedata (no local completion)
  bool spin_pause = false;  // busy ping-pong loops, ferry's and raw's alike, pause per empty poll
  std::string only = "single,paged,scatter,barrier,imm,sendrecv";
  double seconds = 0;  // 0 = 1.0, or 0.25 with --quick
  uint64_t iters = 0;
  int repeat = 1;  // raw and ferry alternate this many times per point; medians reported
  uint64_t region_mib = 256;
  uint64_t max_inflight_mib = 256;
  uint32_t targets = 8;
  uint64_t msg_size = 64;
  std::vector<uint32_t> page_counts;  // empty = 100 and 10 000 (100 with --quick)
  std::string command_line;
  std::string load_start;  // other users' load matters on a shared machine: recorded

  uint64_t region() const { return region_mib << 20; }
  bool nvlink() const { return provider == "nvlink"; }
  int gpu_of(bool server) const { return gpu.empty() ? -1 : gpu[server ? 1 : 0]; }
  // The baseline of every point: raw libfabric on the same provider, or
  // CUDA copies into the peer's region (nvlink), or none.
  const char* baseline() const {
    return no_raw       ? "none"
           : nvlink()   ? "cuda"
           : raw_relay  ? "raw-relay"
           : raw_inject ? "raw-inject"
                        : "raw";
  }
  ferry::PollMode poll_mode() const {
    return poll == "busy" ? ferry::PollMode::kBusy : ferry::PollMode::kAdaptive;
  }
};

// A ping-pong server that spins looks this often (in fruitless polls) whether
// the client ended the point: the look is a poll(2), so ferry's and the raw
// server look equally often.
inline uint64_t end_check_every(const Options& o) {
  return o.poll == "busy" ? 8192 : 256;
}

void pin_self(int cpu);
double cpu_seconds();

inline double secs_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ferry::EngineConfig engine_config(const Options& o, bool server, const Point& p);

// Immediates the server gets per request of a point, as the engine plans them.
uint64_t ferry_imms_per_req(const Point& p, size_t nics);

// Requests kept in flight: the window, bounded by bytes so that draining a
// window of huge requests (10 000 pages of 64 KiB) does not take seconds.
size_t effective_window(const Options& o, const Layout& l);

}  // namespace ferry_bench

// ferry-bench: sweeps the engine's operations between two processes on one
// machine and measures each point against a baseline run in the same
// invocation on the same provider, window and buffers: raw libfabric, or for
// the nvlink provider one cudaMemcpyAsync per write into the peer's region.
// With --gpu both regions are GPU memory (client and server GPU).
//
// Process model: the client (parent) drives; the server (forked child) owns
// the destination memory, counts immediates, answers ping-pongs and verifies.
// Every point runs the raw baseline first, then starts a fresh engine pair for
// the ferry phase and stops it afterwards, so no idle engine thread (busy
// polling!) competes with the baseline on a small machine.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "build_commit.h"
#include "channel.h"
#include "ferry/ferry.h"
#include "gpu.h"
#include "plan.h"
#include "raw_fabric.h"

namespace ferry_bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Immediate values: one per role so no arrival is ever miscounted.
constexpr uint32_t kImmData = 1;      // data writes, barriers
constexpr uint32_t kImmPing = 2;      // client -> server, counter responder
constexpr uint32_t kImmPingCb = 3;    // client -> server, callback responder
constexpr uint32_t kImmPong = 9;      // server -> client
constexpr size_t kFerryRecvs = 64;    // receive buffers posted by each side (send/recv)
constexpr auto kSettleTimeout = 20s;  // for arrivals to land after the initiator is done
// The engine's per-NIC cap on posted, uncompleted writes and writes per post call
// for libfabric NICs (core::DomainInfo::max_outstanding, kPostsPerCall in
// src/core/worker.cpp): the raw baseline gets the same queue depth.
constexpr size_t kRawMaxOutstanding = 1024;
constexpr size_t kRawPostBatch = 64;

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
  const char* baseline() const { return no_raw ? "none" : nvlink() ? "cuda" : "raw"; }
  ferry::PollMode poll_mode() const {
    return poll == "busy" ? ferry::PollMode::kBusy : ferry::PollMode::kAdaptive;
  }
};

// ------------------------------------------------------------------ helpers

void pin_self(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
    std::fprintf(stderr, "ferry-bench: cannot pin to CPU %d\n", cpu);
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double secs_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ferry::EngineConfig engine_config(const Options& o, bool server, const Point& p) {
  const std::vector<int>& cpu = server ? o.server_cpu : o.cpu;
  ferry::EngineConfig c;
  c.provider = o.provider;
  if (!o.nvlink()) c.groups[0].nic_names = o.nic_names;  // nvlink: the GPU's own endpoint
  if (!o.gpu.empty()) {
    c.groups[0].device = ferry::Device::cuda(o.gpu_of(server));
    c.groups[0].insist = true;  // lo / shm are no NICs of the GPU's topology
  }
  c.groups[0].worker_cpu = cpu[0];
  c.callback_cpu = cpu[1];
  c.poll_mode = o.poll_mode();
  c.default_deadline = 60s;
  // One trace per point and side (a later repeat of the point overwrites it).
  if (!o.trace_dir.empty())
    c.trace_file = fmt::format("{}/{}-{}-{}.json", o.trace_dir, kind_name(p.kind), p.size_label(),
                               server ? "server" : "client");
  return c;
}

// Immediates the server gets per request of a point, as the engine plans them.
uint64_t ferry_imms_per_req(const Point& p, size_t nics) {
  if (!p.imm) return 0;
  switch (p.kind) {
    case Kind::kSingle:
      return ferry::ImmPlan::single_write(p.size, {}, nics);
    case Kind::kPaged:
      return ferry::ImmPlan::paged_writes(p.count);
    case Kind::kScatter:
      return p.count * ferry::ImmPlan::scatter_target(p.size, {}, nics);
    case Kind::kBarrier:
      return p.count * ferry::ImmPlan::barrier_target();
    default:
      return 0;
  }
}

// Requests kept in flight: the window, bounded by bytes so that draining a
// window of huge requests (10 000 pages of 64 KiB) does not take seconds.
size_t effective_window(const Options& o, const Layout& l) {
  if (l.bytes_per_req == 0) return size_t(o.window);
  uint64_t cap = (o.max_inflight_mib << 20) / l.bytes_per_req;
  return size_t(std::clamp<uint64_t>(cap, 1, uint64_t(o.window)));
}

// ------------------------------------------------------------------ results

struct Result {
  bool ran = false;
  uint64_t requests = 0, writes = 0, bytes = 0, errors = 0;
  double seconds = 0, cpu = 0;
  std::vector<double> lat_us;  // per request (throughput) or half round trip (latency)
  std::string verify;          // "", "ok" or what failed
  std::string error;

  double pct(double q) const {
    if (lat_us.empty()) return 0;
    std::vector<double> v = lat_us;
    size_t i = std::min(v.size() - 1, size_t(q * double(v.size())));
    std::nth_element(v.begin(), v.begin() + long(i), v.end());
    return v[i];
  }
  double gbs() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
  double ops() const { return seconds > 0 ? double(requests) / seconds : 0; }
  double wps() const { return seconds > 0 ? double(writes) / seconds : 0; }
  double cpu_us_per_op() const { return requests ? cpu * 1e6 / double(requests) : 0; }
  double cpu_us_per_write() const { return writes ? cpu * 1e6 / double(writes) : 0; }
};

struct PointResult {
  Point point;
  size_t window = 0;
  uint64_t bytes_per_req = 0;
  uint32_t writes_per_req = 1;
  Result ferry, raw;                  // with --repeat: the median repetition of each
  std::vector<double> rep_fractions;  // one per repetition (raw and ferry back to back)
  // Ping-pongs and barriers compare p50 latency; everything else GB/s.
  static bool by_latency(const Point& p) { return p.latency() || p.kind == Kind::kBarrier; }
  bool latency_metric() const { return by_latency(point); }
  // Throughput: ferry / raw bytes. Latency: raw p50 / ferry p50.
  static double fraction_of(const Point& p, const Result& ferry, const Result& raw) {
    if (!ferry.ran || !raw.ran) return NAN;
    if (by_latency(p)) {
      double f = ferry.pct(0.5), r = raw.pct(0.5);
      return f > 0 ? r / f : NAN;
    }
    return raw.gbs() > 0 ? ferry.gbs() / raw.gbs() : NAN;
  }
  double fraction() const { return fraction_of(point, ferry, raw); }
};

// The median of several runs of one implementation, by the metric the
// fraction uses (GB/s, or p50 latency), so one noisy second cannot decide.
Result median_run(std::vector<Result>& runs, bool latency) {
  if (runs.empty()) return {};
  auto key = [latency](const Result& r) { return latency ? r.pct(0.5) : r.gbs(); };
  std::sort(runs.begin(), runs.end(),
            [&](const Result& a, const Result& b) { return key(a) < key(b); });
  return std::move(runs[runs.size() / 2]);
}

// ------------------------------------------------------------------ driver

struct DriveConfig {
  size_t window = 1;
  double seconds = 1;
  double warmup = 0.1;
  uint64_t iters = 0;
  uint64_t bytes_per_req = 0;
  uint32_t writes_per_req = 1;
};

// Keeps `window` requests in flight: admit(r, slot) starts request number r in
// `slot`; progress(done) posts what is queued and calls done(slot, ok) for each
// request that finished, returning how many did. A warm-up phase (connection
// setup, first-touch of provider buffers) runs before the measured one.
template <typename Admit, typename Progress, typename Idle>
Result drive(const DriveConfig& c, uint64_t* next_req, Admit&& admit, Progress&& progress,
             Idle&& idle) {
  Result res;
  res.ran = true;
  std::vector<Clock::time_point> started(c.window);
  std::vector<uint32_t> free_slots;
  for (size_t i = c.window; i-- > 0;) free_slots.push_back(uint32_t(i));
  for (int measured = 0; measured < 2; ++measured) {
    uint64_t admitted = 0, finished = 0, errors = 0;
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    const auto until = t0 + std::chrono::duration<double>(measured ? c.seconds : c.warmup);
    const uint64_t limit = measured ? c.iters : 0;
    bool admitting = true;
    auto on_done = [&](uint32_t slot, bool ok) {
      if (measured)
        res.lat_us.push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - started[slot]).count());
      errors += !ok;
      ++finished;
      free_slots.push_back(slot);
    };
    for (;;) {
      if (admitting) {
        auto now = Clock::now();
        if (limit ? admitted >= limit : (now >= until && admitted > 0)) admitting = false;
        while (admitting && !free_slots.empty() && (!limit || admitted < limit)) {
          uint32_t slot = free_slots.back();
          free_slots.pop_back();
          started[slot] = Clock::now();
          admit((*next_req)++, slot);
          ++admitted;
        }
      }
      if (!admitting && finished == admitted) break;
      if (progress(on_done) == 0) idle();
    }
    if (measured) {
      res.seconds = secs_since(t0);
      res.cpu = cpu_seconds() - cpu0;
      res.requests = admitted;
      res.writes = admitted * c.writes_per_req;
      res.bytes = admitted * c.bytes_per_req;
      res.errors = errors;
    }
  }
  return res;
}

// Ping-pong: one(r) runs a single round trip; the result holds half of each.
template <typename One>
Result pingpong(const DriveConfig& c, One&& one) {
  Result res;
  res.ran = true;
  for (int measured = 0; measured < 2; ++measured) {
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    const double limit = measured ? c.seconds : c.warmup;
    uint64_t n = 0;
    while (c.iters && measured ? n < c.iters : secs_since(t0) < limit) {
      auto t = Clock::now();
      if (!one(n)) {
        res.errors++;
        break;
      }
      if (measured)
        res.lat_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() /
                             2);
      ++n;
    }
    if (measured) {
      res.seconds = secs_since(t0);
      res.cpu = cpu_seconds() - cpu0;
      res.requests = res.writes = n;
    }
  }
  return res;
}

// ------------------------------------------------------------------ raw side

enum class RawMode : uint32_t { kSink, kPingWrite, kPingSend };

RawMode raw_mode(const Point& p) {
  if (p.kind == Kind::kSendRecv) return RawMode::kPingSend;
  if (p.latency()) return RawMode::kPingWrite;
  return RawMode::kSink;
}

// Receives stay posted for the process' lifetime; posted once, re-posted on use.
void post_raw_recvs(RawFabric& rf, uint8_t* msg_area, bool* posted) {
  if (*posted) return;
  for (uint32_t i = 0; i < kRawRecvs; ++i)
    if (int ret = rf.recv(0, msg_area + i * kRecvSlot, kRecvSlot, (uint64_t(1) << 32) | i))
      throw std::runtime_error(fmt::format("raw fi_recv failed: {}", fi_strerror(-ret)));
  *posted = true;
}

class RawClient {
 public:
  RawClient(RawFabric& rf, uint8_t* region, uint64_t region_len, RawRegion peer, const Options& o)
      : rf_(rf),
        region_(region),
        msg_(region + region_len - kMsgArea),
        peer_(std::move(peer)),
        o_(o) {}

  Result throughput(const Point& p, const Layout& l, const DriveConfig& dc, uint64_t* next_req) {
    struct Req {
      uint64_t r = 0;
      uint32_t next = 0, left = 0;
      bool failed = false;
    };
    std::vector<Req> reqs(dc.window);
    std::deque<uint32_t> to_post;
    std::optional<uint32_t> imm;
    if (p.imm || p.kind == Kind::kBarrier) imm = kImmData;
    size_t rr = 0;
    std::vector<size_t> outstanding(rf_.nics(), 0);
    RawEvent ev[32];
    auto admit = [&](uint64_t r, uint32_t slot) {
      reqs[slot] = Req{r, 0, l.writes_per_req, false};
      to_post.push_back(slot);
    };
    auto progress = [&](auto&& done) -> size_t {
      // Post in request order until the provider pushes back, at most a
      // batch between two CQ reads (the engine's kPostsPerStep), so that
      // completions and the provider's progress are not starved by posting.
      size_t budget = kRawPostBatch;
      while (!to_post.empty()) {
        Req& q = reqs[to_post.front()];
        while (q.next < l.writes_per_req) {
          WriteSpec w = l.write(q.r, q.next);
          size_t nic = rr % rf_.nics();
          if (outstanding[nic] >= kRawMaxOutstanding || budget == 0) goto reap;
          int ret = rf_.write(nic, region_ + w.src, w.len, peer_.bases[nic] + w.dst,
                              peer_.keys[nic], imm, to_post.front());
          if (ret == -FI_EAGAIN) goto reap;
          if (ret != 0)
            throw std::runtime_error(fmt::format("raw write failed: {}", fi_strerror(-ret)));
          ++q.next;
          ++rr;
          ++outstanding[nic];
          --budget;
        }
        to_post.pop_front();
      }
    reap:
      size_t finished = 0;
      for (size_t k = 0; k < rf_.nics(); ++k) {
        size_t n = rf_.poll(k, ev, 32);
        for (size_t i = 0; i < n; ++i) {
          if (ev[i].kind == RawEvent::Kind::kLocal || ev[i].kind == RawEvent::Kind::kError)
            outstanding[k] -= outstanding[k] > 0;
          // Completions of earlier ping-pong phases carry tagged contexts.
          if ((ev[i].kind != RawEvent::Kind::kLocal && ev[i].kind != RawEvent::Kind::kError) ||
              (ev[i].ctx >> 32) != 0)
            continue;
          Req& q = reqs[uint32_t(ev[i].ctx)];
          q.failed |= ev[i].kind == RawEvent::Kind::kError;
          if (--q.left == 0) {
            done(uint32_t(ev[i].ctx), !q.failed);
            ++finished;
          }
        }
      }
      return finished;
    };
    // Yield when nothing completed, as the ferry client thread does: with two
    // processes on two cores the receiver needs the CPU to drain the socket.
    return drive(dc, next_req, admit, progress, [] { sched_yield(); });
  }

  // Half round trip of a zero-byte write with data, or of a send/recv pair.
  Result pingpong_(const Point& p, const DriveConfig& dc) {
    RawEvent ev[32];
    const bool send = p.kind == Kind::kSendRecv;
    if (send) post_raw_recvs(rf_, msg_, &recvs_posted_);
    uint8_t* sbuf = msg_ + kRawSendOffset;
    std::string bad;
    auto one = [&](uint64_t n) {
      int ret;
      if (send) {
        std::memcpy(sbuf, &n, 8);
        ret = rf_.send(0, sbuf, p.size, uint64_t(2) << 32);
      } else {
        ret = rf_.write(0, region_, 0, peer_.bases[0], peer_.keys[0], kImmPing, uint64_t(3) << 32);
      }
      for (auto t = Clock::now(); ret == -FI_EAGAIN && secs_since(t) < 10;) {
        rf_.poll(0, ev, 32);
        ret = send ? rf_.send(0, sbuf, p.size, uint64_t(2) << 32)
                   : rf_.write(0, region_, 0, peer_.bases[0], peer_.keys[0], kImmPing,
                               uint64_t(3) << 32);
      }
      if (ret != 0) return false;
      for (auto t = Clock::now(); secs_since(t) < 10;) {
        size_t got = rf_.poll(0, ev, 32);
        for (size_t i = 0; i < got; ++i) {
          if (!send && ev[i].kind == RawEvent::Kind::kRemoteData) return true;
          if (send && ev[i].kind == RawEvent::Kind::kRecv) {
            uint32_t idx = uint32_t(ev[i].ctx);
            uint8_t* b = msg_ + idx * kRecvSlot;
            uint64_t echoed;
            std::memcpy(&echoed, b, 8);
            if (o_.verify && (echoed != n || ev[i].len != p.size))
              bad = fmt::format("echo {} of {} bytes, expected {} of {}", echoed, ev[i].len, n,
                                p.size);
            rf_.recv(0, b, kRecvSlot, ev[i].ctx);
            return true;
          }
        }
      }
      return false;
    };
    Result r = pingpong(dc, one);
    if (o_.verify) r.verify = bad.empty() ? "ok" : bad;
    return r;
  }

 private:
  RawFabric& rf_;
  uint8_t* region_;
  uint8_t* msg_;
  RawRegion peer_;
  const Options& o_;
  bool recvs_posted_ = false;
};

// Serves one raw phase until the client's kRawStop, then waits for what is
// still on the wire and verifies. Replies {arrivals, verify text}.
void serve_raw(RawFabric& rf, Region& reg, const RawRegion& client, const Options& o, int fd,
               const Point& p, RawMode mode, uint64_t seed, bool* recvs_posted) {
  const Layout l(p, o.region());
  uint8_t* region = reg.data();
  uint8_t* msg = region + o.region() - kMsgArea;  // host regions only: no ping-pong on GPUs
  if (mode == RawMode::kPingSend) post_raw_recvs(rf, msg, recvs_posted);
  if (o.verify && mode == RawMode::kSink) reg.zero(l.data);
  send_msg(fd, MsgType::kReply);  // ready

  RawEvent ev[32];
  uint64_t arrivals = 0, replies = 0;
  std::deque<std::pair<uint32_t, uint64_t>> sends;  // receive buffer, length
  const bool busy = o.poll_mode() == ferry::PollMode::kBusy;
  auto step = [&]() -> bool {
    bool did = false;
    for (size_t k = 0; k < rf.nics(); ++k) {
      size_t n = rf.poll(k, ev, 32);
      did |= n > 0;
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind == RawEvent::Kind::kRemoteData) {
          ++arrivals;
          if (mode == RawMode::kPingWrite) ++replies;
        } else if (ev[i].kind == RawEvent::Kind::kRecv) {
          sends.emplace_back(uint32_t(ev[i].ctx), ev[i].len);
        } else if (ev[i].kind == RawEvent::Kind::kError) {
          std::fprintf(stderr, "server: raw completion error %u\n", ev[i].data);
        }
      }
    }
    while (replies > 0 && rf.write(0, region, 0, client.bases[0], client.keys[0], kImmPong,
                                   uint64_t(3) << 32) == 0)
      --replies;
    while (!sends.empty()) {
      auto [idx, len] = sends.front();
      uint8_t* b = msg + idx * kRecvSlot;
      std::memcpy(msg + kRawSendOffset, b, len);
      if (rf.send(0, msg + kRawSendOffset, len, uint64_t(2) << 32) != 0) break;
      rf.recv(0, b, kRecvSlot, (uint64_t(1) << 32) | idx);
      sends.pop_front();
    }
    return did;
  };
  auto last_busy = Clock::now();
  for (uint64_t spins = 0;; ++spins) {
    if (step()) {
      last_busy = Clock::now();
      continue;
    }
    if (!busy && Clock::now() - last_busy > 200us) {
      if (!rf.wait(2, fd)) {
        timespec ts{0, 20'000};
        nanosleep(&ts, nullptr);
      }
      if (readable(fd)) break;
    } else if (spins % 256 == 0 && readable(fd)) {
      break;
    }
  }
  Reader stop = recv_msg(fd, MsgType::kRawStop);
  const uint64_t reqs = stop.get<uint64_t>(), expected = stop.get<uint64_t>();
  auto deadline = Clock::now() + kSettleTimeout;
  while (arrivals < expected && Clock::now() < deadline) step();
  std::string verify;
  if (arrivals != expected && mode == RawMode::kSink)
    verify = fmt::format("{} immediates arrived, {} expected", arrivals, expected);
  if (o.verify && mode == RawMode::kSink && verify.empty()) {
    // Writes without an immediate may still be in flight: re-check until they land.
    for (;;) {
      verify = reg.check(l, reqs, seed);
      if (verify.empty() || Clock::now() > deadline) break;
      for (int i = 0; i < 1000; ++i) step();
    }
    if (verify.empty()) verify = "ok";
  }
  send_msg(fd, MsgType::kReply, Writer().put(arrivals).str(verify));
}

// The server half of a CUDA baseline phase: the client's copies are complete
// when it sends kRawStop (it waited for their events), so only the check is left.
void serve_copies(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed) {
  const Layout l(p, o.region());
  if (o.verify) reg.zero(l.data);
  send_msg(fd, MsgType::kReply);  // ready
  Reader stop = recv_msg(fd, MsgType::kRawStop);
  const uint64_t reqs = stop.get<uint64_t>();
  std::string verify;
  if (o.verify) {
    verify = reg.check(l, reqs, seed);
    if (verify.empty()) verify = "ok";
  }
  send_msg(fd, MsgType::kReply, Writer().put(uint64_t(0)).str(verify));
}

// The client half: every write of a request one cudaMemcpyAsync (requests
// round robin over PeerCopier's streams), as NIXL's and Mooncake's NVLink
// paths copy descriptor by descriptor.
class CopyClient {
 public:
  CopyClient(Region& region, std::vector<uint8_t> peer_handle, const Options& o)
      : region_(region), peer_handle_(std::move(peer_handle)), o_(o) {}

  static bool covers(const Point& p) {
    return p.kind == Kind::kSingle || p.kind == Kind::kPaged || p.kind == Kind::kScatter;
  }

  Result throughput(const Layout& l, const DriveConfig& dc, uint64_t* next_req) {
    PeerCopier copier(o_.gpu_of(false), peer_handle_, dc.window);
    std::vector<char> busy(dc.window, 0);
    auto admit = [&](uint64_t r, uint32_t slot) {
      copier.begin(slot, r);
      for (uint32_t k = 0; k < l.writes_per_req; ++k) {
        WriteSpec w = l.write(r, k);
        copier.copy(slot, w.dst, region_.data() + w.src, w.len);
      }
      copier.close(slot);
      busy[slot] = 1;
    };
    auto progress = [&](auto&& on_done) -> size_t {
      size_t n = 0;
      for (uint32_t s = 0; s < dc.window; ++s) {
        if (!busy[s] || !copier.done(s)) continue;
        busy[s] = 0;
        on_done(s, true);
        ++n;
      }
      return n;
    };
    return drive(dc, next_req, admit, progress, [] { std::this_thread::yield(); });
  }

 private:
  Region& region_;
  std::vector<uint8_t> peer_handle_;
  const Options& o_;
};

// ------------------------------------------------------------------ ferry side

// Between polls of a counter: with --poll busy every thread has its own core
// and spins like the raw loop (no syscall); otherwise give the core away.
void relax(const Options& o) {
  if (o.poll == "busy")
    __builtin_ia32_pause();
  else
    std::this_thread::yield();
}

struct FerryServerPoint {
  std::unique_ptr<ferry::TransferEngine> engine;
  std::vector<ferry::MrDesc> descs;
};

// Server half of a ferry phase: engine up, descriptors out, respond or wait,
// then settle, verify and stop the engine. Replies {arrivals, verify text}.
void serve_ferry(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed,
                 const ferry::MrDesc& client) {
  const Layout l(p, o.region());
  if (o.verify) reg.zero(l.data);
  auto e = std::make_unique<ferry::TransferEngine>(engine_config(o, true, p));
  std::vector<ferry::MrDesc> descs;
  if (p.kind == Kind::kScatter || p.kind == Kind::kBarrier) {
    for (uint32_t t = 0; t < p.count; ++t)
      descs.push_back(e->reg_mr(reg.data() + uint64_t(t) * l.slice, l.slice, reg.device()).second);
  } else {
    descs.push_back(e->reg_mr(reg.data(), o.region(), reg.device()).second);
  }
  auto data = e->imm_counter(kImmData);
  ferry::ImmCounter ping;
  if (p.kind == Kind::kImm) ping = e->imm_counter(kImmPing);
  if (p.kind == Kind::kImmCb || p.kind == Kind::kImmInline)
    e->expect_imm_count(
        kImmPingCb, 1, [&] { e->submit_imm(kImmPong, client, ferry::OnDone::none()); },
        p.kind == Kind::kImmInline ? ferry::CallbackOn::kWorker
                                   : ferry::CallbackOn::kCallbackThread);
  if (p.kind == Kind::kSendRecv) {
    ferry::NetAddr to = client.nics[0].addr;
    e->submit_recvs(p.size, kFerryRecvs, [&e, to](std::span<const uint8_t> m) {
      e->submit_send(to, m, ferry::OnDone::none());
    });
  }
  Writer w;
  w.put<uint64_t>(descs.size());
  for (auto& d : descs) w.bytes(d.to_bytes());
  send_msg(fd, MsgType::kReply, w);

  if (p.kind == Kind::kImm) {
    // The "counter" responder: the application thread spins on the counter.
    for (uint64_t spins = 0;; ++spins) {
      if (ping.try_consume(1)) {
        e->submit_imm(kImmPong, client, ferry::OnDone::none());
        continue;
      }
      if (spins % (o.poll == "busy" ? 8192 : 64) == 0 && readable(fd)) break;
      relax(o);
    }
  }
  Reader end = recv_msg(fd, MsgType::kFerryEnd);
  const uint64_t reqs = end.get<uint64_t>(), expected = end.get<uint64_t>();
  std::string verify;
  int64_t arrived = 0;
  if (expected > 0) {
    auto st = data.wait(int64_t(expected), kSettleTimeout);
    arrived = st.is_ok() ? int64_t(expected) : data.value();
    if (!st.is_ok()) verify = fmt::format("{} immediates arrived, {} expected", arrived, expected);
  }
  arrived += data.value();  // any surplus
  if (o.verify && verify.empty() && !p.latency() && p.kind != Kind::kBarrier) {
    auto deadline = Clock::now() + kSettleTimeout;
    for (;;) {
      // Scatter targets are separate registrations carved from the region:
      // the layout's absolute offsets hold for them too.
      verify = reg.check(l, reqs, seed);
      if (verify.empty() || Clock::now() > deadline) break;
      std::this_thread::sleep_for(1ms);
    }
  }
  if (o.verify && verify.empty()) verify = "ok";
  e->stop();
  e.reset();
  send_msg(fd, MsgType::kReply, Writer().put(uint64_t(arrived)).str(verify));
}

class FerryClient {
 public:
  FerryClient(Region& region, const Options& o, int fd) : region_(region), o_(o), fd_(fd) {}

  Result run(uint64_t index, const Point& p, const DriveConfig& dc, uint64_t seed) {
    const Layout l(p, o_.region());
    ferry::TransferEngine e(engine_config(o_, false, p));
    auto [h, mine] = e.reg_mr(region_.data(), o_.region(), region_.device());
    auto pong = e.imm_counter(kImmPong);
    std::atomic<uint64_t> received{0};
    std::atomic<uint64_t> last_echo{~0ull}, last_len{0};
    if (p.kind == Kind::kSendRecv)
      e.submit_recvs(p.size, kFerryRecvs, [&](std::span<const uint8_t> m) {
        uint64_t v = ~0ull;
        if (m.size() >= 8) std::memcpy(&v, m.data(), 8);
        last_echo.store(v);
        last_len.store(m.size());
        received.fetch_add(1, std::memory_order_release);
      });
    send_msg(fd_, MsgType::kFerryBegin, Writer().put(index).put(seed).bytes(mine.to_bytes()));
    Reader rep = recv_msg(fd_, MsgType::kReply);
    std::vector<ferry::MrDesc> descs(rep.get<uint64_t>());
    for (auto& d : descs) d = ferry::MrDesc::from_bytes(rep.bytes());

    Result res;
    uint64_t next_req = 0;
    std::string bad;
    if (p.latency()) {
      const uint32_t ping = p.kind == Kind::kImm ? kImmPing : kImmPingCb;
      std::vector<uint8_t> msg(p.size);
      const ferry::NetAddr server = descs[0].nics[0].addr;
      uint64_t seen = 0;
      auto one = [&](uint64_t n) {
        auto t = Clock::now();
        if (p.kind == Kind::kSendRecv) {
          std::memcpy(msg.data(), &n, std::min<size_t>(8, msg.size()));
          e.submit_send(server, msg, ferry::OnDone::none());
          while (received.load(std::memory_order_acquire) == seen) {
            if (secs_since(t) > 10) return false;
            relax(o_);
          }
          ++seen;
          if (o_.verify && (last_echo.load() != n || last_len.load() != p.size))
            bad = fmt::format("echo {} of {} bytes, expected {} of {}", last_echo.load(),
                              last_len.load(), n, p.size);
          return true;
        }
        e.submit_imm(ping, descs[0], ferry::OnDone::none());
        while (!pong.try_consume(1)) {
          if (secs_since(t) > 10) return false;
          relax(o_);
        }
        return true;
      };
      res = pingpong(dc, one);
      next_req = res.requests;
      if (o_.verify) res.verify = bad.empty() ? "ok" : bad;
    } else {
      res = throughput(e, h, descs, p, l, dc, &next_req);
    }
    send_msg(fd_, MsgType::kFerryEnd,
             Writer().put(next_req).put(next_req * ferry_imms_per_req(p, e.nics_per_group())));
    Reader end = recv_msg(fd_, MsgType::kReply);
    end.get<uint64_t>();
    std::string v = end.str();
    if (!p.latency()) res.verify = v;
    e.stop();
    return res;
  }

 private:
  Result throughput(ferry::TransferEngine& e, ferry::MrHandle h,
                    const std::vector<ferry::MrDesc>& descs, const Point& p, const Layout& l,
                    const DriveConfig& dc, uint64_t* next_req) {
    std::optional<uint32_t> imm;
    if (p.imm) imm = kImmData;
    std::optional<ferry::PeerGroupHandle> group;
    std::vector<ferry::ScatterDst> dsts;
    ferry::Pages src_pages, dst_pages;
    if (p.kind == Kind::kScatter || p.kind == Kind::kBarrier) {
      group = e.add_peer_group(descs);
      for (uint32_t t = 0; t < p.count; ++t) {
        WriteSpec w = l.write(0, t);
        dsts.push_back({w.len, w.src, descs[t], w.dst - uint64_t(t) * l.slice});
      }
    }
    if (p.kind == Kind::kPaged) {
      src_pages.stride = dst_pages.stride = l.stride;
      for (uint32_t k = 0; k < p.count; ++k) {
        WriteSpec w = l.write(0, k);
        src_pages.indices.push_back(uint32_t(w.src / l.stride));
        dst_pages.indices.push_back(uint32_t(w.dst / l.stride));
      }
    }
    std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[dc.window]);
    std::unique_ptr<std::atomic<bool>[]> failed(new std::atomic<bool>[dc.window]);
    std::vector<char> busy(dc.window, 0);
    for (size_t i = 0; i < dc.window; ++i) done[i] = failed[i] = false;
    auto admit = [&](uint64_t r, uint32_t slot) {
      done[slot].store(false, std::memory_order_relaxed);
      failed[slot].store(false, std::memory_order_relaxed);
      busy[slot] = 1;
      auto od = ferry::OnDone::flag(done[slot], &failed[slot]);
      switch (p.kind) {
        case Kind::kSingle: {
          WriteSpec w = l.write(r, 0);
          e.submit_single_write(w.len, imm, h, w.src, descs[0], w.dst, std::move(od));
          break;
        }
        case Kind::kPaged:
          e.submit_paged_writes(p.size, imm, h, src_pages, descs[0], dst_pages, std::move(od));
          break;
        case Kind::kScatter:
          e.submit_scatter(group, std::move(od), imm, h, dsts);
          break;
        case Kind::kBarrier:
          e.submit_barrier(group, std::move(od), kImmData, descs);
          break;
        default:
          break;
      }
    };
    auto progress = [&](auto&& on_done) -> size_t {
      size_t n = 0;
      for (uint32_t s = 0; s < dc.window; ++s) {
        if (!busy[s] || !done[s].load(std::memory_order_acquire)) continue;
        busy[s] = 0;
        on_done(s, !failed[s].load(std::memory_order_relaxed));
        ++n;
      }
      return n;
    };
    // Yield so the engine's worker gets the core when there are fewer cores
    // than busy threads (this machine: 2 cores, 2 processes).
    return drive(dc, next_req, admit, progress, [] { std::this_thread::yield(); });
  }

  Region& region_;
  const Options& o_;
  int fd_;
};

// ------------------------------------------------------------------ points

std::vector<Point> make_points(const Options& o) {
  auto want = [&](const char* k) {
    std::stringstream ss(o.only);
    for (std::string item; std::getline(ss, item, ',');)
      if (item == k) return true;
    return false;
  };
  std::vector<Point> v;
  if (want("single")) {
    std::vector<uint64_t> sizes;
    if (o.quick)
      sizes = {64 << 10, 1 << 20};
    else
      for (uint64_t s = 4 << 10; s <= (64 << 20); s *= 4) sizes.push_back(s);
    for (uint64_t s : sizes)
      for (bool imm : {false, true}) v.push_back({Kind::kSingle, s, 1, imm});
  }
  if (want("paged")) {
    std::vector<uint64_t> pages =
        o.quick ? std::vector<uint64_t>{4 << 10, 64 << 10}
                : std::vector<uint64_t>{1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10};
    std::vector<uint32_t> counts = !o.page_counts.empty() ? o.page_counts
                                   : o.quick              ? std::vector<uint32_t>{100}
                                                          : std::vector<uint32_t>{100, 10000};
    for (uint32_t c : counts)
      for (uint64_t pg : pages) v.push_back({Kind::kPaged, pg, c, true});
  }
  if (want("scatter")) {
    std::vector<uint64_t> sizes = o.quick ? std::vector<uint64_t>{64 << 10}
                                          : std::vector<uint64_t>{4 << 10, 64 << 10, 1 << 20};
    for (uint64_t s : sizes) v.push_back({Kind::kScatter, s, o.targets, true});
  }
  if (want("barrier")) v.push_back({Kind::kBarrier, 0, o.targets, true});
  if (want("imm")) {
    v.push_back({Kind::kImm, 0, 1, true});
    v.push_back({Kind::kImmCb, 0, 1, true});
    v.push_back({Kind::kImmInline, 0, 1, true});
  }
  if (want("sendrecv")) v.push_back({Kind::kSendRecv, o.msg_size, 1, false});
  return v;
}

// ------------------------------------------------------------------ output

std::string shell(const char* cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", c);
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string json_num(double v) {
  return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null";
}

std::string join_nums(const std::vector<double>& v) {
  std::string out;
  for (double x : v) out += (out.empty() ? "" : ", ") + json_num(x);
  return out;
}

std::string json_result(const Result& r, bool latency) {
  if (!r.ran) return "null";
  return fmt::format(
      "{{\"requests\": {}, \"seconds\": {}, \"gb_s\": {}, \"gbps\": {}, \"ops_s\": {}, "
      "\"writes_s\": {}, \"p50_us\": {}, \"p99_us\": {}, \"cpu_us_per_op\": {}, "
      "\"cpu_us_per_write\": {}, \"errors\": {}, \"latency_is_half_rtt\": {}, \"verify\": {}}}",
      r.requests, json_num(r.seconds), json_num(r.gbs()), json_num(r.gbs() * 8), json_num(r.ops()),
      json_num(r.wps()), json_num(r.pct(0.5)), json_num(r.pct(0.99)), json_num(r.cpu_us_per_op()),
      json_num(r.cpu_us_per_write()), r.errors, latency ? "true" : "false",
      r.verify.empty() ? "null" : json_str(r.verify));
}

void write_json(const std::string& path, const Options& o, const std::vector<PointResult>& rs,
                double total_s) {
  utsname u{};
  uname(&u);
  std::string model = shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
  std::ofstream f(path);
  f << "{\n  \"meta\": {";
  f << fmt::format(
      "\"command\": {}, \"git_commit\": {}, \"provider\": {}, \"nics\": {}, \"window\": {}, "
      "\"poll\": {}, \"seconds_per_point\": {}, \"iters\": {}, \"repeat\": {}, \"verify\": {}, "
      "\"raw\": {}, \"baseline\": {}, \"gpu\": {}, \"nproc\": {}, \"cpu_model\": {}, "
      "\"kernel\": {}, \"date\": {}, "
      "\"total_seconds\": {}, "
      "\"loadavg_start\": {}, \"loadavg_end\": {}",
      json_str(o.command_line), json_str(FERRY_BENCH_BUILD_COMMIT), json_str(o.provider),
      o.nic_names.size(), o.window, json_str(o.poll), o.seconds, o.iters, o.repeat,
      o.verify ? "true" : "false", o.no_raw ? "false" : "true", json_str(o.baseline()),
      o.gpu.empty() ? std::string("null") : fmt::format("[{}, {}]", o.gpu[0], o.gpu[1]),
      sysconf(_SC_NPROCESSORS_ONLN), json_str(model),
      json_str(std::string(u.sysname) + " " + u.release),
      json_str(shell("date -u +%Y-%m-%dT%H:%M:%SZ")), json_num(total_s), json_str(o.load_start),
      json_str(shell("cut -d' ' -f1-3 /proc/loadavg")));
  f << "},\n  \"points\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    f << fmt::format(
        "    {{\"kind\": \"{}\", \"size\": {}, \"count\": {}, \"imm\": {}, \"window\": {}, "
        "\"bytes_per_req\": {}, \"writes_per_req\": {}, \"fraction_of_raw\": {}, "
        "\"rep_fractions\": [{}],\n"
        "     \"ferry\": {},\n     \"raw\": {}}}{}\n",
        kind_name(r.point.kind), r.point.size, r.point.count, r.point.imm ? "true" : "false",
        r.window, r.bytes_per_req, r.writes_per_req, json_num(r.fraction()),
        join_nums(r.rep_fractions), json_result(r.ferry, r.point.latency()),
        json_result(r.raw, r.point.latency()), i + 1 < rs.size() ? "," : "");
  }
  f << "  ]\n}\n";
}

void print_header(const char* baseline) {
  fmt::print(
      "{:<9}{:>6}{:>6}{:>4}{:>4} |{:>7}{:>7}{:>9}{:>9}{:>8}{:>8}{:>7} |{:>7}{:>9}{:>8}{:>8}{:>7} "
      "|{:>6}  {}\n",
      "kind", "size", "count", "imm", "win", "GB/s", "Gbps", "ops/s", "wr/s", "p50us", "p99us",
      "cpuus", "GB/s", "ops/s", "p50us", "p99us", "cpuus", "frac", "verify");
  fmt::print("{:<38}|{:^66}|{:^47}|\n", "", "ferry", baseline);
}

void print_row(const PointResult& r) {
  auto v = [](const Result& x) {
    if (x.verify.empty()) return std::string();
    return x.verify == "ok" ? std::string("ok") : "FAIL: " + x.verify;
  };
  const Result& f = r.ferry;
  const Result& w = r.raw;
  // An explicit space before every number, so that a value wider than its
  // column (a paged p99 of 100 ms) cannot run into its neighbour.
  std::string raw = w.ran ? fmt::format(" {:>6.3f} {:>8.0f} {:>7.1f} {:>7.1f} {:>6.2f}", w.gbs(),
                                        w.ops(), w.pct(0.5), w.pct(0.99), w.cpu_us_per_op())
                          : fmt::format("{:>39}", "-");
  std::string verify = v(f);
  if (w.ran && !v(w).empty() && v(w) != "ok") verify += " raw " + v(w);
  fmt::print(
      "{:<9}{:>6}{:>6}{:>4}{:>4} | {:>6.3f} {:>6.2f} {:>8.0f} {:>8.0f} {:>7.1f} {:>7.1f} {:>6.2f} "
      "|{} "
      "|{:>6.3f}  {}{}{}\n",
      kind_name(r.point.kind), r.point.size_label(), r.point.count, r.point.imm ? "y" : "n",
      r.window, f.gbs(), f.gbs() * 8, f.ops(), f.wps(), f.pct(0.5), f.pct(0.99), f.cpu_us_per_op(),
      raw, r.fraction(), verify, f.errors ? " ERRORS" : "", w.errors ? " RAW-ERRORS" : "");
  std::fflush(stdout);
}

// ------------------------------------------------------------------ processes

Writer hello(RawFabric& rf, const RawRegion& reg) {
  Writer w;
  w.put<uint64_t>(rf.nics());
  for (size_t k = 0; k < rf.nics(); ++k) w.bytes(rf.address(k)).put(reg.keys[k]).put(reg.bases[k]);
  return w;
}

RawRegion read_hello(RawFabric& rf, Reader& r) {
  RawRegion reg;
  std::vector<std::vector<uint8_t>> addrs(r.get<uint64_t>());
  for (auto& a : addrs) {
    a = r.bytes();
    reg.keys.push_back(r.get<uint64_t>());
    reg.bases.push_back(r.get<uint64_t>());
  }
  rf.insert_peer(addrs);
  return reg;
}

int server(int fd, const Options& o, const std::vector<Point>& points) {
  pin_self(o.server_cpu[2]);
  Region region(o.region(), o.gpu_of(true));
  std::unique_ptr<RawFabric> rf;
  RawRegion mine, client;
  if (!o.no_raw && !o.nvlink()) {
    rf = std::make_unique<RawFabric>(o.provider, o.nic_names, region.on_gpu());
    mine = rf->register_region(region.data(), o.region(), true, o.gpu_of(true));
  }
  Reader h = recv_msg(fd, MsgType::kHello);
  if (rf) {
    client = read_hello(*rf, h);
    send_msg(fd, MsgType::kHello, hello(*rf, mine));
  } else if (!o.no_raw) {
    send_msg(fd, MsgType::kHello, Writer().bytes(region.ipc_handle()));  // the CUDA baseline
  } else {
    send_msg(fd, MsgType::kHello);
  }
  bool recvs_posted = false;
  for (;;) {
    auto [type, msg] = recv_any(fd);
    if (type == MsgType::kQuit) break;
    const Point& p = points.at(msg.get<uint64_t>());
    if (type == MsgType::kRawRun) {
      auto mode = msg.get<RawMode>();
      const uint64_t seed = msg.get<uint64_t>();
      if (rf)
        serve_raw(*rf, region, client, o, fd, p, mode, seed, &recvs_posted);
      else
        serve_copies(region, o, fd, p, seed);
    } else if (type == MsgType::kFerryBegin) {
      uint64_t seed = msg.get<uint64_t>();
      serve_ferry(region, o, fd, p, seed, ferry::MrDesc::from_bytes(msg.bytes()));
    } else {
      throw std::runtime_error("server: unexpected control message");
    }
  }
  return 0;
}

int client(int fd, Options& o, const std::vector<Point>& points) {
  pin_self(o.cpu[2]);
  Region region(o.region(), o.gpu_of(false));
  const uint64_t data = o.region() - kMsgArea;
  region.fill(data, 0);
  std::unique_ptr<RawFabric> rf;
  std::unique_ptr<RawClient> raw;
  std::unique_ptr<CopyClient> copies;
  if (!o.no_raw && !o.nvlink()) {
    rf = std::make_unique<RawFabric>(o.provider, o.nic_names, region.on_gpu());
    RawRegion mine = rf->register_region(region.data(), o.region(), true, o.gpu_of(false));
    send_msg(fd, MsgType::kHello, hello(*rf, mine));
    Reader r = recv_msg(fd, MsgType::kHello);
    raw = std::make_unique<RawClient>(*rf, region.data(), o.region(), read_hello(*rf, r), o);
  } else {
    send_msg(fd, MsgType::kHello);
    Reader r = recv_msg(fd, MsgType::kHello);
    if (!o.no_raw) copies = std::make_unique<CopyClient>(region, r.bytes(), o);
  }
  // Which points have a baseline: the raw send/recv ping-pong needs host
  // buffers, the CUDA one covers the writes that carry data.
  auto has_baseline = [&](const Point& p) {
    if (raw) return !(region.on_gpu() && p.kind == Kind::kSendRecv);
    return copies && CopyClient::covers(p);
  };
  fmt::print("ferry-bench: provider {}, NICs [{}], {}, window {}, poll {}, {} s per point{}{}{}\n",
             o.provider, fmt::join(o.nic_names, ","),
             o.gpu.empty() ? std::string("host memory")
                           : fmt::format("GPU {} -> GPU {}", o.gpu[0], o.gpu[1]),
             o.window, o.poll, o.seconds,
             o.repeat > 1 ? fmt::format(", median of {} alternating runs", o.repeat) : "",
             o.iters ? fmt::format(" ({} requests)", o.iters) : "", o.verify ? ", verifying" : "");
  fmt::print(
      "latency columns: per-request completion time (throughput points), half round trip "
      "(imm, imm-cb, imm-inl, sendrecv); frac = ferry/{} throughput, or {}/ferry p50 latency{}\n",
      o.baseline(), o.baseline(),
      copies ? "; cuda = one cudaMemcpyAsync per write into the peer's IPC-mapped region" : "");
  o.load_start = shell("cut -d' ' -f1-3 /proc/loadavg");
  fmt::print("load average at start: {}\n", o.load_start);
  print_header(o.baseline());
  FerryClient fc(region, o, fd);
  std::vector<PointResult> results;
  const auto t_start = Clock::now();
  uint64_t seed = 1;
  bool failed = false;
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    const Layout l(p, o.region());
    PointResult pr;
    pr.point = p;
    pr.window = p.latency() ? 1 : (p.kind == Kind::kBarrier ? 1 : effective_window(o, l));
    pr.bytes_per_req = l.bytes_per_req;
    pr.writes_per_req = l.writes_per_req;
    DriveConfig dc;
    dc.window = pr.window;
    dc.seconds = o.seconds;
    dc.warmup = std::min(0.2, o.seconds * 0.2);
    dc.iters = o.iters;
    dc.bytes_per_req = l.bytes_per_req;
    dc.writes_per_req = l.writes_per_req;
    std::vector<Result> raws, ferries;
    try {
      for (int r = 0; r < o.repeat; ++r) {
        if (has_baseline(p)) {
          uint64_t s = seed++;
          if (o.verify && !p.latency()) region.fill(data, s);
          RawMode mode = raw_mode(p);
          send_msg(fd, MsgType::kRawRun, Writer().put<uint64_t>(i).put(mode).put(s));
          recv_msg(fd, MsgType::kReply);
          uint64_t next = 0;
          if (copies)
            pr.raw = copies->throughput(l, dc, &next);
          else
            pr.raw = p.latency() ? raw->pingpong_(p, dc) : raw->throughput(p, l, dc, &next);
          uint64_t per = (p.imm || p.kind == Kind::kBarrier) ? l.writes_per_req : 0;
          send_msg(fd, MsgType::kRawStop, Writer().put(next).put(p.latency() ? 0 : next * per));
          Reader rep = recv_msg(fd, MsgType::kReply);
          rep.get<uint64_t>();
          std::string v = rep.str();
          if (!p.latency()) pr.raw.verify = v;
          raws.push_back(std::move(pr.raw));
        }
        uint64_t s = seed++;
        if (o.verify && !p.latency()) region.fill(data, s);
        ferries.push_back(fc.run(i, p, dc, s));
        if (!raws.empty())
          pr.rep_fractions.push_back(PointResult::fraction_of(p, ferries.back(), raws.back()));
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "point {} {}: {}\n", kind_name(p.kind), p.size_label(), e.what());
      failed = true;
      break;
    }
    auto bad = [](const Result& r) {
      return r.errors > 0 || (!r.verify.empty() && r.verify != "ok");
    };
    for (const auto& r : raws) failed |= bad(r);
    for (const auto& r : ferries) failed |= bad(r);
    pr.raw = median_run(raws, pr.latency_metric());
    pr.ferry = median_run(ferries, pr.latency_metric());
    print_row(pr);
    results.push_back(std::move(pr));
  }
  send_msg(fd, MsgType::kQuit);
  double total = secs_since(t_start);
  fmt::print("{} points in {:.1f} s, load average at end: {}\n", results.size(), total,
             shell("cut -d' ' -f1-3 /proc/loadavg"));
  if (!o.json.empty()) {
    write_json(o.json, o, results, total);
    fmt::print("wrote {}\n", o.json);
  }
  return failed ? 1 : 0;
}

// Exit code of a run that cannot happen here (CTest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

// Whether --gpu can run here: both GPUs visible and, for a libfabric
// provider, GPU memory registers (a libfabric built without CUDA refuses it).
// Asked in a child, which says why not: CUDA does not survive the fork that
// follows.
bool gpus_usable(const Options& o) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 0;
    try {
      const int have = gpu_count();
      if (std::max(o.gpu[0], o.gpu[1]) >= have) {
        std::fprintf(stderr, "ferry-bench: skipped: --gpu %d,%d but %d GPUs visible\n", o.gpu[0],
                     o.gpu[1], have);
        rc = 1;
      } else if (!o.nvlink()) {
        Region r(1 << 20, o.gpu[0]);
        RawFabric rf(o.provider, {o.nic_names[0]}, true);
        rf.register_region(r.data(), r.size(), true, o.gpu[0]);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-bench: skipped: %s cannot register GPU memory here: %s\n",
                   o.provider.c_str(), e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  int st = 0;
  return pid > 0 && ::waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

}  // namespace
}  // namespace ferry_bench

int main(int argc, char** argv) {
  using namespace ferry_bench;
  Options o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  CLI::App app{
      "ferry-bench: two-process sweep of ferry's operations (single and paged writes, scatter, "
      "barrier, immediate and send/recv ping-pong), each measured against a raw libfabric "
      "baseline on the same provider in the same run."};
  app.add_option("--provider", o.provider,
                 "libfabric provider (tcp;ofi_rxm, shm, efa), or nvlink (needs --gpu)")
      ->capture_default_str();
  auto* nics_opt = app.add_option("--nics", o.nics,
                                  "NICs per group (1, 2 or 4), all on the "
                                  "provider's default NIC (lo / shm)")
                       ->capture_default_str();
  app.add_option("--nic", o.nic_names,
                 "NIC (libfabric domain) name; repeat for several NICs per group")
      ->excludes(nics_opt);
  app.add_option("--gpu", o.gpu,
                 "GPU memory: the client's and the server's CUDA device as C,S (e.g. 0,1); "
                 "exits 77 (skipped) when they are not there")
      ->delimiter(',')
      ->expected(2)
      ->check(CLI::Range(0, 127));
  app.add_option("--window", o.window,
                 "requests in flight, the same for ferry and the raw baseline (capped by "
                 "--max-inflight-mib)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--poll", o.poll, "engine poll mode (the raw server follows it): busy or adaptive")
      ->check(CLI::IsMember({"busy", "adaptive"}))
      ->capture_default_str();
  app.add_option("--cpu", o.cpu,
                 "client CPUs as WORKER,CALLBACK,CLIENT (-1 = unpinned); CLIENT also runs the "
                 "raw baseline")
      ->delimiter(',')
      ->expected(3);
  app.add_option("--server-cpu", o.server_cpu, "server CPUs as WORKER,CALLBACK,MAIN")
      ->delimiter(',')
      ->expected(3);
  app.add_option("--json", o.json, "write every point (and the machine) to this JSON file");
  app.add_option("--trace-dir", o.trace_dir,
                 "ferry engines write a trace (docs/OBSERVABILITY.md) per point and side here, "
                 "KIND-SIZE-client.json and -server.json");
  app.add_flag("--verify", o.verify,
               "fill a fresh pattern before every phase and check every written byte (and the "
               "gaps between pages) on the server afterwards; echo check for send/recv");
  app.add_flag("--quick", o.quick, "short sweep for CI (a few sizes, 0.25 s per phase)");
  app.add_flag("--no-raw", o.no_raw,
               "skip the baseline (raw libfabric, or CUDA copies for nvlink)");
  app.add_option("--only", o.only,
                 "comma-separated: single,paged,scatter,barrier,imm,sendrecv (imm runs the "
                 "counter responder, the callback responder on the callback thread (imm-cb) and "
                 "on the worker (imm-inl))")
      ->capture_default_str();
  app.add_option("--repeat", o.repeat,
                 "run raw and ferry alternately this many times per point and report the median "
                 "of each (and every repetition's fraction in the JSON): tames a noisy machine")
      ->check(CLI::Range(1, 50))
      ->capture_default_str();
  app.add_option("--seconds", o.seconds,
                 "measured seconds per point and implementation (default 1, 0.25 with --quick)");
  app.add_option("--iters", o.iters,
                 "requests (or round trips) per point and implementation instead of --seconds");
  app.add_option("--region-mib", o.region_mib, "registered region on each side, MiB")
      ->check(CLI::Range(8, 16384))
      ->capture_default_str();
  app.add_option("--max-inflight-mib", o.max_inflight_mib,
                 "bytes in flight cap: the window shrinks for large requests so a point drains "
                 "quickly")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--targets", o.targets, "scatter and barrier: descriptors (regions) of the peer")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--page-counts", o.page_counts,
                 "paged: pages per request, comma-separated (default 100,10000; 100 with --quick)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--msg-size", o.msg_size, "send/recv ping-pong message bytes")
      ->check(CLI::Range(8, 64 << 10))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (!o.trace_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.trace_dir, ec);
    if (ec) {
      std::fprintf(stderr, "ferry-bench: --trace-dir %s: %s\n", o.trace_dir.c_str(),
                   ec.message().c_str());
      return 2;
    }
  }
  if (o.seconds <= 0) o.seconds = o.quick ? 0.25 : 1.0;
  if (o.nvlink()) {
    if (o.gpu.empty() || !o.nic_names.empty() || o.nics != 1) {
      std::fprintf(stderr, "ferry-bench: nvlink needs --gpu and takes no --nic / --nics\n");
      return 2;
    }
  } else if (o.nic_names.empty()) {
    o.nic_names.assign(size_t(o.nics), o.provider == "shm" ? "shm" : "lo");
  }
  if (!o.nvlink() && o.nic_names.size() != 1 && o.nic_names.size() != 2 &&
      o.nic_names.size() != 4) {
    std::fprintf(stderr, "ferry-bench: 1, 2 or 4 NICs per group\n");
    return 2;
  }
  if (!o.gpu.empty()) {
    if (!gpu_built()) {
      std::fprintf(stderr, "ferry-bench: skipped: built without CUDA, --gpu is unavailable\n");
      return kSkipped;
    }
    if (!gpus_usable(o)) return kSkipped;
  }
  auto points = make_points(o);
  if (points.empty()) {
    std::fprintf(stderr, "ferry-bench: --only selects nothing\n");
    return 2;
  }
  for (const auto& p : points) {
    Layout l(p, o.region());
    if ((p.kind == Kind::kSingle && p.size > l.data) ||
        (p.kind == Kind::kScatter && p.size * p.count > l.data)) {
      std::fprintf(stderr, "ferry-bench: --region-mib too small for %s of %s\n", kind_name(p.kind),
                   p.size_label().c_str());
      return 2;
    }
  }
  // The engine logs every NIC it opens; one engine pair per point makes that noise.
  if (!std::getenv("FERRY_LOG")) setenv("FERRY_LOG", "warn", 1);
  spdlog::set_level(spdlog::level::warn);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    int rc = 1;
    try {
      rc = server(sv[1], o, points);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "server: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(sv[1]);
  int rc = 1;
  try {
    rc = client(sv[0], o, points);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client: %s\n", e.what());
    ::kill(pid, SIGTERM);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = rc ? rc : 3;
  return rc;
}

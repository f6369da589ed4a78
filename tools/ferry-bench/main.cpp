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
//
// Here: the points of a sweep, the two processes and main. Elsewhere: options.h
// (options, shared helpers), driver.h (results, the request loops), raw_side.h
// (the baseline), ferry_side.h (the engine phases), report.h (table, JSON).
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "channel.h"
#include "driver.h"
#include "ferry/ferry.h"
#include "ferry_side.h"
#include "forked_pair.h"
#include "gpu.h"
#include "options.h"
#include "plan.h"
#include "raw_fabric.h"
#include "raw_side.h"
#include "report.h"

namespace ferry_bench {
namespace {

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
  if (want("sendrecv")) {
    v.push_back({Kind::kSendRecv, o.msg_size, 1, false});
    v.push_back({Kind::kSendRecvInline, o.msg_size, 1, false});
    v.push_back({Kind::kSendRecvQueue, o.msg_size, 1, false});
  }
  return v;
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
    if (raw) return !(region.on_gpu() && p.sendrecv());
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
      "(imm, imm-cb, imm-inl, sendrecv, sendrecv-inl, sendrecv-q); frac = ferry/{} throughput, or "
      "{}/ferry p50 "
      "latency{}\n",
      o.baseline(), o.baseline(),
      copies ? "; cuda = one cudaMemcpyAsync per write into the peer's IPC-mapped region"
      : o.raw_relay
          ? "; raw-relay = the raw immediate ping-pong through a NIC thread per side (the other "
            "points' baseline is the plain raw one)"
          : "");
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
                 "on the worker (imm-inl); sendrecv runs the receive callbacks on the callback "
                 "thread (sendrecv) and on the worker (sendrecv-inl), and takes the messages from "
                 "a receive queue on the application thread (sendrecv-q))")
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
  app.add_flag("--wake", o.wake,
               "after each point, print each side's wake-up counts over its ferry run to stderr "
               "(EngineStats::wake: blocks and what ended them, naps, eventfd writes, inline "
               "posts, helped polls, ...): which threads did the work, and who slept");
  app.add_flag("--raw-relay", o.raw_relay,
               "the immediate points' baseline with the engine's thread layout: on each side a "
               "NIC thread owns the endpoint and the application thread hands it each write and "
               "waits for each arrival through shared memory (two thread crossings per half round "
               "trip, no engine); the server answers from its main thread, as for imm");
  app.add_flag("--raw-inject", o.raw_inject,
               "the raw immediate ping-pong's writes as fi_inject_writedata, with no local "
               "completion, as the engine posts its one-line immediates on shm");
  app.add_flag("--spin-pause", o.spin_pause,
               "with busy polling, every ping-pong loop (ferry's and the raw one's alike) "
               "executes a pause instruction after each poll that found nothing; by default "
               "none does, so that both sides spin the same way");
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
  if (o.raw_relay && (o.nvlink() || o.no_raw || o.nic_names.size() != 1)) {
    std::fprintf(
        stderr,
        "ferry-bench: --raw-relay needs a libfabric provider, one NIC and the raw baseline\n");
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

  return ferry::tools::run_forked_pair([&](int fd) { return server(fd, o, points); },
                                       [&](int fd) { return client(fd, o, points); }, 3);
}

// Two GPU processes for the NVLink / fabric-HMEM tests and the benchmark.
// The gtest process never touches CUDA (CUDA does not survive fork), so both
// sides are forked children joined by their own socketpair.
#pragma once

#include <cuda_runtime.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "support/process.h"

namespace ferry::nvtest {

using namespace std::chrono_literals;

// Number of GPUs, asked in a child so this process stays CUDA-free.
inline int gpu_count() {
  test::Peer probe([](test::Channel&) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  });
  const int n = probe.wait(60s);
  return n < 0 || n >= 128 ? 0 : n;
}

// One CUDA group: "nvlink" (no NIC names) or "shm" (libfabric with FI_HMEM).
inline EngineConfig gpu_config(const std::string& provider, int dev, bool busy = false) {
  EngineConfig c;
  c.provider = provider;
  GroupConfig g;
  g.device = Device::cuda(dev);
  if (provider == "shm") g.nic_names = {"shm"};
  g.insist = true;  // shm is no NIC of the topology; a GPU-only config is meant
  c.groups = {g};
  c.default_deadline = 20s;
  if (busy) c.poll_mode = PollMode::kBusy;
  return c;
}

struct DevBuf {
  void* p = nullptr;
  size_t len = 0;
  DevBuf(int dev, size_t n) : len(n) {
    cudaSetDevice(dev);
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() {
    if (p != nullptr) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p); }
};

// Runs writer(ch_to_target) and target(ch_to_writer) in two children; the
// writer's lines to `report` come back to the caller. Returns the exit codes.
inline std::pair<int, int> run_pair(
    const std::function<int(test::Channel&, test::Channel&)>& writer,
    const std::function<int(test::Channel&)>& target, std::vector<std::string>* report,
    std::chrono::seconds timeout = 300s) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return {-2, -2};
  test::Peer b([&](test::Channel&) {
    ::close(sv[0]);
    test::Channel link(sv[1]);
    return target(link);
  });
  test::Peer a([&](test::Channel& parent) {
    ::close(sv[1]);
    test::Channel link(sv[0]);
    return writer(link, parent);
  });
  ::close(sv[0]);
  ::close(sv[1]);
  for (;;) {
    auto line = a.channel().recv_str(timeout);
    if (!line || *line == "END") break;
    std::printf("%s\n", line->c_str());
    std::fflush(stdout);
    if (report) report->push_back(*line);
  }
  const int ra = a.wait(timeout);
  const int rb = b.wait(60s);
  return {ra, rb};
}

// Spins until `done` reaches n (a counter's OnDone); false after 60 s.
inline bool wait_count(std::atomic<uint64_t>& done, uint64_t n) {
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (done.load(std::memory_order_acquire) < n)
    if (std::chrono::steady_clock::now() > give_up) return false;
  return true;
}

struct Seg {
  uint64_t dst_off, len, seed, src_off;
};

inline std::string str(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

// The target side: registers `len` bytes of GPU memory on `dev`, sends its
// descriptor, answers commands until "quit":
//   zero | counter <imm> | count <imm> <n> | verify (next message: Seg[]) | desc <hex> (peer
//   descriptor for pong) | pong <imm_in> <imm_out> <iters> <len> | extra (registers a second
//   1 MiB region, answers its descriptor in hex) | unextra (unregisters and frees it)
inline int serve_gpu_target(test::Channel& ch, const EngineConfig& cfg, int dev, size_t len) {
  cudaSetDevice(dev);
  TransferEngine e(cfg);
  DevBuf buf(dev, len);
  if (buf.p == nullptr) return 10;
  cudaMemset(buf.p, 0, len);
  cudaDeviceSynchronize();
  MrHandle h;
  try {
    auto [handle, desc] = e.reg_mr(buf.p, len, Device::cuda(dev));
    h = handle;
    ch.send(desc.to_bytes());
  } catch (const Error& err) {
    if (err.code() != Code::kUnimplemented) throw;
    ch.send(std::string("SKIP: ") + err.what());  // the transport cannot do GPU memory here
    return 0;
  }
  std::map<uint32_t, ImmCounter> counters;
  MrDesc peer;
  std::unique_ptr<DevBuf> extra;
  MrHandle extra_h;
  for (;;) {
    auto m = ch.recv_str(120s);
    if (!m) return 11;
    std::istringstream in(*m);
    std::string cmd;
    in >> cmd;
    if (cmd == "quit") {
      ch.send("bye");
      return 0;
    } else if (cmd == "zero") {
      cudaMemset(buf.p, 0, len);
      ch.send(cudaDeviceSynchronize() == cudaSuccess ? "ok" : "cuda error");
    } else if (cmd == "counter") {
      uint32_t imm;
      in >> imm;
      counters[imm] = e.imm_counter(imm);
      ch.send("ok");
    } else if (cmd == "count") {
      uint32_t imm;
      int64_t n;
      in >> imm >> n;
      Status s = counters[imm].wait(n, 20s);
      if (!s.is_ok()) {
        ch.send("timeout with " + std::to_string(counters[imm].value()) + " of " +
                std::to_string(n));
        continue;
      }
      std::this_thread::sleep_for(30ms);  // a surplus would show up by now
      ch.send("ok " + std::to_string(counters[imm].value()));
    } else if (cmd == "verify") {
      auto raw = ch.recv(60s);
      if (!raw) return 12;
      std::vector<Seg> segs(raw->size() / sizeof(Seg));
      std::memcpy(segs.data(), raw->data(), segs.size() * sizeof(Seg));
      std::vector<uint8_t> want(len, 0), got(len);
      for (const Seg& s : segs)
        for (uint64_t j = 0; j < s.len; ++j)
          want[s.dst_off + j] = test::pattern_byte(s.seed, s.src_off + j);
      if (cudaMemcpy(got.data(), buf.p, len, cudaMemcpyDeviceToHost) != cudaSuccess) {
        ch.send("cudaMemcpy failed");
        continue;
      }
      const auto mm = std::mismatch(got.begin(), got.end(), want.begin());
      if (mm.first == got.end()) {
        ch.send("ok");
      } else {
        const size_t at = mm.first - got.begin();
        size_t bad = 0;
        for (size_t i = at; i < len; ++i) bad += got[i] != want[i];
        ch.send("mismatch at byte " + std::to_string(at) + ": got " + std::to_string(got[at]) +
                " want " + std::to_string(want[at]) + " (" + std::to_string(bad) +
                " bytes differ)");
      }
    } else if (cmd == "extra") {
      extra = std::make_unique<DevBuf>(dev, 1 << 20);
      auto [eh, ed] = e.reg_mr(extra->p, 1 << 20, Device::cuda(dev));
      extra_h = eh;
      ch.send(ed.to_hex());
    } else if (cmd == "unextra") {
      e.unreg_mr(extra_h);
      cudaDeviceSynchronize();
      extra.reset();  // cudaFree: the memory behind the old descriptor is gone
      ch.send("ok");
    } else if (cmd == "desc") {
      std::string hex;
      in >> hex;
      peer = MrDesc::from_hex(hex);
      ch.send("ok");
    } else if (cmd == "pong") {
      // Answer every 4 KiB write-with-imm by one back: the writer measures
      // the round trip of two one-way latencies.
      uint32_t imm_in, imm_out;
      int iters;
      uint64_t wlen;
      in >> imm_in >> imm_out >> iters >> wlen;
      ImmCounter c = e.imm_counter(imm_in);
      ch.send("ready");
      for (int i = 0; i < iters; ++i) {
        auto give_up = std::chrono::steady_clock::now() + 10s;
        while (!c.try_consume(1))
          if (std::chrono::steady_clock::now() > give_up) return 13;
        e.submit_single_write(wlen, imm_out, h, 0, peer, 0, OnDone::none());
      }
      ch.send("done");
    }
  }
}

}  // namespace ferry::nvtest

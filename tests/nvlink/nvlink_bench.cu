// ferry-nvlink-bench: the NVLink domain on a GPU pair against
// cudaMemcpyPeerAsync measured in the same run (docs/PERFORMANCE.md,
// "NVLink domain"). Writer on GPU 0, target on GPU 1, two processes.
//   ferry-nvlink-bench [--out FILE] [--adaptive]
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include "gather_pages.cuh"
#include "nvlink_pair.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr size_t kTargetLen = 320ull << 20;

double secs(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

bool g_busy = true;  // --adaptive: both engines poll adaptively (the default)

int writer(test::Channel& link, test::Channel& parent) {
  auto say = [&](const std::string& s) { parent.send(s); };
  const int dev = 0, peer_dev = 1;
  cudaSetDevice(dev);
  TransferEngine e(nvtest::gpu_config("nvlink", dev, g_busy));
  say(std::string("poll mode: ") + (g_busy ? "busy" : "adaptive"));
  nvtest::DevBuf src(dev, kTargetLen);
  cudaMemset(src.p, 1, kTargetLen);
  auto [sh, sdesc] = e.reg_mr(src.p, kTargetLen, Device::cuda(dev));
  const MrDesc dst = MrDesc::from_bytes(*link.recv(60s));

  // Baseline: cudaMemcpyPeerAsync GPU0 -> GPU1 into a buffer of this process.
  nvtest::DevBuf peer_buf(peer_dev, kTargetLen);
  cudaSetDevice(dev);
  // Without peer access cudaMemcpyPeerAsync stages through the host (36 GB/s).
  cudaDeviceEnablePeerAccess(peer_dev, 0);
  cudaGetLastError();
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::atomic<uint64_t> done{0}, errors{0};
  for (uint64_t len : {16ull << 20, 256ull << 20}) {
    const int iters = len >= (256ull << 20) ? 8 : 64;
    cudaMemcpyPeerAsync(peer_buf.p, peer_dev, src.p, dev, len, s);  // warm
    cudaStreamSynchronize(s);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) cudaMemcpyPeerAsync(peer_buf.p, peer_dev, src.p, dev, len, s);
    cudaStreamSynchronize(s);
    const double base = double(len) * iters / secs(Clock::now() - t0) / 1e9;
    // ferry: back-to-back single writes, done = data in place (event completed).
    done = 0;
    e.submit_single_write(len, std::nullopt, sh, 0, dst, 0, OnDone::counter(done, &errors));
    nvtest::wait_count(done, 1);
    done = 0;
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      e.submit_single_write(len, 7, sh, 0, dst, 0, OnDone::counter(done, &errors));
    nvtest::wait_count(done, iters);
    const double ferry = double(len) * iters / secs(Clock::now() - t0) / 1e9;
    char line[256];
    std::snprintf(line, sizeof line,
                  "single %4llu MiB x %2d: ferry nvlink %6.1f GB/s, cudaMemcpyPeerAsync %6.1f GB/s "
                  "(%.1f %%)",
                  (unsigned long long)(len >> 20), iters, ferry, base, 100.0 * ferry / base);
    say(line);
  }

  cudaStreamDestroy(s);
  cudaStream_t ss[2];
  for (auto& x : ss) cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);

  // The target counts the immediates of the paged writes, as a receiver would
  // (uncounted ones would each go to its callback thread).
  link.send("counter 9");
  link.recv_str(10s);
  // Each point: kReps runs of back-to-back transfers over kLists random page
  // lists; the median is reported with every run beside it. A 4 KiB run is
  // 400 transfers (1.6 GiB), long enough that start-up does not weigh.
  constexpr int kReps = 5, kLists = 50;
  std::mt19937_64 rng(1);
  for (uint64_t page : {64ull << 10, 4ull << 10, 256ull << 10}) {
    const uint32_t slots = uint32_t(std::min<uint64_t>(kTargetLen / page, 16384));
    const int iters = page >= (64 << 10) ? 40 : 400;
    std::vector<Pages> sps, dps;
    for (int i = 0; i < kLists; ++i) {
      Pages sp, dp;
      sp.stride = dp.stride = page;
      nvtest::random_pages(rng, slots, 1024, sp.indices, dp.indices);
      sps.push_back(sp);
      dps.push_back(dp);
    }
    // The baseline, same page lists, into this process's buffer on GPU 1.
    std::vector<uint32_t> idx;
    for (int i = 0; i < kLists; ++i) {
      idx.insert(idx.end(), sps[i].indices.begin(), sps[i].indices.end());
      idx.insert(idx.end(), dps[i].indices.begin(), dps[i].indices.end());
    }
    nvtest::DevBuf didx(dev, idx.size() * 4);
    cudaMemcpy(didx.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice);
    const uint32_t* ix = static_cast<const uint32_t*>(didx.p);
    std::vector<double> base;
    for (int r = 0; r <= kReps; ++r) {  // r == 0 warms up
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        const uint32_t* l = ix + size_t(i % kLists) * 2048;
        nvtest::gather_pages<<<1056, 256, 0, ss[i % 2]>>>(static_cast<const char*>(src.p),
                                                          static_cast<char*>(peer_buf.p), page, l,
                                                          l + 1024, 1024);
      }
      cudaDeviceSynchronize();
      if (r > 0) base.push_back(double(page) * 1024 * iters / secs(Clock::now() - t0) / 1e9);
    }
    if (cudaGetLastError() != cudaSuccess) say("FAIL: baseline kernel failed");
    std::sort(base.begin(), base.end());
    done = 0;
    e.submit_paged_writes(page, 9, sh, sps[0], dst, dps[0], OnDone::counter(done, &errors));
    nvtest::wait_count(done, 1);
    std::vector<double> runs, submit_us;
    for (int r = 0; r < kReps; ++r) {
      done = 0;
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        e.submit_paged_writes(page, 9, sh, sps[i % kLists], dst, dps[i % kLists],
                              OnDone::counter(done, &errors));
      const double sub = secs(Clock::now() - t0) * 1e6 / iters;
      nvtest::wait_count(done, iters);
      runs.push_back(double(page) * 1024 * iters / secs(Clock::now() - t0) / 1e9);
      submit_us.push_back(sub);
    }
    std::vector<double> sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    std::string all;
    char num[32];
    for (double g : runs) {
      std::snprintf(num, sizeof num, " %.1f", g);
      all += num;
    }
    std::sort(submit_us.begin(), submit_us.end());
    char line[384];
    std::snprintf(line, sizeof line,
                  "paged 1024 x %3llu KiB x %3d: ferry nvlink %6.1f GB/s (median of %d:%s; "
                  "submit call %.1f us per transfer), gather kernel alone %6.1f GB/s (%.1f %%)",
                  (unsigned long long)(page >> 10), iters, sorted[kReps / 2], kReps, all.c_str(),
                  submit_us[kReps / 2], base[kReps / 2],
                  100.0 * sorted[kReps / 2] / base[kReps / 2]);
    say(line);
  }

  // Latency baseline: a 4 KiB cudaMemcpyPeerAsync to GPU 1 in this process,
  // from the call to its event seen complete (no other process, no immediate).
  std::vector<double> base_us;
  {
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    for (int i = 0; i < 2000; ++i) {
      auto t0 = Clock::now();
      cudaMemcpyPeerAsync(peer_buf.p, peer_dev, src.p, dev, 4096, ss[0]);
      cudaEventRecord(ev, ss[0]);
      while (cudaEventQuery(ev) == cudaErrorNotReady) {
      }
      if (i >= 100) base_us.push_back(secs(Clock::now() - t0) * 1e6);
    }
    cudaEventDestroy(ev);
    std::sort(base_us.begin(), base_us.end());
  }
  for (auto& x : ss) cudaStreamDestroy(x);

  // Immediate latency: 4 KiB write with imm, the target answers with one; RTT / 2.
  link.send("desc " + sdesc.to_hex());
  link.recv_str(10s);
  ImmCounter back = e.imm_counter(22);
  // n pings after `gap` each (the target answers every one); the one-way
  // times (RTT / 2, us) of those after the first `warmup`, sorted; empty when
  // a pong did not come within 10 s.
  auto pings = [&](int n, int warmup, std::chrono::microseconds gap) {
    link.send("pong 21 22 " + std::to_string(n) + " 4096");
    link.recv_str(10s);
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      if (gap.count() > 0) std::this_thread::sleep_for(gap);  // pacing, not synchronisation
      auto t0 = Clock::now();
      e.submit_single_write(4096, 21, sh, 0, dst, 0, OnDone::none());
      auto give_up = t0 + 10s;
      while (!back.try_consume(1))
        if (Clock::now() > give_up) return std::vector<double>{};
      if (i >= warmup) us.push_back(secs(Clock::now() - t0) * 1e6 / 2);
    }
    link.recv_str(10s);
    std::sort(us.begin(), us.end());
    return us;
  };
  auto pct = [](const std::vector<double>& us, double q) {
    return us[size_t(q * double(us.size() - 1))];
  };
  const std::vector<double> us = pings(2000, 100, 0us);
  if (us.empty()) {
    say("FAIL: pong lost");
    return 1;
  }
  char line[256];
  std::snprintf(
      line, sizeof line,
      "imm latency (4 KiB write + imm, counter reached in the other process, RTT/2 of %zu): "
      "p50 %.2f us, p90 %.2f us, p99 %.2f us",
      us.size(), pct(us, 0.5), pct(us, 0.9), pct(us, 0.99));
  say(line);
  std::snprintf(line, sizeof line,
                "baseline: 4 KiB cudaMemcpyPeerAsync in one process, call to event complete: "
                "p50 %.2f us, p99 %.2f us (ferry p50 / baseline p50 = %.2f)",
                base_us[base_us.size() / 2], base_us[base_us.size() * 99 / 100],
                pct(us, 0.5) / base_us[base_us.size() / 2]);
  say(line);
  // Sparse pings, 1 ms apart: both workers have gone idle (adaptive polling
  // blocks after 200 us), so each one-way trip includes waking the target.
  const std::vector<double> sparse = pings(300, 20, 1ms);
  if (sparse.empty()) {
    say("FAIL: sparse pong lost");
    return 1;
  }
  std::snprintf(
      line, sizeof line,
      "imm latency, pings 1 ms apart (RTT/2 of %zu): p50 %.2f us, p90 %.2f us, p99 %.2f us",
      sparse.size(), pct(sparse, 0.5), pct(sparse, 0.9), pct(sparse, 0.99));
  say(line);
  // CPU an idle engine burns: this process, nothing submitted for a second.
  auto cpu_ms = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
  };
  std::this_thread::sleep_for(300ms);  // past the 200 us spin before blocking
  const double c0 = cpu_ms();
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(1s);
  std::snprintf(line, sizeof line, "idle engine: %.1f ms of CPU per second of wall time",
                (cpu_ms() - c0) / secs(Clock::now() - w0));
  say(line);
  if (errors.load() != 0) say("FAIL: " + std::to_string(errors.load()) + " transfers failed");
  link.send("quit");
  link.recv_str(10s);
  say("END");
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--out" && i + 1 < argc) out = argv[i + 1];
    if (std::string(argv[i]) == "--adaptive") ferry::g_busy = false;
  }
  if (ferry::nvtest::gpu_count() < 2) {
    std::printf("ferry-nvlink-bench: needs two GPUs\n");
    return 2;
  }
  std::vector<std::string> report;
  auto [ra, rb] = ferry::nvtest::run_pair(
      ferry::writer,
      [](ferry::test::Channel& link) {
        return ferry::nvtest::serve_gpu_target(
            link, ferry::nvtest::gpu_config("nvlink", 1, ferry::g_busy), 1, ferry::kTargetLen);
      },
      &report);
  if (!out.empty()) {
    std::ofstream f(out);
    for (auto& l : report) f << l << "\n";
    f << "writer exit " << ra << ", target exit " << rb << "\n";
  }
  std::printf("writer exit %d, target exit %d\n", ra, rb);
  return ra == 0 && rb == 0 ? 0 : 1;
}

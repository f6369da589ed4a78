// GPU-to-GPU transfers between two processes, byte-for-byte on the device:
// the NVLink domain ("nvlink") and libfabric shm with FI_HMEM ("shm"), writer
// on GPU 0, target on GPU 1 (both on GPU 0 where there is only one).
// SKIPPED without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <numeric>
#include <random>

#include "nvlink/nvlink_domain.h"
#include "nvlink_pair.h"

namespace ferry {
namespace {

using nvtest::Seg;
using namespace std::chrono_literals;

constexpr size_t kTargetLen = 32 << 20;
constexpr size_t kSrcLen = 16 << 20;

// Inside the writer child: failures become report lines and an exit code.
struct Writer {
  test::Channel& b;
  test::Channel& parent;
  int failures = 0;
  void say(const std::string& s) { parent.send(s); }
  void fail(const std::string& s) {
    ++failures;
    say("FAIL: " + s);
  }
  std::string ask(const std::string& cmd) {
    b.send(cmd);
    auto r = b.recv_str(60s);
    return r ? *r : "no answer";
  }
};

bool wait_flag(std::atomic<bool>& done) {
  auto give_up = std::chrono::steady_clock::now() + 30s;
  while (!done.load())
    if (std::chrono::steady_clock::now() > give_up)
      return false;
    else
      std::this_thread::sleep_for(50us);
  return true;
}

// One single write of len bytes from `from` to `to`, and how it ended: refused
// at submit (the thrown error), failed or done (its on_done), or no completion.
Status write_status(TransferEngine& e, MrHandle from, uint64_t len, uint32_t imm,
                    const MrDesc& to) {
  Status got;
  std::atomic<bool> done{false};
  try {
    e.submit_single_write(len, imm, from, 0, to, 0, [&](const Status& s) {
      got = s;
      done = true;
    });
    if (!wait_flag(done)) return Status(Code::kDeadlineExceeded, "no completion in 30 s");
  } catch (const Error& err) {
    return Status(err.code(), err.what());
  }
  return got;
}

int writer_main(const std::string& provider, int dev, test::Channel& link, test::Channel& parent) {
  Writer w{link, parent};
  cudaSetDevice(dev);
  TransferEngine e(nvtest::gpu_config(provider, dev));
  nvtest::DevBuf src(dev, kSrcLen);
  if (src.p == nullptr) {
    w.fail("cudaMalloc");
    return 1;
  }
  auto braw = link.recv(60s);
  if (!braw) {
    w.fail("no descriptor from the target");
    return 1;
  }
  if (nvtest::str(*braw).starts_with("SKIP")) {
    w.say(nvtest::str(*braw));
    w.say("END");
    return 0;
  }
  const MrDesc dst = MrDesc::from_bytes(*braw);
  MrHandle sh;
  try {
    sh = e.reg_mr(src.p, kSrcLen, Device::cuda(dev)).first;
  } catch (const Error& err) {
    if (err.code() != Code::kUnimplemented) throw;
    w.say(std::string("SKIP: ") + err.what());
    w.ask("quit");
    w.say("END");
    return 0;
  }

  // --- registration checks: host memory as GPU memory and the reverse.
  {
    std::vector<uint8_t> host(1 << 20);
    try {
      e.reg_mr(host.data(), host.size(), Device::cuda(dev));
      w.fail("host memory registered as cuda: accepted");
    } catch (const Error& err) {
      const std::string msg = err.what();
      if (err.code() != Code::kInvalidArgument || msg.find("host memory") == std::string::npos)
        w.fail("host as cuda: wrong error: " + msg);
      else
        w.say("[ reg ] host memory as " + Device::cuda(dev).to_string() + ": " + msg);
    }
    try {
      e.reg_mr(src.p, 4096, Device::host());
      w.fail("GPU memory registered as host: accepted");
    } catch (const Error& err) {
      if (err.code() != Code::kInvalidArgument)
        w.fail(std::string("GPU as host: ") + err.what());
      else
        w.say(std::string("[ reg ] GPU memory as host: ") + err.what());
    }
    try {
      e.submit_single_write(4096, 1, sh, 0, dst, dst.len - 100, OnDone::none());
      w.fail("write past the end: accepted");
    } catch (const Error& err) {
      w.say(std::string("[ reg ] write past the end: ") + err.what());
    }
  }

  // FERRY_NVLINK_SEED: other random rounds than the fixed ones of CI.
  const char* seed_env = std::getenv("FERRY_NVLINK_SEED");
  std::mt19937_64 rng(seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10)
                                          : (provider == "nvlink" ? 7 : 11));
  auto rnd = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  std::vector<uint8_t> host_src(kSrcLen);
  uint64_t total_imms = 0, total_bytes = 0;
  // FERRY_NVLINK_ROUNDS: a longer run of the same random rounds (a soak).
  const char* rounds_env = std::getenv("FERRY_NVLINK_ROUNDS");
  const int kRounds = rounds_env != nullptr ? std::max(1, std::atoi(rounds_env)) : 24;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t seed = rng();
    test::fill_pattern(host_src.data(), kSrcLen, seed);
    cudaMemcpy(src.p, host_src.data(), kSrcLen, cudaMemcpyHostToDevice);
    if (w.ask("zero") != "ok") w.fail("zero");
    const uint32_t imm = 1000 + r;
    w.ask("counter " + std::to_string(imm));
    std::vector<Seg> segs;
    uint64_t expect = 0;
    std::atomic<bool> done{false}, failed{false};
    const int kind = r % 4;
    std::string what;
    if (kind == 0 && r % 8 == 0) {
      // One write of >= 4 MiB: copy engines, any alignment.
      const uint64_t len = rnd(4 << 20, 12 << 20);
      const uint64_t so = rnd(0, kSrcLen - len), doff = rnd(0, kTargetLen - len);
      e.submit_single_write(len, imm, sh, so, dst, doff, OnDone::flag(done, &failed));
      segs.push_back({doff, len, seed, so});
      expect = ImmPlan::single_write(len, WriteRoute{}, 1);
      what = "single " + std::to_string(len) + " B";
    } else if (kind == 0) {
      // 1-4 small writes back to back, any alignment, each in its own 8 MiB band:
      // a lone one on an idle GPU takes the copy engine, the others the kernel.
      const uint64_t k = rnd(1, 4);
      std::atomic<uint64_t> n_done{0}, n_failed{0};
      for (uint64_t t = 0; t < k; ++t) {
        const uint64_t len = rnd(1, 3 << 20), so = rnd(0, kSrcLen - len);
        const uint64_t doff = t * (8 << 20) + rnd(0, (8 << 20) - len);
        e.submit_single_write(len, imm, sh, so, dst, doff, OnDone::counter(n_done, &n_failed));
        segs.push_back({doff, len, seed, so});
        expect += ImmPlan::single_write(len, WriteRoute{}, 1);
      }
      failed = !nvtest::wait_count(n_done, k) || n_failed.load() != 0;
      done = true;
      what = std::to_string(k) + " single writes";
    } else if (kind == 1) {
      static const uint64_t kPages[] = {4096, 65536, 3000, 12345, 256 << 10};
      const uint64_t page = kPages[rnd(0, 4)];
      const uint64_t slots = kTargetLen / page, src_slots = kSrcLen / page;
      const size_t n = std::min<uint64_t>(rnd(1, 1024), slots);
      std::vector<uint32_t> all(slots);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      Pages sp, dp;
      sp.stride = dp.stride = page;
      for (size_t i = 0; i < n; ++i) {
        dp.indices.push_back(all[i]);
        sp.indices.push_back(uint32_t(rnd(0, src_slots - 1)));
        segs.push_back({all[i] * page, page, seed, sp.indices.back() * page});
      }
      e.submit_paged_writes(page, imm, sh, std::move(sp), dst, std::move(dp),
                            OnDone::flag(done, &failed));
      expect = ImmPlan::paged_writes(n);
      what = "paged " + std::to_string(n) + " x " + std::to_string(page) + " B";
    } else if (kind == 2) {
      std::vector<ScatterDst> dsts;
      for (int t = 0; t < 3; ++t) {
        const uint64_t len = rnd(1, 2 << 20), so = rnd(0, kSrcLen - len);
        const uint64_t doff = uint64_t(t) * (8 << 20) + rnd(0, 4 << 20);
        dsts.push_back({len, so, dst, doff});
        segs.push_back({doff, len, seed, so});
        expect += ImmPlan::scatter_target(len, GroupRoute{}, 1);
      }
      auto g = e.add_peer_group(std::vector<MrDesc>{dst, dst, dst});
      e.submit_scatter(g, OnDone::flag(done, &failed), imm, sh, std::move(dsts));
      what = "scatter 3 targets";
    } else {
      auto g = e.add_peer_group(std::vector<MrDesc>{dst, dst});
      e.submit_barrier(g, OnDone::flag(done, &failed), imm, {dst, dst});
      std::atomic<bool> d2{false}, f2{false};
      e.submit_imm(imm, dst, OnDone::flag(d2, &f2));
      if (!wait_flag(d2) || f2.load()) w.fail("submit_imm failed");
      expect = 2 * ImmPlan::barrier_target() + ImmPlan::imm();
      what = "barrier x2 + imm";
    }
    if (!wait_flag(done) || failed.load())
      w.fail("round " + std::to_string(r) + " (" + what + "): transfer failed");
    const std::string c = w.ask("count " + std::to_string(imm) + " " + std::to_string(expect));
    if (c != "ok 0") w.fail("round " + std::to_string(r) + " (" + what + "): immediates: " + c);
    link.send("verify");
    std::vector<uint8_t> raw(segs.size() * sizeof(Seg));
    std::memcpy(raw.data(), segs.data(), raw.size());
    link.send(raw);
    auto v = link.recv_str(120s);
    if (!v || *v != "ok")
      w.fail("round " + std::to_string(r) + " (" + what + "): " + (v ? *v : "no answer"));
    total_imms += expect;
    for (auto& s : segs) total_bytes += s.len;
  }
  w.say("[ " + provider + " ] " + std::to_string(kRounds) + " rounds, " +
        std::to_string(total_bytes) +
        " bytes verified on cuda:" + std::to_string(dst.device.ordinal) + ", " +
        std::to_string(total_imms) + " immediates counted exactly");

  // A freed region: the target registers a second region, we write to it, the target
  // unregisters and frees it; a write with the old descriptor must fail with a typed
  // error (nvlink: the region table's generation, kNotFound) and nothing else may
  // suffer: a write to the live region right after lands and is counted.
  {
    auto write_to = [&](const MrDesc& d, uint32_t imm) {
      return write_status(e, sh, 4096, imm, d);
    };
    const MrDesc extra = MrDesc::from_hex(w.ask("extra"));
    Status before = write_to(extra, 61);
    if (!before.is_ok()) w.fail("write to a second region: " + before.message());
    if (w.ask("unextra") != "ok") w.fail("unextra");
    Status stale = write_to(extra, 62);
    if (provider == "nvlink" && stale.code() != Code::kNotFound)
      w.fail("freed region: expected NOT_FOUND, got " + stale.to_string());
    else  // libfabric's shm checks no remote keys: reported, not asserted
      w.say("[ " + provider + " ] write to a freed region: " + stale.to_string());
    if (w.ask("counter 63") != "ok") w.fail("counter 63");
    Status after = write_to(dst, 63);
    const std::string c = w.ask("count 63 1");
    if (!after.is_ok() || c != "ok 0")
      w.fail("write after the freed-region error: " + after.to_string() + ", count " + c);
    else
      w.say("[ " + provider + " ] the next write to the live region landed and was counted");
  }

  if (provider == "nvlink") {
    // A descriptor of another host: same bytes, another boot id.
    MrDesc other = dst;
    std::vector<uint8_t> raw(other.nics[0].addr.raw().begin(), other.nics[0].addr.raw().end());
    raw[8] ^= 0xff;
    other.nics[0].addr = NetAddr(Transport::kNvlink, other.nics[0].addr.incarnation() ^ 1, raw);
    const Status got = write_status(e, sh, 4096, 5, other);
    if (got.code() != Code::kInvalidArgument)
      w.fail("foreign host: " + got.message());
    else
      w.say("[ nvlink ] descriptor of another host: " + got.message());

    // A CUDA error in the copy, last because it poisons this process's CUDA
    // context: a source region freed behind the engine's back (registered, then
    // cudaFree'd) makes the gather kernel fault. The transfer must fail with a
    // typed error naming the CUDA error, and what is submitted after it must
    // end (with an error: the context is gone) rather than hang.
    auto write_from = [&](MrHandle from, uint64_t len) {
      return write_status(e, from, len, 64, dst);
    };
    constexpr size_t kGone = 64 << 20;
    void* gone = nullptr;
    cudaMalloc(&gone, kGone);
    const MrHandle gh = e.reg_mr(gone, kGone, Device::cuda(dev)).first;
    cudaFree(gone);
    const Status bad = write_from(gh, 1 << 20);  // < 4 MiB: the gather kernel
    if (bad.is_ok() || bad.code() == Code::kDeadlineExceeded)
      w.fail("copy from freed memory: " + bad.to_string());
    else
      w.say("[ nvlink ] CUDA error in the copy: " + bad.to_string());
    const Status next = write_from(sh, 4096);
    if (next.code() == Code::kDeadlineExceeded)
      w.fail("the write after a CUDA error hung: " + next.to_string());
    else
      w.say("[ nvlink ] the write after it: " + next.to_string());
  }
  w.ask("quit");
  w.say("END");
  return w.failures == 0 ? 0 : 1;
}

class GpuPair : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuPair, RandomWritesVerifiedOnTheDeviceImmediatesExact) {
  const int gpus = nvtest::gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string provider = GetParam();
  const int dev_a = 0, dev_b = gpus > 1 ? 1 : 0;
  std::vector<std::string> report;
  auto [ra, rb] = nvtest::run_pair(
      [&](test::Channel& link, test::Channel& parent) {
        return writer_main(provider, dev_a, link, parent);
      },
      [&](test::Channel& link) {
        return nvtest::serve_gpu_target(link, nvtest::gpu_config(provider, dev_b), dev_b,
                                        kTargetLen);
      },
      &report);
  for (const auto& line : report)
    if (line.starts_with("SKIP")) GTEST_SKIP() << line;
  EXPECT_EQ(ra, 0) << "writer (cuda:" << dev_a << ")";
  EXPECT_EQ(rb, 0) << "target (cuda:" << dev_b << ")";
}

INSTANTIATE_TEST_SUITE_P(Providers, GpuPair, ::testing::Values("nvlink", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

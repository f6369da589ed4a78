// CPU cost of ferry's submit path with no network.
//
// Two levels:
//  1. The pieces reachable as library functions: sharding (plan_single,
//     plan_runs), the paged-request bounds check, and filling core::WriteDesc
//     the way Worker::fill_writes does (copied minimally: fill_writes is a
//     private member of the worker).
//  2. The whole path through the public API -- validation, command queue,
//     worker, sharding, fill_writes, post, completion, OnDone -- on the fake
//     NIC of src/testing (provider "fake") in its discard mode: it accepts
//     every post and completes it at the next poll without touching memory.
#include <benchmark/benchmark.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "core/calls_in_progress.h"
#include "core/domain.h"
#include "core/loop_lock.h"
#include "core/sharding.h"
#include "ferry/ferry.h"

namespace {

using ferry::core::WriteDesc;

// ------------------------------------------------------------- level 1

void BM_PlanSingle(benchmark::State& state) {
  const uint64_t len = uint64_t(state.range(0));
  const uint32_t nics = uint32_t(state.range(1));
  uint32_t rr = 0;
  for (auto _ : state) {
    auto p = ferry::core::plan_single(len, ferry::WriteRoute{}, nics, rr);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_PlanSingle)->Args({4 << 10, 1})->Args({64 << 20, 4});

void BM_PlanRuns(benchmark::State& state) {
  uint32_t rr = 0;
  for (auto _ : state) {
    auto p = ferry::core::plan_runs(uint32_t(state.range(0)), uint32_t(state.range(1)), rr);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_PlanRuns)->Args({1144, 4})->Args({10000, 4});

ferry::Pages make_pages(uint32_t n, uint64_t stride) {
  ferry::Pages p;
  p.stride = stride;
  for (uint32_t i = 0; i < n; ++i) p.indices.push_back((i * 7919u) % (n * 2));
  return p;
}

// The bounds check TransferEngine::submit_paged_writes does on each side.
void BM_ValidatePaged(benchmark::State& state) {
  auto pages = make_pages(uint32_t(state.range(0)), 64 << 10);
  for (auto _ : state) {
    uint32_t max = *std::max_element(pages.indices.begin(), pages.indices.end());
    uint64_t end = 0;
    bool overflow = __builtin_mul_overflow(uint64_t(max), pages.stride, &end) ||
                    __builtin_add_overflow(end, pages.offset, &end) ||
                    __builtin_add_overflow(end, uint64_t(4096), &end);
    benchmark::DoNotOptimize(overflow);
    benchmark::DoNotOptimize(end);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_ValidatePaged)->Arg(1144)->Arg(10000);

// plan_runs + a fill loop equivalent to Worker::fill_writes for paged
// requests, in batches of 64 (kPostsPerStep) per NIC.
void BM_ShardAndFillPaged(benchmark::State& state) {
  const uint32_t n = uint32_t(state.range(0)), nics = uint32_t(state.range(1));
  auto src = make_pages(n, 4096 + 128), dst = make_pages(n, 4096 + 128);
  std::vector<uint8_t> buf(64);
  WriteDesc batch[64];
  uint32_t units[64];
  uint32_t rr = 0;
  for (auto _ : state) {
    auto plan = ferry::core::plan_runs(n, nics, rr);
    for (uint32_t s = 0; s < plan.num_shards; ++s) {
      const auto& sh = plan.shards[s];
      for (uint32_t next = sh.begin; next < sh.end;) {
        size_t k = 0;
        for (; next < sh.end && k < 64; ++next) {
          units[k] = next;
          WriteDesc& w = batch[k++];
          w.ctx = (uint64_t(1) << 56) | s;
          w.has_imm = true;
          w.imm = 7;
          w.local_desc = nullptr;
          w.len = 4096;
          w.src = buf.data() + uint64_t(src.indices[next]) * src.stride;
          w.peer = sh.nic;
          w.remote_addr = 0x10000 + uint64_t(dst.indices[next]) * dst.stride;
          w.rkey = 42;
        }
        benchmark::DoNotOptimize(batch);
        benchmark::DoNotOptimize(units);
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ShardAndFillPaged)->Args({1144, 4})->Args({10000, 4})->Args({1144, 1});

// ------------------------------------------------------------- level 2

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// CPU of every thread of this process except the caller (the engine's
// worker and callback threads), from /proc/self/task/*/schedstat (ns).
uint64_t other_threads_cpu_ns() {
  const long self = ::syscall(SYS_gettid);
  uint64_t total = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || std::atol(e->d_name) == self) continue;
    char path[300];
    std::snprintf(path, sizeof(path), "/proc/self/task/%s/schedstat", e->d_name);
    if (FILE* f = std::fopen(path, "r")) {
      unsigned long long run = 0;
      if (std::fscanf(f, "%llu", &run) == 1) total += run;
      std::fclose(f);
    }
  }
  ::closedir(d);
  return total;
}

struct Rig {
  explicit Rig(int nics) {
    setenv("FERRY_LOG", "warn", 0);  // one engine per benchmark run: keep the output a table
    ferry::EngineConfig c;
    c.provider = "fake";
    c.groups[0].nic_names.assign(size_t(nics), "discard");
    engine = std::make_unique<ferry::TransferEngine>(c);
    // Pages are spread over 2x their count of slots (make_pages): 10 000 pages
    // of 4 KiB + 128 B fit in 96 MiB.
    src.resize(96 << 20);
    dst.resize(96 << 20);
    std::tie(h, std::ignore) = engine->reg_mr(src.data(), src.size());
    desc = engine->reg_mr(dst.data(), dst.size()).second;
  }
  void wait(uint64_t target) {
    // Spin so the next request follows at once and the worker never idles
    // into its adaptive spin (which would be billed as engine CPU). This
    // thread's CPU is not counted: only submit_* calls are.
    while (done.load(std::memory_order_acquire) < target) std::this_thread::yield();
  }
  std::unique_ptr<ferry::TransferEngine> engine;
  std::vector<uint8_t> src, dst;
  ferry::MrHandle h;
  ferry::MrDesc desc;
  std::atomic<uint64_t> done{0};
};

// Reports per work request (= one write the NIC gets): the submitting
// thread's CPU inside submit_*, the engine threads' CPU, and their sum.
void report(benchmark::State& state, uint64_t wrs, uint64_t submit_ns, uint64_t engine_ns) {
  double n = double(wrs);
  state.counters["submit_ns_per_wr"] = double(submit_ns) / n;
  state.counters["engine_ns_per_wr"] = double(engine_ns) / n;
  state.counters["cpu_ns_per_wr"] = double(submit_ns + engine_ns) / n;
  state.SetItemsProcessed(int64_t(wrs));
}

// `batch` paged requests of `pages` pages of 4 KiB over `nics` NICs per
// iteration, submitted back to back and waited for. batch > 1 keeps the
// worker from idling between requests, so its CPU is the steady-state cost.
void BM_EnginePaged(benchmark::State& state) {
  const uint32_t pages = uint32_t(state.range(0));
  const uint64_t batch = uint64_t(state.range(2));
  Rig rig(int(state.range(1)));
  auto src = make_pages(pages, 4096 + 128), dst = make_pages(pages, 4096 + 128);
  uint64_t submitted = 0, submit_ns = 0;
  const uint64_t engine0 = other_threads_cpu_ns();
  for (auto _ : state) {
    uint64_t t = thread_cpu_ns();
    for (uint64_t b = 0; b < batch; ++b)
      rig.engine->submit_paged_writes(4096, 7, rig.h, src, rig.desc, dst,
                                      ferry::OnDone::counter(rig.done));
    submit_ns += thread_cpu_ns() - t;
    submitted += batch;
    rig.wait(submitted);
  }
  report(state, submitted * pages, submit_ns, other_threads_cpu_ns() - engine0);
}
BENCHMARK(BM_EnginePaged)
    ->ArgNames({"pages", "nics", "batch"})
    ->Args({1144, 4, 1})
    ->Args({1144, 4, 16})
    ->Args({100, 4, 64})
    ->Args({10000, 4, 2})
    ->Args({1144, 1, 16})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Paged requests of `pages` pages as the same shape every time, unprepared
// (submit_paged_writes: validation, lookup and a copy of the page lists per
// request) against prepared (prepare_paged_writes once, then submit), in the
// same run. submit_ns_per_req is the submitting thread's cost per transfer.
void BM_EnginePagedPrepared(benchmark::State& state) {
  const uint32_t pages = uint32_t(state.range(0));
  const uint64_t batch = uint64_t(state.range(2));
  const bool prepared = state.range(3) != 0;
  Rig rig(int(state.range(1)));
  auto src = make_pages(pages, 4096 + 128), dst = make_pages(pages, 4096 + 128);
  ferry::PreparedTransfer p = rig.engine->prepare_paged_writes(4096, rig.h, src, rig.desc, dst);
  uint64_t submitted = 0, submit_ns = 0;
  const uint64_t engine0 = other_threads_cpu_ns();
  for (auto _ : state) {
    uint64_t t = thread_cpu_ns();
    for (uint64_t b = 0; b < batch; ++b) {
      if (prepared)
        rig.engine->submit(p, 7, ferry::OnDone::counter(rig.done));
      else
        rig.engine->submit_paged_writes(4096, 7, rig.h, src, rig.desc, dst,
                                        ferry::OnDone::counter(rig.done));
    }
    submit_ns += thread_cpu_ns() - t;
    submitted += batch;
    rig.wait(submitted);
  }
  report(state, submitted * pages, submit_ns, other_threads_cpu_ns() - engine0);
  state.counters["submit_ns_per_req"] = double(submit_ns) / double(submitted);
}
BENCHMARK(BM_EnginePagedPrepared)
    ->ArgNames({"pages", "nics", "batch", "prepared"})
    ->Args({128, 1, 16, 0})
    ->Args({128, 1, 16, 1})
    ->Args({128, 4, 16, 0})
    ->Args({128, 4, 16, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// `count` single writes of 4 KiB (one work request each) per iteration.
void BM_EngineSingles(benchmark::State& state) {
  const uint64_t count = uint64_t(state.range(0));
  Rig rig(int(state.range(1)));
  uint64_t submitted = 0, submit_ns = 0;
  const uint64_t engine0 = other_threads_cpu_ns();
  for (auto _ : state) {
    uint64_t t = thread_cpu_ns();
    for (uint64_t i = 0; i < count; ++i)
      rig.engine->submit_single_write(4096, 7, rig.h, (i % 1024) * 4096, rig.desc,
                                      (i % 1024) * 4096, ferry::OnDone::counter(rig.done));
    submit_ns += thread_cpu_ns() - t;
    submitted += count;
    rig.wait(submitted);
  }
  report(state, submitted, submit_ns, other_threads_cpu_ns() - engine0);
}
BENCHMARK(BM_EngineSingles)
    ->ArgNames({"writes", "nics"})
    ->Args({1144, 4})
    ->Args({1144, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The guard every public call takes (TransferEngine's Entered): count in,
// read the stopped flag, count out. One engine-wide counter against the
// per-thread shards of core::CallsInProgress, with 1 and 2 threads calling
// at once; on 2 threads the single counter's line moves between the cores
// twice per call.
std::atomic<bool> g_stopped{false};

void BM_CallGuardOneCounter(benchmark::State& state) {
  static std::atomic<int64_t> calls{0};
  for (auto _ : state) {
    calls.fetch_add(1, std::memory_order_seq_cst);
    benchmark::DoNotOptimize(g_stopped.load(std::memory_order_seq_cst));
    calls.fetch_sub(1, std::memory_order_seq_cst);
  }
}
BENCHMARK(BM_CallGuardOneCounter)->Threads(1)->Threads(2)->UseRealTime();

void BM_CallGuardSharded(benchmark::State& state) {
  static ferry::core::CallsInProgress calls;
  for (auto _ : state) {
    const size_t shard = calls.enter();
    benchmark::DoNotOptimize(g_stopped.load(std::memory_order_seq_cst));
    calls.leave(shard);
  }
}
BENCHMARK(BM_CallGuardSharded)->Threads(1)->Threads(2)->UseRealTime();

// What the engine's calls use: a slot of the calling thread's own
// (core/presence.h), no read-modify-write.
void BM_CallGuardPresence(benchmark::State& state) {
  static ferry::core::CallsInProgress calls;
  for (auto _ : state) {
    const ferry::core::CallsInProgress::Counted counted(calls);
    benchmark::DoNotOptimize(g_stopped.load(std::memory_order_seq_cst));
  }
}
BENCHMARK(BM_CallGuardPresence)->Threads(1)->Threads(2)->UseRealTime();

// The loop lock's try_lock and unlock, as every helping poll and inline post
// takes it: a mutex against core::LoopLock.
template <typename Lock>
void BM_LoopLock(benchmark::State& state) {
  static Lock lock;
  for (auto _ : state) {
    if (lock.try_lock()) lock.unlock();
  }
}
BENCHMARK_TEMPLATE(BM_LoopLock, std::mutex);
BENCHMARK_TEMPLATE(BM_LoopLock, ferry::core::LoopLock);

}  // namespace

BENCHMARK_MAIN();

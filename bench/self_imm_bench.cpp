// One engine's immediate to itself, round trip: the application thread submits
// `submit_imm` to its own engine and spins on the counter until the worker has
// posted it and counted it back. Two thread crossings (application -> worker,
// worker -> application) and ferry's path to and from the NIC, with no second
// process: what the submission hand-off costs, measured where two cores are
// enough (the application on one, a busy worker on the other).
//
// With --baselines (a libfabric provider), each round first runs the same
// round trip on the raw provider: by one thread that posts and polls
// ("raw"), and through a NIC thread on the worker's CPU that posts and polls
// for the application thread, which hands it each write and waits for each
// arrival through one cache line each way ("relay", the engine's thread
// layout without the engine). relay - raw is the cost of the two crossings,
// ferry - relay the engine's own path.
//
//   self_imm_bench [--provider fake|shm|tcp] [--cpus A,B] [--iters N] [--rounds R] [--baselines]
//                  [--on-worker] [--idle-polls] [--split] [--send-queue]
//
// Prints, per round and implementation, the p50 and p99 of the round trip in
// nanoseconds. With --idle-polls, also the cost of one poll that finds nothing:
// the raw provider's CQ read against ferry's try_consume on a counter nothing
// arrives for (the busy worker stepped aside, so the call polls the NIC
// itself): a spinning waiter sees an arrival at most one such poll late.
// With --split, also the p50 of the post call alone (raw: the write; ferry:
// submit_imm) within the round trip, so that the engine's share splits into
// the way out and the way back (the rest: polls until the arrival is taken).
// With --send-queue, also the round trip of a 64-byte message sent to the
// engine's own receive queue and popped there.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <rdma/fi_errno.h>
#include "core/cpu_relax.h"
#include "core/log.h"
#include "core/stats.h"
#include "ferry/ferry.h"

#include "raw_fabric.h"
#include "raw_relay.h"

namespace {

using Clock = std::chrono::steady_clock;

// Prints the p50 and p99 of one round's round trips, in nanoseconds.
void report(const std::string& what, size_t round, std::vector<double> rt) {
  std::sort(rt.begin(), rt.end());
  std::printf("%s round %zu: %zu round trips, p50 %.0f ns, p99 %.0f ns\n", what.c_str(), round,
              rt.size(), rt[rt.size() / 2], rt[rt.size() * 99 / 100]);
  std::fflush(stdout);
}

// Times `iters` round trips of one(), which returns false when one did not
// come back, and reports them. False when a round trip failed.
template <typename One>
bool time_round(const std::string& what, size_t round, size_t iters, One&& one) {
  std::vector<double> rt(iters);
  for (size_t i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    if (!one(t0 + std::chrono::seconds(10))) {
      std::fprintf(stderr, "%s: round trip %zu of round %zu did not come back in 10 s\n",
                   what.c_str(), i, round);
      return false;
    }
    rt[i] = double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  }
  report(what, round, std::move(rt));
  return true;
}

// Durations of the post call in each round trip (--split); empty when off.
struct PostTimes {
  bool on = false;
  std::vector<double> ns;
  template <typename Post>
  auto timed(Post&& post) {
    if (!on) return post();
    const auto t0 = Clock::now();
    auto r = post();
    ns.push_back(
        double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
    return r;
  }
  void report(const std::string& what, size_t round) {
    if (!on || ns.empty()) return;
    std::sort(ns.begin(), ns.end());
    std::printf("%s round %zu: post call p50 %.0f ns, p99 %.0f ns\n", what.c_str(), round,
                ns[ns.size() / 2], ns[ns.size() * 99 / 100]);
    std::fflush(stdout);
    ns.clear();
  }
};
PostTimes g_post;

// Spins until done() or the deadline; false on the deadline.
template <typename Done>
bool spin_until(Clock::time_point give_up, Done&& done) {
  for (uint32_t polls = 1; !done(); ++polls) {
    ferry::core::cpu_relax();
    if (polls % 4096 == 0 && Clock::now() > give_up) return false;
  }
  return true;
}

// Nanoseconds per call of poll(), `calls` times in a row.
template <typename Poll>
void report_idle(const std::string& what, size_t round, size_t calls, Poll&& poll) {
  const auto t0 = Clock::now();
  for (size_t i = 0; i < calls; ++i) poll();
  const double ns =
      double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  std::printf("%s round %zu: %zu empty polls, %.1f ns each\n", what.c_str(), round, calls,
              ns / double(calls));
  std::fflush(stdout);
}

// The raw provider, one endpoint writing to itself.
bool raw_rounds(const std::string& provider, size_t round, size_t iters, int worker_cpu,
                bool idle_polls) {
  using ferry_bench::RawEvent;
  ferry_bench::RawFabric rf(provider, {provider == "shm" ? "shm" : "lo"});
  std::vector<uint8_t> region(4096);
  const ferry_bench::RawRegion reg = rf.register_region(region.data(), region.size(), true);
  rf.insert_peer({rf.address(0)});
  RawEvent ev[32];
  const bool raw_ok = time_round(provider + " raw", round, iters, [&](Clock::time_point give_up) {
    bool back = false;
    auto poll = [&] {
      const size_t n = rf.poll(0, ev, 32);
      for (size_t i = 0; i < n; ++i) back |= ev[i].kind == RawEvent::Kind::kRemoteData;
    };
    // The first write to an address may wait for the provider's connection.
    int ret = -FI_EAGAIN;
    if (!spin_until(give_up,
                    [&] {
                      if ((ret = g_post.timed([&] {
                            return rf.write(0, region.data(), 0, reg.bases[0], reg.keys[0], 7, 1);
                          })) == -FI_EAGAIN)
                        poll();
                      return ret != -FI_EAGAIN;
                    }) ||
        ret != 0)
      return false;
    return spin_until(give_up, [&] {
      poll();
      return back;
    });
  });
  if (!raw_ok) return false;
  g_post.report(provider + " raw", round);
  if (idle_polls) report_idle(provider + " raw", round, iters, [&] { rf.poll(0, ev, 32); });
  ferry_bench::RawRelay relay(rf, worker_cpu, false, region.data(), reg.bases[0], reg.keys[0], 7);
  uint64_t sent = 0;
  const bool relay_ok =
      time_round(provider + " relay", round, iters, [&](Clock::time_point give_up) {
        relay.request();
        ++sent;
        return spin_until(give_up, [&] { return relay.arrived() >= sent; });
      });
  if (!relay.error().empty()) std::fprintf(stderr, "%s\n", relay.error().c_str());
  return relay_ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "fake";
  int app_cpu = 0, worker_cpu = 1;
  size_t iters = 200000, rounds = 3;
  bool baselines = false, on_worker = false, idle_polls = false, send_queue = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--provider") {
      provider = next();
      if (provider == "tcp") provider = "tcp;ofi_rxm";
    } else if (a == "--cpus") {
      std::string v = next();
      if (std::sscanf(v.c_str(), "%d,%d", &app_cpu, &worker_cpu) != 2) return 2;
    } else if (a == "--iters") {
      iters = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--rounds") {
      rounds = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--baselines") {
      baselines = true;
    } else if (a == "--on-worker") {
      on_worker = true;
    } else if (a == "--idle-polls") {
      idle_polls = true;
    } else if (a == "--send-queue") {
      send_queue = true;
    } else if (a == "--split") {
      g_post.on = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--provider P] [--cpus A,B] [--iters N] [--rounds R] [--baselines] "
                   "[--on-worker] [--idle-polls] [--split] [--send-queue]\n",
                   argv[0]);
      return 2;
    }
  }
  if (g_post.on) g_post.ns.reserve(iters + 1024);
  setenv("FERRY_LOG", "warn", 0);
  ferry::core::pin_current_thread(app_cpu, "self_imm_bench");
  if (baselines && provider == "fake") {
    std::fprintf(stderr, "--baselines needs a libfabric provider\n");
    return 2;
  }
  for (size_t r = 0; r < rounds; ++r) {
    if (baselines && !raw_rounds(provider, r, iters, worker_cpu, idle_polls)) return 1;
    // A fresh engine per round: its busy worker would otherwise spin on the
    // CPU the relay's NIC thread takes.
    ferry::EngineConfig c;
    c.provider = provider;
    c.poll_mode = ferry::PollMode::kBusy;
    c.groups[0].worker_cpu = worker_cpu;
    ferry::TransferEngine e(c);
    std::vector<uint8_t> region(4096);
    auto [h, desc] = e.reg_mr(region.data(), region.size());
    (void)h;
    auto counter = e.imm_counter(7);
    bool ok = time_round(
        provider + (baselines ? " ferry" : ""), r, iters, [&](Clock::time_point give_up) {
          g_post.timed([&] { return e.submit_imm(7, desc, ferry::OnDone::none()); });
          return spin_until(give_up, [&] { return counter.try_consume(1); });
        });
    g_post.report(provider + (baselines ? " ferry" : ""), r);
    if (ok && idle_polls) {
      // Ask the worker to step aside, then time the polls of a waiter that
      // finds nothing.
      auto never = e.imm_counter(9);
      for (int i = 0; i < 100000; ++i) never.try_consume(1);
      report_idle(provider + " ferry", r, iters, [&] {
        if (never.try_consume(1)) std::abort();
      });
    }
    if (ok && send_queue) {
      // A 64-byte message sent to the engine's own receive queue and popped
      // there (ferry-bench's sendrecv-q, with no second process).
      ferry::RecvQueue queue = e.recv_queue(64, 64);
      std::vector<uint8_t> msg(64, 1);
      const ferry::NetAddr self = desc.nics[0].addr;
      ok = time_round(provider + " ferry sendrecv-q", r, iters, [&](Clock::time_point give_up) {
        e.submit_send(self, msg, ferry::OnDone::none());
        return spin_until(give_up, [&] { return queue.try_pop().valid(); });
      });
    }
    if (ok && on_worker) {
      // The same loop run by the worker alone: each arrival's callback, on
      // the worker, submits the next immediate. No thread crossing: the
      // engine's own path against the raw loop's.
      e.remove_imm_count(7);
      std::vector<int64_t> at(iters + 1);
      std::atomic<size_t> seen{0};
      e.expect_imm_count(
          8, 1,
          [&] {
            const size_t i = seen.load(std::memory_order_relaxed);
            at[i] = ferry::core::now_ns();
            seen.store(i + 1, std::memory_order_release);
            if (i < iters) e.submit_imm(8, desc, ferry::OnDone::none());
          },
          ferry::CallbackOn::kWorker);
      e.submit_imm(8, desc, ferry::OnDone::none());
      ok = spin_until(Clock::now() + std::chrono::seconds(30),
                      [&] { return seen.load(std::memory_order_acquire) == iters + 1; });
      if (ok) {
        std::vector<double> rt(iters);
        for (size_t i = 0; i < iters; ++i) rt[i] = double(at[i + 1] - at[i]);
        report(provider + " on-worker", r, std::move(rt));
      } else {
        std::fprintf(stderr, "on-worker: %zu of %zu round trips in 30 s\n", seen.load(), iters);
      }
    }
    e.stop();
    if (!ok) return 1;
  }
  return 0;
}

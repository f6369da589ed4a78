// One engine's immediate to itself, round trip: the application thread submits
// `submit_imm` to its own engine and spins on the counter until the worker has
// posted it and counted it back. Two thread crossings (application -> worker,
// worker -> application) and ferry's path to and from the NIC, with no second
// process: what the submission hand-off costs, measured where two cores are
// enough (the application on one, a busy worker on the other).
//
//   self_imm_bench [--provider fake|shm|tcp] [--cpus A,B] [--iters N] [--rounds R]
//
// Prints, per round, the p50 and p99 of the round trip in nanoseconds.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_relax.h"
#include "core/log.h"
#include "ferry/ferry.h"

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "fake";
  int app_cpu = 0, worker_cpu = 1;
  size_t iters = 200000, rounds = 3;
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
    } else {
      std::fprintf(stderr, "usage: %s [--provider P] [--cpus A,B] [--iters N] [--rounds R]\n",
                   argv[0]);
      return 2;
    }
  }
  setenv("FERRY_LOG", "warn", 0);
  ferry::core::pin_current_thread(app_cpu, "self_imm_bench");
  ferry::EngineConfig c;
  c.provider = provider;
  c.poll_mode = ferry::PollMode::kBusy;
  c.groups[0].worker_cpu = worker_cpu;
  ferry::TransferEngine e(c);
  std::vector<uint8_t> region(4096);
  auto [h, desc] = e.reg_mr(region.data(), region.size());
  (void)h;
  auto counter = e.imm_counter(7);
  std::vector<double> rt(iters);
  for (size_t r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      e.submit_imm(7, desc, ferry::OnDone::none());
      const auto give_up = t0 + std::chrono::seconds(10);
      for (uint32_t polls = 1; !counter.try_consume(1); ++polls) {
        ferry::core::cpu_relax();
        if (polls % 4096 == 0 && Clock::now() > give_up) {
          std::fprintf(stderr, "immediate %zu of round %zu did not come back in 10 s\n", i, r);
          return 1;
        }
      }
      rt[i] =
          double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
    std::vector<double> s = rt;
    std::sort(s.begin(), s.end());
    std::printf("%s round %zu: %zu round trips, p50 %.0f ns, p99 %.0f ns\n", provider.c_str(), r,
                iters, s[s.size() / 2], s[s.size() * 99 / 100]);
  }
  e.stop();
  return 0;
}

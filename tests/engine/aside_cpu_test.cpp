// A busy worker that stepped aside for a spinning thread sleeps on its
// eventfd rather than spinning (EngineConfig::busy_step_aside,
// src/core/worker_idle.cpp): its CPU time while aside. Run alone (RUN_SERIAL):
// on a loaded machine the spinner is descheduled, the worker takes its NICs
// back meanwhile and spins as a busy worker does, which is not what is
// measured here. An adaptive worker stays aside only while its helpers find
// arrivals (step_aside_test.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

class AsideCpu : public ::testing::TestWithParam<std::string> {};

// CPU seconds used so far by this process's threads named `name` (the
// engine names its worker threads ferry-worker<group>).
double thread_cpu_seconds(const std::string& name) {
  double total = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(t.path() / "comm");
    std::string c;
    std::getline(comm, c);
    if (c != name) continue;
    std::ifstream stat(t.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // Fields after the command's closing parenthesis: state is field 3,
    // utime and stime fields 14 and 15, in clock ticks.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int f = 3; f <= 15 && rest >> field; ++f) {
      if (f == 14) utime = std::stoull(field);
      if (f == 15) stime = std::stoull(field);
    }
    total += double(utime + stime) / double(sysconf(_SC_CLK_TCK));
  }
  return total;
}

// A worker that stepped aside sleeps: while a thread spins on a counter, the
// worker uses little CPU (spinning there, it used a core of its own, and
// slowed the spinner where the two share a physical core or a power budget).
TEST_P(AsideCpu, AWorkerAsideLeavesItsCore) {
  EngineConfig c = test::config_for(GetParam());
  c.poll_mode = PollMode::kBusy;
  TransferEngine a(c);
  auto never = a.imm_counter(47);
  const uint64_t asides = wake_counters().asides.load();
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load()) never.try_consume(1);
  });
  const bool aside = test::wait_until([&] { return wake_counters().asides.load() > asides; }, 10s);
  const double c0 = thread_cpu_seconds("ferry-worker0");
  const auto w0 = std::chrono::steady_clock::now();
  // A window of a second (CPU times count in clock ticks of 10 ms).
  test::wait_until([&] { return std::chrono::steady_clock::now() - w0 > 1s; }, 10s);
  const double used = thread_cpu_seconds("ferry-worker0") - c0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  stop = true;
  spinner.join();
  ASSERT_TRUE(aside) << "the worker never stepped aside";
  EXPECT_LT(used, 0.35 * wall) << "the worker used " << used << " s of CPU in " << wall
                               << " s while aside: it did not sleep";
}

INSTANTIATE_TEST_SUITE_P(Providers, AsideCpu, ::testing::Values("fake", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

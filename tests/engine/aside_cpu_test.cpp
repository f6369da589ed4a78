// A busy worker that stepped aside for a spinning thread sleeps on its
// eventfd rather than spinning (EngineConfig::busy_step_aside,
// src/core/worker_idle.cpp): its CPU time while aside. Run alone (RUN_SERIAL):
// on a loaded machine the spinner is descheduled, the worker takes its NICs
// back meanwhile and spins as a busy worker does, which is not what is
// measured here. An adaptive worker stays aside only while its helpers find
// arrivals (step_aside_test.cpp).
#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/thread_cpu.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using core::wake_counters;

class AsideCpu : public ::testing::TestWithParam<std::string> {};

// A worker that stepped aside sleeps: while a thread spins on a counter, the
// worker uses little CPU (spinning there, it used a core of its own, and
// slowed the spinner where the two share a physical core or a power budget).
TEST_P(AsideCpu, AWorkerAsideLeavesItsCore) {
  EngineConfig c = test::config_for(GetParam());
  c.poll_mode = PollMode::kBusy;
  TransferEngine a(c);
  // The engine names its worker threads ferry-worker<group>.
  const pid_t worker = test::find_thread("ferry-worker0");
  ASSERT_NE(worker, 0) << "no thread named ferry-worker0";
  auto never = a.imm_counter(47);
  const uint64_t asides = wake_counters().asides.load();
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load()) never.try_consume(1);
  });
  const bool aside = test::wait_until([&] { return wake_counters().asides.load() > asides; }, 10s);
  const double c0 = test::thread_cpu_seconds(worker);
  const auto w0 = std::chrono::steady_clock::now();
  // A window of a second (CPU times count in clock ticks of 10 ms).
  test::wait_until([&] { return std::chrono::steady_clock::now() - w0 > 1s; }, 10s);
  const double used = test::thread_cpu_seconds(worker) - c0;
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

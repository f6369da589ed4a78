// Stopping an engine while a peer's writes land in its memory, over libfabric.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/wake.h"
#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

int iterations() {
  const char* env = std::getenv("FERRY_STOP_ITERATIONS");
  return env != nullptr ? std::atoi(env) : 30;
}

// The receiver is stopped (its domains closed) while the sender streams
// 256 KiB writes into it. Closing an endpoint with transfers in flight must
// not crash the receiver, and every one of the sender's transfers ends (ok or
// an error) within its deadline.
TEST(FabricStopTest, ReceiverStopsWhileSenderWrites) {
  constexpr uint64_t kRegion = 8 << 20, kWrite = 256 << 10;
  constexpr int kWrites = 256;
  auto cfg = test::config_for("tcp");
  cfg.default_deadline = 5s;
  test::Buffer src(kRegion), dst(kRegion);
  TransferEngine sender(cfg);
  auto [sh, sdesc] = sender.reg_mr(src.get(), kRegion);
  for (int it = 0; it < iterations(); ++it) {
    auto receiver = std::make_unique<TransferEngine>(cfg);
    auto [rh, rdesc] = receiver->reg_mr(dst.get(), kRegion);
    auto arrivals = receiver->imm_counter(5);
    std::atomic<uint64_t> done{0}, errors{0};
    for (int i = 0; i < kWrites; ++i) {
      const uint64_t off = uint64_t(i) * kWrite % kRegion;
      sender.submit_single_write(kWrite, 5, sh, off, rdesc, off, OnDone::counter(done, &errors));
    }
    // Stop once data is landing, with most writes still in flight.
    ASSERT_TRUE(test::wait_until([&] { return arrivals.value() > 0; }, 10s)) << "iteration " << it;
    receiver->stop();
    receiver.reset();
    ASSERT_TRUE(test::wait_until([&] { return done.load() == kWrites; }, cfg.default_deadline + 5s))
        << "iteration " << it << ": " << done.load() << " of " << kWrites << " ended";
  }
}

// Two shm engines of one process. libfabric 1.17's shm provider reaches a peer
// endpoint of the same process through that endpoint's own mapping of its
// region. The sender stops right after its first write to a receiver whose
// worker naps, so the connection request that write sent is still unread when
// the sender's endpoint closes; the receiver reads it afterwards (waking from
// its nap, or draining at its own stop) and must find the sender's region still
// mapped (src/fabric/shm_parking.h). Without that, the receiver's thread died
// with SIGSEGV in the provider within a few iterations.
TEST(FabricStopTest, ShmSenderStopsBeforeItsSameProcessPeerReadItsFirstWrite) {
  EngineConfig napping = test::config_for("shm");
  napping.poll_mode = PollMode::kAdaptive;
  napping.spin_before_block = 0us;
  test::Buffer src(4096), dst(4096);
  const int rounds = std::max(iterations(), 100);
  for (int it = 0; it < rounds; ++it) {
    TransferEngine receiver(napping);
    auto [rh, rdesc] = receiver.reg_mr(dst.get(), 4096);
    ASSERT_TRUE(test::wait_until([] { return core::wake_counters().asleep.load() > 0; }, 10s))
        << "iteration " << it << ": the receiver's worker never napped";
    std::atomic<uint64_t> done{0}, errors{0};
    {
      TransferEngine sender(test::config_for("shm"));
      auto [sh, sdesc] = sender.reg_mr(src.get(), 4096);
      sender.submit_single_write(64, 9, sh, 0, rdesc, 0, OnDone::counter(done, &errors));
      sender.stop();
    }
    EXPECT_EQ(done.load(), 1u) << "iteration " << it;  // delivered, or cancelled by the stop
    receiver.stop();
  }
}

}  // namespace
}  // namespace ferry

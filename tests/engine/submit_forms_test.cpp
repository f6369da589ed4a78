// The two forms a submission takes in a worker's ring (core/requests.h): a
// request in the command's variant, or an immediate with no OnDone to a group
// of one NIC whole in the command's first line (FastImm). Both forms share
// the ring's cells, lap after lap, so each must leave a cell the other can
// take; both are admitted and must give their admission back.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

class SubmitForms : public ::testing::TestWithParam<std::string> {};

// More submissions than the ring has cells (256), the forms interleaved: a
// fast immediate, an immediate with a counter, a write with an immediate, a
// send. Every one arrives once, with its bytes.
TEST_P(SubmitForms, BothFormsShareTheRingsCellsLapAfterLap) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  constexpr int kRounds = 300;
  constexpr size_t kLen = 64;
  auto src = test::region(a, kRounds * kLen);
  for (size_t i = 0; i < src.buf.size(); ++i) src.buf[i] = uint8_t(i * 7 + 1);
  auto dst = test::region(b, kRounds * kLen);
  auto fast = b.imm_counter(11), counted = b.imm_counter(12), written = b.imm_counter(13);
  std::atomic<uint64_t> recvs{0};
  std::vector<uint8_t> last_msg;
  b.submit_recvs(64, 16, [&](std::span<const uint8_t> m) {
    last_msg.assign(m.begin(), m.end());
    recvs++;
  });
  std::atomic<uint64_t> done{0}, errors{0};
  for (int i = 0; i < kRounds; ++i) {
    a.submit_imm(11, dst.d, OnDone::none());  // the one-line form on one NIC
    a.submit_imm(12, dst.d, OnDone::counter(done, &errors));
    a.submit_single_write(kLen, 13, src.h, i * kLen, dst.d, i * kLen,
                          OnDone::counter(done, &errors));
    if (i % 16 == 0) {
      const uint8_t msg[3] = {uint8_t(i), 1, 2};
      a.submit_send(b.main_address(), msg, OnDone::counter(done, &errors));
      ASSERT_TRUE(test::wait_until([&] { return recvs.load() == uint64_t(i / 16 + 1); }, 20s))
          << "send of round " << i;
      ASSERT_EQ(last_msg.size(), 3u);
      EXPECT_EQ(last_msg[0], uint8_t(i));
    }
    // A few rounds in flight at a time, so that the cells of both forms mix.
    if (i % 8 == 7) {
      ASSERT_TRUE(fast.wait(8, 20s).is_ok()) << "round " << i;
      ASSERT_TRUE(counted.wait(8, 20s).is_ok()) << "round " << i;
      ASSERT_TRUE(written.wait(8, 20s).is_ok()) << "round " << i;
    }
  }
  const uint64_t sends = (kRounds + 15) / 16;
  // Remote visibility only through immediates: a write's local completion
  // may come before its bytes land (shm).
  ASSERT_TRUE(fast.wait(kRounds % 8, 20s).is_ok());
  ASSERT_TRUE(counted.wait(kRounds % 8, 20s).is_ok());
  ASSERT_TRUE(written.wait(kRounds % 8, 20s).is_ok());
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 2 * kRounds + sends; }, 20s))
      << done.load();
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(fast.value(), 0);
  EXPECT_EQ(counted.value(), 0);
  EXPECT_EQ(written.value(), 0);
  EXPECT_EQ(std::memcmp(dst.buf.data(), src.buf.data(), kRounds * kLen), 0);
}

// The one-line form is admitted like any request and gives its admission back
// when it ends: with room for two requests in flight and refusal when full,
// thousands of them one after another never find the group full.
TEST_P(SubmitForms, FastImmediatesGiveTheirAdmissionBack) {
  EngineConfig c = test::config_for(GetParam());
  c.max_requests_in_flight = 2;
  c.queue_full = QueueFull::kRefuse;
  TransferEngine a(c), b(test::config_for(GetParam()));
  auto dst = test::region(b, 4096);
  auto got = b.imm_counter(5);
  for (int i = 0; i < 2000; ++i) {
    a.submit_imm(5, dst.d, OnDone::none());
    ASSERT_TRUE(got.wait(1, 20s).is_ok()) << "immediate " << i;
    // The sender's completion may trail the receiver's arrival: wait for the
    // sender's worker to end it before the next one may need its room.
    ASSERT_TRUE(test::wait_until([&] { return a.stats().transfers_ok() == uint64_t(i + 1); }, 20s))
        << "immediate " << i << " never ended";
  }
}

// Queued one-line immediates at stop give their admission back too, and
// nothing they name is touched after the engine is gone.
TEST_P(SubmitForms, StopWithFastImmediatesQueuedEndsCleanly) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine b(c);
  auto dst = test::region(b, 4096);
  for (int round = 0; round < 5; ++round) {
    TransferEngine a(c);
    for (int i = 0; i < 500; ++i) a.submit_imm(9, dst.d, OnDone::none());
    a.stop();
    EXPECT_THROW(a.submit_imm(9, dst.d, OnDone::none()), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, SubmitForms, ::testing::Values("fake", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

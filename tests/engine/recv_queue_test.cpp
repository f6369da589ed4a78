// Receiving by polling (ferry/recv_queue.h) on the fake NIC, tcp;ofi_rxm and
// shm: every message is taken once with its bytes; a held message keeps its
// buffer and its bytes; waits end at their deadline or at stop; a message
// outlives its engine.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class RecvQueues : public ::testing::TestWithParam<std::string> {};

// Message i: its index in the first 4 bytes, then bytes i + k.
std::vector<uint8_t> message(uint32_t i, size_t len) {
  std::vector<uint8_t> m(len);
  std::memcpy(m.data(), &i, 4);
  for (size_t k = 4; k < len; ++k) m[k] = uint8_t(i + k);
  return m;
}

uint32_t check_message(std::span<const uint8_t> d, size_t len) {
  EXPECT_EQ(d.size(), len);
  uint32_t i = 0;
  std::memcpy(&i, d.data(), 4);
  for (size_t k = 4; k < d.size(); ++k)
    if (d[k] != uint8_t(i + k)) {
      ADD_FAILURE() << "message " << i << " byte " << k;
      break;
    }
  return i;
}

// 3000 messages through 4 buffers: each is taken exactly once with its bytes,
// and the sender never needs more than the buffers given back.
TEST_P(RecvQueues, EveryMessageTakenOnceWithItsBytes) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  RecvQueue q = b.recv_queue(64, 4);
  ASSERT_TRUE(q.valid());
  EXPECT_EQ(q.buffer_len(), 64u);
  EXPECT_EQ(q.buffer_count(), 4u);
  constexpr uint32_t kMessages = 3000;
  std::thread sender([&] {
    for (uint32_t i = 0; i < kMessages; ++i)
      a.submit_send(b.main_address(), message(i, 40), OnDone::none());
  });
  std::vector<int> seen(kMessages);
  for (uint32_t n = 0; n < kMessages; ++n) {
    RecvMessage m;
    ASSERT_TRUE(q.pop(m, 20s).is_ok()) << "after " << n;
    const uint32_t i = check_message(m.data(), 40);
    ASSERT_LT(i, kMessages);
    ++seen[i];
  }
  sender.join();
  for (uint32_t i = 0; i < kMessages; ++i) ASSERT_EQ(seen[i], 1) << i;
  RecvMessage none;
  EXPECT_EQ(q.pop(none, 10ms).code(), Code::kDeadlineExceeded);
}

// The application holds every buffer: nothing more is received until it lets
// one go, and what it holds keeps its bytes meanwhile.
TEST_P(RecvQueues, HeldMessagesKeepTheirBuffersAndBytes) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  RecvQueue q = b.recv_queue(32, 3);
  for (uint32_t i = 0; i < 6; ++i) a.submit_send(b.main_address(), message(i, 32), OnDone::none());
  std::vector<RecvMessage> held(3);
  for (auto& m : held) ASSERT_TRUE(q.pop(m, 20s).is_ok());
  // The other three are sent and wait for a buffer: none can arrive.
  RecvMessage extra;
  EXPECT_EQ(q.pop(extra, 50ms).code(), Code::kDeadlineExceeded);
  EXPECT_FALSE(q.try_pop().valid());
  std::vector<int> seen(6);
  for (auto& m : held) ++seen[check_message(m.data(), 32)];
  for (int k = 0; k < 3; ++k) {
    held[k].release();
    EXPECT_FALSE(held[k].valid());
    RecvMessage m;
    ASSERT_TRUE(q.pop(m, 20s).is_ok()) << k;
    ++seen[check_message(m.data(), 32)];
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(seen[i], 1) << i;
}

TEST_P(RecvQueues, SpinningTakerAndTryPop) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  RecvQueue q = b.recv_queue(16, 2);
  for (uint32_t i = 0; i < 200; ++i) {
    a.submit_send(b.main_address(), message(i, 16), OnDone::none());
    RecvMessage m;
    if (i % 2 == 0) {
      ASSERT_TRUE(q.pop(m, 20s, ImmCounter::WaitMode::kSpin).is_ok()) << i;
    } else {
      const auto until = Clock::now() + 20s;
      while (!(m = q.try_pop()).valid()) ASSERT_LT(Clock::now(), until) << i;
    }
    EXPECT_EQ(check_message(m.data(), 16), i);
  }
}

// Takers share the queue: the messages are split between them, each taken
// once, none lost, even when a taker stalls between its takes (a lost message
// ends the wait at its deadline and fails the count).
TEST_P(RecvQueues, ThreeTakersShareTheMessages) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  RecvQueue q = b.recv_queue(16, 8);
  constexpr uint32_t kMessages = 3000;
  std::vector<std::atomic<int>> seen(kMessages);
  std::atomic<uint32_t> taken{0};
  const auto until = Clock::now() + 60s;
  auto take = [&](int who) {
    uint32_t mine = 0;
    while (taken.load() < kMessages && Clock::now() < until) {
      RecvMessage m;
      const Status st = q.pop(m, 20ms);
      if (st.code() == Code::kDeadlineExceeded) continue;
      ASSERT_TRUE(st.is_ok()) << st.message();
      seen[check_message(m.data(), 16)].fetch_add(1);
      taken.fetch_add(1);
      // One taker lets others run past it now and then, holding its message.
      if (who == 0 && ++mine % 16 == 0) std::this_thread::yield();
    }
  };
  std::thread t1(take, 0), t2(take, 1), t3(take, 2);
  for (uint32_t i = 0; i < kMessages; ++i)
    a.submit_send(b.main_address(), message(i, 16), OnDone::none());
  t1.join();
  t2.join();
  t3.join();
  ASSERT_EQ(taken.load(), kMessages);
  for (uint32_t i = 0; i < kMessages; ++i) ASSERT_EQ(seen[i].load(), 1) << i;
}

// stop() wakes a taker waiting on an empty queue; messages that arrived
// before the stop are still handed out, and released after it harmlessly.
TEST_P(RecvQueues, StopWakesTakersAndLeavesWhatArrived) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c);
  auto b = std::make_unique<TransferEngine>(c);
  RecvQueue q = b->recv_queue(16, 4);
  for (uint32_t i = 0; i < 3; ++i) a.submit_send(b->main_address(), message(i, 16), OnDone::none());
  const auto until = Clock::now() + 20s;
  while (q.size_approx() < 3) {
    ASSERT_LT(Clock::now(), until);
    std::this_thread::yield();
  }
  // Made only now: the pools of an engine share its incoming messages, and
  // nothing is sent after this.
  RecvQueue idle = b->recv_queue(16, 1);
  Status waited;
  std::thread taker([&] {
    RecvMessage m;
    waited = idle.pop(m, 60s);
  });
  const auto t0 = Clock::now();
  b->stop();
  taker.join();
  EXPECT_EQ(waited.code(), Code::kCancelled);
  EXPECT_LT(Clock::now() - t0, 20s);
  std::vector<RecvMessage> left(3);
  for (auto& m : left) ASSERT_TRUE(q.pop(m, 1s).is_ok());
  RecvMessage none;
  EXPECT_EQ(q.pop(none, 1s).code(), Code::kCancelled);
  // The engine goes away; the messages' bytes stay readable, and letting
  // them go touches nothing of it.
  b.reset();
  std::vector<int> seen(3);
  for (auto& m : left) ++seen[check_message(m.data(), 16)];
  for (int i = 0; i < 3; ++i) EXPECT_EQ(seen[i], 1);
  left.clear();
  EXPECT_FALSE(q.try_pop().valid());
}

TEST_P(RecvQueues, MisuseIsRefused) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine b(c);
  EXPECT_EQ(test::code_of([&] { b.recv_queue(0, 4); }), Code::kInvalidArgument);
  EXPECT_EQ(test::code_of([&] { b.recv_queue(16, 0); }), Code::kInvalidArgument);
  RecvQueue empty;
  RecvMessage m;
  EXPECT_EQ(empty.pop(m, 1ms).code(), Code::kFailedPrecondition);
  EXPECT_FALSE(empty.try_pop().valid());
  b.stop();
  EXPECT_EQ(test::code_of([&] { b.recv_queue(16, 4); }), Code::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Providers, RecvQueues, ::testing::Values("fake", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

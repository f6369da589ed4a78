// The two forms a submission takes in a worker's ring (core/requests.h): a
// request in the command's variant, or a command whole in its first line (an
// immediate or a send with no OnDone, a receive buffer going back to the
// NIC). Both forms share the ring's cells, lap after lap, so each must leave
// a cell the other can take; both are admitted and must give their admission
// (and a send its buffer) back. Receive callbacks may run on the worker.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
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
  // Counted once each, whether the NIC reports a completion (tcp) or the
  // immediate is done at its post (shm).
  const EngineStats s = a.stats();
  EXPECT_EQ(s.writes_posted(), 2000u);
  EXPECT_EQ(s.writes_completed(), 2000u);
  EXPECT_EQ(s.transfers_failed(), 0u);
}

// One-line immediates from several threads at once, each thread waiting for
// its own to arrive, while another thread spins on a counter of the sender's
// (and so polls its NICs, holding its loop lock at times): each submission
// either posts at once from its own thread or, finding the lock taken or a
// command queued, goes through the ring. Under both polling modes every
// immediate arrives once and ends once as a success.
TEST_P(SubmitForms, FastImmediatesFromManyThreadsArriveOnceEach) {
  for (const PollMode mode : {PollMode::kAdaptive, PollMode::kBusy}) {
    SCOPED_TRACE(mode == PollMode::kBusy ? "busy" : "adaptive");
    EngineConfig c = test::config_for(GetParam());
    c.poll_mode = mode;
    TransferEngine a(c), b(test::config_for(GetParam()));
    auto dst = test::region(b, 4096);
    auto never = a.imm_counter(22);
    constexpr uint32_t kThreads = 3;
    constexpr int kEach = 1500;
    std::vector<ImmCounter> got;
    for (uint32_t t = 0; t < kThreads; ++t) got.push_back(b.imm_counter(30 + t));
    std::atomic<bool> stop_spin{false};
    std::atomic<uint64_t> spins{0};
    std::thread spinner([&] {
      while (!stop_spin.load(std::memory_order_relaxed)) {
        EXPECT_FALSE(never.try_consume(1));
        spins.fetch_add(1, std::memory_order_relaxed);
      }
    });
    std::atomic<int> lost{0};
    std::vector<std::thread> submitters;
    for (uint32_t t = 0; t < kThreads; ++t)
      submitters.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          a.submit_imm(30 + t, dst.d, OnDone::none());
          if (!got[t].wait(1, 20s).is_ok()) {
            lost++;
            return;
          }
        }
      });
    for (auto& t : submitters) t.join();
    constexpr uint64_t kTotal = uint64_t(kThreads) * kEach;
    EXPECT_EQ(lost.load(), 0);
    EXPECT_TRUE(test::wait_until([&] { return a.stats().transfers_ok() == kTotal; }, 20s))
        << a.stats().transfers_ok();
    stop_spin = true;
    spinner.join();
    EXPECT_GT(spins.load(), 0u);
    // Counted twice, one would show here: the sender ended them all.
    for (uint32_t t = 0; t < kThreads; ++t) EXPECT_EQ(got[t].value(), 0) << "thread " << t;
    const EngineStats s = a.stats();
    EXPECT_EQ(s.writes_posted(), kTotal);
    EXPECT_EQ(s.writes_completed(), kTotal);
    EXPECT_EQ(s.transfers_failed(), 0u);
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

// An echo: b answers every message from its receive callback on the worker
// (a one-line send made on the worker thread, the buffer re-posted inline); a
// receives on the callback thread (each buffer goes back to the NIC as a
// one-line command). Many more messages than receive buffers, send buffers
// and ring cells, a few in flight at a time: each comes back once, intact.
TEST_P(SubmitForms, OneLineSendsAndInlineReceivesEchoEveryMessage) {
  EngineConfig c = test::config_for(GetParam());
  c.send_buffer_count = 8;
  TransferEngine a(c), b(c);
  const NetAddr a_addr = a.main_address();
  b.submit_recvs(
      64, 4, [&](std::span<const uint8_t> m) { b.submit_send(a_addr, m, OnDone::none()); },
      CallbackOn::kWorker);
  constexpr uint32_t kMessages = 2000, kWindow = 4;
  std::mutex mu;
  std::vector<uint32_t> seen(kMessages, 0);
  std::atomic<uint64_t> echoes{0}, bad{0};
  a.submit_recvs(64, 4, [&](std::span<const uint8_t> m) {
    uint32_t i = 0;
    if (m.size() != 40) {
      bad++;
    } else {
      std::memcpy(&i, m.data(), 4);
      for (size_t k = 4; k < m.size(); ++k)
        if (m[k] != uint8_t(i + k)) bad++;
      std::lock_guard lk(mu);
      if (i < kMessages) seen[i]++;
    }
    echoes.fetch_add(1, std::memory_order_release);
  });
  for (uint32_t i = 0; i < kMessages; ++i) {
    if (i >= kWindow)
      ASSERT_TRUE(test::wait_until([&] { return echoes.load() + kWindow > i; }, 20s))
          << "echo of message " << i - kWindow;
    uint8_t msg[40];
    std::memcpy(msg, &i, 4);
    for (size_t k = 4; k < sizeof msg; ++k) msg[k] = uint8_t(i + k);
    a.submit_send(b.main_address(), msg, OnDone::none());
  }
  ASSERT_TRUE(test::wait_until([&] { return echoes.load() == kMessages; }, 20s)) << echoes.load();
  EXPECT_EQ(bad.load(), 0u);
  std::lock_guard lk(mu);
  for (uint32_t i = 0; i < kMessages; ++i) ASSERT_EQ(seen[i], 1u) << "message " << i;
}

// One-line sends give their admission and their send buffer back: with room
// for two requests, two send buffers and refusal when full, thousands of
// sends one after another are never refused.
TEST_P(SubmitForms, OneLineSendsGiveAdmissionAndBufferBack) {
  EngineConfig c = test::config_for(GetParam());
  c.max_requests_in_flight = 2;
  c.send_buffer_count = 2;
  c.queue_full = QueueFull::kRefuse;
  TransferEngine a(c), b(test::config_for(GetParam()));
  std::atomic<uint64_t> got{0};
  b.submit_recvs(
      16, 4, [&](std::span<const uint8_t>) { got.fetch_add(1); }, CallbackOn::kWorker);
  for (uint64_t i = 0; i < 2000; ++i) {
    const uint8_t msg[8] = {uint8_t(i)};
    a.submit_send(b.main_address(), msg, OnDone::none());
    ASSERT_TRUE(test::wait_until([&] { return got.load() == i + 1; }, 20s)) << "send " << i;
    ASSERT_TRUE(test::wait_until([&] { return a.stats().transfers_ok() == i + 1; }, 20s))
        << "send " << i << " never ended";
  }
}

// A receive callback on the worker that throws is counted, the engine keeps
// running, and the buffer goes back to the NIC: more messages than buffers
// all arrive.
TEST_P(SubmitForms, InlineReceiveCallbackThatThrowsKeepsItsBuffer) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  std::atomic<uint64_t> got{0};
  b.submit_recvs(
      16, 2,
      [&](std::span<const uint8_t>) {
        got.fetch_add(1);
        throw std::runtime_error("a user's receive callback failed");
      },
      CallbackOn::kWorker);
  for (uint64_t i = 0; i < 20; ++i) {
    const uint8_t msg[4] = {uint8_t(i)};
    a.submit_send(b.main_address(), msg, OnDone::none());
    ASSERT_TRUE(test::wait_until([&] { return got.load() == i + 1; }, 20s)) << "message " << i;
  }
  // The callback bumps `got` before it throws, so the worker's count of the
  // failure may trail the last message by a moment.
  EXPECT_TRUE(test::wait_until([&] { return b.stats().callback_failures == 20u; }, 20s))
      << b.stats().callback_failures;
}

// A send from a receive callback on the worker never waits for a send buffer
// (the worker is what frees them): with every buffer taken it throws
// kResourceExhausted at once, even with QueueFull::kBlock. The replies are
// larger than a NIC copies out at the post (shm: 4 KiB), so each holds its
// buffer until its completion.
TEST_P(SubmitForms, SendFromInlineReceiveRefusesWhenNoBufferIsFree) {
  EngineConfig c = test::config_for(GetParam());
  c.send_buffer_count = 3;
  c.queue_full = QueueFull::kBlock;
  TransferEngine a(c), b(c);
  const NetAddr a_addr = a.main_address();
  std::atomic<uint64_t> replies{0}, code{0}, sent_before{0};
  std::atomic<bool> returned{false};
  constexpr size_t kReply = 16 << 10;
  a.submit_recvs(kReply, 8, [&](std::span<const uint8_t>) { replies.fetch_add(1); });
  b.submit_recvs(
      16, 2,
      [&](std::span<const uint8_t>) {
        // None of these ends before the callback returns: they go out at once
        // (Worker::answering_inline), but their completions, which give the
        // buffers back, are this worker's to process. So the replies may
        // arrive while the callback still runs.
        static const std::vector<uint8_t> reply(kReply, 7);
        uint64_t n = 0;
        try {
          for (; n < 4; ++n) b.submit_send(a_addr, reply, OnDone::none());
        } catch (const Error& e) {
          code.store(uint64_t(e.code()) + 1);
        }
        sent_before.store(n);
        returned.store(true);
      },
      CallbackOn::kWorker);
  const uint8_t msg[4] = {9};
  a.submit_send(b.main_address(), msg, OnDone::none());
  ASSERT_TRUE(test::wait_until([&] { return replies.load() == 3 && returned.load(); }, 20s))
      << replies.load();
  EXPECT_EQ(sent_before.load(), 3u);
  EXPECT_EQ(code.load(), uint64_t(Code::kResourceExhausted) + 1);
}

// Small sends that the NIC copies out inside the post (shm) go out from the
// submitting thread where it may post for the worker, with no send buffer;
// the others through the ring. Several threads at once, while a waiter
// keeps the worker stepped aside: every message arrives once with its bytes,
// and every send ends as one transfer that completed.
TEST_P(SubmitForms, SmallSendsFromManyThreadsArriveOnceEach) {
  for (const PollMode mode : {PollMode::kAdaptive, PollMode::kBusy}) {
    SCOPED_TRACE(mode == PollMode::kBusy ? "busy" : "adaptive");
    EngineConfig c = test::config_for(GetParam());
    c.poll_mode = mode;
    c.send_buffer_count = 4;
    TransferEngine a(c), b(test::config_for(GetParam()));
    constexpr uint32_t kThreads = 3, kEach = 1000, kLen = 48;
    RecvQueue queue = b.recv_queue(64, 64);
    auto never = a.imm_counter(22);
    std::atomic<bool> stop_spin{false};
    std::thread spinner([&] {
      while (!stop_spin.load(std::memory_order_relaxed)) EXPECT_FALSE(never.try_consume(1));
    });
    const NetAddr to = b.main_address();
    std::vector<std::thread> senders;
    for (uint32_t t = 0; t < kThreads; ++t)
      senders.emplace_back([&, t] {
        for (uint32_t i = 0; i < kEach; ++i) {
          uint8_t msg[kLen];
          std::memcpy(msg, &t, 4);
          std::memcpy(msg + 4, &i, 4);
          for (uint32_t k = 8; k < kLen; ++k) msg[k] = uint8_t(t * 7 + i + k);
          a.submit_send(to, msg, OnDone::none());
        }
      });
    std::vector<uint32_t> seen(kThreads * kEach, 0);
    uint64_t got = 0, bad = 0;
    for (const auto give_up = std::chrono::steady_clock::now() + 30s;
         got < kThreads * kEach && std::chrono::steady_clock::now() < give_up;) {
      RecvMessage m;
      if (!queue.pop(m, 100ms).is_ok()) continue;
      ++got;
      uint32_t t = 0, i = 0;
      if (m.size() != kLen) {
        ++bad;
        continue;
      }
      std::memcpy(&t, m.data().data(), 4);
      std::memcpy(&i, m.data().data() + 4, 4);
      if (t >= kThreads || i >= kEach) {
        ++bad;
        continue;
      }
      for (uint32_t k = 8; k < kLen; ++k)
        if (m.data()[k] != uint8_t(t * 7 + i + k)) ++bad;
      seen[t * kEach + i]++;
    }
    for (auto& s : senders) s.join();
    stop_spin = true;
    spinner.join();
    constexpr uint64_t kTotal = uint64_t(kThreads) * kEach;
    ASSERT_EQ(got, kTotal);
    EXPECT_EQ(bad, 0u);
    for (uint64_t k = 0; k < kTotal; ++k) ASSERT_EQ(seen[k], 1u) << "message " << k;
    EXPECT_TRUE(test::wait_until([&] { return a.stats().transfers_ok() == kTotal; }, 20s))
        << a.stats().transfers_ok();
    const EngineStats s = a.stats();
    EXPECT_EQ(s.transfers_failed(), 0u);
    EXPECT_EQ(s.bytes_posted(), kTotal * kLen);
  }
}

// Empty one-line sends arrive as empty messages, each once, and end as sends
// that completed; a NIC that posts no send without a completion (tcp) keeps
// them on its completion path.
TEST_P(SubmitForms, EmptyOneLineSendsArriveEmpty) {
  EngineConfig c = test::config_for(GetParam());
  TransferEngine a(c), b(c);
  std::atomic<uint64_t> empty{0}, other{0};
  b.submit_recvs(64, 8, [&](std::span<const uint8_t> m) { (m.empty() ? empty : other)++; });
  constexpr uint64_t kSends = 200;
  for (uint64_t i = 0; i < kSends; ++i) {
    a.submit_send(b.main_address(), std::span<const uint8_t>(), OnDone::none());
    ASSERT_TRUE(test::wait_until([&] { return empty.load() == i + 1; }, 20s)) << "send " << i;
  }
  EXPECT_EQ(other.load(), 0u);
  EXPECT_TRUE(test::wait_until([&] { return a.stats().transfers_ok() == kSends; }, 20s))
      << a.stats().transfers_ok();
  EXPECT_EQ(a.stats().transfers_failed(), 0u);
}

// Queued one-line sends at stop give their buffers back and touch nothing
// after the engine is gone.
TEST_P(SubmitForms, StopWithOneLineSendsQueuedEndsCleanly) {
  EngineConfig c = test::config_for(GetParam());
  c.send_buffer_count = 512;
  TransferEngine b(c);
  b.submit_recvs(
      16, 8, [](std::span<const uint8_t>) {}, CallbackOn::kWorker);
  for (int round = 0; round < 5; ++round) {
    TransferEngine a(c);
    const uint8_t msg[8] = {uint8_t(round)};
    for (int i = 0; i < 500; ++i) a.submit_send(b.main_address(), msg, OnDone::none());
    a.stop();
    EXPECT_THROW(a.submit_send(b.main_address(), msg, OnDone::none()), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, SubmitForms, ::testing::Values("fake", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

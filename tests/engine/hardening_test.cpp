// The engine's edges that a production user reaches: stop() racing
// submissions and waiters, bounded queues, read-only targets, conflicting
// immediate mappings, deadlines. On the fake NIC (no network) unless a test
// needs a real provider's behaviour.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
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

using test::code_of;
using test::region;
using test::Region;

// 8 threads submit every kind of request while another thread stops the
// engine: every submit either throws kFailedPrecondition (never queued, its
// OnDone never runs) or returns, and then its OnDone runs exactly once, ok
// or kCancelled.
TEST(StopRace, EveryOnDoneRunsExactlyOnceAndLateCallsThrowFailedPrecondition) {
  const char* env = std::getenv("FERRY_STOP_RACE_CYCLES");
  const int cycles = env ? std::atoi(env) : 1000;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    auto e = std::make_unique<TransferEngine>(test::config_for("fake"));
    Region src = region(*e, 1 << 16), dst = region(*e, 1 << 16);
    e->submit_recvs(256, 16, [](std::span<const uint8_t>) {});
    const NetAddr me = e->main_address();
    std::atomic<uint64_t> accepted{0}, done_ok{0}, done_cancelled{0}, done_other{0};
    std::atomic<uint64_t> refused{0}, wrong_code{0};
    std::atomic<bool> go{false};
    // Per request: whether it was accepted and how often its OnDone ran, so a
    // failure names the kind of request that lost (or doubled) its OnDone.
    constexpr int kThreads = 8, kPerThread = 200;
    std::vector<std::atomic<uint8_t>> was_accepted(kThreads * kPerThread),
        runs(kThreads * kPerThread);
    auto on_done_for = [&](int req) {
      return [&, req](const Status& s) {
        runs[req]++;
        if (s.is_ok())
          done_ok++;
        else if (s.code() == Code::kCancelled)
          done_cancelled++;
        else
          done_other++;
      };
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        uint8_t msg[16] = {};
        for (int i = 0; i < kPerThread; ++i) {
          const int req = t * kPerThread + i;
          const OnDone on_done(on_done_for(req));
          try {
            switch ((t + i) % 6) {
              case 0:
                e->submit_single_write(512, 1, src.h, 0, dst.d, 512, on_done);
                break;
              case 1:
                e->submit_paged_writes(256, 2, src.h, Pages{{0, 1, 2}, 256, 0}, dst.d,
                                       Pages{{3, 4, 5}, 256, 0}, on_done);
                break;
              case 2:
                e->submit_imm(3, dst.d, on_done);
                break;
              case 3:
                e->submit_scatter(std::nullopt, on_done, 4, src.h, {ScatterDst{64, 0, dst.d, 0}});
                break;
              case 4:
                e->submit_barrier(std::nullopt, on_done, 5, {dst.d});
                break;
              case 5:
                e->submit_send(me, msg, on_done);
                break;
            }
            accepted++;
            was_accepted[req] = 1;
          } catch (const Error& err) {
            (err.code() == Code::kFailedPrecondition ? refused : wrong_code)++;
          }
        }
      });
    }
    go = true;
    // Stop at a different point of the traffic each cycle.
    for (int spin = 0; spin < (cycle % 50) * 20; ++spin) std::this_thread::yield();
    e->stop();
    for (auto& th : threads) th.join();
    std::string odd;
    static const char* const kKinds[] = {"single", "paged", "imm", "scatter", "barrier", "send"};
    for (int req = 0; req < kThreads * kPerThread; ++req)
      if (runs[req].load() != was_accepted[req].load())
        odd += fmt::format(" [thread {} request {} ({}): accepted {}, OnDone ran {}x]",
                           req / kPerThread, req % kPerThread,
                           kKinds[(req / kPerThread + req % kPerThread) % 6],
                           int(was_accepted[req].load()), int(runs[req].load()));
    if (!odd.empty()) {
      // Where the lost ones were: still counted in flight or queued, ended
      // on the worker, or waiting for the callback thread.
      const EngineStats st = e->stats();
      for (const auto& w : st.workers)
        odd += fmt::format(" [worker: in flight {}, queued {}, ok {}, failed {}]", w.in_flight,
                           w.queued, w.transfers_ok, st.transfers_failed());
      odd +=
          fmt::format(" [callback queue {}, refused {}]", st.callback_queue_depth, refused.load());
    }
    ASSERT_EQ(wrong_code.load(), 0u) << "cycle " << cycle;
    ASSERT_EQ(done_other.load(), 0u) << "cycle " << cycle;
    ASSERT_EQ(done_ok + done_cancelled, accepted.load()) << "cycle " << cycle << odd;
    ASSERT_TRUE(odd.empty()) << "cycle " << cycle << odd;
    EXPECT_EQ(code_of([&] { e->submit_imm(3, dst.d, {}); }), Code::kFailedPrecondition);
    EXPECT_EQ(code_of([&] { e->imm_counter(9); }), Code::kFailedPrecondition);
  }
}

TEST(StopWakesWaiters, InfiniteCounterWaitReturnsCancelled) {
  auto e = std::make_unique<TransferEngine>(test::config_for("fake"));
  ImmCounter c = e->imm_counter(7);
  ImmCounter c2 = e->imm_counter(8);
  std::atomic<int> got{-1}, got2{-1};
  std::thread waiter([&] { got = int(c.wait(1, std::chrono::nanoseconds::max()).code()); });
  std::thread waiter2([&] { got2 = int(c2.wait(5, std::chrono::hours(1)).code()); });
  // The waiters may or may not have gone to sleep yet: either way they must
  // return once the engine stops.
  const auto t0 = std::chrono::steady_clock::now();
  e->stop();
  waiter.join();
  waiter2.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(got.load(), int(Code::kCancelled));
  EXPECT_EQ(got2.load(), int(Code::kCancelled));
  // A counter kept past stop stays cancelled.
  EXPECT_EQ(c.wait(1, 1h).code(), Code::kCancelled);
}

TEST(StopFromACallback, IsRefusedAndTheEngineStopsLater) {
  auto e = std::make_unique<TransferEngine>(test::config_for("fake"));
  Region dst = region(*e, 4096);
  std::atomic<int> code{-1};
  e->submit_imm(1, dst.d, [&](const Status&) {
    try {
      e->stop();
      code = 0;
    } catch (const Error& err) {
      code = int(err.code());
    }
  });
  ASSERT_TRUE(test::wait_until([&] { return code.load() != -1; }, 10s));
  EXPECT_EQ(code.load(), int(Code::kFailedPrecondition));
  e->stop();
  EXPECT_EQ(code_of([&] { e->imm_counter(1); }), Code::kFailedPrecondition);
}

TEST(StopWakesWaiters, RemovedCounterWaitReturnsCancelled) {
  TransferEngine e(test::config_for("fake"));
  ImmCounter c = e.imm_counter(7);
  std::atomic<int> got{-1};
  std::thread waiter([&] { got = int(c.wait(1, 1h).code()); });
  e.remove_imm_count(7);
  waiter.join();
  EXPECT_EQ(got.load(), int(Code::kCancelled));
}

TEST(ImmMappings, ACounterAndACallbackOnOneImmediateConflict) {
  TransferEngine e(test::config_for("fake"));
  e.expect_imm_count(1, 1, [] {});
  EXPECT_EQ(code_of([&] { e.imm_counter(1); }), Code::kAlreadyExists);
  e.imm_counter(2);
  EXPECT_EQ(code_of([&] { e.expect_imm_count(2, 1, [] {}); }), Code::kAlreadyExists);
  // Same kind: the counter is shared, the callback replaced.
  EXPECT_EQ(code_of([&] { e.imm_counter(2); }), Code::kOk);
  EXPECT_EQ(code_of([&] { e.expect_imm_count(1, 2, [] {}); }), Code::kOk);
  e.remove_imm_count(1);
  EXPECT_EQ(code_of([&] { e.imm_counter(1); }), Code::kOk);
}

TEST(ImmMappings, OnImmInsideAnOnImmCallbackDoesNotDeadlock) {
  TransferEngine e(test::config_for("fake"));
  Region dst = region(e, 4096);
  std::atomic<int> outer{0}, inner{0};
  std::atomic<bool> added{false};
  e.on_imm([&](uint32_t) {
    outer++;
    if (!added.exchange(true)) e.on_imm([&](uint32_t) { inner++; });
  });
  e.submit_imm(11, dst.d, {});
  ASSERT_TRUE(test::wait_until([&] { return outer.load() == 1; }, 10s));
  e.submit_imm(12, dst.d, {});
  ASSERT_TRUE(test::wait_until([&] { return outer.load() == 2 && inner.load() == 1; }, 10s))
      << outer.load() << " outer, " << inner.load() << " inner";
}

TEST(ImmMappings, CountCallbacksFireOncePerMultipleUnderAFlood) {
  TransferEngine e(test::config_for("fake"));
  Region dst = region(e, 4096);
  std::atomic<int> fired{0};
  e.expect_imm_count(21, 4, [&] { fired++; });
  std::atomic<uint64_t> done{0};
  for (int i = 0; i < 4000; ++i) e.submit_imm(21, dst.d, OnDone::counter(done));
  ASSERT_TRUE(test::wait_until([&] { return fired.load() == 1000; }, 30s)) << fired.load();
  EXPECT_EQ(done.load(), 4000u);
}

// A region the owner cannot write is no write target: the owner registers it
// without remote write and its descriptor says so; senders are refused
// before anything is posted, immediates and barriers included.
TEST(ReadOnlyTarget, EveryWriteIsRefusedBeforePosting) {
  for (const char* provider : {"fake", "tcp", "shm"}) {
    SCOPED_TRACE(provider);
    TransferEngine e(test::config_for(provider));
    const size_t len = 1 << 16;
    void* ro = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(ro, MAP_FAILED);
    auto [rh, rd] = e.reg_mr(ro, len);
    EXPECT_FALSE(rd.writable);
    EXPECT_FALSE(MrDesc::from_bytes(rd.to_bytes()).writable) << "the flag survives the wire";
    Region src = region(e, len);
    EXPECT_TRUE(src.d.writable);
    EXPECT_TRUE(MrDesc::from_bytes(src.d.to_bytes()).writable);
    EXPECT_EQ(code_of([&] { e.submit_single_write(64, 1, src.h, 0, rd, 0, {}); }),
              Code::kFailedPrecondition);
    EXPECT_EQ(code_of([&] {
                e.submit_paged_writes(64, 1, src.h, Pages{{0}, 64, 0}, rd, Pages{{1}, 64, 0}, {});
              }),
              Code::kFailedPrecondition);
    EXPECT_EQ(code_of([&] {
                e.submit_scatter(std::nullopt, {}, 1, src.h, {ScatterDst{64, 0, rd, 0}});
              }),
              Code::kFailedPrecondition);
    EXPECT_EQ(code_of([&] { e.submit_imm(31, rd, {}); }), Code::kFailedPrecondition);
    EXPECT_EQ(code_of([&] { e.submit_barrier(std::nullopt, {}, 31, {rd}); }),
              Code::kFailedPrecondition);
    // The same engine still writes into writable memory.
    auto c = e.imm_counter(31);
    Region dst = region(e, len);
    std::atomic<bool> done{false}, failed{false};
    e.submit_single_write(64, 31, src.h, 0, dst.d, 0, OnDone::flag(done, &failed));
    ASSERT_TRUE(c.wait(1, 20s).is_ok());
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 20s));
    EXPECT_FALSE(failed.load());
    e.unreg_mr(rh);
    e.stop();
    ::munmap(ro, len);
  }
}

// Sends to a peer that posted no receive stay in flight (receiver not
// ready), which fills the group.
TEST(Bounded, AFullGroupRefusesAtOnceWithKRefuse) {
  EngineConfig cfg = test::config_for("fake");
  cfg.max_requests_in_flight = 4;
  cfg.queue_full = QueueFull::kRefuse;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  const uint8_t msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::atomic<uint64_t> done{0};
  for (int i = 0; i < 4; ++i)
    sender.submit_send(receiver.main_address(), msg, OnDone::counter(done));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(code_of([&] { sender.submit_send(receiver.main_address(), msg, {}); }),
            Code::kResourceExhausted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  std::atomic<int> received{0};
  receiver.submit_recvs(64, 8, [&](std::span<const uint8_t> m) {
    if (m.size() == 8 && m[7] == 8) received++;
  });
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 4 && received.load() == 4; }, 20s))
      << done.load() << " done, " << received.load() << " received";
  // Room again.
  EXPECT_EQ(code_of([&] { sender.submit_send(receiver.main_address(), msg, {}); }), Code::kOk);
}

TEST(Bounded, AFullGroupBlocksTheSubmitterUntilThereIsRoom) {
  EngineConfig cfg = test::config_for("fake");
  cfg.max_requests_in_flight = 2;
  cfg.queue_full = QueueFull::kBlock;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  const uint8_t msg[4] = {9, 9, 9, 9};
  std::atomic<uint64_t> done{0}, errors{0};
  for (int i = 0; i < 2; ++i)
    sender.submit_send(receiver.main_address(), msg, OnDone::counter(done, &errors));
  // Full (the receiver is not ready). Room comes when another thread posts
  // receives; the third submit can only return once one of the two ended.
  std::atomic<int> received{0};
  std::thread ready(
      [&] { receiver.submit_recvs(64, 8, [&](std::span<const uint8_t>) { received++; }); });
  EXPECT_EQ(code_of([&] {
              sender.submit_send(receiver.main_address(), msg, OnDone::counter(done, &errors));
            }),
            Code::kOk);
  EXPECT_GE(done.load(), 1u) << "admitted with two requests in flight";
  ready.join();
  ASSERT_TRUE(test::wait_until([&] { return done.load() == 3 && received.load() == 3; }, 20s));
  EXPECT_EQ(errors.load(), 0u);
}

// A callback on the worker cannot wait for room (the worker makes it): its
// submissions use a reserve beyond the limit, which is itself bounded.
TEST(Bounded, ACallbackOnTheWorkerSubmitsIntoAFullGroupUpToTheReserve) {
  EngineConfig cfg = test::config_for("fake");
  cfg.max_requests_in_flight = 2;
  cfg.queue_full = QueueFull::kBlock;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  Region on_sender = region(sender, 4096), on_receiver = region(receiver, 4096);
  const uint8_t msg[4] = {1, 2, 3, 4};
  std::atomic<uint64_t> sends{0};
  for (int i = 0; i < 2; ++i)  // full: the receiver posted no receive
    sender.submit_send(receiver.main_address(), msg, OnDone::counter(sends));
  constexpr int kReserve = 64;  // max(64, 2 / 8)
  std::atomic<int> admitted{0}, refused{0}, other{0};
  std::atomic<uint64_t> imms_done{0}, imm_errors{0};
  sender.expect_imm_count(
      40, 1,
      [&] {
        for (int i = 0; i < kReserve + 1; ++i) {
          const Code c = code_of([&] {
            sender.submit_imm(41, on_receiver.d, OnDone::counter(imms_done, &imm_errors));
          });
          (c == Code::kOk ? admitted : c == Code::kResourceExhausted ? refused : other)++;
        }
      },
      CallbackOn::kWorker);
  auto arrived = receiver.imm_counter(41);
  receiver.submit_imm(40, on_sender.d, {});
  ASSERT_TRUE(arrived.wait(kReserve, 20s).is_ok()) << admitted.load() << " admitted";
  EXPECT_EQ(admitted.load(), kReserve);
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(other.load(), 0);
  ASSERT_TRUE(test::wait_until([&] { return imms_done.load() == kReserve; }, 20s));
  EXPECT_EQ(imm_errors.load(), 0u);
  EXPECT_EQ(sends.load(), 0u) << "the two sends are still waiting for receives";
}

TEST(Bounded, ABlockedSubmitterGivesUpAtItsDeadline) {
  EngineConfig cfg = test::config_for("fake");
  cfg.max_requests_in_flight = 1;
  cfg.queue_full = QueueFull::kBlock;
  cfg.default_deadline = 200ms;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  const uint8_t msg[4] = {};
  std::atomic<uint64_t> done{0};
  sender.submit_send(receiver.main_address(), msg, OnDone::counter(done));
  // The request in flight ends at its own deadline, just before the blocked
  // one's: the blocked submit either got in then or gave up at its deadline;
  // either way it returned within about one deadline, not never.
  const auto t0 = std::chrono::steady_clock::now();
  const Code c = code_of([&] { sender.submit_send(receiver.main_address(), msg, {}); });
  EXPECT_TRUE(c == Code::kOk || c == Code::kResourceExhausted) << int(c);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(Bounded, StopWakesASubmitterBlockedOnAFullGroup) {
  EngineConfig cfg = test::config_for("fake");
  cfg.max_requests_in_flight = 1;
  cfg.default_deadline = 0ms;  // none: only stop can wake it
  auto sender = std::make_unique<TransferEngine>(cfg);
  TransferEngine receiver(test::config_for("fake"));
  const uint8_t msg[4] = {};
  std::atomic<uint64_t> done{0};
  sender->submit_send(receiver.main_address(), msg, OnDone::counter(done));
  std::atomic<int> code{-1};
  std::thread blocked(
      [&] { code = int(code_of([&] { sender->submit_send(receiver.main_address(), msg, {}); })); });
  // Whether or not it is asleep yet, stop() must wake it.
  sender->stop();
  blocked.join();
  EXPECT_EQ(code.load(), int(Code::kFailedPrecondition));
  EXPECT_EQ(done.load(), 1u);
}

TEST(Bounded, SendPoolExhaustedRefusesWithKRefuse) {
  EngineConfig cfg = test::config_for("fake");
  cfg.send_buffer_count = 2;
  cfg.queue_full = QueueFull::kRefuse;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  const uint8_t msg[4] = {};
  sender.submit_send(receiver.main_address(), msg, {});
  sender.submit_send(receiver.main_address(), msg, {});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(code_of([&] { sender.submit_send(receiver.main_address(), msg, {}); }),
            Code::kResourceExhausted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(Deadlines, DefaultDeadlineIsFinite) {
  EXPECT_GT(EngineConfig{}.default_deadline.count(), 0);
}

TEST(Deadlines, APeerThatClosedIsReportedUnavailable) {
  TransferEngine e(test::config_for("fake"));
  Region src = region(e, 4096);
  MrDesc gone;
  {
    TransferEngine peer(test::config_for("fake"));
    std::vector<uint8_t> mem(4096);
    gone = peer.reg_mr(mem.data(), mem.size()).second;
  }
  std::atomic<bool> done{false};
  Status got;
  e.submit_single_write(64, 1, src.h, 0, gone, 0, [&](const Status& s) {
    got = s;
    done = true;
  });
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 20s));
  EXPECT_EQ(got.code(), Code::kUnavailable) << got.to_string();
}

TEST(Deadlines, ATransferNobodyAcceptsEndsAtItsDeadlineSayingSo) {
  EngineConfig cfg = test::config_for("fake");
  cfg.default_deadline = 100ms;
  TransferEngine sender(cfg), receiver(test::config_for("fake"));
  const uint8_t msg[4] = {};
  std::atomic<bool> done{false};
  Status got;
  sender.submit_send(receiver.main_address(), msg, [&](const Status& s) {
    got = s;
    done = true;
  });
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 20s));
  EXPECT_EQ(got.code(), Code::kDeadlineExceeded);
  EXPECT_NE(got.message().find("accepted none"), std::string::npos) << got.message();
}

}  // namespace
}  // namespace ferry

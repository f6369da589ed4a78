// Completion-channel bookkeeping (CqNotify) against a scripted fake of the
// four raw calls: no device needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "verbs/verbs_notify.h"

namespace ferry::verbs {
namespace {

// A CQ and its channel as the kernel would keep them: CQEs queue up, an armed
// CQ raises one event at its next CQE and is then disarmed.
struct FakeCq {
  std::deque<int> cqes;  // queued completions (values are opaque)
  int channel_events = 0;
  bool armed = false;
  int arm_error = 0;
  uint64_t acked = 0;
  uint64_t taken = 0;
  std::vector<uint32_t> ack_calls;
  std::vector<std::string> calls;  // order of raw calls
  std::vector<int> stash;          // what poll_one kept for the domain's next poll

  void complete(int v) {
    cqes.push_back(v);
    if (armed) {
      armed = false;
      ++channel_events;
    }
  }
  bool fd_readable() const { return channel_events > 0; }

  // CqNotify's Ops.
  bool get_event() {
    calls.push_back("get_event");
    if (channel_events == 0) return false;
    --channel_events;
    ++taken;
    return true;
  }
  void ack(uint32_t n) {
    calls.push_back("ack");
    ack_calls.push_back(n);
    acked += n;
  }
  int arm() {
    calls.push_back("arm");
    if (arm_error != 0) return arm_error;
    armed = true;
    return 0;
  }
  bool poll_one() {
    calls.push_back("poll_one");
    if (cqes.empty()) return false;
    stash.push_back(cqes.front());
    cqes.pop_front();
    return true;
  }
};

TEST(VerbsNotify, ArmsThenPollsOnceBeforeBlocking) {
  FakeCq cq;
  CqNotify n;
  EXPECT_TRUE(n.can_block(cq));
  EXPECT_EQ(cq.calls, (std::vector<std::string>{"get_event", "arm", "poll_one"}));
  EXPECT_TRUE(n.armed());
  EXPECT_TRUE(cq.armed);
  // Still armed (no event since): no second arm.
  cq.calls.clear();
  EXPECT_TRUE(n.can_block(cq));
  EXPECT_EQ(cq.calls, (std::vector<std::string>{"get_event", "poll_one"}));
  EXPECT_EQ(n.arms(), 1u);
}

TEST(VerbsNotify, CompletionBeforeArmingIsNotSleptThrough) {
  // The race: a CQE lands after the domain's last poll and before arming. It
  // raises no event, so blocking would sleep through it.
  FakeCq cq;
  CqNotify n;
  cq.complete(7);  // CQ not armed: no event
  EXPECT_FALSE(cq.fd_readable());
  EXPECT_FALSE(n.can_block(cq));
  ASSERT_EQ(cq.stash, std::vector<int>{7}) << "the CQE is kept for the next poll";
  EXPECT_EQ(n.raced(), 1u);
  EXPECT_TRUE(n.armed()) << "armed before the poll: the next CQE raises an event";
  cq.stash.clear();
  EXPECT_TRUE(n.can_block(cq));  // CQ empty now
  cq.complete(8);
  EXPECT_TRUE(cq.fd_readable()) << "a blocked worker wakes up";
}

TEST(VerbsNotify, EventDisarmsAndIsDrainedBeforeRearming) {
  FakeCq cq;
  CqNotify n;
  ASSERT_TRUE(n.can_block(cq));
  cq.complete(1);  // wakes the worker
  ASSERT_TRUE(cq.fd_readable());
  cq.cqes.clear();  // the worker's poll() drained the CQ
  cq.calls.clear();
  EXPECT_TRUE(n.can_block(cq));
  EXPECT_EQ(cq.calls, (std::vector<std::string>{"get_event", "get_event", "arm", "poll_one"}));
  EXPECT_FALSE(cq.fd_readable()) << "the event was consumed: poll() on the fd would spin";
  EXPECT_EQ(n.events(), 1u);
  EXPECT_EQ(n.unacked(), 1u);
  EXPECT_EQ(cq.acked, 0u) << "acks are batched";
}

TEST(VerbsNotify, AcksInBatchesAndEverythingBeforeDestroy) {
  FakeCq cq;
  CqNotify n(4);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(n.can_block(cq)) << i;
    cq.complete(i);
    cq.cqes.clear();
  }
  ASSERT_TRUE(n.can_block(cq));  // drains the 10th event
  EXPECT_EQ(cq.taken, 10u);
  EXPECT_EQ(cq.ack_calls, (std::vector<uint32_t>{4, 4}));
  EXPECT_EQ(n.unacked(), 2u);
  // What the CQ deleter does before ibv_destroy_cq.
  const uint32_t rest = n.take_unacked();
  cq.ack(rest);
  EXPECT_EQ(cq.acked, cq.taken) << "every event taken is acked";
  EXPECT_EQ(n.take_unacked(), 0u);
}

TEST(VerbsNotify, SeveralEventsInOneDrain) {
  // Spurious or repeated notifications (a CQ armed twice, events from before
  // a reconnect) are drained and acked like any other.
  FakeCq cq;
  CqNotify n(2);
  cq.channel_events = 5;
  EXPECT_TRUE(n.can_block(cq));
  EXPECT_EQ(cq.taken, 5u);
  EXPECT_EQ(cq.ack_calls, (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(n.unacked(), 1u);
}

TEST(VerbsNotify, ArmFailureNeverBlocks) {
  FakeCq cq;
  cq.arm_error = 22;  // EINVAL
  CqNotify n;
  EXPECT_FALSE(n.can_block(cq));
  EXPECT_FALSE(n.armed());
  EXPECT_EQ(n.arm_failures(), 1u);
  EXPECT_EQ(cq.calls, (std::vector<std::string>{"get_event", "arm"}))
      << "no poll: the caller keeps polling anyway";
  cq.arm_error = 0;
  EXPECT_TRUE(n.can_block(cq));
}

TEST(VerbsNotify, RandomisedNeverMissesAWakeup) {
  // Whatever the interleaving of completions, polls and blocking attempts:
  // whenever can_block says yes, the CQ is empty and armed, so the next CQE
  // makes the fd readable; and every event taken is eventually acked.
  FakeCq cq;
  CqNotify n(3);
  uint32_t rng = 12345;
  const auto next = [&rng] {
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
  };
  for (int step = 0; step < 20000; ++step) {
    switch (next() % 4) {
      case 0:
        cq.complete(step);
        break;
      case 1:  // the domain's poll(): stash first, then the CQ
        cq.stash.clear();
        cq.cqes.clear();
        break;
      default:
        if (!cq.stash.empty()) break;  // the domain refuses to block with a stashed CQE
        if (n.can_block(cq)) {
          ASSERT_TRUE(cq.cqes.empty()) << step;
          ASSERT_TRUE(cq.armed) << step;
          cq.complete(step);
          ASSERT_TRUE(cq.fd_readable()) << step;
        }
        break;
    }
  }
  cq.ack(n.take_unacked());
  EXPECT_EQ(cq.acked, cq.taken);
  EXPECT_GT(n.raced(), 0u);
  EXPECT_GT(n.events(), 100u);
}

}  // namespace
}  // namespace ferry::verbs

// core::presence and its users (Lifeline, CallsInProgress::Counted): a thread
// inside a gate holds a slot of its own, and the closer, after its flag and
// one membarrier(2), sees every thread still inside and none that entered
// after the flag.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/lifeline.h"
#include "core/presence.h"

namespace ferry::core {
namespace {

TEST(Presence, NestedGatesHoldOneSlotEachUntilTheThreadRunsOut) {
  if (!presence::expedited()) GTEST_SKIP() << "membarrier(2) unavailable: every gate counts";
  int gates[presence::kSlots + 1];
  std::vector<int> slots;
  for (int i = 0; i < presence::kSlots; ++i) {
    slots.push_back(presence::enter(&gates[i]));
    EXPECT_EQ(slots.back(), i);
  }
  // One more than a thread has slots: the caller counts itself instead.
  EXPECT_EQ(presence::enter(&gates[presence::kSlots]), presence::kNoSlot);
  presence::heavy_fence();
  for (int i = 0; i < presence::kSlots; ++i) EXPECT_TRUE(presence::anyone_in(&gates[i]));
  EXPECT_FALSE(presence::anyone_in(&gates[presence::kSlots]));
  for (int i = presence::kSlots; i-- > 0;) {
    presence::leave(slots[size_t(i)]);
    EXPECT_FALSE(presence::anyone_in(&gates[i]));
  }
  EXPECT_EQ(presence::enter(&gates[0]), 0);  // all slots free again
  presence::leave(0);
}

// Threads that exited give their records back: a thousand short-lived threads
// in a row need a handful of records, not a thousand.
TEST(Presence, ExitedThreadsGiveTheirRecordsBack) {
  if (!presence::expedited()) GTEST_SKIP() << "membarrier(2) unavailable: every gate counts";
  int gate = 0;
  std::atomic<int> slotless{0};
  for (int i = 0; i < 2 * int(presence::kRecords); ++i)
    std::thread([&] {
      const int s = presence::enter(&gate);
      if (s == presence::kNoSlot)
        slotless.fetch_add(1);
      else
        presence::leave(s);
    }).join();
  EXPECT_EQ(slotless.load(), 0);
  presence::heavy_fence();
  EXPECT_FALSE(presence::anyone_in(&gate));
}

// Lifeline: close() returns only once the call inside has left, and no call
// runs after it.
TEST(Presence, LifelineCloseWaitsForTheCallInside) {
  Lifeline gate;
  std::atomic<bool> inside{false}, release{false}, after_close{false}, ran_late{false};
  std::thread caller([&] {
    EXPECT_TRUE(gate.run([&] {
      inside.store(true);
      while (!release.load()) std::this_thread::yield();
      if (after_close.load()) ran_late.store(true);
    }));
    // Closed by now or soon: a later call never runs.
    while (!after_close.load()) std::this_thread::yield();
    EXPECT_FALSE(gate.run([&] { ran_late.store(true); }));
  });
  while (!inside.load()) std::this_thread::yield();
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    gate.close();
    closed.store(true);
  });
  // The closer waits while the call is inside (a bounded look, not a sleep
  // as synchronisation: it passes only if close() has not returned).
  for (int i = 0; i < 1000; ++i) {
    EXPECT_FALSE(closed.load());
    std::this_thread::yield();
  }
  release.store(true);
  closer.join();
  after_close.store(true);
  caller.join();
  EXPECT_FALSE(ran_late.load());
}

// A call that throws leaves the gate all the same: close() does not wait for
// it, and the thread's slots are all free again.
TEST(Presence, ALifelineCallThatThrowsLeavesTheGate) {
  Lifeline gate;
  EXPECT_THROW(gate.run([] { throw std::runtime_error("from inside"); }), std::runtime_error);
  EXPECT_FALSE(gate.anyone_inside());
  std::thread closer([&] { gate.close(); });
  closer.join();  // returns: nobody is inside
  if (presence::expedited()) {
    int other = 0;
    EXPECT_EQ(presence::enter(&other), 0);  // the thrown call gave its slot back
    presence::leave(0);
  }
}

}  // namespace
}  // namespace ferry::core

// The engine's interned addresses (core/addr_table.h): one stable copy per
// distinct address, whichever NetAddr object or thread asks, across growth.
#include "core/addr_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

NetAddr addr(uint32_t n, uint64_t incarnation = 1) {
  uint8_t raw[16] = {};
  std::memcpy(raw, &n, sizeof n);
  return NetAddr(Transport::kFake, incarnation, raw);
}

TEST(AddrTable, EqualAddressesShareOneCopyThatOutlivesTheCaller) {
  AddrTable t;
  const NetAddr* p = nullptr;
  {
    NetAddr a = addr(7);
    p = t.intern(a);
    EXPECT_EQ(*p, a);
    EXPECT_NE(p, &a);
  }
  // A separately decoded copy (its own bytes) finds the same entry.
  NetAddr b = NetAddr::from_bytes(addr(7).bytes());
  EXPECT_EQ(t.intern(b), p);
  EXPECT_EQ(p->brief(), b.brief());
  // Another incarnation of the same endpoint is another address.
  EXPECT_NE(t.intern(addr(7, 2)), p);
  EXPECT_EQ(t.size(), 2u);
}

// The thread's last lookup is reused only for the same table and the same
// bytes: a second table, or a new table where a destroyed one was, gets its
// own entry; another address named after it gets its own.
TEST(AddrTable, TheLastLookupServesOnlyItsTableAndItsAddress) {
  const NetAddr a = addr(1), b = addr(2);
  auto t1 = std::make_unique<AddrTable>();
  const NetAddr* in1 = t1->intern(a);
  EXPECT_EQ(t1->intern(a), in1);
  AddrTable t2;
  const NetAddr* in2 = t2.intern(a);
  EXPECT_NE(in2, in1);
  EXPECT_EQ(*in2, a);
  EXPECT_EQ(t2.size(), 1u);
  const NetAddr* bin = t2.intern(b);
  EXPECT_EQ(*bin, b);
  EXPECT_EQ(t2.intern(a), in2);
  t1->intern(a);
  t1.reset();
  t1 = std::make_unique<AddrTable>();  // may lie where the first one did
  const NetAddr* again = t1->intern(a);
  EXPECT_EQ(*again, a);
  EXPECT_EQ(t1->size(), 1u) << "the new table must have interned the address itself";
}

TEST(AddrTable, EntriesStayPutWhileTheTableGrows) {
  AddrTable t;
  std::vector<const NetAddr*> first;
  for (uint32_t i = 0; i < 5000; ++i) first.push_back(t.intern(addr(i)));
  EXPECT_EQ(t.size(), 5000u);
  for (uint32_t i = 0; i < 5000; ++i) {
    ASSERT_EQ(t.intern(addr(i)), first[i]) << i;
    ASSERT_EQ(*first[i], addr(i)) << i;
  }
}

// Threads intern overlapping sets while the table grows under them: each
// address must end with exactly one entry, the same pointer for every thread.
TEST(AddrTable, ConcurrentInternsAgreeOnOneEntryPerAddress) {
  constexpr int kThreads = 4;
  constexpr uint32_t kAddrs = 3000;
  AddrTable t;
  std::atomic<bool> go{false};
  std::vector<std::vector<const NetAddr*>> seen(kThreads, std::vector<const NetAddr*>(kAddrs));
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k)
    threads.emplace_back([&, k] {
      std::vector<NetAddr> mine;
      for (uint32_t i = 0; i < kAddrs; ++i) mine.push_back(addr(i));
      while (!go.load()) std::this_thread::yield();
      // Different orders, so inserts race with lookups of the same entries.
      for (uint32_t j = 0; j < kAddrs; ++j) {
        const uint32_t i = (k % 2 == 0) ? j : kAddrs - 1 - j;
        seen[k][i] = t.intern(mine[i]);
      }
    });
  go.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.size(), size_t(kAddrs));
  for (uint32_t i = 0; i < kAddrs; ++i) {
    ASSERT_EQ(*seen[0][i], addr(i)) << i;
    for (int k = 1; k < kThreads; ++k) ASSERT_EQ(seen[k][i], seen[0][i]) << i;
  }
}

}  // namespace
}  // namespace ferry::core

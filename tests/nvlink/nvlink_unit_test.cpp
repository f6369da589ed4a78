// NVLink domain parts that need no GPU: the address codec and the
// shared-memory mailbox across processes.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <set>

#include "nvlink/nvlink_domain.h"
#include "nvlink/nvlink_shm.h"
#include "support/process.h"

namespace ferry::nvlink {
namespace {

TEST(NvlinkAddress, RoundTripAndRejects) {
  RawAddress a;
  ASSERT_TRUE(local_boot_id(&a.boot_id));
  a.pid = 1234;
  a.device = 1;
  a.shm_name = "/ferry-nvl-test";
  auto bytes = a.encode();
  std::string why;
  auto b = RawAddress::decode(bytes, &why);
  ASSERT_TRUE(b) << why;
  EXPECT_EQ(b->boot_id, a.boot_id);
  EXPECT_EQ(b->pid, 1234u);
  EXPECT_EQ(b->device, 1);
  EXPECT_EQ(b->shm_name, a.shm_name);
  bytes[0] ^= 1;
  EXPECT_FALSE(RawAddress::decode(bytes, &why));
  EXPECT_FALSE(RawAddress::decode(std::span(bytes.data(), 10), &why));
}

TEST(NvlinkMailbox, FourProducerProcessesEveryImmediateOnceBackPressureWhenFull) {
  Status st;
  const std::string name = "/ferry-nvl-unit-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  constexpr uint32_t kPer = 50000;
  std::vector<std::unique_ptr<test::Peer>> producers;
  for (uint32_t p = 0; p < 4; ++p)
    producers.push_back(std::make_unique<test::Peer>([&, p](test::Channel&) {
      Status s;
      auto seg = ShmSegment::open(name, &s);
      if (!seg) return 2;
      for (uint32_t i = 0; i < kPer; ++i)
        while (!seg->push_imm(p << 24 | i)) usleep(10);  // full: the consumer lags
      return 0;
    }));
  std::vector<uint32_t> next(4, 0);
  ImmRun buf[256];
  uint64_t got = 0;
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < 4ull * kPer && std::chrono::steady_clock::now() < give_up) {
    const size_t n = owner->pop_runs(buf);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t p = buf[i].imm >> 24, v = buf[i].imm & 0xFFFFFF;
      ASSERT_LT(p, 4u);
      ASSERT_EQ(buf[i].count, 1u);
      ASSERT_EQ(v, next[p]) << "producer " << p << ": its own pushes arrive in order, once";
      next[p]++;
    }
    got += n;
  }
  EXPECT_EQ(got, 4ull * kPer);
  for (auto& p : producers) EXPECT_EQ(p->wait(), 0);
  // Full ring: pushes fail instead of overwriting.
  uint32_t pushed = 0;
  while (owner->push_imm(pushed)) ++pushed;
  EXPECT_EQ(pushed, kMailboxCapacity);
}

TEST(NvlinkMailbox, ARunIsOneCellWithItsCount) {
  Status st;
  auto owner =
      ShmSegment::create("/ferry-nvl-unit-c-" + std::to_string(::getpid()), ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  ASSERT_TRUE(owner->push_run(7, 1024));
  ASSERT_TRUE(owner->push_run(8, 1));
  ASSERT_TRUE(owner->push_run(7, 3));
  ImmRun buf[8];
  ASSERT_EQ(owner->pop_runs(buf), 3u);
  EXPECT_EQ(buf[0].imm, 7u);
  EXPECT_EQ(buf[0].count, 1024u);
  EXPECT_EQ(buf[1].imm, 8u);
  EXPECT_EQ(buf[1].count, 1u);
  EXPECT_EQ(buf[2].count, 3u);
  EXPECT_EQ(owner->pop_runs(buf), 0u);
  // Capacity is in runs, whatever their counts; popped cells are reusable.
  uint32_t pushed = 0;
  while (owner->push_run(pushed, 1000)) ++pushed;
  EXPECT_EQ(pushed, kMailboxCapacity);
  EXPECT_EQ(owner->pop_runs(buf), 8u);
  EXPECT_TRUE(owner->push_run(1, 1));
}

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

TEST(NvlinkMailbox, ASleepingOwnerIsWokenByAnotherProcessPush) {
  Status st;
  const std::string name = "/ferry-nvl-unit-w-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  ASSERT_GE(owner->wake_fd(), 0);
  // Awake owner: a push sends nothing.
  ASSERT_TRUE(owner->push_run(1, 1));
  EXPECT_FALSE(readable(owner->wake_fd(), 0));
  // A run already waiting: no sleeping.
  EXPECT_FALSE(owner->prepare_to_sleep());
  ImmRun buf[4];
  ASSERT_EQ(owner->pop_runs(buf), 1u);
  // Empty: the owner may sleep, and a push from another process wakes it.
  ASSERT_TRUE(owner->prepare_to_sleep());
  test::Peer writer([&](test::Channel&) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    return seg && seg->push_run(5, 3) ? 0 : 2;
  });
  EXPECT_TRUE(readable(owner->wake_fd(), 10000)) << "no wake-up within 10 s";
  EXPECT_EQ(writer.wait(), 0);
  owner->woken();
  EXPECT_FALSE(readable(owner->wake_fd(), 0)) << "woken() drains the socket";
  ASSERT_EQ(owner->pop_runs(buf), 1u);
  EXPECT_EQ(buf[0].imm, 5u);
  EXPECT_EQ(buf[0].count, 3u);
  // One wake per sleep: the writer cleared the announcement.
  ASSERT_TRUE(owner->push_run(6, 1));
  EXPECT_FALSE(readable(owner->wake_fd(), 0));
}

// Sleep / push races: every time the owner blocks, a wake-up must come while
// runs are still to arrive; a lost one shows as a blocked poll that times out
// with a run waiting in the ring.
TEST(NvlinkMailbox, NoLostWakeUpsUnderRacingPushes) {
  Status st;
  const std::string name = "/ferry-nvl-unit-x-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  constexpr uint32_t kRuns = 20000;
  test::Peer writer([&](test::Channel&) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    if (!seg) return 2;
    for (uint32_t i = 0; i < kRuns; ++i) {
      while (!seg->push_run(i, 1)) usleep(10);
      if (i % 7 == 0) usleep(i % 50);  // let the owner fall asleep now and then
    }
    return 0;
  });
  uint32_t got = 0, slept = 0;
  ImmRun buf[64];
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < kRuns && std::chrono::steady_clock::now() < give_up) {
    const size_t n = owner->pop_runs(buf);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i].imm, got++);
    if (n > 0 || !owner->prepare_to_sleep()) continue;
    ++slept;
    const bool woke = readable(owner->wake_fd(), 200);
    owner->woken();
    ImmRun one[1];
    // Timed out with a run waiting: the wake-up was lost.
    ASSERT_FALSE(!woke && owner->pop_runs(one) == 1) << "lost wake-up at sleep " << slept;
  }
  std::printf("%u runs, the owner blocked %u times\n", got, slept);
  EXPECT_EQ(got, kRuns);
  EXPECT_GT(slept, 0u);
  EXPECT_EQ(writer.wait(), 0);
}

TEST(NvlinkRegionTable, GenerationsMakeStaleKeysFail) {
  Status st;
  auto owner =
      ShmSegment::create("/ferry-nvl-unit-r-" + std::to_string(::getpid()), ::getpid(), 0, &st);
  ASSERT_TRUE(owner);
  uint8_t h[kIpcHandleBytes] = {1, 2, 3};
  const uint64_t k1 = owner->publish(0x1000, 4096, 16, h);
  RegionEntry e;
  ASSERT_TRUE(owner->lookup(k1, &e));
  EXPECT_EQ(e.ptr, 0x1000u);
  EXPECT_EQ(e.alloc_offset, 16u);
  owner->unpublish(k1);
  EXPECT_FALSE(owner->lookup(k1, &e));
  const uint64_t k2 = owner->publish(0x2000, 4096, 0, h);
  EXPECT_EQ(uint32_t(k2), uint32_t(k1)) << "slot reused";
  EXPECT_NE(k2, k1) << "with a new generation";
  EXPECT_FALSE(owner->lookup(k1, &e));
  EXPECT_TRUE(owner->lookup(k2, &e));
}

}  // namespace
}  // namespace ferry::nvlink

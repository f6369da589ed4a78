// NVLink domain parts that need no GPU: the address codec, the shared-memory
// mailbox and message ring across processes, the region table.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "nvlink/nvlink_domain.h"
#include "nvlink/nvlink_liveness.h"
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

// A writer killed between claiming a cell and publishing it. The owner waits
// at the cell while the claimant lives (a slow writer is not skipped), and
// once it is dead skips the cell within a bounded time, counting it lost;
// every later writer's run arrives, in order, and the ring keeps its full
// capacity. `advance` false: the claimant dies before moving the enqueue
// position past its cell, so the next writer must move it on.
void dead_claimant_mailbox(bool advance) {
  using namespace std::chrono_literals;
  Status st;
  const std::string name =
      "/ferry-nvl-unit-d" + std::to_string(advance) + "-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  ASSERT_TRUE(owner->push_run(1, 1));  // before the dead claim: arrives as usual
  test::Peer victim([&](test::Channel& ch) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    if (!seg || !seg->abandon_claim_for_test(/*message=*/false, advance)) return 2;
    ch.send("claimed");
    ch.recv_str(120s);  // SIGKILLed here, its cell never published
    return 3;
  });
  ASSERT_EQ(victim.channel().recv_str(30s), "claimed");
  constexpr uint32_t kLater = 1000;
  test::Peer later([&](test::Channel&) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    if (!seg) return 2;
    for (uint32_t i = 0; i < kLater; ++i)
      while (!seg->push_run(100 + i, 1)) usleep(10);
    return 0;
  });
  ASSERT_EQ(later.wait(), 0);
  std::vector<uint32_t> got;
  ImmRun buf[256];
  auto drain_until = [&](std::chrono::steady_clock::time_point until, size_t want) {
    while (got.size() < want && std::chrono::steady_clock::now() < until) {
      const size_t n = owner->pop_runs(buf);
      for (size_t i = 0; i < n; ++i) got.push_back(buf[i].imm);
      if (n == 0) usleep(100);
    }
  };
  // The claimant lives: the owner waits at its cell, past several liveness checks.
  drain_until(std::chrono::steady_clock::now() + 10 * kDeadClaimCheck, 2);
  ASSERT_EQ(got, std::vector<uint32_t>{1}) << "nothing passes a live claimant's cell";
  EXPECT_EQ(owner->lost_runs(), 0u);
  // Killed, not reaped yet: a zombie is dead too (its pidfd is readable).
  const pid_t victim_pid = victim.pid();
  ASSERT_EQ(::kill(victim_pid, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  drain_until(t0 + 30s, 1 + kLater);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(got.size(), 1 + kLater) << "the owner stalled at the dead writer's cell";
  for (uint32_t i = 0; i < kLater; ++i) ASSERT_EQ(got[1 + i], 100 + i) << "in order, once";
  EXPECT_LT(waited, 2s) << "skipping a dead claimant's cell takes " << kDeadClaimCheck.count()
                        << " ms plus a liveness check, not seconds";
  EXPECT_EQ(owner->lost_runs(), 1u);
  EXPECT_EQ(owner->last_lost_claimant(), uint32_t(victim_pid));
  EXPECT_EQ(victim.wait(), 128 + SIGKILL);
  EXPECT_EQ(owner->pop_runs(buf), 0u);
  // The skipped cell was freed for the next lap: the ring holds a full lap again.
  uint32_t pushed = 0;
  while (owner->push_run(pushed, 1)) ++pushed;
  EXPECT_EQ(pushed, kMailboxCapacity);
  uint32_t popped = 0;
  for (size_t n; (n = owner->pop_runs(buf)) > 0;)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i].imm, popped++);
  EXPECT_EQ(popped, kMailboxCapacity);
}

TEST(NvlinkMailbox, AWriterKilledBetweenClaimAndPublishStallsNobody) {
  dead_claimant_mailbox(/*advance=*/true);
}

TEST(NvlinkMailbox, AWriterKilledBeforeMovingTheEnqueuePositionStallsNobody) {
  dead_claimant_mailbox(/*advance=*/false);
}

// Message i of producer p: 8-byte header (p, i), then bytes derived from both.
std::vector<uint8_t> message(uint32_t p, uint32_t i) {
  const size_t len = 8 + (size_t(i) * 7919 + p * 104729) % (kMsgBytes - 8 + 1);
  std::vector<uint8_t> m(len);
  std::memcpy(m.data(), &p, 4);
  std::memcpy(m.data() + 4, &i, 4);
  for (size_t k = 8; k < len; ++k) m[k] = uint8_t(k * 31 + i * 7 + p);
  return m;
}

TEST(NvlinkMessages, ThreeProducerProcessesEveryMessageIntactInOrder) {
  Status st;
  const std::string name = "/ferry-nvl-unit-m-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  constexpr uint32_t kPer = 2000;  // a 64-slot ring: producers meet back-pressure
  std::vector<std::unique_ptr<test::Peer>> producers;
  for (uint32_t p = 0; p < 3; ++p)
    producers.push_back(std::make_unique<test::Peer>([&, p](test::Channel&) {
      Status s;
      auto seg = ShmSegment::open(name, &s);
      if (!seg) return 2;
      for (uint32_t i = 0; i < kPer; ++i) {
        const auto m = message(p, i);
        while (!seg->push_msg(m.data(), m.size())) usleep(10);
      }
      return 0;
    }));
  std::vector<uint32_t> next(3, 0);
  std::vector<uint8_t> buf(kMsgBytes);
  uint32_t got = 0;
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < 3 * kPer && std::chrono::steady_clock::now() < give_up) {
    const int64_t len = owner->pop_msg(buf.data(), buf.size());
    if (len < 0) continue;
    uint32_t p, i;
    std::memcpy(&p, buf.data(), 4);
    std::memcpy(&i, buf.data() + 4, 4);
    ASSERT_LT(p, 3u);
    ASSERT_EQ(i, next[p]) << "producer " << p << ": in order, once";
    const auto want = message(p, i);
    ASSERT_EQ(size_t(len), want.size());
    ASSERT_EQ(0, std::memcmp(buf.data(), want.data(), want.size())) << "message " << p << "/" << i;
    next[p]++;
    got++;
  }
  EXPECT_EQ(got, 3 * kPer);
  for (auto& p : producers) EXPECT_EQ(p->wait(), 0);
}

TEST(NvlinkMessages, LimitsTruncationAndWakeUp) {
  Status st;
  const std::string name = "/ferry-nvl-unit-n-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  std::vector<uint8_t> big(kMsgBytes + 1, 0xab);
  EXPECT_FALSE(owner->push_msg(big.data(), big.size())) << "longer than a slot";
  EXPECT_EQ(owner->pop_msg(big.data(), big.size()), -1) << "nothing was pushed";
  EXPECT_TRUE(owner->push_msg(nullptr, 0)) << "an empty message";
  EXPECT_EQ(owner->pop_msg(nullptr, 0), 0);
  // Into a smaller buffer: the full length is reported, only cap bytes copied.
  ASSERT_TRUE(owner->push_msg(big.data(), 100));
  uint8_t small[10] = {};
  EXPECT_EQ(owner->pop_msg(small, sizeof small), 100);
  EXPECT_EQ(small[9], 0xab);
  // Full ring: back-pressure, then room again after a pop.
  uint32_t pushed = 0;
  while (owner->push_msg(&pushed, 4)) ++pushed;
  EXPECT_EQ(pushed, kMsgSlots);
  ASSERT_EQ(owner->pop_msg(small, sizeof small), 4);
  EXPECT_TRUE(owner->push_msg(&pushed, 4));
  while (owner->pop_msg(small, sizeof small) >= 0) {
  }
  // A waiting message keeps the owner awake only when receives are posted.
  ASSERT_TRUE(owner->push_msg(small, 4));
  EXPECT_FALSE(owner->prepare_to_sleep(/*messages_count=*/true));
  EXPECT_TRUE(owner->prepare_to_sleep(/*messages_count=*/false));
  owner->woken();
  owner->pop_msg(small, sizeof small);
  // A sleeping owner is woken by a message from another process.
  ASSERT_TRUE(owner->prepare_to_sleep(true));
  test::Peer writer([&](test::Channel&) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    const char m[3] = {'h', 'e', 'y'};
    return seg && seg->push_msg(m, 3) ? 0 : 2;
  });
  EXPECT_TRUE(readable(owner->wake_fd(), 10000)) << "no wake-up within 10 s";
  EXPECT_EQ(writer.wait(), 0);
  owner->woken();
  ASSERT_EQ(owner->pop_msg(small, sizeof small), 3);
  EXPECT_EQ(std::memcmp(small, "hey", 3), 0);
}

// The message ring's version of the dead claimant: a sender killed between
// claiming a slot and publishing its message.
TEST(NvlinkMessages, ASenderKilledBetweenClaimAndPublishStallsNobody) {
  using namespace std::chrono_literals;
  Status st;
  const std::string name = "/ferry-nvl-unit-dm-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  test::Peer victim([&](test::Channel& ch) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    if (!seg || !seg->abandon_claim_for_test(/*message=*/true, /*advance=*/true)) return 2;
    ch.send("claimed");
    ch.recv_str(120s);
    return 3;
  });
  ASSERT_EQ(victim.channel().recv_str(30s), "claimed");
  constexpr uint32_t kLater = 200;  // more than the ring holds: the sender meets back-pressure
  test::Peer later([&](test::Channel&) {
    Status s;
    auto seg = ShmSegment::open(name, &s);
    if (!seg) return 2;
    for (uint32_t i = 0; i < kLater; ++i) {
      const auto m = message(7, i);
      while (!seg->push_msg(m.data(), m.size())) usleep(10);
    }
    return 0;
  });
  std::vector<uint8_t> buf(kMsgBytes);
  const auto alive_until = std::chrono::steady_clock::now() + 10 * kDeadClaimCheck;
  while (std::chrono::steady_clock::now() < alive_until)
    ASSERT_EQ(owner->pop_msg(buf.data(), buf.size()), -1) << "no message passes a live claimant";
  EXPECT_EQ(owner->lost_msgs(), 0u);
  const uint32_t victim_pid = uint32_t(victim.pid());
  victim.kill();  // SIGKILL, reaped
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t got = 0;
  while (got < kLater && std::chrono::steady_clock::now() < t0 + 30s) {
    const int64_t len = owner->pop_msg(buf.data(), buf.size());
    if (len < 0) {
      usleep(100);
      continue;
    }
    const auto want = message(7, got);
    ASSERT_EQ(size_t(len), want.size());
    ASSERT_EQ(0, std::memcmp(buf.data(), want.data(), want.size())) << "message " << got;
    ++got;
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(got, kLater) << "the owner stalled at the dead sender's slot";
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(owner->lost_msgs(), 1u);
  EXPECT_EQ(owner->last_lost_claimant(), victim_pid);
  EXPECT_EQ(later.wait(), 0);
  EXPECT_EQ(owner->pop_msg(buf.data(), buf.size()), -1);
}

TEST(NvlinkLiveness, AnExitedPeerIsDeadWithinOnePeriodAndStaysDead) {
  using namespace std::chrono_literals;
  test::Peer child([](test::Channel& ch) { return ch.recv_str(60s) == "exit" ? 0 : 2; });
  PeerLiveness l(child.pid(), 50ms);
  const auto t0 = PeerLiveness::Clock::now();
  EXPECT_TRUE(l.alive(t0));
  ASSERT_TRUE(child.channel().send("exit"));
  ASSERT_EQ(child.wait(), 0);
  EXPECT_TRUE(l.alive(t0 + 10ms)) << "within the period the last answer stands";
  EXPECT_FALSE(l.alive(t0 + 60ms));
  EXPECT_FALSE(l.alive(t0 + 70ms));
  // A pid with no process behind it (the reaped child's) is dead at once.
  PeerLiveness gone(child.pid(), 50ms);
  EXPECT_FALSE(gone.alive());
}

TEST(NvlinkRegionTable, GenerationsMakeStaleKeysFail) {
  Status st;
  auto owner =
      ShmSegment::create("/ferry-nvl-unit-r-" + std::to_string(::getpid()), ::getpid(), 0, &st);
  ASSERT_TRUE(owner);
  uint8_t h[kIpcHandleBytes] = {1, 2, 3};
  const uint64_t k1 = owner->publish(0x1000, 4096, 16, h);
  RegionInfo e;
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

// The region table's seqlock: an owner thread rewrites entries (unpublish,
// publish with a new generation) while reader threads look keys up, current
// and stale ones. Every field of an entry is derived from its generation, so
// a lookup that succeeds must return exactly that generation's fields: a copy
// torn between two publications, or a stale key answered with newer fields,
// fails the check. Under ThreadSanitizer it also shows the lookup races with
// no publication (two readers share the owner's mapping, where TSan sees the
// accesses; one reads through a mapping of its own, as a writer process does).
void fill_entry(uint64_t v, uint8_t (&h)[kIpcHandleBytes]) {
  for (size_t i = 0; i < kIpcHandleBytes; ++i) h[i] = uint8_t(v * 131 + i);
}

TEST(NvlinkRegionTable, LookupsRacingRewritesReturnConsistentSnapshots) {
  using namespace std::chrono_literals;
  Status st;
  const std::string name = "/ferry-nvl-unit-s-" + std::to_string(::getpid());
  auto owner = ShmSegment::create(name, ::getpid(), 0, &st);
  ASSERT_TRUE(owner) << st.message();
  auto other = ShmSegment::open(name, &st);
  ASSERT_TRUE(other) << st.message();
  constexpr size_t kKeys = 4;
  std::atomic<uint64_t> keys[kKeys];
  uint64_t next_gen = 1;  // the table's generations count publications: 1, 2, ...
  auto publish = [&](uint64_t* key) {
    uint8_t h[kIpcHandleBytes];
    fill_entry(next_gen, h);
    *key = owner->publish(next_gen << 12, next_gen, next_gen ^ 0x5555, h);
    return (*key >> 32) == next_gen++;
  };
  for (auto& k : keys) {
    uint64_t key;
    ASSERT_TRUE(publish(&key));
    k.store(key);
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, hits{0}, misses{0};
  auto reader = [&](ShmSegment* seg, uint32_t seed) {
    std::minstd_rand rng(seed);
    uint64_t stale = keys[0].load();
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t key = rng() % 4 == 0 ? stale : keys[rng() % kKeys].load();
      RegionInfo e;
      if (!seg->lookup(key, &e)) {
        misses.fetch_add(1, std::memory_order_relaxed);
        stale = keys[rng() % kKeys].load();
        continue;
      }
      hits.fetch_add(1, std::memory_order_relaxed);
      const uint64_t v = key >> 32;
      uint8_t h[kIpcHandleBytes];
      fill_entry(v, h);
      if (e.ptr != v << 12 || e.len != v || e.alloc_offset != (v ^ 0x5555) ||
          std::memcmp(e.handle, h, sizeof h) != 0)
        bad.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> readers;
  readers.emplace_back(reader, owner.get(), 1);
  readers.emplace_back(reader, owner.get(), 2);
  readers.emplace_back(reader, other.get(), 3);
  while (hits.load() + misses.load() < 3) std::this_thread::yield();  // the readers run
  bool gens_ok = true;
  uint64_t rewrites = 0;
  const auto until = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < until) {
    for (auto& k : keys) {
      owner->unpublish(k.load());
      uint64_t key;
      gens_ok = publish(&key) && gens_ok;  // reuses the slot just freed
      k.store(key);
      ++rewrites;
    }
  }
  stop.store(true);
  for (auto& t : readers) t.join();
  std::printf("%llu rewrites, %llu lookups hit, %llu missed\n", (unsigned long long)rewrites,
              (unsigned long long)hits.load(), (unsigned long long)misses.load());
  EXPECT_TRUE(gens_ok) << "each publication takes the next generation";
  EXPECT_EQ(bad.load(), 0u) << "lookups returned fields of another generation";
  EXPECT_GT(hits.load(), 0u);
  EXPECT_GT(rewrites, 1000u);
}

}  // namespace
}  // namespace ferry::nvlink

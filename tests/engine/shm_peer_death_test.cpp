// A peer reached over libfabric's shm provider dies (SIGKILL) while large
// writes to it are in flight. libfabric 1.17's shm never completes work aimed
// at a dead process and can spin forever inside fi_writemsg on a lock the dead
// process held; the engine must stay in control all the same.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/ferry.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"
#include "support/shm_region.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::ask;
using test::Channel;

int repeats() {
  const char* env = std::getenv("FERRY_SHM_DEATH_REPEATS");
  return env != nullptr ? std::atoi(env) : 12;
}

struct Outcomes {
  std::mutex mu;
  std::vector<Status> statuses;
  std::atomic<int> ended{0};
  OnDone record() {
    return OnDone::callback([this](const Status& st) {
      {
        std::lock_guard lk(mu);
        statuses.push_back(st);
      }
      ended.fetch_add(1);
    });
  }
};

bool dead_peer_code(Code c) {
  return c == Code::kUnavailable || c == Code::kDeadlineExceeded;
}

// 64 writes of 4 MiB to a peer: 16 land (so earlier kills left the NIC
// working), then the peer is killed (SIGKILL) while the other 48 are being
// submitted, posted and copied (after 48, 36, 24 or 12 of them, varying by
// repeat; every other repeat once it is seen holding its region lock). Every
// write ends within its deadline, ok if it landed before the kill, else
// kUnavailable or kDeadlineExceeded; and from then on writes to the dead peer
// fail with kUnavailable.
TEST(ShmPeerDeathTest, KilledPeerFailsInFlightWritesAndLaterWrites) {
  constexpr uint64_t kWrite = 4 << 20, kSlots = 4, kRegion = kSlots * kWrite;
  constexpr int kFirst = 16, kBurst = 48;
  auto cfg = test::config_for("shm");
  cfg.default_deadline = 5s;
  test::PeerSpawner victims([&](Channel& ch) { return test::serve_region(ch, cfg, kRegion); });
  TransferEngine e(cfg);
  test::Buffer src(kWrite);
  auto [h, mine] = e.reg_mr(src.get(), kWrite);
  int failed_total = 0, holding_kills = 0;
  for (int rep = 0; rep < repeats(); ++rep) {
    SCOPED_TRACE("repeat " + std::to_string(rep));
    auto victim = victims.spawn();
    ASSERT_TRUE(victim) << "cannot start a peer";
    const pid_t pid = victim->pid();
    auto desc = MrDesc::from_bytes(victim->channel().recv(30s).value());
    ASSERT_EQ(ask(victim->channel(), "counter 1"), "ok");
    auto write = [&](int i, Outcomes& out) {
      e.submit_single_write(kWrite, 1, h, 0, desc, (i % kSlots) * kWrite, out.record());
    };

    Outcomes first;
    for (int i = 0; i < kFirst; ++i) write(i, first);
    ASSERT_TRUE(test::wait_until([&] { return first.ended.load() == kFirst; }, 20s));
    {
      std::lock_guard lk(first.mu);
      for (const Status& st : first.statuses) ASSERT_TRUE(st.is_ok()) << st.to_string();
    }

    Outcomes burst;
    const int before_kill = kBurst - (rep % 4) * 12;
    const auto submitted = std::chrono::steady_clock::now();
    for (int i = 0; i < before_kill; ++i) write(i, burst);
    // Every other repeat, the peer dies while it holds its region lock
    // (copying our writes), the case that used to leave the sender spinning
    // inside fi_writemsg for ever.
    if (rep % 2 == 0) {
      const auto raw = desc.nics[0].addr.raw();
      test::ShmRegionLock lock(
          std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
      holding_kills += test::wait_until([&] { return lock.taken(); }, 2s);
    }
    victim->kill();  // SIGKILL, then reaped
    const auto killed = std::chrono::steady_clock::now();
    for (int i = before_kill; i < kBurst; ++i) write(i, burst);
    ASSERT_TRUE(
        test::wait_until([&] { return burst.ended.load() == kBurst; }, cfg.default_deadline + 5s))
        << burst.ended.load() << " of " << kBurst << " writes ended";
    EXPECT_LT(std::chrono::steady_clock::now() - submitted, cfg.default_deadline + 2s);
    {
      std::lock_guard lk(burst.mu);
      for (const Status& st : burst.statuses) {
        if (st.is_ok()) continue;
        ++failed_total;
        EXPECT_TRUE(dead_peer_code(st.code())) << st.to_string();
      }
    }

    // Writes to the dead peer are refused from now on: at once when its
    // death was noticed in flight, else at the next liveness check (at most
    // 100 ms after the kill, plus a worker's loop).
    Status later;
    ASSERT_TRUE(test::wait_until(
        [&] {
          std::atomic<bool> done{false};
          e.submit_single_write(8, 1, h, 0, desc, 0, [&](const Status& st) {
            later = st;
            done = true;
          });
          return test::wait_until([&] { return done.load(); }, cfg.default_deadline + 5s) &&
                 !later.is_ok();
        },
        2s))
        << "writes to the dead peer still succeed: " << later.to_string();
    EXPECT_EQ(later.code(), Code::kUnavailable) << later.to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - killed, 1s);
    for (int i = 0; i < 3; ++i) {
      std::atomic<bool> done{false};
      Status again;
      e.submit_single_write(8, 1, h, 0, desc, 0, [&](const Status& st) {
        again = st;
        done = true;
      });
      ASSERT_TRUE(test::wait_until([&] { return done.load(); }, cfg.default_deadline + 5s));
      EXPECT_EQ(again.code(), Code::kUnavailable) << again.to_string();
    }
    // A killed process leaves its shm region behind.
    test::remove_shm_regions_of(pid);
  }
  RecordProperty("writes_failed", std::to_string(failed_total));
  RecordProperty("kills_holding_the_lock", std::to_string(holding_kills));
  EXPECT_GT(failed_total, 0) << "no write was in flight at a kill";
}

}  // namespace
}  // namespace ferry

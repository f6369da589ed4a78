// A sender that dies holding the receiver's shm region lock. libfabric 1.17's
// shm progress (fi_cq_read) takes the receiver's own region lock, so without
// help the receiver's worker would spin inside the provider for ever; the
// Domain's rescuer releases a lock held that long while a peer has exited.
// With nothing queued, the receiver's progress never takes the lock at all,
// yet every sender backs off from it: the rescuer also watches the lock once
// a peer has exited, and stops watching once no lock a dead peer may hold is
// taken.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/domain.h"
#include "fabric/fabric_domain.h"
#include "support/fabric_target.h"
#include "support/process.h"
#include "support/shm_region.h"

namespace ferry::fabric {
namespace {

using core::Completion;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::unique_ptr<core::Domain> open_shm() {
  return test::open_fabric_nic("shm", "shm");
}

// The region lock word of the endpoint `name` ("fi_shm://<region>"), mapped
// read-write; nullptr when the region cannot be mapped.
int* map_lock(std::string_view name, void** map) {
  name = name.substr(0, name.find('\0'));
  name.remove_prefix(std::string_view("fi_shm://").size());
  const int fd = ::open(("/dev/shm/" + std::string(name)).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  *map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (*map == MAP_FAILED) return nullptr;
  return reinterpret_cast<int*>(static_cast<uint8_t*>(*map) + 24);
}

// The sender: an shm endpoint of its own (a live peer with a region), which
// on "lock" sends the receiver a message, takes the receiver's region lock
// and reports it, then waits to be killed.
int sender(test::Channel& ch) {
  auto d = open_shm();
  if (!d) return 2;
  auto target = ch.recv(30s);
  if (!target) return 3;
  ch.send(std::vector<uint8_t>(d->raw_address().begin(), d->raw_address().end()));
  Status st;
  const core::PeerId peer = d->add_peer(*target, &st);
  if (!st.is_ok()) return 6;
  static const char msg[8] = "stalled";
  Completion buf[8];
  auto send = [&] {
    const auto posted_by = Clock::now() + 10s;
    while (d->post_send(peer, msg, sizeof(msg), nullptr, 1).posted == 0) {
      if (Clock::now() > posted_by) return false;
      d->poll(buf);
    }
    return true;
  };
  // The first message connects (the receiver polls meanwhile).
  if (!send()) return 7;
  ch.send(std::string("connected"));
  if (ch.recv_str(30s) != "lock") return 4;
  void* map = nullptr;
  int* lock = map_lock(
      std::string_view(reinterpret_cast<const char*>(target->data()), target->size()), &map);
  if (lock == nullptr) return 5;
  // A message queued for the receiver (which does not poll now), so that its
  // progress has a command to take the lock for; then the lock, as a sender
  // holds it while queueing.
  if (!send()) return 8;
  pthread_spin_lock(reinterpret_cast<pthread_spinlock_t*>(lock));
  ch.send(std::string("locked"));
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) d->poll(buf);
  return 0;
}

// Spawns a sender, tells it our shm name, and adds the address it answers with
// as a peer of `d`: the rescuer watches the peers this domain knows.
void spawn_known_sender(test::PeerSpawner& spawner, core::Domain& d, const std::string& name,
                        std::unique_ptr<test::Peer>* out,
                        std::vector<uint8_t>* its_address = nullptr) {
  auto proc = spawner.spawn();
  ASSERT_TRUE(proc);
  ASSERT_TRUE(proc->channel().send(std::vector<uint8_t>(name.begin(), name.end())));
  auto raw = proc->channel().recv(30s);
  ASSERT_TRUE(raw);
  Status st;
  d.add_peer(*raw, &st);
  ASSERT_TRUE(st.is_ok()) << st.message();
  if (its_address != nullptr) *its_address = *raw;
  *out = std::move(proc);
}

TEST(FabricShmLockRescue, ASenderKilledHoldingOurRegionLockDoesNotStallOurProgress) {
  test::PeerSpawner spawner(sender);
  auto a = open_shm();
  ASSERT_NE(a, nullptr);
  const std::string name(reinterpret_cast<const char*>(a->raw_address().data()),
                         a->raw_address().size());
  test::ShmRegionLock our_lock(name);
  std::unique_ptr<test::Peer> proc;
  ASSERT_NO_FATAL_FAILURE(spawn_known_sender(spawner, *a, name, &proc));
  std::optional<std::string> connected;
  const auto connect_by = Clock::now() + 30s;
  while (!(connected = proc->channel().recv_str(10ms)) && Clock::now() < connect_by) {
    Completion buf[8];
    a->poll(buf);
  }
  ASSERT_EQ(connected, "connected");
  ASSERT_TRUE(proc->channel().send(std::string("lock")));
  ASSERT_EQ(proc->channel().recv_str(30s), "locked");
  ASSERT_TRUE(our_lock.taken());
  proc->kill();

  // Our progress on another thread; should it spin for good, the test frees
  // the lock itself after 10 s so that the failure is reported, not a hang.
  std::atomic<bool> returned{false};
  const auto t0 = Clock::now();
  std::thread poller([&] {
    Completion buf[8];
    a->poll(buf);
    returned = true;
  });
  while (!returned && Clock::now() - t0 < 10s) std::this_thread::sleep_for(10ms);
  const auto took = Clock::now() - t0;
  const bool rescued = returned.load();
  if (!rescued) {
    void* map = nullptr;
    int* lock = map_lock(name, &map);
    ASSERT_NE(lock, nullptr);
    pthread_spin_unlock(reinterpret_cast<pthread_spinlock_t*>(lock));
    ::munmap(map, 4096);
  }
  poller.join();
  EXPECT_TRUE(rescued) << "progress spun on our region lock for 10 s";
  EXPECT_LT(took, 3s);
  EXPECT_FALSE(our_lock.taken());
  test::remove_shm_regions_of(proc->pid());
}

// A peer that takes the receiver's region lock and queues nothing: it opens
// an shm endpoint of its own (a live peer the receiver watches), sends its
// address, and on "lock" takes the lock, reports it and waits to be killed.
int lock_holder(test::Channel& ch) {
  auto d = open_shm();
  if (!d) return 2;
  auto target = ch.recv(30s);
  if (!target) return 3;
  ch.send(std::vector<uint8_t>(d->raw_address().begin(), d->raw_address().end()));
  if (ch.recv_str(30s) != "lock") return 4;
  void* map = nullptr;
  int* lock = map_lock(
      std::string_view(reinterpret_cast<const char*>(target->data()), target->size()), &map);
  if (lock == nullptr) return 5;
  pthread_spin_lock(reinterpret_cast<pthread_spinlock_t*>(lock));
  ch.send(std::string("locked"));
  ch.recv_str(60s);  // killed meanwhile
  return 0;
}

constexpr uint32_t kImm = 0x5eed;
constexpr char kPayload[8] = "arrived";

// A fresh sender: gets the receiver's address, key and base, writes
// kPayload with kImm to it (retrying on back-pressure for up to 20 s) and
// reports "written" once the write completed, or what went wrong.
int imm_writer(test::Channel& ch) {
  auto d = open_shm();
  if (!d) return 2;
  auto msg = ch.recv(30s);
  if (!msg || msg->size() < 17) return 3;
  const std::vector<uint8_t> raw(msg->begin(), msg->end() - 16);
  core::WriteDesc w;
  std::memcpy(&w.rkey, msg->data() + msg->size() - 16, 8);
  std::memcpy(&w.remote_addr, msg->data() + msg->size() - 8, 8);
  Status st;
  w.peer = d->add_peer(raw, &st);
  if (!st.is_ok()) return 4;
  w.src = kPayload;
  w.len = sizeof(kPayload);
  w.imm = kImm;
  w.has_imm = true;
  w.ctx = 7;
  Completion buf[8];
  const auto deadline = Clock::now() + 20s;
  for (;;) {
    const core::PostResult r = d->post_writes({&w, 1});
    if (!r.error.is_ok()) {
      ch.send("post failed: " + r.error.message());
      return 5;
    }
    if (r.posted == 1) break;
    if (Clock::now() > deadline) {
      ch.send(std::string("not posted within 20 s"));
      return 6;
    }
    d->poll(buf);
  }
  for (;;) {
    const size_t n = d->poll(buf);
    for (size_t i = 0; i < n; ++i) {
      if (buf[i].kind != Completion::Kind::kWrite || buf[i].ctx != 7) continue;
      ch.send(buf[i].status.is_ok() ? std::string("written")
                                    : "write failed: " + buf[i].status.message());
      ch.recv_str(60s);  // until the receiver is done
      return 0;
    }
    if (Clock::now() > deadline) {
      ch.send(std::string("no completion within 20 s"));
      return 7;
    }
  }
}

TEST(FabricShmLockRescue, ALockLeftByAKilledPeerIsReleasedWithoutOurProgressNeedingIt) {
  test::PeerSpawner holders(lock_holder);
  test::PeerSpawner writers(imm_writer);
  auto r = open_shm();
  ASSERT_NE(r, nullptr);
  const std::string name(reinterpret_cast<const char*>(r->raw_address().data()),
                         r->raw_address().size());
  std::vector<uint8_t> region(64, 0);
  Status st;
  auto mr = r->register_mr(region.data(), region.size(), Device::host(), true, &st);
  ASSERT_NE(mr, nullptr) << st.message();
  test::ShmRegionLock our_lock(name);

  std::unique_ptr<test::Peer> s1;
  ASSERT_NO_FATAL_FAILURE(spawn_known_sender(holders, *r, name, &s1));
  ASSERT_TRUE(s1->channel().send(std::string("lock")));
  ASSERT_EQ(s1->channel().recv_str(30s), "locked");
  ASSERT_TRUE(our_lock.taken());
  s1->kill();  // holding our lock, nothing queued; we do nothing meanwhile

  const auto t0 = Clock::now();
  auto s2 = writers.spawn();
  ASSERT_TRUE(s2);
  std::vector<uint8_t> msg(name.begin(), name.end());
  msg.resize(msg.size() + 16);
  std::memcpy(msg.data() + msg.size() - 16, &mr->rkey, 8);
  std::memcpy(msg.data() + msg.size() - 8, &mr->remote_base, 8);
  ASSERT_TRUE(s2->channel().send(msg));

  // Our progress: it never needs our lock (nothing is queued to us).
  bool arrived = false;
  std::optional<std::string> report;
  while (!arrived && Clock::now() - t0 < 5s) {
    Completion buf[8];
    const size_t n = r->poll(buf);
    for (size_t i = 0; i < n; ++i)
      if (buf[i].kind == Completion::Kind::kRemoteImm && buf[i].imm == kImm) {
        EXPECT_TRUE(buf[i].status.is_ok()) << buf[i].status.message();
        arrived = true;
      }
  }
  const auto took = Clock::now() - t0;
  const bool lock_freed = !our_lock.taken();
  if (!lock_freed) {
    // Free it ourselves, so that the failure is reported rather than a hang.
    void* map = nullptr;
    int* lock = map_lock(name, &map);
    ASSERT_NE(lock, nullptr);
    pthread_spin_unlock(reinterpret_cast<pthread_spinlock_t*>(lock));
    ::munmap(map, 4096);
  }
  EXPECT_TRUE(arrived) << "the second sender's write did not arrive within 5 s";
  EXPECT_TRUE(lock_freed) << "our region lock is still held by the killed peer";
  if (arrived) {
    EXPECT_EQ(std::memcmp(region.data(), kPayload, sizeof(kPayload)), 0);
    EXPECT_LT(took, 3s);
    // The writer's own view: its write completed.
    const auto report_by = Clock::now() + 10s;
    while (!(report = s2->channel().recv_str(10ms)) && Clock::now() < report_by) {
      Completion buf[8];
      r->poll(buf);
    }
    EXPECT_EQ(report, "written");
  }
  s2->channel().send(std::string("done"));
  s2->kill();
  test::remove_shm_regions_of(s1->pid());
  test::remove_shm_regions_of(s2->pid());
}

// A peer that takes its own region lock, as its progress does while it copies
// what is queued to it: it opens an shm endpoint, sends its address, and on
// "lock" takes the lock, reports it and waits to be killed.
int own_lock_holder(test::Channel& ch) {
  auto d = open_shm();
  if (!d) return 2;
  if (!ch.recv(30s)) return 3;
  const std::vector<uint8_t> own(d->raw_address().begin(), d->raw_address().end());
  ch.send(own);
  if (ch.recv_str(30s) != "lock") return 4;
  void* map = nullptr;
  int* lock =
      map_lock(std::string_view(reinterpret_cast<const char*>(own.data()), own.size()), &map);
  if (lock == nullptr) return 5;
  pthread_spin_lock(reinterpret_cast<pthread_spinlock_t*>(lock));
  ch.send(std::string("locked"));
  ch.recv_str(60s);  // killed meanwhile
  return 0;
}

// After a peer's exit the rescuer looks every 50 ms while a lock the dead
// process may hold is taken; once none is, it waits on the pidfds again
// instead of waking for the rest of the domain's life.
TEST(FabricShmLockRescue, TheRescuerRestsOnceNoLockOfADeadPeerIsTaken) {
  test::PeerSpawner holders(own_lock_holder);
  auto r = open_shm();
  ASSERT_NE(r, nullptr);
  const std::string name(reinterpret_cast<const char*>(r->raw_address().data()),
                         r->raw_address().size());
  std::unique_ptr<test::Peer> p;
  std::vector<uint8_t> its_address;
  ASSERT_NO_FATAL_FAILURE(spawn_known_sender(holders, *r, name, &p, &its_address));
  const std::string its_name(reinterpret_cast<const char*>(its_address.data()), its_address.size());
  ASSERT_TRUE(p->channel().send(std::string("lock")));
  ASSERT_EQ(p->channel().recv_str(30s), "locked");
  test::ShmRegionLock its_lock(its_name);
  ASSERT_TRUE(its_lock.taken());
  p->kill();  // holding its own lock

  ASSERT_TRUE(test::wait_until([&] { return shm_rescuer_counts(*r).exits_seen == 1; }, 10s));
  const uint64_t woken = shm_rescuer_counts(*r).timed_wakes;
  EXPECT_TRUE(
      test::wait_until([&] { return shm_rescuer_counts(*r).timed_wakes >= woken + 2; }, 10s))
      << "the rescuer does not look while the dead peer's lock is taken";
  EXPECT_EQ(shm_rescuer_counts(*r).rests, 0u);

  // Freed as a rescue would, with a store: pthread_spin_unlock here would be an
  // unlock ThreadSanitizer never saw locked. Nothing is left to rescue.
  void* map = nullptr;
  int* lock = map_lock(its_name, &map);
  ASSERT_NE(lock, nullptr);
  pthread_spinlock_t fresh;
  pthread_spin_init(&fresh, PTHREAD_PROCESS_SHARED);
  int unlocked = 0;
  std::memcpy(&unlocked, const_cast<const void*>(static_cast<volatile void*>(&fresh)),
              sizeof(unlocked));
  pthread_spin_destroy(&fresh);
  __atomic_store_n(lock, unlocked, __ATOMIC_RELEASE);
  ::munmap(map, 4096);
  EXPECT_TRUE(test::wait_until([&] { return shm_rescuer_counts(*r).rests == 1; }, 10s))
      << "the rescuer still looks every 50 ms with no lock of a dead peer taken";
  const uint64_t resting = shm_rescuer_counts(*r).timed_wakes;
  // Six looks' time, were it still looking.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(shm_rescuer_counts(*r).timed_wakes, resting);
  EXPECT_EQ(shm_rescuer_counts(*r).rests, 1u);
  test::remove_shm_regions_of(p->pid());
}

}  // namespace
}  // namespace ferry::fabric

// A sender that dies holding the receiver's shm region lock. libfabric 1.17's
// shm progress (fi_cq_read) takes the receiver's own region lock, so without
// help the receiver's worker would spin inside the provider for ever; the
// Domain's rescuer releases a lock held that long while a peer has exited.
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

TEST(FabricShmLockRescue, ASenderKilledHoldingOurRegionLockDoesNotStallOurProgress) {
  test::PeerSpawner spawner(sender);
  auto a = open_shm();
  ASSERT_NE(a, nullptr);
  const std::string name(reinterpret_cast<const char*>(a->raw_address().data()),
                         a->raw_address().size());
  test::ShmRegionLock our_lock(name);
  auto proc = spawner.spawn();
  ASSERT_TRUE(proc);
  ASSERT_TRUE(proc->channel().send(std::vector<uint8_t>(name.begin(), name.end())));
  auto raw = proc->channel().recv(30s);
  ASSERT_TRUE(raw);
  Status st;
  a->add_peer(*raw, &st);  // the rescuer watches the peers this domain knows
  ASSERT_TRUE(st.is_ok()) << st.message();
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

}  // namespace
}  // namespace ferry::fabric

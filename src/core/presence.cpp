#include "core/presence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

#include "core/thread_records.h"

namespace ferry::core::presence {

namespace {

// Static storage, never destroyed: threads may still enter gates while the
// process exits.
constinit ThreadRecords<Record, kRecords> g_records;

long membarrier(int cmd) {
  return ::syscall(__NR_membarrier, cmd, 0, 0);
}

// Set once the thread's Releaser is gone: gates entered by destructors that
// run after it count themselves the old way.
thread_local bool t_exiting = false;

// Gives the thread's record back when the thread exits.
struct Releaser {
  Record* r = nullptr;
  ~Releaser() {
    t_exiting = true;
    if (r == nullptr) return;
    detail::t_record = nullptr;
    r->depth = 0;
    g_records.give_back(r);
  }
};

}  // namespace

bool expedited() {
  static const bool ok = [] {
    const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
    return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }();
  return ok;
}

// Registering costs the kernel an RCU grace period (milliseconds under load)
// once the process has several threads, and nothing while it has one: decide
// when the library is loaded, before the engine's threads exist, rather than
// at the first gate entered, which is on a caller's way to the wire.
[[maybe_unused]] const bool g_registered_at_load = expedited();

Record* acquire_record() {
  if (t_exiting || !expedited()) return nullptr;
  static thread_local Releaser releaser;
  Record* got = g_records.take();
  if (got == nullptr) return nullptr;
  got->depth = 0;
  releaser.r = got;
  detail::t_record = got;
  return got;
}

void heavy_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!expedited()) return;  // nobody holds a slot: every gate counts
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // The registration is kept across fork(2); should it be lost all the same,
  // register again, and failing that take the slow barrier that needs none.
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0) return;
  // No barrier at all: wait out every thread's time slice instead, which
  // orders what they stored before it on any kernel that preempts them.
  for (int i = 0; i < 64; ++i) std::this_thread::yield();
}

bool anyone_in(const void* gate) {
  for (size_t i = 0, used = g_records.used(); i < used; ++i)
    for (const auto& s : g_records[i].slot)
      if (s.load(std::memory_order_acquire) == gate) return true;
  return false;
}

}  // namespace ferry::core::presence

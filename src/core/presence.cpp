#include "core/presence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>

namespace ferry::core::presence {

namespace {

// Static storage, never destroyed: threads may still enter gates while the
// process exits.
Record g_records[kRecords];
std::atomic<size_t> g_used{0};  // records ever handed out (a high-water mark)

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
    r->owned.store(false, std::memory_order_release);
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
  Record* got = nullptr;
  const size_t used = g_used.load(std::memory_order_acquire);
  for (size_t i = 0; i < used && got == nullptr; ++i) {
    bool free = false;
    if (g_records[i].owned.compare_exchange_strong(free, true, std::memory_order_acq_rel))
      got = &g_records[i];
  }
  while (got == nullptr) {
    size_t n = g_used.load(std::memory_order_relaxed);
    if (n >= kRecords) return nullptr;
    bool free = false;
    if (g_records[n].owned.compare_exchange_strong(free, true, std::memory_order_acq_rel)) {
      got = &g_records[n];
      size_t expect = n;
      // Publish it to the closers' scans (a record that is not published
      // yet has never held a slot).
      while (expect < n + 1 && !g_used.compare_exchange_weak(expect, n + 1)) {
      }
    }
  }
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
  const size_t used = g_used.load(std::memory_order_acquire);
  for (size_t i = 0; i < used; ++i)
    for (const auto& s : g_records[i].slot)
      if (s.load(std::memory_order_acquire) == gate) return true;
  return false;
}

}  // namespace ferry::core::presence

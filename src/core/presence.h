// Where threads announce that they are inside a gate (a Lifeline's run, a
// public engine call) so that whoever closes the gate can wait for them to
// leave, without an atomic read-modify-write on either side of every entry.
//
// The usual shape is a shared count: enter adds one, checks the closed flag,
// leaves by taking one off; the closer sets the flag, then waits for the count
// to reach zero. Those are two locked instructions per entry, on a line every
// entering thread writes. Here each thread writes a slot of its own instead
// (a plain store) and the closer pays for the ordering: after setting its
// flag it runs membarrier(2), which puts a full barrier on every running
// thread of the process, so each entering thread either stored its slot
// before that barrier (the closer's scan sees it and waits) or loads the flag
// after it (and sees the gate closed). Entry then needs only a compiler
// barrier between its store and its load.
//
// Where membarrier is unavailable (old kernels, filters), or a thread holds
// more than kSlots gates at once, or more than kRecords threads are inside
// gates, enter() returns kNoSlot and the caller counts itself the old way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::core::presence {

inline constexpr int kNoSlot = -1;
inline constexpr int kSlots = 6;          // gates one thread may hold at once
inline constexpr size_t kRecords = 1024;  // threads that may hold a slot at once

struct alignas(64) Record {
  std::atomic<const void*> slot[kSlots] = {};
  uint32_t depth = 0;  // slots in use; the owning thread only
  std::atomic<bool> owned{false};
};

// Whether the closer's side works (membarrier registered); decided once per
// process, before the first entry.
bool expedited();
// The calling thread's record (acquired on first use, given back when the
// thread exits), or null.
Record* acquire_record();

namespace detail {
// Trivial, so reading it needs no initialisation check.
inline thread_local Record* t_record = nullptr;
}  // namespace detail

// The slot the calling thread now holds for `gate`, or kNoSlot. The caller
// reads its closed flag after this and, seeing it closed, leaves at once.
inline int enter(const void* gate) {
  Record* r = detail::t_record;
  if (r == nullptr && (r = acquire_record()) == nullptr) return kNoSlot;
  const uint32_t d = r->depth;
  if (d == kSlots) return kNoSlot;
  r->slot[d].store(gate, std::memory_order_relaxed);
  r->depth = d + 1;
  // The store above and the caller's load of its flag: the closer's
  // membarrier orders them for every thread.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return int(d);
}

// Leaves what enter() returned (innermost first). Release: what the caller
// did inside comes before the closer's scan seeing the slot empty.
inline void leave(int slot) {
  Record* r = detail::t_record;
  r->slot[slot].store(nullptr, std::memory_order_release);
  r->depth = uint32_t(slot);
}

// After the closer stored its flag (sequentially consistent): every thread
// still inside `gate` is seen by the scan that follows this; threads entering
// later see the flag.
void heavy_fence();
// True when some thread holds a slot for `gate`. Call heavy_fence() first.
bool anyone_in(const void* gate);

}  // namespace ferry::core::presence

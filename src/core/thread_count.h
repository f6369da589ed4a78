// A count that many threads add to per submission or per poll (the wake-up
// counters of core/wake.h), with no locked instruction on the way: each
// thread adds to a cell of its own, one writer per cell, by a load and a
// store. Cells live in a per-thread block (core/thread_records.h), folded into
// the retired totals and cleared when its thread exits; load() sums the blocks
// and the retired totals under the totals' lock (for tests and statistics,
// not for the datapath).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::core {

inline constexpr size_t kMaxThreadCounts = 16;  // ThreadCount objects per process
// Threads with a block at once; those beyond it add to the totals directly (a
// locked instruction per add).
inline constexpr size_t kMaxCountingThreads = 1024;

namespace detail {
// A line of its own for each thread's block: blocks stand side by side in
// one table, and two threads adding on a shared line would contend for it.
struct alignas(64) ThreadCells {
  std::array<std::atomic<uint64_t>, kMaxThreadCounts> v{};
  std::atomic<bool> owned{false};
};
// Trivial, so reading it needs no initialisation check.
inline thread_local ThreadCells* t_cells = nullptr;
// The calling thread's block, taken on first use; null once the thread's exit
// handling retired it, or when every block is taken (a count added then goes
// to the totals).
ThreadCells* register_thread_cells();
void add_retired(size_t id, uint64_t n);
}  // namespace detail

class ThreadCount {
 public:
  // Objects with static storage only (core/wake.h's counters): ids are never
  // given back, and kMaxThreadCounts of them exist at most.
  ThreadCount();
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

  void add() {
    detail::ThreadCells* c = detail::t_cells;
    if (c == nullptr && (c = detail::register_thread_cells()) == nullptr) {
      detail::add_retired(id_, 1);
      return;
    }
    std::atomic<uint64_t>& v = c->v[id_];
    v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  uint64_t load() const;

 private:
  size_t id_;
};

}  // namespace ferry::core

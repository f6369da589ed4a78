// A fixed table of per-thread records, for state that many threads write on
// a hot path and one reader scans now and then (core/presence.h's gate slots,
// core/thread_count.h's counts). A thread takes a free record on first use
// (no lock: one compare-and-swap on the record's `owned`) and gives it back
// when it exits, for a later thread to reuse; a reader scans the records
// handed out so far (used()), owned or not. `R` holds `std::atomic<bool> owned`.
#pragma once

#include <atomic>
#include <cstddef>

namespace ferry::core {

template <typename R, size_t N>
class ThreadRecords {
 public:
  // A record now owned by the caller, or null when all N are owned.
  R* take() {
    const size_t used = used_.load(std::memory_order_acquire);
    for (size_t i = 0; i < used; ++i)
      if (claim(records_[i])) return &records_[i];
    for (;;) {
      size_t n = used_.load(std::memory_order_relaxed);
      if (n >= N) return nullptr;
      if (!claim(records_[n])) continue;  // another thread took it first
      // Published to the readers' scans; a record not published yet has never
      // been written by its owner.
      size_t expect = n;
      while (expect < n + 1 && !used_.compare_exchange_weak(expect, n + 1)) {
      }
      return &records_[n];
    }
  }
  // The record is free again once this returns; what its owner wrote must be
  // cleared (or kept, for the next owner) before.
  void give_back(R* r) { r->owned.store(false, std::memory_order_release); }

  // Records handed out so far, owned now or not: what a scan reads.
  size_t used() const { return used_.load(std::memory_order_acquire); }
  R& operator[](size_t i) { return records_[i]; }
  const R& operator[](size_t i) const { return records_[i]; }

 private:
  static bool claim(R& r) {
    bool free = false;
    return r.owned.compare_exchange_strong(free, true, std::memory_order_acq_rel);
  }

  R records_[N];
  std::atomic<size_t> used_{0};
};

}  // namespace ferry::core

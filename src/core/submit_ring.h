// The submission hand-off to a worker: a bounded ring of cells, many
// submitters, one consumer (the worker, or a thread holding its loop lock).
//
// Each cell's sequence number sits on the same cache line as the start of its
// command, so a hand-off moves the command's lines and nothing else: no block
// index, no per-producer lookup. The consumer works on the command where it
// lies and gives the cell back afterwards. A full ring refuses (try_push
// returns false) and the caller queues elsewhere; nothing here allocates
// after construction.
//
// Cells follow the bounded queue of D. Vyukov: a producer claims position p
// when cell p % N says p (free for lap p / N), publishes p + 1 once filled;
// the consumer frees it for the next lap by storing p + N.
//
// A producer preempted between claiming and filling would hold back every
// value published after its cell, for as long as the scheduler keeps it off
// a CPU (milliseconds). The consumer therefore takes published cells past an
// unfilled one and frees them at once: a cell's sequence number says whether
// its position was consumed (p + N or beyond), so the oldest position moves
// over them when the hole is filled and taken, with no other record. The
// order between producers was never defined; each producer's own values keep
// theirs, since it claims its next cell only after filling the last.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace ferry::core {

template <typename T>
class SubmitRing {
 public:
  // capacity: a power of two, at least 2.
  explicit SubmitRing(size_t capacity)
      : cells_(std::make_unique<Cell[]>(capacity)), mask_(capacity - 1) {
    for (size_t i = 0; i < capacity; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  SubmitRing(const SubmitRing&) = delete;
  SubmitRing& operator=(const SubmitRing&) = delete;

  // Any thread. Moves from v only when it returns true.
  bool try_push(T&& v) {
    return try_emplace([&](T& cell) { cell = std::move(v); });
  }

  // Any thread: fill(T&) writes the claimed cell in place, which still holds
  // the value of the cell's previous lap. Called only when it returns true;
  // fill must not throw.
  template <typename Fill>
  bool try_emplace(Fill&& fill) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      const uint64_t seq = c.seq.load(std::memory_order_acquire);
      const auto diff = int64_t(seq - pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          fill(c.value);
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;  // the cell of this lap is still the consumer's: full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  // Consumer only: a published value and its position, or null. The oldest
  // position's when it is published; otherwise one published past it (see
  // above). It stays in its cell (and the cell stays taken) until pop(pos).
  T* next(uint64_t* pos) {
    Cell& c = cells_[head_ & mask_];
    if (c.seq.load(std::memory_order_acquire) == head_ + 1) {
      *pos = head_;
      return &c.value;
    }
    // A hole shows as one of the next kLookAhead cells published (more
    // stalled submitters in a row than that wait for the first to be filled).
    // Looking there costs nothing on an idle ring (the consumer freed those
    // cells last lap and nobody wrote them since), where reading the
    // submitters' tail_ on every poll would take that line from the one
    // submitting and slow its next claim.
    if (ahead_ == 0 && !published_ahead()) return nullptr;
    return next_past_hole(pos);
  }
  // Consumer only: true when next() would find nothing, read as next() reads
  // (no tail_), inline for a helper's poll that mostly finds the ring empty.
  bool idle() const {
    if (cells_[head_ & mask_].seq.load(std::memory_order_acquire) == head_ + 1 || ahead_ != 0)
      return false;
    return !published_ahead();
  }
  void pop(uint64_t pos) {
    cells_[pos & mask_].seq.store(pos + mask_ + 1, std::memory_order_release);
    consumed_.store(consumed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (pos != head_) {
      ++ahead_;
      // Keep first_open_ at the lowest position past head_ not yet taken.
      uint64_t& f = first_open_;
      if (f <= head_) f = head_ + 1;
      while (f < head_ + mask_ + 1 && consumed_at(f)) ++f;
      return;
    }
    ++head_;
    // Move over the positions taken past the hole this one was: their cells
    // say p + N (freed) or p + N + 1 (refilled for the next lap), never less.
    while (ahead_ != 0 && consumed_at(head_)) {
      ++head_;
      --ahead_;
    }
  }

  // Consumer only: the oldest position not yet consumed. Every position below
  // claimed() was taken by a producer, which publishes it once filled (fill
  // cannot block or throw), so draining until head() reaches a claimed() read
  // before, waiting where next() finds nothing, reaches every value claimed
  // by then.
  uint64_t head() const { return head_; }
  uint64_t claimed() const { return tail_.load(std::memory_order_acquire); }

  // Any thread; approximate while others push or pop.
  size_t size_approx() const {
    const uint64_t done = consumed_.load(std::memory_order_relaxed);
    const uint64_t claimed = tail_.load(std::memory_order_relaxed);
    return claimed > done ? size_t(claimed - done) : 0;
  }

 private:
  struct alignas(64) Cell {
    std::atomic<uint64_t> seq{0};
    T value;
  };
  // The lowest published position past an unfilled one. The search starts at
  // the lowest position past head_ not yet taken (first_open_); at most
  // kScanCells positions per call. Positions from head_ + N on belong to the
  // next lap of cells not yet freed: never looked at.
  //
  // A producer publishes its earlier cell before it claims the next, but the
  // search may read the earlier cell before that and the later one after: so
  // once a cell is found, everything below it is looked at again (the
  // acquire of its number makes the earlier cells of its producer visible),
  // down to a cell below which nothing is published. Each producer's values
  // thus come out in its order.
  T* next_past_hole(uint64_t* pos) {
    const uint64_t end = std::min(tail_.load(std::memory_order_acquire), head_ + mask_ + 1);
    const uint64_t from = std::max(first_open_, head_ + 1);
    uint64_t found = lowest_published(from, end, kScanCells);
    if (found == end) return nullptr;
    for (uint64_t lower; (lower = lowest_published(head_, found, mask_ + 1)) != found;)
      found = lower;
    *pos = found;
    return &cells_[found & mask_].value;
  }
  // The lowest position in [lo, hi) whose cell is published, looking at no
  // more than `budget` of them; hi when none.
  uint64_t lowest_published(uint64_t lo, uint64_t hi, uint64_t budget) const {
    for (uint64_t p = lo; p < hi && budget != 0; ++p, --budget)
      if (cells_[p & mask_].seq.load(std::memory_order_acquire) == p + 1) return p;
    return hi;
  }
  bool published_ahead() const {
    const Cell* cells = cells_.get();
    const uint64_t mask = mask_;
    const uint64_t head = head_;
    if (mask >= kLookAhead) {  // every ring but the smallest: a fixed count, unrolled
      static_assert(kLookAhead == 4);
      auto at = [&](uint64_t i) {
        return cells[(head + i) & mask].seq.load(std::memory_order_relaxed) == head + i + 1;
      };
      return at(1) | at(2) | at(3) | at(4);
    }
    for (uint64_t p = head + 1; p <= head + mask; ++p)
      if (cells[p & mask].seq.load(std::memory_order_relaxed) == p + 1) return true;
    return false;
  }
  // Position p (head_ <= p < head_ + N) was taken: its cell says p + N (freed)
  // or p + N + 1 (refilled for the next lap), never less.
  bool consumed_at(uint64_t p) const {
    return int64_t(cells_[p & mask_].seq.load(std::memory_order_acquire) - p) > int64_t(mask_);
  }
  static constexpr uint64_t kScanCells = 64;
  static constexpr uint64_t kLookAhead = 4;

  std::unique_ptr<Cell[]> cells_;
  const uint64_t mask_;
  alignas(64) std::atomic<uint64_t> tail_{0};  // submitters
  alignas(64) uint64_t head_ = 0;              // the consumer
  uint64_t first_open_ = 0;                    // the consumer: see next_past_hole
  uint64_t ahead_ = 0;                         // the consumer: taken past head_
  std::atomic<uint64_t> consumed_{0};          // positions consumed, for size_approx
};

}  // namespace ferry::core

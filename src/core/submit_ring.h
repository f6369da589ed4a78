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
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace ferry::core {

template <typename T>
class SubmitRing {
 public:
  // capacity: a power of two.
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

  // Consumer only: the oldest published command, or null. It stays in its
  // cell (and the cell stays taken) until pop().
  T* front() {
    Cell& c = cells_[head_ & mask_];
    if (c.seq.load(std::memory_order_acquire) != head_ + 1) return nullptr;
    return &c.value;
  }
  void pop() {
    Cell& c = cells_[head_ & mask_];
    c.seq.store(head_ + mask_ + 1, std::memory_order_release);
    ++head_;
    consumed_.store(head_, std::memory_order_relaxed);
  }

  // Consumer only: the next position to consume. Every position below
  // claimed() was taken by a producer, which publishes it once filled (fill
  // cannot block or throw); front() returns null at one still being filled,
  // and the positions after it wait behind it.
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
  std::unique_ptr<Cell[]> cells_;
  const uint64_t mask_;
  alignas(64) std::atomic<uint64_t> tail_{0};  // submitters
  alignas(64) uint64_t head_ = 0;              // the consumer
  std::atomic<uint64_t> consumed_{0};          // head_, for size_approx
};

}  // namespace ferry::core

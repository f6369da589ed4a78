// The arrival-ordered messages of a receive queue: a ring that one producer
// at a time fills (the receiving worker, or a thread holding its loop lock;
// the lock orders them) and any number of takers empty, with no lock on
// either side. A taker copies the oldest item, then claims it by moving the
// head past it with one compare-and-swap; a taker that loses the race, or
// stalls before its claim, throws its copy away and holds nothing the
// producer waits for. A stall after the claim holds nothing either: the copy
// is taken already. So the producer never laps onto an item still being
// read, and a push finds room whenever fewer than `capacity` items are
// queued (for a receive queue, always: a buffer is posted again only after
// its message was taken).
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace ferry::core {

class MessageRing {
 public:
  struct Item {
    uint32_t buffer = 0;
    uint64_t len = 0;
  };

  explicit MessageRing(size_t capacity)
      : mask_(std::bit_ceil(capacity < 1 ? size_t(1) : capacity) - 1),
        cells_(std::make_unique<Cell[]>(mask_ + 1)) {}

  // One producer at a time. False only when `capacity` items are queued.
  bool try_push(const Item& it) {
    const uint64_t t = tail_.load(std::memory_order_relaxed);
    if (t - head_.load(std::memory_order_acquire) > mask_) return false;
    Cell& c = cells_[t & mask_];
    c.buffer.store(it.buffer, std::memory_order_relaxed);
    c.len.store(it.len, std::memory_order_relaxed);
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }

  // Any thread. The oldest item, if any: two loads when there is none.
  bool try_take(Item& out) {
    uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      if (h == tail_.load(std::memory_order_acquire)) return false;
      const Cell& c = cells_[h & mask_];
      // Read before the claim: once the head moves past h the producer may
      // refill this cell. A copy read while it did is thrown away, since the
      // claim then fails (the head is no longer h).
      const Item it{c.buffer.load(std::memory_order_relaxed),
                    c.len.load(std::memory_order_relaxed)};
      if (head_.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
        out = it;
        return true;
      }
    }
  }

  size_t size_approx() const {
    const uint64_t h = head_.load(std::memory_order_acquire);
    const uint64_t t = tail_.load(std::memory_order_acquire);
    return t > h ? size_t(t - h) : 0;
  }
  size_t capacity() const { return mask_ + 1; }

 private:
  struct Cell {
    std::atomic<uint32_t> buffer{0};
    std::atomic<uint64_t> len{0};
  };
  const uint64_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<uint64_t> head_{0};  // takers'
  alignas(64) std::atomic<uint64_t> tail_{0};  // the producer's
};

}  // namespace ferry::core

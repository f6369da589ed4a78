// Calls in progress on an object that one thread may close: TransferEngine's
// public calls, which stop() waits out before it takes the workers down.
// Every call announces itself in a slot of its own thread (core/presence.h):
// no atomic read-modify-write on a submission's way to the wire. A call that
// gets no slot counts itself in and out; that count is spread over cache
// lines by calling thread, so that threads submitting at once do not pass
// one line between them twice per call.
//
// Closing (the closer's flag store, then any()) against entering (enter(),
// then the caller's check of the flag) is a store-then-load on each side:
// either the entering call sees the flag, or any() sees its slot or count.
// A shard never goes below 0, because a call leaves the shard it entered.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/presence.h"

namespace ferry::core {

class CallsInProgress {
 public:
  static constexpr size_t kShards = 16;

  // A call counted from construction to destruction.
  class Counted {
   public:
    explicit Counted(CallsInProgress& calls)
        : calls_(calls), slot_(presence::enter(&calls)), shard_(0) {
      if (slot_ == presence::kNoSlot) shard_ = calls.enter();
    }
    ~Counted() {
      if (slot_ == presence::kNoSlot)
        calls_.leave(shard_);
      else
        presence::leave(slot_);
    }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;

   private:
    CallsInProgress& calls_;
    int slot_;
    size_t shard_;
  };

  // Counting without a slot: the shard the caller counted itself in; leave()
  // takes it back.
  size_t enter() {
    const size_t i = my_shard();
    shards_[i].n.fetch_add(1, std::memory_order_seq_cst);
    return i;
  }
  void leave(size_t shard) { shards_[shard].n.fetch_sub(1, std::memory_order_seq_cst); }
  // True when a call is inside. A call that entered before the closer's flag
  // store and has not left makes every such check true; one that sees the
  // flag leaves again at once. Costs a membarrier(2): call it after the flag
  // store, in the closer's wait.
  bool any() const {
    presence::heavy_fence();
    if (presence::anyone_in(this)) return true;
    for (const auto& s : shards_)
      if (s.n.load(std::memory_order_seq_cst) > 0) return true;
    return false;
  }

 private:
  static size_t my_shard() {
    static std::atomic<size_t> next{0};
    static thread_local const size_t shard = next.fetch_add(1, std::memory_order_relaxed) % kShards;
    return shard;
  }
  struct alignas(64) Shard {
    std::atomic<int64_t> n{0};
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace ferry::core

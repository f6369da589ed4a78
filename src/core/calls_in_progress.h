// Calls in progress on an object that one thread may close: TransferEngine's
// public calls, which stop() waits out before it takes the workers down.
// Every call counts itself in and out; the count is spread over cache lines
// by calling thread, so that threads submitting at once do not pass one line
// between them twice per call.
//
// Closing (close() then wait_idle()) against entering (enter(), then the
// caller's check of its closed flag) is a store-then-load on each side, all
// sequentially consistent: either the entering call sees the flag, or
// wait_idle() sees its count. A shard never goes below 0, because a call
// leaves the shard it entered.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::core {

class CallsInProgress {
 public:
  static constexpr size_t kShards = 16;

  // A call counted from construction to destruction.
  class Counted {
   public:
    explicit Counted(CallsInProgress& calls) : calls_(calls), shard_(calls.enter()) {}
    ~Counted() { calls_.leave(shard_); }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;

   private:
    CallsInProgress& calls_;
    size_t shard_;
  };

  // The shard the caller counted itself in; leave() takes it back.
  size_t enter() {
    const size_t i = my_shard();
    shards_[i].n.fetch_add(1, std::memory_order_seq_cst);
    return i;
  }
  void leave(size_t shard) { shards_[shard].n.fetch_sub(1, std::memory_order_seq_cst); }
  // True when some shard counts a call. A call that entered before the
  // closer's flag store and has not left makes every scan true; one that
  // sees the flag leaves again at once.
  bool any() const {
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

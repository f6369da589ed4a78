// Indices of the engine's free send buffers: taken by submitters (submit_send)
// and given back by the worker once the send completed. A lock-free stack (R.
// K. Treiber's, its head tagged against ABA), so neither side takes a lock on
// its way to the wire; only a submitter that finds none waits (RoomWait).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "core/room_wait.h"
#include "ferry/types.h"

namespace ferry::core {

class SendBuffers {
 public:
  using Clock = std::chrono::steady_clock;

  // n buffers, every one free. Before any other call.
  void reset(uint32_t n);
  // Any thread.
  void release(uint32_t i) {
    push(i);  // sequentially consistent, as RoomWait asks of a give-back
    room_.released();
  }
  // kOk with *out set; kResourceExhausted when none came by the deadline (at
  // once when !wait; epoch = no deadline); kFailedPrecondition once closed.
  Status acquire(Clock::time_point deadline, bool wait, uint32_t* out);
  // Wakes every waiter; acquire fails from now on.
  void close() { room_.close(); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static uint32_t index_of(uint64_t head) { return uint32_t(head); }
  static uint64_t with(uint64_t head, uint32_t index) {
    return (((head >> 32) + 1) << 32) | index;  // every change bumps the tag
  }
  bool try_pop(uint32_t* out);
  void push(uint32_t i);

  std::unique_ptr<std::atomic<uint32_t>[]> next_;
  alignas(64) std::atomic<uint64_t> head_{kNone};  // tag << 32 | top index
  RoomWait room_;
};

}  // namespace ferry::core

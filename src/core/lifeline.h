// Lets threads outside the engine call into it (poll its NICs, give a receive
// buffer back) only while it runs: after close() returns no call is inside
// and none will enter, so what the call touches may go away. Objects that may
// outlive their engine (counters, receive queues, messages) hold one shared.
//
// A call announces itself in a slot of its own thread (core/presence.h), so a
// spinning waiter's every poll costs no atomic read-modify-write; the count
// below serves the threads that get no slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "core/presence.h"

namespace ferry::core {

class Lifeline {
 public:
  // Runs f() unless closed; true when it ran.
  template <typename F>
  bool run(F&& f) {
    // Left however f returns: a throw that skipped it would make close() wait for ever.
    struct Inside {
      Lifeline& l;
      const int slot;
      explicit Inside(Lifeline& line) : l(line), slot(presence::enter(&line)) {
        if (slot == presence::kNoSlot) l.users_.fetch_add(1, std::memory_order_seq_cst);
      }
      ~Inside() {
        if (slot == presence::kNoSlot)
          l.users_.fetch_sub(1, std::memory_order_release);
        else
          presence::leave(slot);
      }
      Inside(const Inside&) = delete;
      Inside& operator=(const Inside&) = delete;
    } inside(*this);
    const bool live = live_.load(std::memory_order_seq_cst);
    if (live) f();
    return live;
  }

  void close() {
    live_.store(false, std::memory_order_seq_cst);
    presence::heavy_fence();
    while (presence::anyone_in(this) || users_.load(std::memory_order_acquire) > 0)
      std::this_thread::yield();
  }

 private:
  std::atomic<int32_t> users_{0};
  std::atomic<bool> live_{true};
};

}  // namespace ferry::core

// Lets threads outside the engine call into it (poll its NICs, give a receive
// buffer back) only while it runs: after close() returns no call is inside
// and none will enter, so what the call touches may go away. Objects that may
// outlive their engine (counters, receive queues, messages) hold one shared.
//
// The calls are counted as the engine's public calls are (core/calls_in_progress.h):
// each announces itself in a slot of its own thread, so a spinning waiter's
// every poll costs no atomic read-modify-write.
#pragma once

#include <atomic>
#include <thread>

#include "core/calls_in_progress.h"

namespace ferry::core {

class Lifeline {
 public:
  // Runs f() unless closed; true when it ran. The call is left however f
  // returns: a throw that skipped it would make close() wait for ever.
  template <typename F>
  bool run(F&& f) {
    const CallsInProgress::Counted inside(users_);
    const bool live = live_.load(std::memory_order_seq_cst);
    if (live) f();
    return live;
  }

  void close() {
    live_.store(false, std::memory_order_seq_cst);
    while (anyone_inside()) std::this_thread::yield();
  }

  // Whether a call is inside run(); costs a membarrier(2) (CallsInProgress::any).
  bool anyone_inside() const { return users_.any(); }

 private:
  CallsInProgress users_;
  std::atomic<bool> live_{true};
};

}  // namespace ferry::core

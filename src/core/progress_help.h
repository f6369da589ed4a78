// A thread waiting for arrivals (ImmCounter::try_consume, wait) may drive the
// NICs itself while the worker idles, instead of waiting for the worker to be
// scheduled: on a machine with fewer cores than spinning threads each such
// hand-off is a context switch. The engine installs the hook (adaptive polling
// with NICs any thread may call) and closes it before its workers stop; a
// counter may outlive its engine, so the hook is shared and checked per use.
#pragma once

#include <functional>

#include "core/lifeline.h"

namespace ferry::core {

class ProgressHelp {
 public:
  // The engine's hook: plain functions and their context, so that a waiter's
  // every poll reaches the worker with one indirect call (a std::function and
  // a loop over the workers cost as much as the empty poll's own checks).
  using HelpFn = bool (*)(void*);
  using LeaveFn = void (*)(void*);
  ProgressHelp(HelpFn help, LeaveFn leave, void* ctx) : help_(help), leave_(leave), ctx_(ctx) {}
  // leave: a thread that helped stops (it blocks now); a worker that napped
  // while it polled takes the NICs back at once, not at the end of its nap.
  ProgressHelp(std::function<bool()> help, std::function<void()> leave)
      : owned_help_(std::move(help)),
        owned_leave_(std::move(leave)),
        help_([](void* p) { return static_cast<ProgressHelp*>(p)->owned_help_(); }),
        leave_([](void* p) { static_cast<ProgressHelp*>(p)->owned_leave_(); }),
        ctx_(this) {}
  ProgressHelp(const ProgressHelp&) = delete;
  ProgressHelp& operator=(const ProgressHelp&) = delete;

  // True when the call polled something (an arrival may now be counted).
  bool try_help() {
    bool did = false;
    gate_.run([&] { did = help_(ctx_); });
    return did;
  }
  void leave() {
    gate_.run([&] { leave_(ctx_); });
  }
  // After close() returns no call is inside help_ and none will enter it.
  void close() { gate_.close(); }

 private:
  std::function<bool()> owned_help_;
  std::function<void()> owned_leave_;
  HelpFn help_;
  LeaveFn leave_;
  void* ctx_;
  Lifeline gate_;
};

}  // namespace ferry::core

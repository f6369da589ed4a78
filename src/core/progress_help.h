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
  // leave: a thread that helped stops (it blocks now); a worker that napped
  // while it polled takes the NICs back at once, not at the end of its nap.
  ProgressHelp(std::function<bool()> help, std::function<void()> leave)
      : help_(std::move(help)), leave_(std::move(leave)) {}

  // True when the call polled something (an arrival may now be counted).
  bool try_help() {
    bool did = false;
    gate_.run([&] { did = help_(); });
    return did;
  }

  void leave() {
    gate_.run([&] { leave_(); });
  }

  // After close() returns no call is inside help_ and none will enter it.
  void close() { gate_.close(); }

 private:
  std::function<bool()> help_;
  std::function<void()> leave_;
  Lifeline gate_;
};

}  // namespace ferry::core

// Whether the process behind an NVLink peer still runs. Writes to a peer that
// exited would "succeed" into memory nobody reads (its IPC mappings stay
// valid here) and its immediates would go to an unlinked segment, so the
// domain asks before posting and fails the transfer with kUnavailable, as a
// NIC reports a dead peer. The answer is refreshed at most every `period`:
// posts cost no system call.
#pragma once

#include <sys/types.h>

#include <chrono>

#include "core/unique_fd.h"

namespace ferry::nvlink {

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PeerLiveness(pid_t pid, Clock::duration period = std::chrono::milliseconds(100));

  // False once the process has exited (and from then on).
  bool alive(Clock::time_point now = Clock::now());

 private:
  bool check();
  pid_t pid_;
  core::UniqueFd pidfd_;  // readable once the process exits; immune to pid reuse
  Clock::duration period_;
  Clock::time_point next_{};
  bool dead_ = false;
};

}  // namespace ferry::nvlink

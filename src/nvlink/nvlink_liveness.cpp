#include "nvlink/nvlink_liveness.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace ferry::nvlink {

PeerLiveness::PeerLiveness(pid_t pid, Clock::duration period) : pid_(pid), period_(period) {
#ifdef SYS_pidfd_open
  // Kernels before 5.3 lack it: then kill(pid, 0), which a reused pid fools.
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0)
    pidfd_.reset(int(fd));
  else if (errno == ESRCH)
    dead_ = true;
#endif
}

bool PeerLiveness::alive(Clock::time_point now) {
  if (dead_) return false;
  if (now < next_) return true;
  next_ = now + period_;
  dead_ = !check();
  return !dead_;
}

bool PeerLiveness::check() {
  if (pidfd_.valid()) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }
  return ::kill(pid_, 0) == 0 || errno != ESRCH;
}

}  // namespace ferry::nvlink

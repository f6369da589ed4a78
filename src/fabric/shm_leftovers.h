// Regions that libfabric's shm provider left in /dev/shm when a process died
// without closing its endpoints (SIGKILL, a crash).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <ctime>
#include <string>

namespace ferry::fabric {

// libfabric 1.17's shm names an endpoint's region "<pid>:<n>:<m>" and refuses to
// create one whose name exists while that pid is alive. A killed process leaves
// its regions behind; once the kernel hands its pid to a new process, that
// process can never open shm (fi_enable: EBUSY). Removes the entries of `dir`
// named "<pid>:..." that were last modified before `started` (so they belong to
// an earlier process that had this pid, never to this one). Returns how many.
size_t remove_stale_shm_regions(const std::string& dir, pid_t pid, std::time_t started);

// The above for this process and /dev/shm, once per process (forked children
// run it again for their own pid).
void remove_own_stale_shm_regions();

}  // namespace ferry::fabric

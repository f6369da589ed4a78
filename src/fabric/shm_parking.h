// Where the libfabric resources of a closed shm NIC wait while another shm NIC
// of the same process is open.
//
// libfabric 1.17's shm provider does not map the region of a peer endpoint
// that lives in the same process: smr_map_to_region finds the peer's name among
// the process's own endpoints and reuses that endpoint's mapping. Closing an
// endpoint unmaps its region, so another endpoint of the process that has yet
// to handle the first message from it (the connection request its first write
// carries), or that writes to it later, reads or writes unmapped memory:
// SIGSEGV in smr_progress_connreq, seen when one of two engines of a process
// stopped while the other's worker was starved of CPU. A closing shm NIC
// therefore parks its endpoint, queues, domain and fabric here (its
// registrations are closed already, so nothing lands in user memory) while any
// other shm NIC of the process is open; the last one to close closes them all.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>

namespace ferry::fabric {

struct FabricResources;

class ShmParking {
 public:
  // At most this many wait; past it the oldest is closed. libfabric's shm
  // maps at most 256 peers per endpoint, so an older one is not in use by any.
  static constexpr size_t kMaxParked = 256;

  // Never destroyed: what waits here at exit belongs to engines still open,
  // and closing it after libfabric's own teardown (a library destructor) would
  // touch freed provider state.
  static ShmParking& instance();

  void opened();
  // Takes `res` of a closing shm NIC: parks it while another shm NIC is open,
  // else closes it and everything parked. Closes outside the lock.
  void closed(std::shared_ptr<FabricResources> res);

 private:
  std::mutex mu_;
  size_t open_ = 0;
  std::deque<std::shared_ptr<FabricResources>> parked_;
};

}  // namespace ferry::fabric

#include "fabric/shm_parking.h"

#include <vector>

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

ShmParking& ShmParking::instance() {
  static ShmParking* const parking = new ShmParking();  // see the header: never destroyed
  return *parking;
}

void ShmParking::opened() {
  std::lock_guard lk(mu_);
  ++open_;
}

void ShmParking::closed(std::shared_ptr<FabricResources> res) {
  // Released after the lock: closing an endpoint can take milliseconds.
  std::vector<std::shared_ptr<FabricResources>> to_close;
  {
    std::lock_guard lk(mu_);
    if (open_ > 0) --open_;
    if (open_ > 0) {
      parked_.push_back(std::move(res));
      while (parked_.size() > kMaxParked) {
        to_close.push_back(std::move(parked_.front()));
        parked_.pop_front();
      }
    } else {
      to_close.assign(std::make_move_iterator(parked_.begin()),
                      std::make_move_iterator(parked_.end()));
      parked_.clear();
      to_close.push_back(std::move(res));
    }
  }
  // Each closes in libfabric's order (FabricResources' members: the endpoint
  // first, the fabric last).
  to_close.clear();
}

}  // namespace ferry::fabric

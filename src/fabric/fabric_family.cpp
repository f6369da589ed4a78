// libfabric as a NIC family: every provider string no other family claims.
#include "fabric/fabric_domain.h"

namespace ferry::fabric {

const core::DomainFamily& fabric_family() {
  static const core::DomainFamily f{"fabric", [](std::string_view) { return true; },
                                    &open_fabric_domain};
  return f;
}

}  // namespace ferry::fabric

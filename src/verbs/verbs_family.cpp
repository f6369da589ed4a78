// ferry's own libibverbs domain. libfabric's layered verbs provider keeps its
// own name ("verbs;ofi_rxm") and goes to the fabric family.
#include "verbs/verbs_domain.h"

namespace ferry::verbs {

const core::DomainFamily& verbs_family() {
  static const core::DomainFamily f{"verbs", [](std::string_view p) { return p == "verbs"; },
                                    &open_verbs_domain};
  return f;
}

}  // namespace ferry::verbs

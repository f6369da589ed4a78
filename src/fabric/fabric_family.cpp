// libfabric as a NIC family: every provider string no other family claims.
#include "fabric/fabric_domain.h"

namespace ferry::fabric {

namespace {

ProviderListing list(const std::string& provider) {
  ProviderListing out;
  out.provider = provider;
  out.family = "fabric";
  for (auto& n : list_fabric_nics(provider, &out.note))
    out.nics.push_back(
        NicListing{n.domain, n.provider, n.fabric, n.link_speed_bps, n.pci_address, n.hmem});
  return out;
}

}  // namespace

const core::DomainFamily& fabric_family() {
  static const core::DomainFamily f{"fabric", [](std::string_view) { return true; },
                                    &open_fabric_domain, &list};
  return f;
}

}  // namespace ferry::fabric

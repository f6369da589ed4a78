// ferry's own libibverbs domain. libfabric's layered verbs provider keeps its
// own name ("verbs;ofi_rxm") and goes to the fabric family.
#include "verbs/verbs_devinfo.h"
#include "verbs/verbs_domain.h"

namespace ferry::verbs {

namespace {

ProviderListing list(const std::string& provider) {
  ProviderListing out;
  out.provider = provider;
  out.family = "verbs";
  for (const auto& n : list_verbs_nics()) {
    NicListing l;
    l.name = n.name;
    l.provider = "verbs";
    l.fabric = n.ethernet ? "RoCE" : "InfiniBand";
    l.link_speed_bps = n.link_speed_bps;
    out.nics.push_back(std::move(l));
  }
  if (out.nics.empty()) {
    std::string note;
    if (ibv_device_names(&note).empty())
      out.note = note.empty() ? "libibverbs lists no device" : note;
    else
      out.note = "no RDMA device with an ACTIVE port";
  }
  return out;
}

}  // namespace

const core::DomainFamily& verbs_family() {
  static const core::DomainFamily f{"verbs", [](std::string_view p) { return p == "verbs"; },
                                    &open_verbs_domain, &list};
  return f;
}

}  // namespace ferry::verbs

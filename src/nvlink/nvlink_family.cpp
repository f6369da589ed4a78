// ferry's CUDA IPC domain for GPUs of one host (docs/NVLINK.md); in builds
// without CUDA its open reports kUnimplemented (nvlink_none.cpp).
#include "nvlink/nvlink_domain.h"

namespace ferry::nvlink {

namespace {

ProviderListing list(const std::string& provider) {
  ProviderListing out;
  out.provider = provider;
  out.family = "nvlink";
  // One endpoint per group's GPU: there is no NIC to name, and whether it
  // opens is decided by the group's device at start-up.
  out.note = "one endpoint per GPU group (CUDA IPC); GroupConfig::nic_names are not used";
  return out;
}

}  // namespace

const core::DomainFamily& nvlink_family() {
  static const core::DomainFamily f{"nvlink", [](std::string_view p) { return p == "nvlink"; },
                                    &open_nvlink_domain, &list};
  return f;
}

}  // namespace ferry::nvlink

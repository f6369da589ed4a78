// The probes behind provider "auto" (engine/provider_select.h). Separate from
// provider_select.cpp, which stays pure, and from domain_factory.cpp, which
// tests and benchmarks replace with their own open_domain.
#include <fmt/format.h>

#include "engine/provider_select.h"
#include "fabric/fabric_domain.h"
#include "verbs/verbs_domain.h"

namespace ferry::engine {

ProviderProbes host_provider_probes(const std::string& sysfs_root) {
  ProviderProbes probes;
  probes.verbs = [sysfs_root](std::string* note) {
    return verbs::probe_verbs_devices(sysfs_root, note);
  };
  probes.efa = [](std::string* note) {
    const auto nics = fabric::list_fabric_nics("efa");
    *note = nics.empty() ? std::string("fi_getinfo(efa): no domain")
                         : fmt::format("fi_getinfo(efa): {} domain{} ({}{})", nics.size(),
                                       nics.size() == 1 ? "" : "s", nics.front().domain,
                                       nics.size() > 1 ? ", ..." : "");
    return !nics.empty();
  };
  return probes;
}

ProviderChoice resolve_auto_provider(const std::string& sysfs_root) {
  return resolve_provider(host_provider_probes(sysfs_root));
}

}  // namespace ferry::engine

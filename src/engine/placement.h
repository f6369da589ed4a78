// Worker placement from the machine's topology: which CPUs a group's worker
// may run on, and whether explicitly named NICs and CPUs fit the group.
#pragma once

#include <string>
#include <vector>

#include "ferry/engine.h"
#include "topo/topology.h"

namespace ferry::engine {

// Throws Error(kInvalidArgument) for NICs or CPUs the topology places away
// from their group, unless the group insists (then it only warns).
void validate_against_topology(const EngineConfig& config);

// CPUs of the NUMA node of the group's devices; empty = do not pin.
std::vector<int> default_affinity(const GroupConfig& g);

// NICs for a GPU group that names none: the `count` NICs the topology puts
// closest to its GPU, as domain names of `provider`. Only for the RDMA
// families whose domains are the devices the topology lists ("efa",
// "verbs", "verbs;ofi_rxm"); empty (the provider's first domains, as for the
// host group) for other providers, the host group, or a GPU the topology has
// too few NICs for.
std::vector<std::string> default_nics(const GroupConfig& g, const std::string& provider,
                                      size_t count);
std::vector<std::string> topology_nics(const topo::Topology& t, const Device& device,
                                       const std::string& provider, size_t count);

}  // namespace ferry::engine

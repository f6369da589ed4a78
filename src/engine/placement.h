// Worker placement from the machine's topology: which CPUs a group's worker
// may run on, and whether explicitly named NICs and CPUs fit the group.
#pragma once

#include <vector>

#include "ferry/engine.h"

namespace ferry::engine {

// Throws Error(kInvalidArgument) for NICs or CPUs the topology places away
// from their group, unless the group insists (then it only warns).
void validate_against_topology(const EngineConfig& config);

// CPUs of the NUMA node of the group's devices; empty = do not pin.
std::vector<int> default_affinity(const GroupConfig& g);

}  // namespace ferry::engine

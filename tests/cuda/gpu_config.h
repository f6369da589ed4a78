// Engine configuration for the GPU-signalling tests: shm, one NIC.
#pragma once

#include "ferry/engine.h"
#include "support/engine_config.h"

namespace ferry::test {

// shm is no NIC of the machine's topology: where the engine checks groups
// against the topology (GroupConfig::insist), say it is meant. Written so it
// compiles whether or not GroupConfig has that field.
inline EngineConfig gpu_test_config() {
  EngineConfig c = config_for("shm");
  for (auto& g : c.groups) {
    if constexpr (requires { g.insist; }) g.insist = true;
  }
  return c;
}

}  // namespace ferry::test

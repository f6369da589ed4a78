#pragma once

#include <string>

#include "ferry/engine.h"

namespace ferry::test {

// Engine configuration for a provider available on every CI machine:
// "tcp" = tcp;ofi_rxm on the loopback interface, "shm" = shared memory,
// "fake" = the in-process fake NIC of src/testing (no network).
// Several NICs are several endpoints on the same interface.
inline EngineConfig config_for(const std::string& kind, size_t nics = 1) {
  EngineConfig c;
  c.groups = {GroupConfig{}};
  if (kind == "tcp") {
    c.provider = "tcp;ofi_rxm";
    c.groups[0].nic_names.assign(nics, "lo");
  } else if (kind == "fake") {
    c.provider = "fake";
    c.groups[0].nic_names.assign(nics, "fake");
  } else {
    c.provider = "shm";
    c.groups[0].nic_names.assign(nics, "shm");
  }
  c.default_deadline = std::chrono::seconds(20);
  return c;
}

// The same with adaptive polling that blocks as soon as there is nothing to do: for
// tests of how an idle worker is woken.
inline EngineConfig adaptive_config_for(const std::string& kind) {
  EngineConfig c = config_for(kind);
  c.poll_mode = PollMode::kAdaptive;
  c.spin_before_block = std::chrono::microseconds(0);
  return c;
}

}  // namespace ferry::test

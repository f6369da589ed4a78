#pragma once

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/engine.h"

namespace ferry::test {

// The providers a parameterised engine suite runs on: `base` (those every CI
// machine has), then those FERRY_TEST_PROVIDERS adds, comma-separated
// ("verbs", "efa"), for a run on a host with RDMA NICs (docs/VERBS.md).
inline std::vector<std::string> providers(std::initializer_list<const char*> base) {
  std::vector<std::string> out(base.begin(), base.end());
  const char* extra = std::getenv("FERRY_TEST_PROVIDERS");
  for (std::string_view rest = extra != nullptr ? extra : ""; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    if (!name.empty()) out.emplace_back(name);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

// Engine configuration for a provider available on every CI machine:
// "tcp" = tcp;ofi_rxm on the loopback interface, "shm" = shared memory,
// "fake" = the in-process fake NIC of src/testing (no network); or for
// "verbs" and "efa" where FERRY_TEST_PROVIDERS asks for them.
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
  } else if (kind == "verbs" || kind == "efa") {
    // A host's RDMA NICs: FERRY_TEST_NIC names the one to use (several
    // endpoints on it for nics > 1); unset, the provider's first `nics`.
    c.provider = kind;
    c.nics_per_group = nics;
    if (const char* nic = std::getenv("FERRY_TEST_NIC"); nic != nullptr && *nic != 0)
      c.groups[0].nic_names.assign(nics, nic);
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

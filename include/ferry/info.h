// What the engine would open on this host, asked the way the engine asks
// (ferry-info, python -m ferry.info and ferry-bench all use this).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

// One NIC (or endpoint) a provider offers, under the name GroupConfig::nic_names takes.
struct NicListing {
  std::string name;      // "rdmap16s27-rdm", "lo", "shm", "mlx5_0"
  std::string provider;  // as reported: "efa", "tcp;ofi_rxm", "shm", "verbs"
  std::string fabric;
  uint64_t link_speed_bps = 0;
  std::string pci_address;  // "0000:16:00.0" when known
  bool hmem = false;        // GPU memory can be registered on it
};

struct ProviderListing {
  std::string provider;  // as asked
  std::string family;    // the NIC family that serves it: "fabric", "verbs", "nvlink", "fake"
  std::vector<NicListing> nics;
  std::string note;  // why `nics` is empty (the library call's answer), or a remark
};

// The NICs EngineConfig::provider = `provider` would open: the family the
// engine picks for that string and, for libfabric, the same fi_getinfo hints
// and filters as the engine's own NICs, so a listed NIC is one that opens.
// Never throws for an absent provider: `nics` is empty and `note` says why.
ProviderListing list_provider(const std::string& provider);

}  // namespace ferry

// What libibverbs lists, described from sysfs: the input of provider "auto"
// (src/engine/provider_select.h), tested on fixtures without a NIC.
#pragma once

#include <string>
#include <vector>

namespace ferry::verbs {

struct RdmaPort {
  int number = 0;          // 1-based, as in ports/<n>
  std::string state;       // "ACTIVE", "DOWN", "INIT", ... (ports/<n>/state without "4: ")
  std::string link_layer;  // "InfiniBand", "Ethernet" (ports/<n>/link_layer)
  bool active() const { return state == "ACTIVE"; }
};

// One device libibverbs lists ("mlx5_0", "rdmap16s27", "rxe0").
struct RdmaDevice {
  std::string name;
  std::string driver;     // basename of device/driver: "mlx5_core", "efa"; empty if none
  std::string vendor;     // device/vendor: "0x15b3" (Mellanox), "0x1d0f" (Amazon); may be empty
  std::string node_type;  // node_type without the number: "CA", "RNIC", "unspecified"
  std::vector<RdmaPort> ports;
};

// EFA appears in libibverbs too, but ferry reaches it only through
// libfabric's "efa" provider (SRD, not RC): such a device never selects
// "verbs".
inline bool is_efa_device(const RdmaDevice& d) {
  return d.driver == "efa" || d.vendor == "0x1d0f";  // Amazon
}

}  // namespace ferry::verbs

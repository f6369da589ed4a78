// The PCI addresses of this process's CUDA devices, in CUDA's order, from the
// driver (libcuda.so.1 through dlsym, no CUDA headers). Only where the
// process has loaded and initialised the driver already, as pointer_info
// does: asking never initialises CUDA (forking harnesses stay fork-safe), and
// the environment answers otherwise (topo/cuda_visible.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ferry::cuda {

// "0000:3b:00.0"-style bus ids of devices 0..n-1; unset with *why said when
// the driver is not loaded, not initialised, or a call fails.
std::optional<std::vector<std::string>> driver_pci_bus_ids(std::string* why);

}  // namespace ferry::cuda

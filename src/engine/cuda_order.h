// GPU numbering of the detected topology in CUDA's order, so that a group's
// Device::cuda(i) gets the NICs and cores of the GPU that CUDA calls device i
// in this process (CUDA_VISIBLE_DEVICES remaps it in most launchers).
#pragma once

#include <filesystem>
#include <string>

#include "topo/topology.h"

namespace ferry::engine {

struct CudaOrderApplied {
  std::string source;  // "driver", "environment", or empty when the sysfs order stayed
  std::string note;    // what could not be mapped, for a warning; empty when all is clear
};

// The driver's order where this process has initialised CUDA; otherwise
// CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, with GPU UUIDs read below
// `root` (fixtures use a tree of their own). Never throws: what cannot be
// mapped leaves the sysfs order and says why.
CudaOrderApplied apply_cuda_order(topo::Topology& topo, const std::filesystem::path& root = "/");

}  // namespace ferry::engine

// Which physical GPUs this process's CUDA devices are, read the way the CUDA
// runtime reads CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, without loading
// the driver. Launchers that give each process one GPU (Ray, Slurm, vLLM and
// SGLang workers) set CUDA_VISIBLE_DEVICES: without this, "cuda:0" in such a
// process would be handed the NICs and cores of the machine's first GPU, not
// of its own.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "topo/topology.h"

namespace ferry::topo {

struct CudaEnv {
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES; unset = every GPU
  std::optional<std::string> device_order;     // CUDA_DEVICE_ORDER; unset = FASTEST_FIRST
  static CudaEnv of_process();
};

struct CudaOrder {
  // cuda_order for assign_gpu_ordinals: the PCI address of CUDA device i.
  // Unset where the environment does not say (the sysfs order stays).
  std::optional<std::vector<PciAddr>> order;
  std::string note;  // why order is unset, or what was dropped; empty when all is clear
};

// uuids: each GPU's UUID ("GPU-8a2c…") by PCI address, for entries of
// CUDA_VISIBLE_DEVICES that name GPUs by UUID (or a unique prefix of one).
//
// As the runtime does, the list ends at its first entry that names no
// device (an index out of range, an unknown UUID, a GPU listed twice), and
// an empty list hides every GPU. The runtime's default order, FASTEST_FIRST,
// is taken to be the PCI order where every GPU is the same model (its ties);
// with mixed models it is the runtime's own and the order is left unset.
// MIG instances ("MIG-…") are not mapped here.
CudaOrder cuda_order_from_env(const Topology& topo, const CudaEnv& env,
                              const std::map<PciAddr, std::string>& uuids);

// The UUIDs the NVIDIA driver lists under <root>/proc/driver/nvidia/gpus;
// empty where it is not loaded or the files are unreadable.
std::map<PciAddr, std::string> read_gpu_uuids(const std::filesystem::path& root = "/");

}  // namespace ferry::topo

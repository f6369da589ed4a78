#include "engine/cuda_order.h"

#include <exception>
#include <map>
#include <string>
#include <vector>

#include "cuda/device_order.h"
#include "topo/cuda_visible.h"

namespace ferry::engine {

CudaOrderApplied apply_cuda_order(topo::Topology& topo, const std::filesystem::path& root) {
  CudaOrderApplied out;
  if (topo.gpus.empty()) return out;
  std::vector<topo::PciAddr> order;
  std::string why;
  if (auto ids = cuda::driver_pci_bus_ids(&why)) {
    for (const auto& id : *ids) {
      const auto a = topo::PciAddr::parse(id);
      if (!a) {
        out.note = "the CUDA driver reported bus id '" + id + "', which is no PCI address";
        return out;
      }
      order.push_back(*a);
    }
    out.source = "driver";
  } else {
    // The driver's GPU list is read only for a list that may name UUIDs.
    const topo::CudaEnv cuda_env = topo::CudaEnv::of_process();
    topo::CudaOrder env = topo::cuda_order_from_env(topo, cuda_env,
                                                    cuda_env.visible_devices
                                                        ? topo::read_gpu_uuids(root)
                                                        : std::map<topo::PciAddr, std::string>{});
    out.note = std::move(env.note);
    if (!env.order) return out;
    order = std::move(*env.order);
    out.source = "environment";
  }
  try {
    topo::assign_gpu_ordinals(topo, order);
  } catch (const std::exception& e) {
    // A MIG instance shares its GPU's address; a container may hide a GPU
    // from sysfs that CUDA still lists.
    out.note = std::string("CUDA's device order does not fit the topology (") + e.what() + ")";
    out.source.clear();
  }
  return out;
}

}  // namespace ferry::engine

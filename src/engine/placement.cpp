// Where workers run and which NICs serve which GPU, from the detected
// topology (docs/TOPOLOGY.md).
#include "engine/placement.h"

#include <fmt/format.h>

#include <memory>

#include "core/log.h"
#include "engine/cuda_order.h"
#include "topo/topology.h"

namespace ferry::engine {

namespace {

// The machine's topology, read once per process, its GPUs numbered as CUDA
// numbers them here; nullptr when sysfs is unreadable (containers), in which
// case nothing is pinned by default.
const topo::Topology* machine_topology() {
  static const std::unique_ptr<topo::Topology> topo = []() -> std::unique_ptr<topo::Topology> {
    std::unique_ptr<topo::Topology> t;
    try {
      t = std::make_unique<topo::Topology>(topo::detect());
    } catch (const std::exception& e) {
      core::log().warn("topology detection failed: {}; workers are not pinned", e.what());
      return nullptr;
    }
    const CudaOrderApplied applied = apply_cuda_order(*t);
    if (!applied.note.empty())
      core::log().warn("GPU numbering: {}{}", applied.note,
                       applied.source.empty() ? "; GPUs keep their PCI order" : "");
    else if (!applied.source.empty())
      core::log().debug("GPU numbering from the CUDA {}: {} of {} GPUs visible", applied.source,
                        t->visible_gpu_count(), t->gpus.size());
    return t;
  }();
  return topo.get();
}

const topo::TopologyGroup* topology_group(const topo::Topology& t, const Device& d) {
  return d.is_host() ? &t.host_group() : t.group(d.ordinal);
}

// libfabric names a NIC's domain after the device (efa: "<dev>-rdm").
std::string domain_name(const topo::NicInfo& nic) {
  return nic.kind == topo::NicKind::kEfa ? nic.name + "-rdm" : nic.name;
}

}  // namespace

// Checks explicit NICs and CPUs against the topology; NICs it does not know
// (loopback, veth in a namespace, shm) are development setups and pass.
void validate_against_topology(const EngineConfig& config) {
  const topo::Topology* t = machine_topology();
  if (!t) return;
  for (const auto& g : config.groups) {
    const topo::TopologyGroup* tg = topology_group(*t, g.device);
    if (!tg) {
      if (!g.insist)
        throw Error(Code::kInvalidArgument,
                    fmt::format("{} is not in the detected topology (set GroupConfig::insist to "
                                "use it anyway)",
                                g.device.to_string()));
      continue;
    }
    std::vector<std::string> known;
    for (const auto& n : g.nic_names)
      for (const auto& nic : t->nics)
        if (domain_name(nic) == n || nic.name == n) known.push_back(nic.name);
    std::vector<std::string> problems;
    if (g.worker_cpu >= 0) {
      int node = t->numa_of_cpu(g.worker_cpu);
      if (node < 0)
        problems.push_back(fmt::format("worker CPU {} does not exist", g.worker_cpu));
      else if (node != tg->numa)
        problems.push_back(
            fmt::format("worker CPU {} is on NUMA node {}, the group's devices on {}", g.worker_cpu,
                        node, tg->numa));
    }
    if (!known.empty()) {
      int gpu = g.device.is_host() ? -1 : g.device.ordinal;
      for (const auto& p : topo::validate_group(*t, gpu, known, {}, true))
        problems.push_back(p.message);
    }
    for (const auto& p : problems) {
      if (!g.insist)
        throw Error(Code::kInvalidArgument,
                    fmt::format("group for {}: {} (set GroupConfig::insist to use it anyway)",
                                g.device.to_string(), p));
      core::log().warn("group for {}: {}", g.device.to_string(), p);
    }
  }
}

std::vector<int> default_affinity(const GroupConfig& g) {
  const topo::Topology* t = machine_topology();
  if (!t || g.worker_cpu >= 0) return {};
  const topo::TopologyGroup* tg = topology_group(*t, g.device);
  if (!tg) return {};
  auto node = t->numa_nodes.find(tg->numa);
  return node == t->numa_nodes.end() ? std::vector<int>{} : node->second.cpus;
}

std::vector<std::string> topology_nics(const topo::Topology& t, const Device& device,
                                       const std::string& provider, size_t count) {
  if (device.is_host() || count == 0) return {};
  const bool efa = provider == "efa";
  const bool verbs = provider == "verbs" || provider.starts_with("verbs;");
  if (!(efa && t.fabric_kind == topo::NicKind::kEfa) &&
      !(verbs && t.fabric_kind == topo::NicKind::kVerbs))
    return {};
  const topo::TopologyGroup* tg = t.group(device.ordinal);
  if (tg == nullptr || tg->nics.size() < count) return {};
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) out.push_back(domain_name(tg->nics[i]));
  return out;
}

std::vector<std::string> default_nics(const GroupConfig& g, const std::string& provider,
                                      size_t count) {
  const topo::Topology* t = machine_topology();
  if (!t || !g.nic_names.empty()) return {};
  return topology_nics(*t, g.device, provider, count);
}

}  // namespace ferry::engine

namespace ferry {

EngineConfig EngineConfig::from_topology(const std::vector<int>& gpus, size_t nics_per_gpu,
                                         std::string provider) {
  const topo::Topology* t = engine::machine_topology();
  if (!t)
    throw Error(Code::kUnavailable, "EngineConfig::from_topology: no topology (sysfs unreadable)");
  EngineConfig c;
  c.provider = std::move(provider);
  c.nics_per_group = nics_per_gpu;
  c.groups.clear();
  std::vector<int> wanted = gpus.empty() ? std::vector<int>{-1} : gpus;
  for (int gpu : wanted) {
    const topo::TopologyGroup* tg = gpu < 0 ? &t->host_group() : t->group(gpu);
    if (!tg)
      throw Error(Code::kNotFound, fmt::format("GPU {} is not in the detected topology", gpu));
    if (tg->nics.size() < nics_per_gpu)
      throw Error(Code::kFailedPrecondition,
                  fmt::format("{} has {} NICs in the topology, {} requested",
                              gpu < 0 ? std::string("the host") : fmt::format("GPU {}", gpu),
                              tg->nics.size(), nics_per_gpu));
    GroupConfig g;
    g.device = gpu < 0 ? Device::host() : Device::cuda(gpu);
    for (size_t i = 0; i < nics_per_gpu; ++i)
      g.nic_names.push_back(engine::domain_name(tg->nics[i]));
    if (!tg->cpus.empty()) g.worker_cpu = tg->cpus.front();
    c.groups.push_back(std::move(g));
  }
  return c;
}

}  // namespace ferry

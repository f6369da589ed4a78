// Topology: groups of a GPU, its NICs and CPUs built from what the sysfs scan
// found (sysfs_detect.cpp), their checks, and the public parsers.
#include "topo/topology.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "topo/text.h"

namespace ferry::topo {

namespace {

using text::kMaxCpuId;
using text::parse_number;
using text::trim;

// The NICs groups are built from: the best kind present, and of that kind
// only the most common model, so a lone storage or management adapter of
// another model is not mixed into the GPUs' NICs.
std::vector<const NicInfo*> fabric_nics(const Topology& topo) {
  std::vector<const NicInfo*> out;
  for (const auto& n : topo.nics) {
    if (n.kind == topo.fabric_kind) out.push_back(&n);
  }
  if (topo.fabric_kind == NicKind::kEfa || out.size() < 2) return out;
  std::map<std::pair<uint16_t, uint16_t>, std::pair<size_t, uint64_t>> models;
  for (const auto* n : out) {
    auto& m = models[{n->vendor_id, n->device_id}];
    m.first++;
    m.second += n->link_speed_bps;
  }
  auto best = std::max_element(models.begin(), models.end(), [](const auto& a, const auto& b) {
    return a.second < b.second;  // by count, then total speed
  });
  std::erase_if(out, [&](const NicInfo* n) {
    return std::make_pair(n->vendor_id, n->device_id) != best->first;
  });
  return out;
}

// Contiguous shares: item i of k gets [i*n/k ... ) with the first n%k one larger.
std::pair<size_t, size_t> slice(size_t n, size_t k, size_t i) {
  const size_t base = n / k, extra = n % k;
  const size_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// NICs for `k` GPUs out of `nics`: an even number each (leftovers unused so
// every GPU drives the same number of NICs), or a shared NIC when there are
// fewer NICs than GPUs.
std::vector<std::vector<const NicInfo*>> share_nics(const std::vector<const NicInfo*>& nics,
                                                    size_t k) {
  std::vector<std::vector<const NicInfo*>> out(k);
  if (nics.empty() || k == 0) return out;
  if (nics.size() >= k) {
    const size_t per = nics.size() / k;
    for (size_t i = 0; i < k; ++i)
      out[i].assign(nics.begin() + i * per, nics.begin() + (i + 1) * per);
  } else {
    for (size_t i = 0; i < k; ++i) out[i].push_back(nics[i * nics.size() / k]);
  }
  return out;
}

std::string join_problems(const std::vector<Problem>& problems) {
  std::string s;
  for (const auto& p : problems) {
    if (!p.is_error()) continue;
    if (!s.empty()) s += "; ";
    s += p.message;
  }
  return s;
}

}  // namespace

// --- PciAddr ------------------------------------------------------------------

std::optional<PciAddr> PciAddr::parse(std::string_view s) {
  s = trim(s);
  // Digit counts as the kernel prints them, so names such as "0:0.0" that
  // merely look similar are not taken for PCI functions.
  auto hex = [](std::string_view t, size_t min_digits,
                size_t max_digits) -> std::optional<uint32_t> {
    if (t.size() < min_digits || t.size() > max_digits) return std::nullopt;
    for (char c : t) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
    }
    return parse_number<uint32_t>(t, 16);
  };
  PciAddr a;
  const size_t dot = s.rfind('.');
  if (dot == s.npos) return std::nullopt;
  auto fn = hex(s.substr(dot + 1), 1, 1);
  std::string_view head = s.substr(0, dot);
  const size_t c2 = head.rfind(':');
  if (c2 == head.npos) return std::nullopt;
  auto dev = hex(head.substr(c2 + 1), 2, 2);
  head = head.substr(0, c2);
  const size_t c1 = head.rfind(':');
  auto bus = hex(c1 == head.npos ? head : head.substr(c1 + 1), 2, 2);
  std::optional<uint32_t> domain = 0u;
  if (c1 != head.npos) domain = hex(head.substr(0, c1), 4, 8);
  if (!fn || !dev || !bus || !domain || *fn > 7 || *dev > 31) return std::nullopt;
  a.domain = *domain;
  a.bus = static_cast<uint8_t>(*bus);
  a.dev = static_cast<uint8_t>(*dev);
  a.fn = static_cast<uint8_t>(*fn);
  return a;
}

std::string PciAddr::to_string() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

std::string_view nic_kind_name(NicKind k) {
  switch (k) {
    case NicKind::kEfa:
      return "efa";
    case NicKind::kVerbs:
      return "verbs";
    case NicKind::kNetdev:
      return "netdev";
  }
  return "?";
}

std::string_view nic_locality_name(NicLocality l) {
  switch (l) {
    case NicLocality::kNone:
      return "none";
    case NicLocality::kPcieSwitch:
      return "pcie-switch";
    case NicLocality::kNumaNode:
      return "numa-node";
    case NicLocality::kAnyNode:
      return "any-node";
    case NicLocality::kHost:
      return "host";
    case NicLocality::kOverride:
      return "override";
  }
  return "?";
}

// --- cpulist ------------------------------------------------------------------

std::optional<std::vector<int>> parse_cpulist(std::string_view s) {
  s = trim(s);
  std::vector<int> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    s = comma == s.npos ? std::string_view() : s.substr(comma + 1);
    const size_t dash = item.find('-');
    auto lo = parse_number<int>(item.substr(0, dash), 10);
    auto hi = dash == item.npos ? lo : parse_number<int>(item.substr(dash + 1), 10);
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > kMaxCpuId) return std::nullopt;
    for (int c = *lo; c <= *hi; ++c) out.push_back(c);
    if (comma != std::string_view::npos && s.empty()) return std::nullopt;  // trailing comma
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::vector<int> v = cpus;
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(v[i]);
    if (j > i) s += '-' + std::to_string(v[j]);
    i = j + 1;
  }
  return s;
}

// --- Topology -----------------------------------------------------------------

const GpuInfo* Topology::gpu(int ordinal) const {
  if (ordinal < 0) return nullptr;
  for (const auto& g : gpus) {
    if (g.ordinal == ordinal) return &g;
  }
  return nullptr;
}

const NicInfo* Topology::nic(std::string_view name) const {
  for (const auto& n : nics) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

const TopologyGroup* Topology::group(int gpu) const {
  for (const auto& g : groups) {
    if (g.gpu == gpu) return &g;
  }
  return nullptr;
}

const TopologyGroup& Topology::host_group() const {
  static const TopologyGroup kEmpty;
  const TopologyGroup* g = group(-1);
  return g ? *g : kEmpty;
}

int Topology::numa_of_cpu(int cpu) const {
  for (const auto& [id, node] : numa_nodes) {
    if (std::binary_search(node.cpus.begin(), node.cpus.end(), cpu)) return id;
  }
  return -1;
}

size_t Topology::visible_gpu_count() const {
  return static_cast<size_t>(
      std::count_if(gpus.begin(), gpus.end(), [](const GpuInfo& g) { return g.ordinal >= 0; }));
}

void build_groups(Topology& topo) {
  topo.groups.clear();
  auto has = [&](NicKind k) {
    return std::any_of(topo.nics.begin(), topo.nics.end(),
                       [&](const NicInfo& n) { return n.kind == k; });
  };
  topo.fabric_kind = has(NicKind::kEfa)     ? NicKind::kEfa
                     : has(NicKind::kVerbs) ? NicKind::kVerbs
                                            : NicKind::kNetdev;
  const std::vector<const NicInfo*> nics = fabric_nics(topo);

  // Every physical GPU takes part, visible or not, so the split is the same
  // in every process of the machine whatever CUDA_VISIBLE_DEVICES says.
  std::vector<size_t> order(topo.gpus.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return topo.gpus[a].pci < topo.gpus[b].pci; });

  std::vector<TopologyGroup> per_gpu(topo.gpus.size());
  std::set<const NicInfo*> claimed;

  // 1. GPUs and NICs under one branching ancestor (PCIe switch).
  std::map<std::string, std::vector<size_t>> gpus_by_branch;
  for (size_t i : order) gpus_by_branch[topo.gpus[i].branch].push_back(i);
  for (const auto& [branch, gpus] : gpus_by_branch) {
    std::vector<const NicInfo*> local;
    for (const auto* n : nics) {
      if (!branch.empty() && n->branch == branch) local.push_back(n);
    }
    auto shares = share_nics(local, gpus.size());
    for (size_t j = 0; j < gpus.size(); ++j) {
      if (shares[j].empty()) continue;
      per_gpu[gpus[j]].locality = NicLocality::kPcieSwitch;
      for (const auto* n : shares[j]) {
        per_gpu[gpus[j]].nics.push_back(*n);
        claimed.insert(n);
      }
    }
  }

  // 2. GPUs still without NICs: their NUMA node's NICs, unclaimed ones first.
  std::map<int, std::vector<size_t>> orphans_by_node;
  for (size_t i : order) {
    if (per_gpu[i].nics.empty()) orphans_by_node[topo.gpus[i].numa].push_back(i);
  }
  for (const auto& [node, gpus] : orphans_by_node) {
    auto pick = [&](bool same_node, bool unclaimed) {
      std::vector<const NicInfo*> v;
      for (const auto* n : nics) {
        if ((!same_node || n->numa == node) && (!unclaimed || !claimed.contains(n))) v.push_back(n);
      }
      return v;
    };
    NicLocality locality = NicLocality::kNumaNode;
    std::vector<const NicInfo*> pool = pick(true, true);
    if (pool.empty()) pool = pick(true, false);
    if (pool.empty()) {
      locality = NicLocality::kAnyNode;
      pool = pick(false, true);
      if (pool.empty()) pool = pick(false, false);
    }
    auto shares = share_nics(pool, gpus.size());
    for (size_t j = 0; j < gpus.size(); ++j) {
      per_gpu[gpus[j]].locality = shares[j].empty() ? NicLocality::kNone : locality;
      for (const auto* n : shares[j]) per_gpu[gpus[j]].nics.push_back(*n);
    }
  }

  // 3. Each node's physical cores, split among its GPUs in PCI order.
  std::map<int, std::vector<size_t>> gpus_by_node;
  for (size_t i : order) gpus_by_node[topo.gpus[i].numa].push_back(i);
  for (const auto& [node, gpus] : gpus_by_node) {
    auto it = topo.numa_nodes.find(node);
    const std::vector<int> empty;
    const std::vector<int>& cores = it == topo.numa_nodes.end() ? empty : it->second.cores;
    if (cores.size() < gpus.size()) {
      topo.warnings.push_back("NUMA node " + std::to_string(node) + " has " +
                              std::to_string(cores.size()) + " cores for " +
                              std::to_string(gpus.size()) + " GPUs: some groups get no CPU");
    }
    for (size_t j = 0; j < gpus.size(); ++j) {
      auto [b, e] = slice(cores.size(), gpus.size(), j);
      per_gpu[gpus[j]].cpus.assign(cores.begin() + b, cores.begin() + e);
    }
  }

  std::vector<size_t> visible;
  for (size_t i = 0; i < topo.gpus.size(); ++i) {
    per_gpu[i].gpu = topo.gpus[i].ordinal;
    per_gpu[i].numa = topo.gpus[i].numa;
    if (topo.gpus[i].ordinal >= 0) visible.push_back(i);
  }
  std::sort(visible.begin(), visible.end(),
            [&](size_t a, size_t b) { return topo.gpus[a].ordinal < topo.gpus[b].ordinal; });
  for (size_t i : visible) topo.groups.push_back(std::move(per_gpu[i]));

  // Host group: node 0 (or the lowest node) with its NICs, else all NICs.
  TopologyGroup host;
  host.gpu = -1;
  host.locality = nics.empty() ? NicLocality::kNone : NicLocality::kHost;
  if (!topo.numa_nodes.empty()) {
    const NumaNode& n0 = topo.numa_nodes.begin()->second;
    host.numa = n0.id;
    host.cpus = n0.cores;
  }
  for (const auto* n : nics) {
    if (n->numa == host.numa) host.nics.push_back(*n);
  }
  if (host.nics.empty()) {
    for (const auto* n : nics) host.nics.push_back(*n);
  }
  topo.groups.push_back(std::move(host));
}

void assign_gpu_ordinals(Topology& topo, const std::vector<PciAddr>& cuda_order) {
  std::set<PciAddr> seen;
  for (const auto& a : cuda_order) {
    if (!seen.insert(a).second) {
      throw Error(Code::kInvalidArgument,
                  "topology: GPU " + a.to_string() + " listed twice in the CUDA order");
    }
    auto it = std::find_if(topo.gpus.begin(), topo.gpus.end(),
                           [&](const GpuInfo& g) { return g.pci == a; });
    if (it == topo.gpus.end()) {
      throw Error(Code::kNotFound, "topology: CUDA GPU " + a.to_string() + " not found in sysfs");
    }
  }
  for (auto& g : topo.gpus) {
    auto it = std::find(cuda_order.begin(), cuda_order.end(), g.pci);
    g.ordinal = it == cuda_order.end() ? -1 : static_cast<int>(it - cuda_order.begin());
  }
  std::stable_sort(topo.gpus.begin(), topo.gpus.end(), [](const GpuInfo& a, const GpuInfo& b) {
    if ((a.ordinal < 0) != (b.ordinal < 0)) return a.ordinal >= 0;
    return a.ordinal >= 0 ? a.ordinal < b.ordinal : a.pci < b.pci;
  });
  build_groups(topo);
}

std::vector<Problem> validate_group(const Topology& topo, int gpu,
                                    const std::vector<std::string>& nic_names,
                                    const std::vector<int>& cpus, bool insist) {
  std::vector<Problem> out;
  const Problem::Severity soft = insist ? Problem::Severity::kWarning : Problem::Severity::kError;
  auto add = [&](Problem::Severity s, std::string m) { out.push_back({s, std::move(m)}); };
  const std::string who = gpu < 0 ? std::string("host group") : "GPU " + std::to_string(gpu);

  const GpuInfo* g = nullptr;
  if (gpu >= 0) {
    g = topo.gpu(gpu);
    // Not downgraded by insist: there is nothing to build a group for.
    if (!g) add(Problem::Severity::kError, who + ": no such GPU");
  }
  const int numa = g ? g->numa : topo.host_group().numa;

  if (nic_names.empty()) add(soft, who + ": no NIC given");
  std::set<std::string> names;
  for (const auto& name : nic_names) {
    if (!names.insert(name).second) {
      add(Problem::Severity::kError, who + ": NIC " + name + " listed twice");
      continue;
    }
    const NicInfo* nic = topo.nic(name);
    if (!nic) {
      add(soft, who + ": unknown NIC " + name);
      continue;
    }
    if (gpu >= 0) {
      // A NIC driven by two workers halves both GPUs' bandwidth.
      for (const auto& other : topo.groups) {
        if (other.gpu < 0 || other.gpu == gpu) continue;
        const bool taken = std::any_of(other.nics.begin(), other.nics.end(),
                                       [&](const NicInfo& n) { return n.name == name; });
        if (taken)
          add(soft, who + ": NIC " + name + " belongs to GPU " + std::to_string(other.gpu));
      }
    }
    if (g && nic->numa != numa) {
      add(Problem::Severity::kWarning, who + " (NUMA " + std::to_string(numa) + "): NIC " + name +
                                           " is on NUMA node " + std::to_string(nic->numa));
    }
  }

  std::set<int> seen_cpus;
  for (int cpu : cpus) {
    if (!seen_cpus.insert(cpu).second) {
      add(Problem::Severity::kError, who + ": CPU " + std::to_string(cpu) + " listed twice");
      continue;
    }
    const int node = topo.numa_of_cpu(cpu);
    if (node < 0) {
      add(soft, who + ": unknown CPU " + std::to_string(cpu));
    } else if (g && node != numa) {
      add(soft, who + ": CPU " + std::to_string(cpu) + " is on NUMA node " + std::to_string(node) +
                    ", the GPU on node " + std::to_string(numa));
    }
  }
  return out;
}

TopologyGroup make_group(const Topology& topo, int gpu, const std::vector<std::string>& nic_names,
                         const std::vector<int>& cpus, bool insist,
                         std::vector<Problem>* warnings) {
  std::vector<Problem> problems = validate_group(topo, gpu, nic_names, cpus, insist);
  if (std::any_of(problems.begin(), problems.end(),
                  [](const Problem& p) { return p.is_error(); })) {
    throw Error(Code::kInvalidArgument, "topology override: " + join_problems(problems));
  }
  if (warnings) {
    for (auto& p : problems) warnings->push_back(std::move(p));
  }
  TopologyGroup group;
  group.gpu = gpu;
  const GpuInfo* g = topo.gpu(gpu);
  group.numa = g ? g->numa : topo.host_group().numa;
  group.locality = NicLocality::kOverride;
  for (const auto& name : nic_names) {
    if (const NicInfo* nic = topo.nic(name)) {
      group.nics.push_back(*nic);
    } else {
      // Insisted on a NIC sysfs cannot see: keep the name for the provider.
      NicInfo n;
      n.name = name;
      n.kind = topo.fabric_kind;
      n.numa = group.numa;
      group.nics.push_back(std::move(n));
    }
  }
  group.cpus = cpus;
  return group;
}

}  // namespace ferry::topo

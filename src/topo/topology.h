// GPU / NIC / NUMA / CPU topology of the local machine, read from sysfs.
//
// sysfs is the only source: everything is read below a root directory given
// by the caller, so tests run the same code on generated fixture trees and
// nothing here needs CUDA, libfabric or hwloc. CUDA (when a later layer has
// it) only renumbers GPUs through assign_gpu_ordinals().
#pragma once

#include <compare>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::topo {

// domain:bus:device.function. The domain is 32 bits wide because VMD
// domains ("10000:e1:00.0") do not fit the usual four hex digits.
struct PciAddr {
  uint32_t domain = 0;
  uint8_t bus = 0;
  uint8_t dev = 0;  // 0..31
  uint8_t fn = 0;   // 0..7

  // Accepts "0000:bb:00.0" and the domain-less "bb:00.0"; case-insensitive.
  static std::optional<PciAddr> parse(std::string_view s);
  std::string to_string() const;  // "0000:bb:00.0"
  auto operator<=>(const PciAddr&) const = default;
};

enum class NicKind : uint8_t {
  kEfa,     // AWS Elastic Fabric Adapter (libfabric "efa")
  kVerbs,   // any other RDMA device in /sys/class/infiniband (ConnectX, rxe, ...)
  kNetdev,  // a PCI Ethernet interface without RDMA (libfabric "tcp")
};
std::string_view nic_kind_name(NicKind k);

struct GpuInfo {
  int ordinal = -1;  // -1: present in sysfs but not visible to this process
  PciAddr pci;
  int numa = 0;
  uint16_t device_id = 0;
  std::string branch;  // sysfs name of the branching PCI ancestor (≈ PCIe switch)
};

struct NicInfo {
  std::string name;  // verbs/efa device name ("mlx5_0", "rdmap79s0") or netdev ("eth0")
  NicKind kind = NicKind::kNetdev;
  std::optional<PciAddr> pci;  // unset for software devices with no PCI parent
  int numa = 0;
  uint64_t link_speed_bps = 0;  // 0 = unknown
  std::string netdev;           // Ethernet/IPoIB interface of an RDMA device, if any
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string branch;
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;   // every logical CPU, ascending
  std::vector<int> cores;  // the lowest logical CPU of each physical core, ascending
};

// Why a group got the NICs it has; printed by ferry-info so a surprising
// pairing can be traced to the rule that made it.
enum class NicLocality : uint8_t {
  kNone,        // no NIC at all on the machine
  kPcieSwitch,  // NICs under the GPU's branching PCI ancestor
  kNumaNode,    // no NIC shares a switch: NICs of the GPU's NUMA node
  kAnyNode,     // not even that: NICs of other nodes
  kHost,        // the host group: NICs of NUMA node 0
  kOverride,    // given by the user (make_group)
};
std::string_view nic_locality_name(NicLocality l);

struct TopologyGroup {
  int gpu = -1;  // CUDA ordinal; -1 = the host-only group
  int numa = 0;
  std::vector<NicInfo> nics;  // in PCI order
  std::vector<int> cpus;      // one logical CPU per physical core, contiguous slice
  NicLocality locality = NicLocality::kNone;
};

struct Topology {
  std::vector<GpuInfo> gpus;  // visible GPUs first in ordinal order, then invisible ones
  std::vector<NicInfo> nics;  // every NIC found, in PCI order (software devices last)
  std::map<int, NumaNode> numa_nodes;
  // One group per visible GPU, in ordinal order, then the host group (gpu -1).
  std::vector<TopologyGroup> groups;
  // The NIC kind groups are built from: EFA if any, else verbs, else netdev.
  NicKind fabric_kind = NicKind::kNetdev;
  // Things that were missing or malformed and how they were worked around.
  std::vector<std::string> warnings;

  const GpuInfo* gpu(int ordinal) const;
  const NicInfo* nic(std::string_view name) const;
  const TopologyGroup* group(int gpu) const;  // gpu -1 = host group
  const TopologyGroup& host_group() const;
  int numa_of_cpu(int cpu) const;  // -1 when the CPU is on no node
  size_t visible_gpu_count() const;
};

struct DetectOptions {
  std::filesystem::path sysfs_root = "/";  // reads <root>/sys/...
};

// Reads the topology. Missing or malformed sysfs entries become warnings
// (numa_node -1 means node 0, an unreadable device is skipped); throws
// Error(kNotFound) only when the root itself is missing.
Topology detect(const DetectOptions& options = {});

// Renumbers GPUs in CUDA's order: cuda_order[i] is the PCI address of CUDA
// device i. GPUs not listed become invisible (ordinal -1) but keep their
// share of NICs and cores, so processes that see other GPUs do not collide
// with them. Throws Error(kNotFound) for an address sysfs does not know and
// Error(kInvalidArgument) for a duplicate; rebuilds the groups.
void assign_gpu_ordinals(Topology& topo, const std::vector<PciAddr>& cuda_order);

// Recomputes topo.groups from gpus, nics and numa_nodes (detect() calls it).
void build_groups(Topology& topo);

struct Problem {
  enum class Severity : uint8_t { kError, kWarning };
  Severity severity = Severity::kError;
  std::string message;
  bool is_error() const { return severity == Severity::kError; }
};

// Checks a user-chosen group for GPU `gpu` (-1 = host). Unknown NICs, NICs
// of another GPU's default group and CPUs off the GPU's NUMA node are errors
// unless `insist`, which downgrades them to warnings: the user may know
// better (a container hiding sysfs, a deliberate cross-socket setup).
std::vector<Problem> validate_group(const Topology& topo, int gpu,
                                    const std::vector<std::string>& nic_names,
                                    const std::vector<int>& cpus, bool insist);

// validate_group, then the group itself. Throws Error(kInvalidArgument)
// naming every error; warnings go to *warnings when given.
TopologyGroup make_group(const Topology& topo, int gpu, const std::vector<std::string>& nic_names,
                         const std::vector<int>& cpus, bool insist,
                         std::vector<Problem>* warnings = nullptr);

// Linux cpulist syntax ("0-3,8,10-11"). parse returns nullopt when malformed.
std::optional<std::vector<int>> parse_cpulist(std::string_view s);
std::string format_cpulist(const std::vector<int>& cpus);

}  // namespace ferry::topo

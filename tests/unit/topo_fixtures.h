// Generates sysfs trees of known machines in a temporary directory, so the
// topology detector is tested on the layouts it will meet without
// committing thousands of recorded sysfs files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ferry::topo::testing {

enum class FxKind {
  kGpuH100,
  kGpuH200,
  kEfa,            // EFA v2 (p5), rdma device "rdmap<bus>s0"
  kEfa3,           // EFA v3 (p5en)
  kEna,            // AWS ENA Ethernet (netdev only)
  kConnectX7,      // mlx5_N + IPoIB netdev ibp<bus>s0
  kConnectX6Dual,  // two PCI functions, two mlx5_N, one slot
  kNvme,
  kVirtioNet,  // netdev under .../virtioN, speed -1
  kIntelEth,   // 10 GbE management port
};

struct FxDevice {
  FxKind kind;
  double gbps = 0;  // link rate; 0 = the kind's usual one
};

// A PCIe switch: an upstream port and one downstream port per device.
struct FxSwitch {
  std::vector<FxDevice> devices;
};

// A host bridge (pciDDDD:BB) with switches and devices on plain root ports.
struct FxRoot {
  int numa = 0;
  std::vector<FxSwitch> switches;
  std::vector<FxDevice> direct;
};

struct FxMachine {
  std::string name;
  std::vector<FxRoot> roots;
  int sockets = 1;  // = NUMA nodes
  int cores_per_socket = 1;
  int threads_per_core = 1;
  bool report_numa = true;      // false: every numa_node file says -1 (some VMs)
  bool numa_dirs = true;        // false: no sys/devices/system/node (kernel without NUMA)
  bool absolute_links = false;  // class links as absolute "/sys/..." paths
};

// AWS p5.48xlarge: 2 sockets x 48 cores (SMT), 8 PCIe switches (one per
// host bridge), each 4 EFA + 1 H100 + 1 NVMe; one ENA on socket 0.
FxMachine p5_48xlarge();
// AWS p5en.48xlarge: as p5 with H200 and 2 EFA v3 (200 Gb/s) per switch.
FxMachine p5en_48xlarge();
// DGX H100: 2 sockets x 56 cores, 4 switches of 2 H100 + 2 ConnectX-7
// (400 Gb/s), one dual-port ConnectX-6 storage NIC and one 10 GbE port.
FxMachine dgx_h100();
// This build machine: 1 node, 2 CPUs, one virtio netdev, numa_node -1.
FxMachine small_vm();

// Writes the tree under dir (which must exist) and returns dir.
std::filesystem::path write_fixture(const FxMachine& m, const std::filesystem::path& dir);

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Overwrites (or creates) <root>/<rel> with text.
void write_file(const std::filesystem::path& root, const std::string& rel, const std::string& text);

}  // namespace ferry::topo::testing

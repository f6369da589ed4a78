#include "topo_fixtures.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <system_error>

namespace ferry::topo::testing {
namespace fs = std::filesystem;

namespace {

struct Ids {
  const char* vendor;
  const char* device;
  const char* cls;
};

Ids ids_of(FxKind k) {
  switch (k) {
    case FxKind::kGpuH100:
      return {"0x10de", "0x2330", "0x030200"};
    case FxKind::kGpuH200:
      return {"0x10de", "0x2335", "0x030200"};
    case FxKind::kEfa:
      return {"0x1d0f", "0xefa1", "0x020000"};
    case FxKind::kEfa3:
      return {"0x1d0f", "0xefa2", "0x020000"};
    case FxKind::kEna:
      return {"0x1d0f", "0xec20", "0x020000"};
    case FxKind::kConnectX7:
      return {"0x15b3", "0x1021", "0x020700"};
    case FxKind::kConnectX6Dual:
      return {"0x15b3", "0x101b", "0x020000"};
    case FxKind::kNvme:
      return {"0x1d0f", "0xcd01", "0x010802"};
    case FxKind::kVirtioNet:
      return {"0x1af4", "0x1041", "0x020000"};
    case FxKind::kIntelEth:
      return {"0x8086", "0x1563", "0x020000"};
  }
  return {"0x0000", "0x0000", "0x000000"};
}

double default_gbps(FxKind k) {
  switch (k) {
    case FxKind::kEfa:
      return 100;
    case FxKind::kEfa3:
      return 200;
    case FxKind::kEna:
      return 100;
    case FxKind::kConnectX7:
      return 400;
    case FxKind::kConnectX6Dual:
      return 200;
    case FxKind::kIntelEth:
      return 10;
    default:
      return 0;
  }
}

std::string hex2(int v) {
  char b[16];
  std::snprintf(b, sizeof(b), "%02x", v & 0xff);
  return b;
}

class Writer {
 public:
  Writer(const FxMachine& m, fs::path root) : m_(m), root_(std::move(root)) {}

  void run() {
    for (const auto& r : m_.roots) write_root(r);
    write_cpus();
  }

 private:
  std::string addr(int bus, int dev, int fn = 0) {
    return "0000:" + hex2(bus) + ":" + hex2(dev) + "." + std::to_string(fn);
  }

  void file(const std::string& rel, const std::string& text) { write_file(root_, rel, text); }

  // Links like the kernel's: relative, unless the machine asks for absolute.
  void link(const std::string& at, const std::string& target, bool absolute = false) {
    fs::path where = root_ / at;
    fs::create_directories(where.parent_path());
    fs::path to = absolute ? fs::path("/") / target
                           : (root_ / target).lexically_relative(where.parent_path());
    fs::create_symlink(to, where);
  }

  void pci_dev(const std::string& path, const std::string& a, const Ids& ids, int numa) {
    file(path + "/vendor", std::string(ids.vendor) + "\n");
    file(path + "/device", std::string(ids.device) + "\n");
    file(path + "/class", std::string(ids.cls) + "\n");
    file(path + "/numa_node", std::to_string(m_.report_numa ? numa : -1) + "\n");
    link("sys/bus/pci/devices/" + a, path);
  }

  void bridge(const std::string& path, const std::string& a, int numa) {
    pci_dev(path, a, {"0x1000", "0xc030", "0x060400"}, numa);
  }

  void write_root(const FxRoot& r) {
    const int root_bus = next_bus_++;
    const std::string host = "sys/devices/pci0000:" + hex2(root_bus);
    int port = 0;
    for (const auto& sw : r.switches) {
      // root port -> upstream port -> downstream ports -> devices
      const std::string rp_a = addr(root_bus, port++);
      const std::string rp = host + "/" + rp_a;
      bridge(rp, rp_a, r.numa);
      const std::string up_a = addr(next_bus_++, 0);
      const std::string up = rp + "/" + up_a;
      bridge(up, up_a, r.numa);
      const int down_bus = next_bus_++;
      int slot = 1;
      for (const auto& d : sw.devices) {
        const std::string dp_a = addr(down_bus, slot++);
        const std::string dp = up + "/" + dp_a;
        bridge(dp, dp_a, r.numa);
        write_device(dp, d, r.numa);
      }
    }
    for (const auto& d : r.direct) {
      const std::string rp_a = addr(root_bus, port++);
      const std::string rp = host + "/" + rp_a;
      bridge(rp, rp_a, r.numa);
      write_device(rp, d, r.numa);
    }
  }

  void write_device(const std::string& parent, const FxDevice& d, int numa) {
    const int bus = next_bus_++;
    const Ids ids = ids_of(d.kind);
    const double gbps = d.gbps > 0 ? d.gbps : default_gbps(d.kind);
    const int functions = d.kind == FxKind::kConnectX6Dual ? 2 : 1;
    for (int fn = 0; fn < functions; ++fn) {
      const std::string a = addr(bus, 0, fn);
      const std::string path = parent + "/" + a;
      pci_dev(path, a, ids, numa);
      const std::string pname =
          "p" + std::to_string(bus) + "s0" + (fn ? "f" + std::to_string(fn) : "");
      switch (d.kind) {
        case FxKind::kEfa:
        case FxKind::kEfa3:
          fs::create_directories(root_ / "sys/bus/pci/drivers/efa");
          link(path + "/driver", "sys/bus/pci/drivers/efa");
          rdma(path, "rdma" + pname, gbps);
          break;
        case FxKind::kConnectX7:
        case FxKind::kConnectX6Dual: {
          rdma(path, "mlx5_" + std::to_string(mlx_++), gbps);
          netdev(path, path, (d.kind == FxKind::kConnectX7 ? "ib" : "en") + pname, gbps);
          break;
        }
        case FxKind::kEna:
          netdev(path, path, "ens" + std::to_string(bus), gbps);
          break;
        case FxKind::kIntelEth:
          netdev(path, path, "eno" + std::to_string(++eno_), gbps);
          break;
        case FxKind::kVirtioNet: {
          const std::string vdev = path + "/virtio" + std::to_string(virtio_++);
          file(vdev + "/vendor", "0x1af4\n");
          netdev(vdev, vdev, "eth" + std::to_string(eth_++), -1);
          break;
        }
        default:
          break;
      }
    }
  }

  void rdma(const std::string& pci_path, const std::string& name, double gbps) {
    const std::string dir = pci_path + "/infiniband/" + name;
    char rate[64];
    std::snprintf(rate, sizeof(rate), "%g Gb/sec (4X NDR)\n", gbps);
    file(dir + "/ports/1/rate", rate);
    file(dir + "/node_type", "1: CA\n");
    link(dir + "/device", pci_path);
    link("sys/class/infiniband/" + name, dir, m_.absolute_links);
  }

  // gbps < 0 writes the "-1" virtio reports.
  void netdev(const std::string& owner, const std::string& device, const std::string& name,
              double gbps) {
    const std::string dir = owner + "/net/" + name;
    file(dir + "/speed", gbps < 0 ? "-1\n" : std::to_string(static_cast<long>(gbps * 1000)) + "\n");
    link(dir + "/device", device);
    link("sys/class/net/" + name, dir, m_.absolute_links);
  }

  void write_cpus() {
    const int s_n = m_.sockets, c_n = m_.cores_per_socket, t_n = m_.threads_per_core;
    // Linux numbering: all first threads of all sockets, then the siblings.
    for (int s = 0; s < s_n; ++s) {
      std::string list;
      for (int t = 0; t < t_n; ++t) {
        const int lo = t * s_n * c_n + s * c_n;
        if (!list.empty()) list += ",";
        list += std::to_string(lo) + (c_n > 1 ? "-" + std::to_string(lo + c_n - 1) : "");
        for (int c = 0; c < c_n; ++c) {
          const std::string t_dir =
              "sys/devices/system/cpu/cpu" + std::to_string(lo + c) + "/topology/";
          file(t_dir + "core_id", std::to_string(c) + "\n");
          file(t_dir + "physical_package_id", std::to_string(s) + "\n");
        }
      }
      if (m_.numa_dirs)
        file("sys/devices/system/node/node" + std::to_string(s) + "/cpulist", list + "\n");
    }
    const int n = s_n * c_n * t_n;
    file("sys/devices/system/cpu/online", "0" + (n > 1 ? "-" + std::to_string(n - 1) : "") + "\n");
    // Keep the real tree's noise: a node directory has more than nodeN.
    if (m_.numa_dirs)
      file("sys/devices/system/node/possible", "0-" + std::to_string(s_n - 1) + "\n");
  }

  const FxMachine& m_;
  fs::path root_;
  int next_bus_ = 0x10;
  int mlx_ = 0;
  int eno_ = 0;
  int eth_ = 0;
  int virtio_ = 0;
};

FxMachine aws_p5(FxKind gpu, FxKind efa, int efa_per_gpu, const char* name) {
  FxMachine m;
  m.name = name;
  m.sockets = 2;
  m.cores_per_socket = 48;
  m.threads_per_core = 2;
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < 4; ++i) {
      FxRoot r;
      r.numa = s;
      FxSwitch sw;
      for (int e = 0; e < efa_per_gpu; ++e) sw.devices.push_back({efa});
      sw.devices.push_back({gpu});
      sw.devices.push_back({FxKind::kNvme});
      r.switches.push_back(sw);
      if (s == 0 && i == 0) r.direct.push_back({FxKind::kEna});
      m.roots.push_back(r);
    }
  }
  return m;
}

}  // namespace

FxMachine p5_48xlarge() {
  return aws_p5(FxKind::kGpuH100, FxKind::kEfa, 4, "p5.48xlarge");
}

FxMachine p5en_48xlarge() {
  return aws_p5(FxKind::kGpuH200, FxKind::kEfa3, 2, "p5en.48xlarge");
}

FxMachine dgx_h100() {
  FxMachine m;
  m.name = "dgx-h100";
  m.sockets = 2;
  m.cores_per_socket = 56;
  m.threads_per_core = 2;
  for (int s = 0; s < 2; ++s) {
    FxRoot r;
    r.numa = s;
    for (int i = 0; i < 2; ++i) {
      r.switches.push_back(
          {{{FxKind::kGpuH100}, {FxKind::kConnectX7}, {FxKind::kGpuH100}, {FxKind::kConnectX7}}});
    }
    if (s == 0) r.direct.push_back({FxKind::kIntelEth});
    if (s == 1) r.direct.push_back({FxKind::kConnectX6Dual});
    m.roots.push_back(r);
  }
  return m;
}

FxMachine small_vm() {
  FxMachine m;
  m.name = "small-vm";
  m.sockets = 1;
  m.cores_per_socket = 2;
  m.threads_per_core = 1;
  m.report_numa = false;
  m.absolute_links = true;
  FxRoot r;
  r.direct.push_back({FxKind::kVirtioNet});
  m.roots.push_back(r);
  return m;
}

fs::path write_fixture(const FxMachine& m, const fs::path& dir) {
  Writer(m, dir).run();
  return dir;
}

void write_file(const fs::path& root, const std::string& rel, const std::string& text) {
  fs::path p = root / rel;
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

TempDir::TempDir() {
  // A fixture is ~2000 small files: on tmpfs that is milliseconds, on a busy
  // disk seconds. TMPDIR still wins when set.
  std::error_code ec;
  fs::path base = std::getenv("TMPDIR") == nullptr && fs::is_directory("/dev/shm", ec) &&
                          access("/dev/shm", W_OK) == 0
                      ? fs::path("/dev/shm")
                      : fs::temp_directory_path();
  std::string tmpl = (base / "ferry-topo-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace ferry::topo::testing

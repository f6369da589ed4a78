// Topology detection: a scan of sysfs (CPUs, NUMA nodes, the PCI tree, GPUs
// and NICs) under a root that may be a fixture tree. The groups built from
// what it finds are in topology.cpp.
#include <algorithm>
#include <charconv>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "topo/text.h"
#include "topo/topology.h"

namespace ferry::topo {
namespace fs = std::filesystem;

namespace {

using text::kMaxCpuId;
using text::parse_number;
using text::trim;

constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint16_t kVendorAmazon = 0x1d0f;

// Reads <root>/<relative path>, following links the way the kernel would
// if <root> were "/": an absolute link target is taken relative to <root>,
// so a fixture tree (or a copied /sys with absolute links) never escapes to
// the host's real sysfs.
class Sysfs {
 public:
  explicit Sysfs(fs::path root) : root_(std::move(root)) {}

  fs::path full(const std::string& rel) const { return root_ / rel; }

  std::optional<std::string> read(const std::string& rel) const {
    std::ifstream in(full(rel));
    if (!in) return std::nullopt;
    std::string s;
    // sysfs attributes are small; the cap keeps a hostile fixture cheap.
    s.resize(4096);
    in.read(s.data(), static_cast<std::streamsize>(s.size()));
    if (in.bad()) return std::nullopt;
    s.resize(static_cast<size_t>(in.gcount()));
    return std::string(trim(s));
  }

  // Directory entry names, sorted; empty when missing.
  std::vector<std::string> list(const std::string& rel) const {
    std::vector<std::string> out;
    std::error_code ec;
    fs::directory_iterator it(full(rel), ec), end;
    for (; !ec && it != end; it.increment(ec)) out.push_back(it->path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  bool exists(const std::string& rel) const {
    std::error_code ec;
    return fs::exists(full(rel), ec);
  }

  // Path components below the root of `rel` with every link resolved;
  // nullopt when something on the way is missing or links loop.
  std::optional<std::vector<std::string>> resolve(const std::string& rel) const {
    std::deque<std::string> todo;
    for (const auto& c : fs::path(rel)) todo.push_back(c.string());
    std::vector<std::string> done;
    int links = 0;
    while (!todo.empty()) {
      std::string c = std::move(todo.front());
      todo.pop_front();
      if (c.empty() || c == "." || c == "/") continue;
      if (c == "..") {
        if (!done.empty()) done.pop_back();
        continue;
      }
      done.push_back(c);
      fs::path here = root_ / join(done);
      std::error_code ec;
      if (!fs::is_symlink(fs::symlink_status(here, ec)) || ec) {
        if (!fs::exists(here, ec)) return std::nullopt;
        continue;
      }
      if (++links > 40) return std::nullopt;
      fs::path target = fs::read_symlink(here, ec);
      if (ec) return std::nullopt;
      done.pop_back();
      if (target.is_absolute()) done.clear();
      std::vector<std::string> parts;
      for (const auto& t : target) parts.push_back(t.string());
      todo.insert(todo.begin(), parts.begin(), parts.end());
    }
    return done;
  }

  static std::string join(const std::vector<std::string>& parts) {
    std::string s;
    for (const auto& p : parts) {
      if (!s.empty()) s += '/';
      s += p;
    }
    return s;
  }

 private:
  fs::path root_;
};

// A PCI device with what grouping needs to know about it.
struct PciDev {
  PciAddr addr;
  std::string parent;  // sysfs name of the parent: a bridge address or "pci0000:00"
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint32_t class_code = 0;
  int numa = -1;  // as read; -1 = the kernel did not say
  std::string driver;
};

bool is_root_bus(std::string_view name) {
  return name.starts_with("pci");
}

class Detector {
 public:
  explicit Detector(const fs::path& root) : sys_(root) {}

  Topology run() {
    read_numa();
    read_pci();
    read_gpus();
    read_rdma();
    read_netdevs();
    warn_guessed_numa();
    std::sort(topo_.nics.begin(), topo_.nics.end(), [](const NicInfo& a, const NicInfo& b) {
      // Software devices (no PCI) last; they are the least likely choice.
      return std::make_tuple(!a.pci.has_value(), a.pci.value_or(PciAddr{}), a.name) <
             std::make_tuple(!b.pci.has_value(), b.pci.value_or(PciAddr{}), b.name);
    });
    build_groups(topo_);
    return std::move(topo_);
  }

 private:
  void warn(std::string w) { topo_.warnings.push_back(std::move(w)); }

  // --- CPUs and NUMA nodes --------------------------------------------------
  void read_numa() {
    const std::string node_dir = "sys/devices/system/node";
    for (const auto& name : sys_.list(node_dir)) {
      if (!name.starts_with("node")) continue;
      auto id = parse_number<int>(std::string_view(name).substr(4), 10);
      if (!id || *id < 0) continue;
      auto text = sys_.read(node_dir + "/" + name + "/cpulist");
      std::optional<std::vector<int>> cpus = text ? parse_cpulist(*text) : std::nullopt;
      if (!cpus) {
        warn(node_dir + "/" + name + "/cpulist missing or malformed: node has no CPUs");
        cpus.emplace();
      }
      topo_.numa_nodes[*id] = NumaNode{*id, std::move(*cpus), {}};
    }
    if (topo_.numa_nodes.empty()) {
      // Kernels without CONFIG_NUMA have no node directory: one node 0 holds all.
      std::vector<int> cpus;
      if (auto online = sys_.read("sys/devices/system/cpu/online")) {
        cpus = parse_cpulist(*online).value_or(std::vector<int>{});
      }
      if (cpus.empty()) {
        for (const auto& name : sys_.list("sys/devices/system/cpu")) {
          if (!name.starts_with("cpu")) continue;
          if (auto id = parse_number<int>(std::string_view(name).substr(3), 10))
            cpus.push_back(*id);
        }
        std::sort(cpus.begin(), cpus.end());
      }
      if (cpus.empty()) warn("no CPUs found under sys/devices/system");
      topo_.numa_nodes[0] = NumaNode{0, std::move(cpus), {}};
      warn("no NUMA node directories: assuming a single node 0");
    }
    // Hyper-threads share a core's execution units; pinning two busy-polling
    // workers on siblings halves both, so groups only get one CPU per core.
    std::set<std::tuple<int, int, int>> seen;
    for (auto& [id, node] : topo_.numa_nodes) {
      for (int cpu : node.cpus) {
        const std::string t = "sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        auto pkg = parse_number<int>(sys_.read(t + "physical_package_id").value_or(""), 10);
        auto core = parse_number<int>(sys_.read(t + "core_id").value_or(""), 10);
        auto die = parse_number<int>(sys_.read(t + "die_id").value_or("0"), 10);
        if (!pkg || !core) {
          // Unknown siblings: count the CPU as its own core rather than drop it.
          node.cores.push_back(cpu);
          continue;
        }
        if (seen.insert({*pkg, die.value_or(0), *core}).second) node.cores.push_back(cpu);
      }
    }
  }

  // --- PCI tree ---------------------------------------------------------------
  void read_pci() {
    const std::string dir = "sys/bus/pci/devices";
    for (const auto& name : sys_.list(dir)) {
      auto addr = PciAddr::parse(name);
      if (!addr) {
        warn(dir + "/" + name + ": not a PCI address, skipped");
        continue;
      }
      PciDev d;
      d.addr = *addr;
      const std::string base = dir + "/" + name + "/";
      auto path = sys_.resolve(dir + "/" + name);
      if (path && !path->empty()) {
        // .../pci0000:bb/0000:bb:00.0/0000:bc:00.0/<this>: the component
        // before ours is the parent bridge or the root bus.
        auto self = std::find(path->rbegin(), path->rend(), name);
        if (self != path->rend() && std::next(self) != path->rend()) {
          const std::string& up = *std::next(self);
          if (PciAddr::parse(up) || is_root_bus(up)) d.parent = up;
        }
      }
      if (d.parent.empty()) {
        // No usable chain (dangling link, odd layout): the device is its own
        // island and shares a switch with nobody.
        d.parent = "?" + name;
      }
      auto vendor = parse_number<uint16_t>(sys_.read(base + "vendor").value_or(""), 16);
      auto device = parse_number<uint16_t>(sys_.read(base + "device").value_or(""), 16);
      auto cls = parse_number<uint32_t>(sys_.read(base + "class").value_or(""), 16);
      if (!vendor || !device || !cls) {
        warn(base + "{vendor,device,class} missing or malformed: not treated as a GPU or NIC");
      }
      d.vendor = vendor.value_or(0);
      d.device = device.value_or(0);
      d.class_code = cls.value_or(0);
      d.numa = parse_number<int>(sys_.read(base + "numa_node").value_or("-1"), 10).value_or(-1);
      if (auto drv = sys_.resolve(base + "driver"); drv && !drv->empty()) d.driver = drv->back();
      pci_[name] = std::move(d);
    }
    // A multi-function device (dual-port NIC, GPU + audio) is one slot: count
    // slots, not functions, or its own bridge would look like a switch.
    std::map<std::string, std::set<std::tuple<uint32_t, uint8_t, uint8_t>>> slots;
    for (const auto& [name, d] : pci_)
      slots[d.parent].insert({d.addr.domain, d.addr.bus, d.addr.dev});
    for (const auto& [parent, s] : slots) children_[parent] = s.size();
  }

  // The nearest ancestor with more than one slot below it. Root buses stop
  // the walk: devices on one host bridge share at least that.
  std::string branch_of(const std::string& name) const {
    auto it = pci_.find(name);
    if (it == pci_.end()) return "";
    std::string p = it->second.parent;
    for (int hops = 0; hops < 64; ++hops) {
      auto c = children_.find(p);
      if (c != children_.end() && c->second > 1) return p;
      auto up = pci_.find(p);
      if (up == pci_.end()) return p;  // a root bus or an island
      p = up->second.parent;
    }
    return p;
  }

  // Kernel's numa_node, else the nearest bridge's, else 0: some VMs report
  // -1 everywhere and dropping those devices would leave nothing.
  int numa_of(const std::string& name) {
    std::string p = name;
    for (int hops = 0; hops < 64; ++hops) {
      auto it = pci_.find(p);
      if (it == pci_.end()) break;
      if (it->second.numa >= 0) return known_node(it->second.numa, name);
      p = it->second.parent;
    }
    if (topo_.numa_nodes.size() > 1) guessed_numa_.insert(name);
    return known_node(0, name);
  }

  int known_node(int node, const std::string& who) {
    if (topo_.numa_nodes.contains(node) || topo_.numa_nodes.empty()) return node;
    warn(who + ": numa_node " + std::to_string(node) + " has no node directory, using " +
         std::to_string(topo_.numa_nodes.begin()->first));
    return topo_.numa_nodes.begin()->first;
  }

  // One line for all of them: a VM reporting -1 everywhere would otherwise
  // bury every other warning.
  void warn_guessed_numa() {
    if (guessed_numa_.empty()) return;
    std::string list;
    size_t shown = 0;
    for (const auto& n : guessed_numa_) {
      if (shown++ == 4) {
        list += ", ...";
        break;
      }
      list += (list.empty() ? "" : ", ") + n;
    }
    warn("numa_node -1 for " + std::to_string(guessed_numa_.size()) + " device(s) (" + list +
         ") on a machine with " + std::to_string(topo_.numa_nodes.size()) +
         " NUMA nodes: assuming node 0");
  }

  void read_gpus() {
    for (const auto& [name, d] : pci_) {
      const uint32_t cls = d.class_code >> 8;  // drop the programming interface
      if (d.vendor != kVendorNvidia || (cls != 0x0302 && cls != 0x0300)) continue;
      GpuInfo g;
      g.pci = d.addr;
      g.numa = numa_of(name);
      g.device_id = d.device;
      g.branch = branch_of(name);
      topo_.gpus.push_back(std::move(g));
    }
    std::sort(topo_.gpus.begin(), topo_.gpus.end(),
              [](const GpuInfo& a, const GpuInfo& b) { return a.pci < b.pci; });
    for (size_t i = 0; i < topo_.gpus.size(); ++i) topo_.gpus[i].ordinal = static_cast<int>(i);
  }

  // The last PCI address in a resolved device path: netdevs of virtio NICs
  // hang off ".../0000:00:03.0/virtio2", not the PCI function itself.
  static std::optional<std::string> pci_in_path(const std::vector<std::string>& path) {
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (PciAddr::parse(*it)) return *it;
    }
    return std::nullopt;
  }

  void fill_pci(NicInfo& nic, const std::string& pci_name) {
    nic.pci = PciAddr::parse(pci_name);
    nic.numa = numa_of(pci_name);
    nic.branch = branch_of(pci_name);
    if (auto it = pci_.find(pci_name); it != pci_.end()) {
      nic.vendor_id = it->second.vendor;
      nic.device_id = it->second.device;
    }
  }

  // --- RDMA devices (verbs and EFA) ---------------------------------------------
  void read_rdma() {
    const std::string dir = "sys/class/infiniband";
    for (const auto& name : sys_.list(dir)) {
      const std::string base = dir + "/" + name;
      NicInfo nic;
      nic.name = name;
      nic.kind = NicKind::kVerbs;
      std::optional<std::string> pci_name;
      if (auto dev = sys_.resolve(base + "/device")) pci_name = pci_in_path(*dev);
      if (!pci_name) {
        // Soft-RoCE (rxe) and siw name their netdev in "parent" instead.
        if (auto parent = sys_.read(base + "/parent")) {
          nic.netdev = *parent;
          if (auto dev = sys_.resolve("sys/class/net/" + *parent + "/device")) {
            pci_name = pci_in_path(*dev);
          }
        }
      }
      if (pci_name) {
        fill_pci(nic, *pci_name);
        auto it = pci_.find(*pci_name);
        if (it != pci_.end() &&
            (it->second.driver == "efa" || it->second.vendor == kVendorAmazon)) {
          nic.kind = NicKind::kEfa;
        }
      } else {
        nic.numa = known_node(0, base);
        nic.branch = "?" + name;
        warn(base + ": no PCI device found, assuming NUMA node " + std::to_string(nic.numa));
      }
      if (name.starts_with("efa")) nic.kind = NicKind::kEfa;
      nic.link_speed_bps = read_rdma_rate(base);
      topo_.nics.push_back(std::move(nic));
    }
  }

  uint64_t read_rdma_rate(const std::string& base) {
    // "100 Gb/sec (4X EDR)"; "2.5 Gb/sec (1X SDR)". Port 1 unless only others exist.
    std::vector<std::string> ports = sys_.list(base + "/ports");
    if (std::find(ports.begin(), ports.end(), "1") != ports.end()) ports = {"1"};
    for (const auto& port : ports) {
      auto rate = sys_.read(base + "/ports/" + port + "/rate");
      if (!rate) continue;
      std::string_view r = *rate;
      size_t end = r.find_first_not_of("0123456789.");
      double gbps = 0;
      auto [p, ec] = std::from_chars(r.data(), r.data() + (end == r.npos ? r.size() : end), gbps);
      if (ec == std::errc() && p != r.data() && gbps > 0 && gbps < 1e6 &&
          r.find("Gb/sec") != r.npos) {
        return static_cast<uint64_t>(gbps * 1e9);
      }
      warn(base + "/ports/" + port + "/rate: cannot parse \"" + *rate + "\"");
    }
    return 0;
  }

  // --- Ethernet interfaces ------------------------------------------------------
  void read_netdevs() {
    const std::string dir = "sys/class/net";
    for (const auto& name : sys_.list(dir)) {
      // lo, bridges, veths, tunnels: no device link, nothing to pin to.
      auto dev = sys_.resolve(dir + "/" + name + "/device");
      if (!dev) continue;
      auto pci_name = pci_in_path(*dev);
      if (!pci_name) continue;
      auto addr = PciAddr::parse(*pci_name);
      // The Ethernet / IPoIB face of an RDMA device is the same NIC.
      auto rdma = std::find_if(topo_.nics.begin(), topo_.nics.end(), [&](const NicInfo& n) {
        return n.kind != NicKind::kNetdev && (n.pci == addr || n.netdev == name);
      });
      if (rdma != topo_.nics.end()) {
        if (rdma->netdev.empty()) rdma->netdev = name;
        continue;
      }
      NicInfo nic;
      nic.name = name;
      nic.kind = NicKind::kNetdev;
      nic.netdev = name;
      fill_pci(nic, *pci_name);
      // Mb/s; -1 or EINVAL while the link is down or for virtio.
      auto mbps = parse_number<int64_t>(sys_.read(dir + "/" + name + "/speed").value_or(""), 10);
      if (mbps && *mbps > 0) nic.link_speed_bps = static_cast<uint64_t>(*mbps) * 1000000;
      topo_.nics.push_back(std::move(nic));
    }
  }

  Sysfs sys_;
  Topology topo_;
  std::map<std::string, PciDev> pci_;
  std::map<std::string, size_t> children_;
  std::set<std::string> guessed_numa_;
};

}  // namespace

Topology detect(const DetectOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(options.sysfs_root, ec)) {
    throw Error(Code::kNotFound,
                "topology: sysfs root " + options.sysfs_root.string() + " is not a directory");
  }
  try {
    return Detector(options.sysfs_root).run();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Filesystem races (a device unplugged mid-scan) must not take the
    // process down; the caller may retry.
    throw Error(Code::kInternal, std::string("topology: detection failed: ") + e.what());
  }
}

}  // namespace ferry::topo

#include "topo/topology.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <deque>
#include <fstream>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

namespace ferry::topo {
namespace fs = std::filesystem;

namespace {

constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint16_t kVendorAmazon = 0x1d0f;
// A CPU id past this is a corrupt cpulist, not a machine: refuse it rather
// than allocate for it.
constexpr int kMaxCpuId = 1 << 16;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename T>
std::optional<T> parse_number(std::string_view s, int base) {
  s = trim(s);
  if (base == 16 && s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.empty()) return std::nullopt;
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

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

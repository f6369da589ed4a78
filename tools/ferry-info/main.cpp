// ferry-info: what ferry sees on this machine. GPUs, NICs, NUMA nodes and
// cores from sysfs, the libfabric providers that answer, and the groups a
// topology-driven engine would build. `--json` is the same for scripts.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cuda_order.h"
#include "engine/provider_select.h"
#include "ferry/info.h"
#include "ferry/status.h"
#include "ferry/version.h"
#include "topo/topology.h"

namespace {

using ferry::topo::NicInfo;
using ferry::topo::NicKind;
using ferry::topo::Topology;
using ferry::topo::TopologyGroup;

// --- libfabric --------------------------------------------------------------------

const char* const kProviders[] = {"efa", "tcp;ofi_rxm", "shm", "verbs;ofi_rxm"};

struct FabricDomain {
  std::string name;
  std::string fabric;
  std::string provider;
  uint64_t link_speed_bps = 0;
  std::string pci;  // empty when the provider does not say
  bool hmem = false;
};

struct ProviderProbe {
  std::string provider;
  std::string error;  // fi_getinfo's answer when it found nothing
  std::vector<FabricDomain> domains;
};

// Asked the way the engine asks (ferry/info.h): the same family and, for
// libfabric, the same fi_getinfo hints and filters, so a listed NIC opens.
ProviderProbe probe(const std::string& prov) {
  const ferry::ProviderListing l = ferry::list_provider(prov);
  ProviderProbe out{prov, l.nics.empty() ? l.note : "", {}};
  for (const auto& n : l.nics)
    out.domains.push_back(
        FabricDomain{n.name, n.fabric, n.provider, n.link_speed_bps, n.pci_address, n.hmem});
  return out;
}

// --- what a topology-driven engine would build --------------------------------------

std::string provider_for(NicKind k) {
  switch (k) {
    case NicKind::kEfa:
      return "efa";
    case NicKind::kVerbs:
      return "verbs;ofi_rxm";
    case NicKind::kNetdev:
      return "tcp;ofi_rxm";
  }
  return "";
}

// GroupConfig::nic_names are libfabric domain names; sysfs names differ
// ("rdmap79s0" vs "rdmap79s0-rdm"), so match by PCI address, then by name.
std::string domain_for(const NicInfo& nic, const ProviderProbe* probe) {
  if (probe) {
    for (const auto& d : probe->domains) {
      if (nic.pci && d.pci == nic.pci->to_string()) return d.name;
    }
    for (const auto& d : probe->domains) {
      if (d.name == nic.name || d.name == nic.netdev || d.name.rfind(nic.name + "-", 0) == 0) {
        return d.name;
      }
    }
  }
  return nic.kind == NicKind::kEfa      ? nic.name + "-rdm"
         : nic.kind == NicKind::kNetdev ? nic.netdev
                                        : nic.name;
}

struct EngineView {
  std::string default_provider;
  std::string default_source;  // "FERRY_PROVIDER" or "built-in default"
  bool default_available = false;
  std::string auto_provider;  // what "auto" resolves to here; empty if nothing / not probed
  std::string auto_reason;    // its reason, or the error listing what was probed
  std::string suggested_provider;
  bool suggested_available = false;
  bool probed = false;
  struct Group {
    std::string device;
    std::vector<std::string> nic_names;
    int worker_cpu = -1;
    uint64_t link_speed_bps = 0;
    bool all_reported = true;  // every NIC found among the provider's domains
  };
  std::vector<Group> groups;
};

EngineView engine_view(const Topology& t, const std::vector<ProviderProbe>& probes, bool probed) {
  EngineView v;
  v.probed = probed;
  const char* env = std::getenv("FERRY_PROVIDER");
  v.default_provider = env && *env ? env : ferry::engine::kAutoProvider;
  v.default_source = env && *env ? "FERRY_PROVIDER" : "built-in default";
  if (probed && v.default_provider == ferry::engine::kAutoProvider) {
    const ferry::engine::ProviderChoice c = ferry::engine::resolve_auto_provider();
    v.auto_provider = c.provider;
    v.auto_reason = c.error.is_ok() ? c.reason : c.error.message();
    v.default_available = c.error.is_ok();
  }
  v.suggested_provider = provider_for(t.fabric_kind);
  const ProviderProbe* suggested = nullptr;
  for (const auto& p : probes) {
    if (p.provider == v.default_provider && !p.domains.empty()) v.default_available = true;
    if (p.provider == v.suggested_provider) suggested = &p;
  }
  v.suggested_available = suggested && !suggested->domains.empty();
  for (const auto& g : t.groups) {
    EngineView::Group eg;
    eg.device = g.gpu < 0 ? "host" : "cuda:" + std::to_string(g.gpu);
    eg.worker_cpu = g.cpus.empty() ? -1 : g.cpus.front();
    for (const auto& n : g.nics) {
      std::string d = domain_for(n, v.suggested_available ? suggested : nullptr);
      bool reported = false;
      if (suggested) {
        for (const auto& fd : suggested->domains) reported |= fd.name == d;
      }
      eg.all_reported &= reported;
      eg.nic_names.push_back(std::move(d));
      eg.link_speed_bps += n.link_speed_bps;
    }
    v.groups.push_back(std::move(eg));
  }
  return v;
}

// --- text output ------------------------------------------------------------------

std::string speed(uint64_t bps) {
  if (bps == 0) return "unknown";
  std::ostringstream s;
  if (bps % 1'000'000'000 == 0) {
    s << bps / 1'000'000'000 << " Gb/s";
  } else {
    s << static_cast<double>(bps) / 1e9 << " Gb/s";
  }
  return s.str();
}

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s.empty() ? "-" : s;
}

std::string hex16(uint16_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "%04x", v);
  return b;
}

// Columns padded to the widest cell, so the output lines up for any names.
class Table {
 public:
  explicit Table(std::vector<std::string> head) { rows_.push_back(std::move(head)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const {
    std::vector<size_t> w;
    for (const auto& r : rows_) {
      w.resize(std::max(w.size(), r.size()));
      for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    for (const auto& r : rows_) {
      std::string line = "  ";
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
      }
      os << line << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

void print_text(std::ostream& os, const std::string& root, const Topology& t,
                const std::vector<ProviderProbe>& probes, const EngineView& ev) {
  os << "ferry-info " << ferry::kVersion << " (sysfs root " << root << ")\n\n";

  os << "NUMA nodes (" << t.numa_nodes.size() << ")\n";
  Table numa({"node", "cpus", "physical cores (one CPU each)"});
  for (const auto& [id, n] : t.numa_nodes) {
    numa.add({std::to_string(id),
              ferry::topo::format_cpulist(n.cpus) + " (" + std::to_string(n.cpus.size()) + ")",
              ferry::topo::format_cpulist(n.cores) + " (" + std::to_string(n.cores.size()) + ")"});
  }
  numa.print(os);

  os << "\nGPUs (" << t.gpus.size() << ")\n";
  if (t.gpus.empty()) {
    os << "  none\n";
  } else {
    Table gpus({"ordinal", "pci", "device", "numa", "switch"});
    for (const auto& g : t.gpus) {
      gpus.add({g.ordinal < 0 ? "hidden" : std::to_string(g.ordinal), g.pci.to_string(),
                "10de:" + hex16(g.device_id), std::to_string(g.numa), g.branch});
    }
    gpus.print(os);
  }

  os << "\nNICs (" << t.nics.size() << "; groups use " << ferry::topo::nic_kind_name(t.fabric_kind)
     << ")\n";
  if (t.nics.empty()) {
    os << "  none\n";
  } else {
    Table nics({"name", "kind", "pci", "id", "numa", "link", "netdev", "switch"});
    for (const auto& n : t.nics) {
      nics.add({n.name, std::string(ferry::topo::nic_kind_name(n.kind)),
                n.pci ? n.pci->to_string() : "-", hex16(n.vendor_id) + ":" + hex16(n.device_id),
                std::to_string(n.numa), speed(n.link_speed_bps), n.netdev.empty() ? "-" : n.netdev,
                n.branch});
    }
    nics.print(os);
  }

  os << "\nproviders, as the engine opens them (ferry/info.h)\n";
  if (probes.empty()) os << "  not probed (--no-fabric)\n";
  for (const auto& p : probes) {
    if (p.domains.empty()) {
      os << "  " << p.provider << ": none (" << p.error << ")\n";
      continue;
    }
    os << "  " << p.provider << ": " << p.domains.size() << " domain"
       << (p.domains.size() == 1 ? "" : "s") << "\n";
    Table doms({"  domain", "fabric", "link", "pci", "hmem"});
    for (const auto& d : p.domains) {
      doms.add({"  " + d.name, d.fabric, speed(d.link_speed_bps), d.pci.empty() ? "-" : d.pci,
                d.hmem ? "yes" : "no"});
    }
    doms.print(os);
  }

  os << "\nGroups\n";
  // Lists last: a host group of 16 EFAs would otherwise stretch every row.
  Table groups({"group", "numa", "cpus", "link total", "nics from", "nics"});
  for (const auto& g : t.groups) {
    std::vector<std::string> names;
    uint64_t total = 0;
    for (const auto& n : g.nics) {
      names.push_back(n.name);
      total += n.link_speed_bps;
    }
    groups.add({g.gpu < 0 ? "host" : "gpu " + std::to_string(g.gpu), std::to_string(g.numa),
                g.cpus.empty() ? "-" : ferry::topo::format_cpulist(g.cpus), speed(total),
                std::string(ferry::topo::nic_locality_name(g.locality)), join(names)});
  }
  groups.print(os);

  os << "\nDefault engine\n";
  os << "  EngineConfig provider: " << ev.default_provider << " (" << ev.default_source << ")";
  if (ev.probed && !ev.auto_reason.empty()) {
    os << (ev.default_available ? " -> " + ev.auto_provider : ", NOT available here") << " ("
       << ev.auto_reason << ")";
  } else if (ev.probed) {
    os << (ev.default_available ? ", available" : ", NOT available here");
  }
  os << "\n  topology suggests:     " << ev.suggested_provider;
  if (ev.probed) os << (ev.suggested_available ? ", available" : ", NOT available here");
  os << "\n";
  Table cfg({"device", "worker_cpu", "link total", "nic_names"});
  for (const auto& g : ev.groups) {
    cfg.add({g.device, std::to_string(g.worker_cpu), speed(g.link_speed_bps),
             join(g.nic_names) +
                 (ev.probed && !g.all_reported ? " (not all reported by the provider)" : "")});
  }
  cfg.print(os);

  if (!t.warnings.empty()) {
    os << "\nWarnings (" << t.warnings.size() << ")\n";
    for (const auto& w : t.warnings) os << "  " << w << "\n";
  }
}

// --- JSON -------------------------------------------------------------------------

std::string quote(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char b[16];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          o += b;
        } else {
          o += static_cast<char>(c);  // UTF-8 passes through; sysfs names are ASCII
        }
    }
  }
  return o + "\"";
}

// Minimal writer: values are appended in order, commas handled here.
class Json {
 public:
  Json& begin_obj() { return open('{'); }
  Json& end_obj() { return close('}'); }
  Json& begin_arr() { return open('['); }
  Json& end_arr() { return close(']'); }
  Json& key(std::string_view k) {
    comma();
    s_ += quote(k) + ":";
    after_key_ = true;
    return *this;
  }
  Json& str(std::string_view v) { return raw(quote(v)); }
  Json& num(int64_t v) { return raw(std::to_string(v)); }
  Json& unum(uint64_t v) { return raw(std::to_string(v)); }
  Json& boolean(bool v) { return raw(v ? "true" : "false"); }
  Json& null() { return raw("null"); }
  Json& ints(const std::vector<int>& v) {
    begin_arr();
    for (int x : v) num(x);
    return end_arr();
  }
  Json& strs(const std::vector<std::string>& v) {
    begin_arr();
    for (const auto& x : v) str(x);
    return end_arr();
  }
  const std::string& text() const { return s_; }

 private:
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty() && !first_.back()) s_ += ",";
    if (!first_.empty()) first_.back() = false;
  }
  Json& raw(const std::string& v) {
    comma();
    s_ += v;
    return *this;
  }
  Json& open(char c) {
    comma();
    s_ += c;
    first_.push_back(true);
    return *this;
  }
  Json& close(char c) {
    first_.pop_back();
    s_ += c;
    return *this;
  }
  std::string s_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

std::string to_json(const std::string& root, const Topology& t,
                    const std::vector<ProviderProbe>& probes, const EngineView& ev) {
  Json j;
  j.begin_obj();
  j.key("version").str(ferry::kVersion);
  j.key("sysfs_root").str(root);
  j.key("numa_nodes").begin_arr();
  for (const auto& [id, n] : t.numa_nodes) {
    j.begin_obj().key("id").num(id).key("cpus").ints(n.cpus).key("cores").ints(n.cores).end_obj();
  }
  j.end_arr();
  j.key("gpus").begin_arr();
  for (const auto& g : t.gpus) {
    j.begin_obj().key("ordinal").num(g.ordinal).key("pci").str(g.pci.to_string());
    j.key("device_id").str("0x" + hex16(g.device_id)).key("numa").num(g.numa);
    j.key("switch").str(g.branch).end_obj();
  }
  j.end_arr();
  j.key("fabric_kind").str(ferry::topo::nic_kind_name(t.fabric_kind));
  j.key("nics").begin_arr();
  for (const auto& n : t.nics) {
    j.begin_obj().key("name").str(n.name).key("kind").str(ferry::topo::nic_kind_name(n.kind));
    j.key("pci");
    n.pci ? j.str(n.pci->to_string()) : j.null();
    j.key("vendor_id")
        .str("0x" + hex16(n.vendor_id))
        .key("device_id")
        .str("0x" + hex16(n.device_id));
    j.key("numa").num(n.numa).key("link_speed_bps").unum(n.link_speed_bps);
    j.key("netdev").str(n.netdev).key("switch").str(n.branch).end_obj();
  }
  j.end_arr();
  j.key("groups").begin_arr();
  for (const auto& g : t.groups) {
    std::vector<std::string> names;
    for (const auto& n : g.nics) names.push_back(n.name);
    j.begin_obj().key("gpu").num(g.gpu).key("numa").num(g.numa);
    j.key("locality").str(ferry::topo::nic_locality_name(g.locality));
    j.key("nics").strs(names).key("cpus").ints(g.cpus).end_obj();
  }
  j.end_arr();
  j.key("providers").begin_arr();
  for (const auto& p : probes) {
    j.begin_obj()
        .key("provider")
        .str(p.provider)
        .key("error")
        .str(p.error)
        .key("domains")
        .begin_arr();
    for (const auto& d : p.domains) {
      j.begin_obj()
          .key("name")
          .str(d.name)
          .key("fabric")
          .str(d.fabric)
          .key("provider")
          .str(d.provider);
      j.key("link_speed_bps").unum(d.link_speed_bps).key("pci");
      d.pci.empty() ? j.null() : j.str(d.pci);
      j.key("hmem").boolean(d.hmem).end_obj();
    }
    j.end_arr().end_obj();
  }
  j.end_arr();
  j.key("engine").begin_obj();
  j.key("default_provider").str(ev.default_provider).key("default_source").str(ev.default_source);
  j.key("probed").boolean(ev.probed);
  j.key("default_available").boolean(ev.default_available);
  j.key("auto_provider").str(ev.auto_provider).key("auto_reason").str(ev.auto_reason);
  j.key("suggested_provider").str(ev.suggested_provider);
  j.key("suggested_available").boolean(ev.suggested_available);
  j.key("groups").begin_arr();
  for (const auto& g : ev.groups) {
    j.begin_obj().key("device").str(g.device).key("nic_names").strs(g.nic_names);
    j.key("worker_cpu").num(g.worker_cpu).key("link_speed_bps").unum(g.link_speed_bps);
    j.key("all_reported").boolean(g.all_reported).end_obj();
  }
  j.end_arr().end_obj();
  j.key("warnings").strs(t.warnings);
  j.end_obj();
  return j.text() + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-info: GPU/NIC/NUMA/CPU map, libfabric providers and default engine groups"};
  bool json = false;
  bool no_fabric = false;
  std::string root = "/";
  std::vector<std::string> providers(std::begin(kProviders), std::end(kProviders));
  app.add_flag("--json", json, "print JSON for tools");
  app.add_option("--sysfs-root", root, "read <root>/sys instead of /sys (fixtures)")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--no-fabric", no_fabric, "skip the libfabric probe (e.g. with a fixture root)");
  app.add_option("--provider", providers, "libfabric providers to probe (repeatable)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  Topology topo;
  try {
    topo = ferry::topo::detect({root});
  } catch (const ferry::Error& e) {
    std::cerr << "ferry-info: " << e.what() << "\n";
    return 1;
  }
  // GPUs as this process's CUDA numbers them (CUDA_VISIBLE_DEVICES), as an
  // engine started here would see them.
  const auto applied = ferry::engine::apply_cuda_order(topo, root);
  if (!applied.note.empty()) std::cerr << "ferry-info: GPU numbering: " << applied.note << "\n";
  std::vector<ProviderProbe> probes;
  if (!no_fabric) {
    for (const auto& p : providers) probes.push_back(probe(p));
  }
  const EngineView ev = engine_view(topo, probes, !no_fabric);
  if (json) {
    std::cout << to_json(root, topo, probes, ev);
  } else {
    print_text(std::cout, root, topo, probes, ev);
  }
  return 0;
}

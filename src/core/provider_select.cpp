#include "core/provider_select.h"

#include <fmt/format.h>

namespace ferry::core {

namespace {

constexpr const char* kAmazonVendor = "0x1d0f";

std::string link_name(const std::string& link_layer) {
  if (link_layer == "Ethernet") return "Ethernet (RoCE)";
  if (link_layer.empty()) return "link layer unknown";
  return link_layer;
}

// Why a device does not select "verbs"; empty when it would.
std::string passed_over(const RdmaDevice& d) {
  if (is_efa_device(d)) {
    return fmt::format("{}: EFA (driver {}), served by libfabric 'efa'", d.name,
                       d.driver.empty() ? "?" : d.driver);
  }
  if (d.ports.empty()) return fmt::format("{}: no ports", d.name);
  std::string states;
  for (const auto& p : d.ports) {
    if (p.active()) return {};
    states += fmt::format("{}port {} {}", states.empty() ? "" : ", ", p.number,
                          p.state.empty() ? "state unknown" : p.state);
  }
  return fmt::format("{}: no ACTIVE port ({})", d.name, states);
}

std::string device_summary(const std::vector<RdmaDevice>& devices, const std::string& note) {
  std::string out;
  for (const auto& d : devices) {
    const std::string why = passed_over(d);
    out += (out.empty() ? "" : "; ") + (why.empty() ? d.name : why);
  }
  if (out.empty()) return note.empty() ? "no devices" : note;
  return note.empty() ? out : fmt::format("{} ({})", out, note);
}

}  // namespace

bool is_efa_device(const RdmaDevice& d) {
  return d.driver == "efa" || d.vendor == kAmazonVendor;
}

std::optional<ProviderChoice> choose_verbs(const std::vector<RdmaDevice>& devices) {
  for (const auto& d : devices) {
    if (is_efa_device(d)) continue;
    for (const auto& p : d.ports) {
      if (!p.active()) continue;
      ProviderChoice c;
      c.provider = "verbs";
      c.reason = fmt::format("{} port {} ACTIVE, {}{}", d.name, p.number, link_name(p.link_layer),
                             d.driver.empty() ? "" : ", driver " + d.driver);
      return c;
    }
  }
  return std::nullopt;
}

ProviderChoice choose_provider(const ProviderProbe& probe) {
  if (auto v = choose_verbs(probe.verbs_devices)) return *v;
  const std::string verbs = device_summary(probe.verbs_devices, probe.verbs_note);
  const std::string efa = probe.efa_note.empty() ? "fi_getinfo(efa) not run" : probe.efa_note;
  ProviderChoice c;
  if (probe.efa.value_or(false)) {
    c.provider = "efa";
    c.reason = fmt::format("{}; no verbs device qualifies (libibverbs: {})", efa, verbs);
    return c;
  }
  c.error = Status(Code::kUnavailable,
                   fmt::format("provider auto: no RDMA provider on this host: libibverbs: {}; "
                               "libfabric: {}. Name a provider in EngineConfig::provider or "
                               "FERRY_PROVIDER (e.g. \"tcp;ofi_rxm\" for TCP)",
                               verbs, efa));
  return c;
}

ProviderChoice resolve_provider(const ProviderProbes& probes) {
  ProviderProbe p;
  if (probes.verbs) p.verbs_devices = probes.verbs(&p.verbs_note);
  if (!choose_verbs(p.verbs_devices) && probes.efa) p.efa = probes.efa(&p.efa_note);
  return choose_provider(p);
}

}  // namespace ferry::core

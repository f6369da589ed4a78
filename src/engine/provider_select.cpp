#include "engine/provider_select.h"

#include <fmt/format.h>

#include <optional>

namespace ferry::engine {

namespace {

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

std::string verbs_attempt(const ProviderChoice& failed, const Status& open_error) {
  return fmt::format("provider auto: verbs ({}) failed to open: {}", failed.reason,
                     open_error.message());
}

}  // namespace

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

ProviderChoice fallback_after_open_failure(const ProviderChoice& failed, const Status& open_error,
                                           std::optional<bool> efa, const std::string& efa_note) {
  ProviderChoice c;
  if (failed.provider != "verbs") {
    c.error = open_error;
    return c;
  }
  const std::string note = efa_note.empty() ? "fi_getinfo(efa) not run" : efa_note;
  if (efa.value_or(false)) {
    c.provider = "efa";
    c.reason = fmt::format("fallback after verbs failed to open; {}", note);
    return c;
  }
  // Code kOk would make the Status read as success.
  const Code code = open_error.is_ok() ? Code::kUnavailable : open_error.code();
  c.error = Status(
      code, fmt::format("{}; no efa to fall back to: {}", verbs_attempt(failed, open_error), note));
  return c;
}

AutoOpen open_auto_provider(const ProviderChoice& choice, const ProviderProbes& probes,
                            const std::function<Status(const std::string& provider)>& open,
                            const std::function<void(const std::string&)>& warn) {
  AutoOpen r;
  if (!choice.error.is_ok()) {
    r.error = choice.error;
    return r;
  }
  const Status first = open(choice.provider);
  if (first.is_ok()) {
    r.provider = choice.provider;
    return r;
  }
  if (choice.provider != "verbs") {
    r.error = first;
    return r;
  }
  warn(verbs_attempt(choice, first));
  std::string efa_note;
  std::optional<bool> efa;
  if (probes.efa) efa = probes.efa(&efa_note);
  const ProviderChoice next = fallback_after_open_failure(choice, first, efa, efa_note);
  if (!next.error.is_ok()) {
    r.error = next.error;
    return r;
  }
  warn(fmt::format("provider auto -> {} ({})", next.provider, next.reason));
  const Status second = open(next.provider);
  if (second.is_ok()) {
    r.provider = next.provider;
    return r;
  }
  r.error = Status(first.code(),
                   fmt::format("{}; then {} ({}) failed to open: {}", verbs_attempt(choice, first),
                               next.provider, next.reason, second.message()));
  return r;
}

}  // namespace ferry::engine

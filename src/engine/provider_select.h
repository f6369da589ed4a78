// Provider "auto": which Domain family an engine opens when the user named
// none. The decision is a pure function of what was probed (RDMA devices as
// libibverbs lists them, described from sysfs; whether libfabric reports
// efa), so it is tested on fixtures without a NIC. The probes themselves
// live with their families (verbs/verbs_devinfo, fabric/fabric_devinfo) and
// are wired together by engine::resolve_auto_provider (provider_probe.cpp).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "verbs/rdma_device.h"

namespace ferry::engine {

inline constexpr const char* kAutoProvider = "auto";

using verbs::is_efa_device;
using verbs::RdmaDevice;
using verbs::RdmaPort;

// What the auto probe found. `efa` is unset when it was not probed (a verbs
// device was chosen first).
struct ProviderProbe {
  std::vector<RdmaDevice> verbs_devices;
  std::string verbs_note;  // e.g. "libibverbs listed 0 devices", or a failure
  std::optional<bool> efa;
  std::string efa_note;  // e.g. "fi_getinfo(efa): 2 domains", "fi_getinfo(efa): no domain"
};

struct ProviderChoice {
  std::string provider;  // "verbs" or "efa"; empty when `error` is set
  std::string reason;    // "mlx5_0 port 1 ACTIVE, Ethernet (RoCE), driver mlx5_core"
  Status error;          // kUnavailable, listing everything probed
};

// The first device (libibverbs order) that is not EFA and has an ACTIVE
// port, as a "verbs" choice; nullopt when none qualifies.
std::optional<ProviderChoice> choose_verbs(const std::vector<RdmaDevice>& devices);

// The decision: "verbs" when choose_verbs finds a device, else "efa" when
// libfabric reports it, else kUnavailable naming every device and why it
// was passed over.
ProviderChoice choose_provider(const ProviderProbe& probe);

// The probes, injectable for tests.
struct ProviderProbes {
  // libibverbs' device list described from sysfs; sets *note.
  std::function<std::vector<RdmaDevice>(std::string* note)> verbs;
  // fi_getinfo reports the efa provider; sets *note.
  std::function<bool(std::string* note)> efa;
};

// Runs the verbs probe, and the efa probe only when no verbs device
// qualifies; then choose_provider.
ProviderChoice resolve_provider(const ProviderProbes& probes);

// Listing a device says nothing about whether it opens (memlock limit,
// permissions on /dev/infiniband/uverbs*, a bad GID index), so a "verbs"
// choice whose domains fail to open gets a second chance on "efa". The
// decision: "efa" when `efa` (the probe, run only now: it was skipped while
// verbs qualified) reports it, its reason saying it is a fallback; else an
// error with the verbs failure's code naming the verbs attempt and the efa
// probe's answer. A choice other than "verbs" has no fallback: its
// open_error comes back as it is.
ProviderChoice fallback_after_open_failure(const ProviderChoice& failed, const Status& open_error,
                                           std::optional<bool> efa, const std::string& efa_note);

struct AutoOpen {
  std::string provider;  // what opened; empty when `error` is set
  Status error;          // names every attempt when a fallback ran and failed too
};

// Opens the "auto" choice with `open` (which starts every group's domains
// for one provider and leaves nothing open when it fails) and, when a
// "verbs" choice fails, falls back as fallback_after_open_failure decides.
// The efa probe runs only then. `warn` hears the verbs failure and the
// fallback; when the fallback fails too, the returned error names both
// attempts (the caller throws it, so it is not logged twice).
AutoOpen open_auto_provider(const ProviderChoice& choice, const ProviderProbes& probes,
                            const std::function<Status(const std::string& provider)>& open,
                            const std::function<void(const std::string&)>& warn);

// The probes of this host: libibverbs' devices described from the sysfs tree
// at sysfs_root; fi_getinfo for efa. In their own translation unit
// (provider_probe.cpp): they pull in both NIC families.
ProviderProbes host_provider_probes(const std::string& sysfs_root = "/sys/class/infiniband");

// Provider "auto" on this host: resolve_provider(host_provider_probes()).
ProviderChoice resolve_auto_provider(const std::string& sysfs_root = "/sys/class/infiniband");

}  // namespace ferry::engine

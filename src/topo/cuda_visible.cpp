#include "topo/cuda_visible.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string_view>
#include <system_error>

#include "topo/text.h"

namespace ferry::topo {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

bool iequal_prefix(std::string_view prefix, std::string_view s) {
  if (prefix.size() > s.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(prefix[i])) !=
        std::tolower(static_cast<unsigned char>(s[i])))
      return false;
  return true;
}

// The GPU whose UUID starts with `entry` (with or without "GPU-"): one, or
// none when no UUID or several match.
std::optional<PciAddr> by_uuid(std::string_view entry,
                               const std::map<PciAddr, std::string>& uuids) {
  std::optional<PciAddr> found;
  for (const auto& [pci, uuid] : uuids) {
    std::string_view u = uuid;
    const bool match =
        iequal_prefix(entry, u) || (iequal_prefix("GPU-", u) && iequal_prefix(entry, u.substr(4)));
    if (!match) continue;
    if (found) return std::nullopt;  // ambiguous: the runtime refuses it too
    found = pci;
  }
  return found;
}

// Could name a GPU by UUID: a hex digit, then hex digits and dashes, "GPU-"
// before them or not.
bool uuid_like(std::string_view entry) {
  if (iequal_prefix("GPU-", entry)) entry.remove_prefix(4);
  return !entry.empty() && std::isxdigit(static_cast<unsigned char>(entry.front())) != 0 &&
         std::all_of(entry.begin(), entry.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == '-';
         });
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == s.npos) return out;
    s.remove_prefix(at + 1);
  }
}

}  // namespace

CudaEnv CudaEnv::of_process() {
  return {env("CUDA_VISIBLE_DEVICES"), env("CUDA_DEVICE_ORDER")};
}

CudaOrder cuda_order_from_env(const Topology& topo, const CudaEnv& e,
                              const std::map<PciAddr, std::string>& uuids) {
  CudaOrder out;
  std::vector<PciAddr> by_pci;
  for (const auto& g : topo.gpus) by_pci.push_back(g.pci);
  std::sort(by_pci.begin(), by_pci.end());
  const bool pci_order = e.device_order && text::trim(*e.device_order) == "PCI_BUS_ID";
  const bool one_model = std::all_of(topo.gpus.begin(), topo.gpus.end(), [&](const GpuInfo& g) {
    return g.device_id == topo.gpus.front().device_id;
  });
  // Where the runtime orders by speed among different models, its device i
  // is not sysfs's: indices cannot be mapped (UUIDs still can).
  const bool indices_known = pci_order || one_model;
  const char* unknown_order =
      "CUDA_DEVICE_ORDER is FASTEST_FIRST on a machine with GPUs of different models: CUDA's "
      "order is not sysfs's (set CUDA_DEVICE_ORDER=PCI_BUS_ID)";
  if (!e.visible_devices) {
    if (indices_known)
      out.order = std::move(by_pci);
    else
      out.note = unknown_order;
    return out;
  }
  std::vector<PciAddr> order;
  std::set<PciAddr> seen;
  const std::string_view list = text::trim(*e.visible_devices);
  if (list.empty()) {
    out.order = std::move(order);  // every GPU hidden
    return out;
  }
  for (std::string_view entry : split(list, ',')) {
    entry = text::trim(entry);
    std::optional<PciAddr> gpu;
    std::string why;
    if (!entry.empty() && std::all_of(entry.begin(), entry.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) != 0;
        })) {
      if (!indices_known) {
        out.note = unknown_order;
        return out;
      }
      const auto i = text::parse_number<size_t>(entry, 10);
      if (i && *i < by_pci.size())
        gpu = by_pci[*i];
      else
        why = "no such device";
    } else if (iequal_prefix("MIG-", entry)) {
      out.note = "CUDA_VISIBLE_DEVICES names a MIG instance: not mapped to a GPU here";
      return out;
    } else if (uuid_like(entry)) {
      if (uuids.empty()) {
        out.note =
            "CUDA_VISIBLE_DEVICES names GPUs by UUID and the driver's GPU list "
            "(/proc/driver/nvidia/gpus) is unreadable";
        return out;
      }
      gpu = by_uuid(entry, uuids);
      if (!gpu) why = "no single GPU has this UUID";
    } else {
      why = entry.empty() ? "empty entry" : "neither an index nor a UUID";
    }
    if (gpu && !seen.insert(*gpu).second) {
      gpu.reset();
      why = "listed before";
    }
    if (!gpu) {
      // The runtime stops here as well: the devices before this entry.
      out.note = "CUDA_VISIBLE_DEVICES entry '" + std::string(entry) + "' (" + why +
                 ") ends the list there, as CUDA ends it";
      break;
    }
    order.push_back(*gpu);
  }
  out.order = std::move(order);
  return out;
}

std::map<PciAddr, std::string> read_gpu_uuids(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  std::map<PciAddr, std::string> out;
  std::error_code ec;
  const fs::path dir = root / "proc/driver/nvidia/gpus";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto pci = PciAddr::parse(it->path().filename().string());
    if (!pci) continue;
    std::ifstream in(it->path() / "information");
    for (std::string line; std::getline(in, line);) {
      std::string_view l = line;
      if (!l.starts_with("GPU UUID:")) continue;
      const std::string_view uuid = text::trim(l.substr(9));
      if (!uuid.empty()) out[*pci] = std::string(uuid);
      break;
    }
  }
  return out;
}

}  // namespace ferry::topo

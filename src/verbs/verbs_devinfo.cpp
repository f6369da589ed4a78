#include "verbs/verbs_devinfo.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/log.h"
#include "verbs/verbs_domain.h"
#include "verbs/verbs_handles.h"

namespace ferry::verbs {

namespace {

std::optional<std::string> read_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!f || !std::getline(f, s)) return std::nullopt;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_zero(const Gid& g) {
  return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == 0; });
}
bool is_v4_mapped(const Gid& g) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.data(), kPrefix, sizeof(kPrefix)) == 0;
}
bool is_link_local(const Gid& g) {
  return g[0] == 0xfe && (g[1] & 0xc0) == 0x80;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < lo || n > hi) {
    core::log().warn("ferry verbs: ignoring {}='{}' (expected an integer {}..{})", name, v, lo, hi);
    return -1;
  }
  return static_cast<int>(n);
}

}  // namespace

std::optional<Gid> parse_gid(std::string_view text) {
  Gid g{};
  size_t nibble = 0;
  for (char c : text) {
    if (c == ':') continue;
    const int d = hex_digit(c);
    if (d < 0 || nibble >= 32) return std::nullopt;
    g[nibble / 2] = static_cast<uint8_t>(g[nibble / 2] | (nibble % 2 == 0 ? d << 4 : d));
    ++nibble;
  }
  if (nibble != 32) return std::nullopt;
  return g;
}

GidEntry::Type parse_gid_type(std::string_view text) {
  if (text == "RoCE v2") return GidEntry::Type::kRoceV2;
  if (text == "IB/RoCE v1") return GidEntry::Type::kRoceV1;
  if (text == "IB") return GidEntry::Type::kIb;
  return GidEntry::Type::kUnknown;
}

uint64_t parse_rate_bps(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double gbps = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(gbps > 0) || gbps > 1e6) return 0;
  return static_cast<uint64_t>(gbps * 1e9);
}

uint64_t read_link_speed_bps(const std::string& root, const std::string& dev, int port) {
  const auto line =
      read_line(std::filesystem::path(root) / dev / "ports" / std::to_string(port) / "rate");
  return line ? parse_rate_bps(*line) : 0;
}

std::vector<GidEntry> read_gid_table(const std::string& root, const std::string& dev, int port) {
  namespace fs = std::filesystem;
  std::vector<GidEntry> out;
  const fs::path port_dir = fs::path(root) / dev / "ports" / std::to_string(port);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(port_dir / "gids", ec)) {
    const std::string name = e.path().filename().string();
    char* end = nullptr;
    const long idx = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0' || idx < 0 || idx > 0xFFFF) continue;
    const auto text = read_line(e.path());
    if (!text) continue;
    const auto gid = parse_gid(*text);
    if (!gid || is_zero(*gid)) continue;
    GidEntry g;
    g.index = static_cast<int>(idx);
    g.gid = *gid;
    // Reading the type of an unpopulated entry fails with EINVAL.
    const auto type = read_line(port_dir / "gid_attrs" / "types" / name);
    if (!type) continue;
    g.type = parse_gid_type(*type);
    g.ndev = read_line(port_dir / "gid_attrs" / "ndevs" / name).value_or("");
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(),
            [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
  return out;
}

Gid ipv4_mapped_gid(uint32_t ipv4_host_order) {
  Gid g{};
  g[10] = 0xff;
  g[11] = 0xff;
  g[12] = static_cast<uint8_t>(ipv4_host_order >> 24);
  g[13] = static_cast<uint8_t>(ipv4_host_order >> 16);
  g[14] = static_cast<uint8_t>(ipv4_host_order >> 8);
  g[15] = static_cast<uint8_t>(ipv4_host_order);
  return g;
}

std::vector<Gid> netdev_gids(const std::string& ifname) {
  std::vector<Gid> out;
  ifaddrs* list = nullptr;
  if (ifname.empty() || getifaddrs(&list) != 0) return out;
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, freeifaddrs);
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || ifname != a->ifa_name) continue;
    if (a->ifa_addr->sa_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      out.push_back(ipv4_mapped_gid(ntohl(sin->sin_addr.s_addr)));
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      Gid g;
      std::memcpy(g.data(), &sin6->sin6_addr, g.size());
      out.push_back(g);
    }
  }
  return out;
}

int choose_gid_index(std::span<const GidEntry> table, std::span<const Gid> netdev_ips,
                     bool ethernet, int override_index, std::string* why) {
  const auto set_why = [why](std::string s) {
    if (why != nullptr) *why = std::move(s);
  };
  if (override_index >= 0) {
    for (const auto& e : table) {
      if (e.index == override_index) return e.index;
    }
    set_why(fmt::format("FERRY_VERBS_GID_INDEX={} names no populated GID entry", override_index));
    return -1;
  }
  if (table.empty()) {
    set_why("the port's GID table is empty");
    return -1;
  }
  if (!ethernet) {
    for (const auto& e : table) {
      if (e.index == 0) return 0;
    }
    return table.front().index;
  }
  const auto has_ip = [&](const Gid& g) {
    return std::find(netdev_ips.begin(), netdev_ips.end(), g) != netdev_ips.end();
  };
  // Ranked passes; the first entry (lowest index) of the best pass wins.
  const auto roce2 = [](const GidEntry& e) { return e.type == GidEntry::Type::kRoceV2; };
  const std::function<bool(const GidEntry&)> passes[] = {
      [&](const GidEntry& e) { return roce2(e) && is_v4_mapped(e.gid) && has_ip(e.gid); },
      [&](const GidEntry& e) { return roce2(e) && !is_link_local(e.gid) && has_ip(e.gid); },
      [&](const GidEntry& e) { return roce2(e) && is_v4_mapped(e.gid); },
      [&](const GidEntry& e) { return roce2(e) && !is_link_local(e.gid); },
      [&](const GidEntry& e) { return roce2(e); },
  };
  for (const auto& pass : passes) {
    for (const auto& e : table) {
      if (pass(e)) return e.index;
    }
  }
  return table.front().index;
}

GidChoice choose_gid(const std::string& nic, int port, std::span<const GidEntry> table,
                     std::span<const Gid> netdev_ips, bool ethernet, int option_index,
                     int env_index) {
  GidChoice c;
  const int explicit_index = option_index >= 0 ? option_index : env_index;
  if (explicit_index >= 0) {
    c.source = option_index >= 0 ? "EngineConfig::verbs_gid_index" : "FERRY_VERBS_GID_INDEX";
    for (const auto& e : table) {
      if (e.index != explicit_index) continue;
      c.index = e.index;
      return c;
    }
    std::string populated;
    for (const auto& e : table) {
      populated += fmt::format("{}{}", populated.empty() ? "" : ", ", e.index);
    }
    c.error = Status(Code::kInvalidArgument,
                     fmt::format("verbs NIC '{}' port {}: GID index {} ({}) names no populated "
                                 "GID entry (populated: {})",
                                 nic, port, explicit_index, c.source,
                                 populated.empty() ? "none readable in sysfs" : populated));
    return c;
  }
  c.source = "automatic";
  std::string why;
  c.index = choose_gid_index(table, netdev_ips, ethernet, -1, &why);
  if (c.index >= 0) return c;
  if (!ethernet) {
    c.index = 0;  // InfiniBand without a readable sysfs table: the port GID
    return c;
  }
  c.error = Status(Code::kFailedPrecondition,
                   fmt::format("verbs NIC '{}' port {}: no usable GID: {}", nic, port, why));
  return c;
}

int env_gid_index() {
  return env_int("FERRY_VERBS_GID_INDEX", 0, 0xFFFF);
}
int env_port() {
  return env_int("FERRY_VERBS_PORT", 1, 255);
}

std::string strip_enum_number(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon != std::string_view::npos && colon > 0 &&
      std::all_of(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(colon),
                  [](char c) { return c >= '0' && c <= '9'; })) {
    text.remove_prefix(colon + 1);
  }
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  return std::string(text);
}

RdmaDevice read_rdma_device(const std::string& root, const std::string& dev) {
  namespace fs = std::filesystem;
  RdmaDevice d;
  d.name = dev;
  const fs::path dir = fs::path(root) / dev;
  d.node_type = strip_enum_number(read_line(dir / "node_type").value_or(""));
  d.vendor = read_line(dir / "device" / "vendor").value_or("");
  std::error_code ec;
  const fs::path driver = fs::read_symlink(dir / "device" / "driver", ec);
  if (!ec) d.driver = driver.filename().string();
  for (const auto& e : fs::directory_iterator(dir / "ports", ec)) {
    const std::string name = e.path().filename().string();
    char* end = nullptr;
    const long n = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0' || n < 1 || n > 255) continue;
    RdmaPort p;
    p.number = static_cast<int>(n);
    p.state = strip_enum_number(read_line(e.path() / "state").value_or(""));
    p.link_layer = read_line(e.path() / "link_layer").value_or("");
    d.ports.push_back(std::move(p));
  }
  std::sort(d.ports.begin(), d.ports.end(),
            [](const RdmaPort& a, const RdmaPort& b) { return a.number < b.number; });
  return d;
}

std::vector<std::string> ibv_device_names(std::string* note) {
  std::vector<std::string> out;
  int n = 0;
  errno = 0;
  DeviceListPtr list(ibv_get_device_list(&n));
  if (!list) {
    *note = fmt::format("no devices (ibv_get_device_list failed: {})",
                        std::strerror(errno != 0 ? errno : ENODEV));
    return out;
  }
  for (int i = 0; i < n; ++i) out.emplace_back(ibv_get_device_name(list.get()[i]));
  if (out.empty()) *note = "ibv_get_device_list returned 0 devices";
  return out;
}

std::vector<RdmaDevice> describe_rdma_devices(const std::string& root,
                                              const std::vector<std::string>& names) {
  std::vector<RdmaDevice> out;
  out.reserve(names.size());
  for (const auto& n : names) out.push_back(read_rdma_device(root, n));
  return out;
}

std::vector<RdmaDevice> probe_verbs_devices(const std::string& sysfs_root, std::string* note) {
  return describe_rdma_devices(sysfs_root, ibv_device_names(note));
}

std::vector<VerbsNicInfo> list_verbs_nics() {
  std::vector<VerbsNicInfo> out;
  int n = 0;
  DeviceListPtr list(ibv_get_device_list(&n));
  if (!list) return out;
  for (int i = 0; i < n; ++i) {
    ibv_device* dev = list.get()[i];
    ContextPtr ctx(ibv_open_device(dev));
    if (!ctx) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx.get(), &attr) != 0) continue;
    const int forced = env_port();
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      if (forced > 0 && p != forced) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(ctx.get(), static_cast<uint8_t>(p), &pa) != 0) continue;
      if (pa.state != IBV_PORT_ACTIVE && forced < 0) continue;
      VerbsNicInfo nic;
      nic.name = ibv_get_device_name(dev);
      nic.port = p;
      nic.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      nic.link_speed_bps = read_link_speed_bps(kSysfsInfiniband, nic.name, p);
      out.push_back(std::move(nic));
      break;
    }
  }
  return out;
}

}  // namespace ferry::verbs

// RDMA device discovery and port / GID selection. The sysfs parsing and the
// GID choice are pure functions of their inputs (a sysfs root can be a test
// fixture), so they are tested without a NIC.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "verbs/rdma_device.h"

namespace ferry::verbs {

using Gid = std::array<uint8_t, 16>;

inline constexpr const char* kSysfsInfiniband = "/sys/class/infiniband";

struct GidEntry {
  enum class Type : uint8_t { kUnknown, kIb, kRoceV1, kRoceV2 };
  int index = 0;
  Type type = Type::kUnknown;
  Gid gid{};
  std::string ndev;  // gid_attrs/ndevs/<i>: the netdev the GID belongs to (RoCE)
};

// Reads <root>/<dev>/ports/<port>/{gids,gid_attrs/types,gid_attrs/ndevs}.
// Unpopulated entries (all-zero GID, unreadable type) are skipped.
std::vector<GidEntry> read_gid_table(const std::string& root, const std::string& dev, int port);

// "fe80:0000:0000:0000:0e42:a1ff:fe5b:1234" -> bytes.
std::optional<Gid> parse_gid(std::string_view text);
// gid_attrs/types/<i>: "RoCE v2", "IB/RoCE v1".
GidEntry::Type parse_gid_type(std::string_view text);
// ports/<p>/rate: "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)" -> bits/s; 0 if unparsable.
uint64_t parse_rate_bps(std::string_view text);
uint64_t read_link_speed_bps(const std::string& root, const std::string& dev, int port);

// A GID for an IP address: IPv4 as ::ffff:a.b.c.d (how RoCEv2 GIDs encode it).
Gid ipv4_mapped_gid(uint32_t ipv4_host_order);
// IPv4 and IPv6 addresses of a netdev as GIDs (getifaddrs); empty if none.
std::vector<Gid> netdev_gids(const std::string& ifname);

// The GID index to use on a port.
//  - override_index >= 0 (an explicit index): that entry, if it exists.
//  - InfiniBand: index 0 (the port GID; traffic is LID-routed).
//  - Ethernet (RoCE): the RoCEv2 GID whose address is one of the netdev's IPs,
//    IPv4 before global IPv6; then any RoCEv2 IPv4 / global GID; then any
//    RoCEv2; then the first populated entry. Never blindly 0: on RoCE index 0
//    is usually the RoCEv1 link-local GID, which does not route.
// Returns -1 with *why set when the table has nothing usable.
int choose_gid_index(std::span<const GidEntry> table, std::span<const Gid> netdev_ips,
                     bool ethernet, int override_index, std::string* why);

// The GID a domain uses, and where the index came from. The explicit index
// is DomainOptions::gid_index (EngineConfig::verbs_gid_index) when >= 0, else
// FERRY_VERBS_GID_INDEX when set, else the automatic choice above.
struct GidChoice {
  int index = -1;
  std::string source;  // "EngineConfig::verbs_gid_index", "FERRY_VERBS_GID_INDEX", "automatic"
  // kInvalidArgument: the explicit index names no populated entry (the message
  // names the NIC, port, index, its source and the populated indices);
  // kFailedPrecondition: a RoCE port with no usable GID.
  Status error;
};
// InfiniBand with an unreadable table and no explicit index gets 0 (the port
// GID, LID-routed traffic); an explicit index is never taken unchecked.
GidChoice choose_gid(const std::string& nic, int port, std::span<const GidEntry> table,
                     std::span<const Gid> netdev_ips, bool ethernet, int option_index,
                     int env_index);

// Environment overrides, validated: -1 when unset or unparsable.
int env_gid_index();
int env_port();

struct VerbsNicInfo {
  std::string name;  // "mlx5_0"
  int port = 0;      // first ACTIVE port (or FERRY_VERBS_PORT)
  bool ethernet = false;
  uint64_t link_speed_bps = 0;
};

// Devices with an active port, in ibv_get_device_list order.
std::vector<VerbsNicInfo> list_verbs_nics();

// --- provider "auto" (engine/provider_select.h)

// "4: ACTIVE" -> "ACTIVE", "1: CA" -> "CA" (sysfs prefixes enum values with
// their number); text without a prefix is returned as is.
std::string strip_enum_number(std::string_view text);
// Reads <root>/<dev>/{node_type,device/driver,device/vendor} and every
// ports/<n>/{state,link_layer}; ports sorted by number. Missing files leave
// fields empty (soft-RoCE has no device/driver).
RdmaDevice read_rdma_device(const std::string& root, const std::string& dev);
// Device names libibverbs lists (ibv_get_device_list; no device is opened).
// *note says why the list is empty.
std::vector<std::string> ibv_device_names(std::string* note);
// The devices named, described from the sysfs tree at root.
std::vector<RdmaDevice> describe_rdma_devices(const std::string& root,
                                              const std::vector<std::string>& names);

}  // namespace ferry::verbs

// Port / GID selection from a fixture sysfs tree and plain tables.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "verbs/verbs_devinfo.h"

namespace ferry::verbs {
namespace {

namespace fs = std::filesystem;

Gid gid(const char* text) {
  const auto g = parse_gid(text);
  EXPECT_TRUE(g) << text;
  return g.value_or(Gid{});
}

TEST(VerbsDevinfo, ParseGidAndType) {
  const auto g = parse_gid("fe80:0000:0000:0000:0e42:a1ff:fe5b:12af");
  ASSERT_TRUE(g);
  EXPECT_EQ((*g)[0], 0xfe);
  EXPECT_EQ((*g)[1], 0x80);
  EXPECT_EQ((*g)[15], 0xaf);
  EXPECT_FALSE(parse_gid("fe80::1"));
  EXPECT_FALSE(parse_gid("fe80:0000:0000:0000:0e42:a1ff:fe5b:12af:00"));
  EXPECT_FALSE(parse_gid("ge80:0000:0000:0000:0e42:a1ff:fe5b:12af"));
  EXPECT_EQ(parse_gid_type("RoCE v2"), GidEntry::Type::kRoceV2);
  EXPECT_EQ(parse_gid_type("IB/RoCE v1"), GidEntry::Type::kRoceV1);
  EXPECT_EQ(parse_gid_type("bogus"), GidEntry::Type::kUnknown);
  EXPECT_EQ(ipv4_mapped_gid(0x0a000102), gid("0000:0000:0000:0000:0000:ffff:0a00:0102"));
}

TEST(VerbsDevinfo, ParseRate) {
  EXPECT_EQ(parse_rate_bps("400 Gb/sec (4X NDR)"), 400'000'000'000u);
  EXPECT_EQ(parse_rate_bps("2.5 Gb/sec (1X SDR)"), 2'500'000'000u);
  EXPECT_EQ(parse_rate_bps("200 Gb/sec (2X HDR)"), 200'000'000'000u);
  EXPECT_EQ(parse_rate_bps(""), 0u);
  EXPECT_EQ(parse_rate_bps("fast"), 0u);
  EXPECT_EQ(parse_rate_bps("-5 Gb/sec"), 0u);
}

// A typical ConnectX RoCE port: v1/v2 pairs for link-local, IPv4 and a
// global IPv6 address.
std::vector<GidEntry> roce_table() {
  using T = GidEntry::Type;
  return {
      {0, T::kRoceV1, gid("fe80:0000:0000:0000:0e42:a1ff:fe5b:12af"), "eth2"},
      {1, T::kRoceV2, gid("fe80:0000:0000:0000:0e42:a1ff:fe5b:12af"), "eth2"},
      {2, T::kRoceV1, gid("0000:0000:0000:0000:0000:ffff:0a00:0102"), "eth2"},
      {3, T::kRoceV2, gid("0000:0000:0000:0000:0000:ffff:0a00:0102"), "eth2"},
      {4, T::kRoceV1, gid("2001:0db8:0000:0000:0000:0000:0000:0042"), "eth2"},
      {5, T::kRoceV2, gid("2001:0db8:0000:0000:0000:0000:0000:0042"), "eth2"},
      {6, T::kRoceV2, gid("0000:0000:0000:0000:0000:ffff:c0a8:0001"), "eth2.100"},
  };
}

TEST(VerbsDevinfo, RoceV2PicksTheGidOfTheNetdevIp) {
  const auto t = roce_table();
  std::string why;
  // The netdev has 10.0.1.2: index 3, not 0 (RoCEv1 link-local) nor 1.
  std::vector<Gid> ips = {ipv4_mapped_gid(0x0a000102)};
  EXPECT_EQ(choose_gid_index(t, ips, true, -1, &why), 3);
  // The IP is on the VLAN netdev: index 6.
  ips = {ipv4_mapped_gid(0xc0a80001)};
  EXPECT_EQ(choose_gid_index(t, ips, true, -1, &why), 6);
  // IPv6 only.
  ips = {gid("2001:0db8:0000:0000:0000:0000:0000:0042")};
  EXPECT_EQ(choose_gid_index(t, ips, true, -1, &why), 5);
  // IPv4 preferred over IPv6 when the netdev has both.
  ips = {gid("2001:0db8:0000:0000:0000:0000:0000:0042"), ipv4_mapped_gid(0x0a000102)};
  EXPECT_EQ(choose_gid_index(t, ips, true, -1, &why), 3);
  // IPs unknown (no getifaddrs match): first RoCEv2 IPv4 GID.
  EXPECT_EQ(choose_gid_index(t, {}, true, -1, &why), 3);
  // Only link-local RoCEv2: still RoCEv2 rather than v1.
  const std::vector<GidEntry> ll(t.begin(), t.begin() + 2);
  EXPECT_EQ(choose_gid_index(ll, {}, true, -1, &why), 1);
  // Only RoCEv1: the first populated entry.
  const std::vector<GidEntry> v1 = {t[0], t[2]};
  EXPECT_EQ(choose_gid_index(v1, {}, true, -1, &why), 0);
}

TEST(VerbsDevinfo, OverrideAndInfiniband) {
  const auto t = roce_table();
  std::string why;
  EXPECT_EQ(choose_gid_index(t, {}, true, 4, &why), 4);
  EXPECT_EQ(choose_gid_index(t, {}, true, 9, &why), -1);
  EXPECT_NE(why.find("FERRY_VERBS_GID_INDEX"), std::string::npos);
  EXPECT_EQ(choose_gid_index({}, {}, true, -1, &why), -1);
  const std::vector<GidEntry> ib = {
      {0, GidEntry::Type::kIb, gid("fe80:0000:0000:0000:0e42:a1ff:fe5b:12af"), ""}};
  EXPECT_EQ(choose_gid_index(ib, {}, false, -1, &why), 0);
}

TEST(VerbsDevinfo, GidIndexOptionIsValidatedAgainstTheTable) {
  const auto t = roce_table();
  const std::vector<Gid> ips = {ipv4_mapped_gid(0x0a000102)};
  // Automatic: the RoCEv2 GID of the netdev's IPv4 address.
  GidChoice c = choose_gid("mlx5_0", 1, t, ips, true, -1, -1);
  ASSERT_TRUE(c.error.is_ok()) << c.error.message();
  EXPECT_EQ(c.index, 3);
  EXPECT_EQ(c.source, "automatic");
  // The option (EngineConfig::verbs_gid_index) wins over the environment.
  c = choose_gid("mlx5_0", 1, t, ips, true, 5, 4);
  EXPECT_EQ(c.index, 5);
  EXPECT_EQ(c.source, "EngineConfig::verbs_gid_index");
  // The environment is the fallback.
  c = choose_gid("mlx5_0", 1, t, ips, true, -1, 4);
  EXPECT_EQ(c.index, 4);
  EXPECT_EQ(c.source, "FERRY_VERBS_GID_INDEX");
  // An explicit RoCEv1 entry is taken as asked.
  c = choose_gid("mlx5_0", 1, t, ips, true, 0, -1);
  EXPECT_EQ(c.index, 0);
  // An index the table lacks: a typed error naming NIC, port, index, source.
  c = choose_gid("mlx5_0", 1, t, ips, true, 9, -1);
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.error.code(), Code::kInvalidArgument);
  EXPECT_EQ(c.error.message(),
            "verbs NIC 'mlx5_0' port 1: GID index 9 (EngineConfig::verbs_gid_index) names no "
            "populated GID entry (populated: 0, 1, 2, 3, 4, 5, 6)");
  c = choose_gid("mlx5_1", 2, t, ips, true, -1, 7);
  EXPECT_EQ(c.error.code(), Code::kInvalidArgument);
  EXPECT_NE(c.error.message().find("'mlx5_1' port 2: GID index 7 (FERRY_VERBS_GID_INDEX)"),
            std::string::npos)
      << c.error.message();
  // Never taken unchecked, even on InfiniBand with an unreadable table.
  c = choose_gid("mlx5_0", 1, {}, {}, false, 1, -1);
  EXPECT_EQ(c.error.code(), Code::kInvalidArgument);
  EXPECT_NE(c.error.message().find("none readable in sysfs"), std::string::npos)
      << c.error.message();
  // InfiniBand, table unreadable, automatic: the port GID.
  c = choose_gid("mlx5_0", 1, {}, {}, false, -1, -1);
  EXPECT_TRUE(c.error.is_ok());
  EXPECT_EQ(c.index, 0);
  // RoCE with nothing usable.
  c = choose_gid("mlx5_0", 1, {}, {}, true, -1, -1);
  EXPECT_EQ(c.error.code(), Code::kFailedPrecondition);
  EXPECT_NE(c.error.message().find("no usable GID"), std::string::npos) << c.error.message();
}

void write_file(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s << "\n";
}

TEST(VerbsDevinfo, ReadsSysfsTable) {
  const fs::path root = fs::path(testing::TempDir()) / "ferry_verbs_sysfs";
  fs::remove_all(root);
  const fs::path port = root / "mlx5_0" / "ports" / "1";
  write_file(port / "rate", "400 Gb/sec (4X NDR)");
  const auto t = roce_table();
  for (const auto& e : t) {
    const std::string i = std::to_string(e.index);
    std::string text;
    for (int b = 0; b < 16; b += 2) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "%s%02x%02x", b == 0 ? "" : ":", e.gid[b], e.gid[b + 1]);
      text += buf;
    }
    write_file(port / "gids" / i, text);
    write_file(port / "gid_attrs" / "types" / i,
               e.type == GidEntry::Type::kRoceV2 ? "RoCE v2" : "IB/RoCE v1");
    write_file(port / "gid_attrs" / "ndevs" / i, e.ndev);
  }
  // Unpopulated entries: zero GID, and a GID whose type cannot be read.
  write_file(port / "gids" / "7", "0000:0000:0000:0000:0000:0000:0000:0000");
  write_file(port / "gids" / "8", "fe80:0000:0000:0000:0000:0000:0000:0009");
  const auto got = read_gid_table(root.string(), "mlx5_0", 1);
  ASSERT_EQ(got.size(), t.size());
  for (size_t k = 0; k < t.size(); ++k) {
    EXPECT_EQ(got[k].index, t[k].index);
    EXPECT_EQ(got[k].type, t[k].type);
    EXPECT_EQ(got[k].gid, t[k].gid);
    EXPECT_EQ(got[k].ndev, t[k].ndev);
  }
  EXPECT_EQ(read_link_speed_bps(root.string(), "mlx5_0", 1), 400'000'000'000u);
  EXPECT_EQ(read_link_speed_bps(root.string(), "mlx5_9", 1), 0u);
  EXPECT_TRUE(read_gid_table(root.string(), "mlx5_9", 1).empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace ferry::verbs

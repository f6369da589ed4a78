#include "topo/topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "topo_fixtures.h"

namespace ferry::topo {
namespace {

namespace fs = std::filesystem;
using testing::FxDevice;
using testing::FxKind;
using testing::FxMachine;
using testing::FxRoot;
using testing::FxSwitch;
using testing::TempDir;

Topology detect_machine(const FxMachine& m, const TempDir& dir) {
  testing::write_fixture(m, dir.path());
  return detect({dir.path()});
}

std::vector<std::string> names(const std::vector<NicInfo>& nics) {
  std::vector<std::string> out;
  for (const auto& n : nics) out.push_back(n.name);
  return out;
}

bool contains_text(const std::vector<std::string>& v, std::string_view needle) {
  return std::any_of(v.begin(), v.end(),
                     [&](const std::string& s) { return s.find(needle) != s.npos; });
}

// Each GPU group: NICs all under the GPU's own switch, never shared, and
// CPUs one per physical core on the GPU's node, disjoint across groups.
void expect_disjoint_local_groups(const Topology& t, size_t nics_per_gpu, size_t cpus_per_gpu) {
  std::set<std::string> nic_seen;
  std::set<int> cpu_seen;
  for (const auto& g : t.groups) {
    if (g.gpu < 0) continue;
    const GpuInfo* gpu = t.gpu(g.gpu);
    ASSERT_NE(gpu, nullptr);
    EXPECT_EQ(g.numa, gpu->numa);
    EXPECT_EQ(g.locality, NicLocality::kPcieSwitch) << "GPU " << g.gpu;
    ASSERT_EQ(g.nics.size(), nics_per_gpu) << "GPU " << g.gpu;
    for (const auto& n : g.nics) {
      EXPECT_EQ(n.branch, gpu->branch) << n.name;
      EXPECT_EQ(n.numa, gpu->numa) << n.name;
      EXPECT_TRUE(nic_seen.insert(n.name).second) << n.name << " in two groups";
    }
    ASSERT_EQ(g.cpus.size(), cpus_per_gpu) << "GPU " << g.gpu;
    for (int c : g.cpus) {
      EXPECT_EQ(t.numa_of_cpu(c), gpu->numa) << "cpu " << c;
      EXPECT_TRUE(cpu_seen.insert(c).second) << "cpu " << c << " in two groups";
    }
    EXPECT_TRUE(std::is_sorted(g.cpus.begin(), g.cpus.end()));
    EXPECT_EQ(g.cpus.back() - g.cpus.front() + 1, static_cast<int>(g.cpus.size()))
        << "slice not contiguous";
  }
}

// --- PciAddr and cpulist --------------------------------------------------------

TEST(PciAddr, ParsesAndFormats) {
  auto a = PciAddr::parse("0000:bd:01.4");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->domain, 0u);
  EXPECT_EQ(a->bus, 0xbd);
  EXPECT_EQ(a->dev, 1);
  EXPECT_EQ(a->fn, 4);
  EXPECT_EQ(a->to_string(), "0000:bd:01.4");
  EXPECT_EQ(PciAddr::parse("BD:1f.7")->to_string(), "0000:bd:1f.7");
  EXPECT_EQ(PciAddr::parse("10000:e1:00.0")->to_string(), "10000:e1:00.0");
  EXPECT_LT(*PciAddr::parse("0000:18:00.0"), *PciAddr::parse("0000:18:00.1"));
}

TEST(PciAddr, RejectsMalformed) {
  for (const char* s :
       {"", "0000:bd:01", "0000:bd:20.0", "0000:bd:01.8", "0000:zz:01.0", "pci0000:00", "virtio2",
        "0:0.0", "0000:0bd:01.0", "0x00:bd:01.0", "0000:bd:01.0.1", "123456789:00:00.0"}) {
    EXPECT_FALSE(PciAddr::parse(s)) << s;
  }
}

TEST(CpuList, RoundTrips) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist(""), std::vector<int>{});
  EXPECT_EQ(format_cpulist({11, 0, 1, 2, 3, 8, 10}), "0-3,8,10-11");
  EXPECT_FALSE(parse_cpulist("3-1"));
  EXPECT_FALSE(parse_cpulist("a"));
  EXPECT_FALSE(parse_cpulist("1,"));
  EXPECT_FALSE(parse_cpulist("0-99999999"));
}

// --- recorded machine layouts ---------------------------------------------------------

TEST(TopologyP5, FourEfaPerGpuUnderEachSwitch) {
  TempDir dir;
  Topology t = detect_machine(testing::p5_48xlarge(), dir);
  ASSERT_EQ(t.gpus.size(), 8u);
  EXPECT_EQ(t.fabric_kind, NicKind::kEfa);
  EXPECT_EQ(std::count_if(t.nics.begin(), t.nics.end(),
                          [](const NicInfo& n) { return n.kind == NicKind::kEfa; }),
            32);
  // The ENA is listed but not used for groups: EFA is there.
  EXPECT_EQ(std::count_if(t.nics.begin(), t.nics.end(),
                          [](const NicInfo& n) { return n.kind == NicKind::kNetdev; }),
            1);
  ASSERT_EQ(t.groups.size(), 9u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.gpus[i].ordinal, i);
    EXPECT_EQ(t.gpus[i].numa, i / 4);
    EXPECT_EQ(t.groups[i].gpu, i);
  }
  expect_disjoint_local_groups(t, 4, 12);
  for (const auto& n : t.groups[0].nics) EXPECT_EQ(n.link_speed_bps, 100'000'000'000u);
  EXPECT_EQ(t.groups[0].cpus.front(), 0);
  EXPECT_EQ(t.groups[4].cpus.front(), 48);
  EXPECT_EQ(t.numa_nodes.at(0).cpus.size(), 96u);
  EXPECT_EQ(t.numa_nodes.at(0).cores.size(), 48u);
  EXPECT_EQ(format_cpulist(t.numa_nodes.at(1).cpus), "48-95,144-191");

  const TopologyGroup& host = t.host_group();
  EXPECT_EQ(host.gpu, -1);
  EXPECT_EQ(host.numa, 0);
  EXPECT_EQ(host.nics.size(), 16u);
  EXPECT_EQ(format_cpulist(host.cpus), "0-47");
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
}

TEST(TopologyP5en, TwoEfaV3PerGpu) {
  TempDir dir;
  Topology t = detect_machine(testing::p5en_48xlarge(), dir);
  ASSERT_EQ(t.gpus.size(), 8u);
  EXPECT_EQ(t.gpus[0].device_id, 0x2335);
  expect_disjoint_local_groups(t, 2, 12);
  for (const auto& g : t.groups) {
    for (const auto& n : g.nics) {
      EXPECT_EQ(n.kind, NicKind::kEfa);
      EXPECT_EQ(n.link_speed_bps, 200'000'000'000u);
    }
  }
}

TEST(TopologyDgxH100, OneConnectX7PerGpuTwoGpusPerSwitch) {
  TempDir dir;
  Topology t = detect_machine(testing::dgx_h100(), dir);
  ASSERT_EQ(t.gpus.size(), 8u);
  EXPECT_EQ(t.fabric_kind, NicKind::kVerbs);
  expect_disjoint_local_groups(t, 1, 14);
  // NICs in PCI order, GPU i of a switch takes the i-th: GPU0 -> mlx5_0 ...
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.groups[i].nics[0].name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(t.groups[i].nics[0].link_speed_bps, 400'000'000'000u);
    EXPECT_EQ(t.groups[i].nics[0].netdev.substr(0, 3), "ibp");
  }
  EXPECT_EQ(t.groups[0].nics[0].branch, t.groups[1].nics[0].branch);  // one switch
  EXPECT_NE(t.groups[1].nics[0].branch, t.groups[2].nics[0].branch);
  EXPECT_EQ(format_cpulist(t.groups[0].cpus), "0-13");
  EXPECT_EQ(format_cpulist(t.groups[4].cpus), "56-69");

  // IPoIB netdevs fold into their mlx5 device; the 10 GbE port stays a netdev.
  const NicInfo* eno = t.nic("eno1");
  ASSERT_NE(eno, nullptr);
  EXPECT_EQ(eno->kind, NicKind::kNetdev);
  EXPECT_EQ(eno->link_speed_bps, 10'000'000'000u);
  EXPECT_EQ(t.nics.size(), 8u + 2u + 1u);
  // The two-function ConnectX-6 is another model: listed, but in no group.
  const NicInfo* cx6 = t.nic("mlx5_8");
  ASSERT_NE(cx6, nullptr);
  EXPECT_EQ(cx6->device_id, 0x101b);
  EXPECT_EQ(cx6->numa, 1);
  EXPECT_EQ(t.nic("mlx5_9")->branch, cx6->branch);  // one slot, two functions
  for (const auto& g : t.groups) {
    for (const auto& n : g.nics) {
      EXPECT_EQ(n.device_id, 0x1021) << n.name;
    }
  }
  EXPECT_EQ(names(t.host_group().nics),
            (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
}

TEST(TopologySmallVm, NoGpuOneVirtioNetdev) {
  TempDir dir;
  Topology t = detect_machine(testing::small_vm(), dir);
  EXPECT_TRUE(t.gpus.empty());
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].name, "eth0");
  EXPECT_EQ(t.nics[0].kind, NicKind::kNetdev);
  EXPECT_EQ(t.nics[0].link_speed_bps, 0u);  // virtio reports -1
  EXPECT_EQ(t.nics[0].numa, 0);             // numa_node -1
  ASSERT_EQ(t.groups.size(), 1u);
  EXPECT_EQ(t.groups[0].gpu, -1);
  EXPECT_EQ(names(t.groups[0].nics), std::vector<std::string>{"eth0"});
  EXPECT_EQ(t.groups[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_TRUE(t.warnings.empty()) << t.warnings.front();
}

// --- grouping rules ---------------------------------------------------------------------

TEST(TopologyGrouping, FallsBackToSameNumaNicsWhenNoneShareASwitch) {
  FxMachine m;
  m.sockets = 2;
  m.cores_per_socket = 8;
  for (int s = 0; s < 2; ++s) {
    FxRoot r;
    r.numa = s;
    r.switches.push_back({{{FxKind::kGpuH100}, {FxKind::kGpuH100}, {FxKind::kNvme}}});
    r.direct = {{FxKind::kConnectX7}, {FxKind::kConnectX7}};
    m.roots.push_back(r);
  }
  TempDir dir;
  Topology t = detect_machine(m, dir);
  ASSERT_EQ(t.gpus.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const TopologyGroup& g = t.groups[i];
    EXPECT_EQ(g.locality, NicLocality::kNumaNode);
    ASSERT_EQ(g.nics.size(), 1u);
    EXPECT_EQ(g.nics[0].name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(g.nics[0].numa, g.numa);
    EXPECT_EQ(g.cpus.size(), 4u);
  }
}

TEST(TopologyGrouping, SharesTheOnlyNicOfASwitchAndFallsBackAcrossNodes) {
  FxMachine m;
  m.sockets = 2;
  m.cores_per_socket = 4;
  FxRoot r0;
  r0.switches.push_back({{{FxKind::kGpuH100}, {FxKind::kConnectX7}, {FxKind::kGpuH100}}});
  FxRoot r1;
  r1.numa = 1;
  r1.switches.push_back({{{FxKind::kGpuH100}}});
  m.roots = {r0, r1};
  TempDir dir;
  Topology t = detect_machine(m, dir);
  ASSERT_EQ(t.gpus.size(), 3u);
  EXPECT_EQ(names(t.groups[0].nics), std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(names(t.groups[1].nics), std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(t.groups[1].locality, NicLocality::kPcieSwitch);
  EXPECT_EQ(names(t.groups[2].nics), std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(t.groups[2].locality, NicLocality::kAnyNode);
  EXPECT_EQ(format_cpulist(t.groups[0].cpus), "0-1");
  EXPECT_EQ(format_cpulist(t.groups[1].cpus), "2-3");
  EXPECT_EQ(format_cpulist(t.groups[2].cpus), "4-7");
}

TEST(TopologyGrouping, UnevenNicsLeaveTheRemainderUnused) {
  FxMachine m;
  m.cores_per_socket = 5;
  FxRoot r;
  r.switches.push_back(
      {{{FxKind::kEfa}, {FxKind::kEfa}, {FxKind::kEfa}, {FxKind::kGpuH100}, {FxKind::kGpuH100}}});
  m.roots = {r};
  TempDir dir;
  Topology t = detect_machine(m, dir);
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.groups[0].nics.size(), 1u);
  EXPECT_EQ(t.groups[1].nics.size(), 1u);
  EXPECT_NE(t.groups[0].nics[0].name, t.groups[1].nics[0].name);
  EXPECT_EQ(t.groups[0].cpus.size(), 3u);  // 5 cores: 3 + 2
  EXPECT_EQ(t.groups[1].cpus.size(), 2u);
}

TEST(TopologyGrouping, NumaMinusOneEverywhereKeepsDevicesOnNodeZero) {
  FxMachine m = testing::dgx_h100();
  m.report_numa = false;
  TempDir dir;
  Topology t = detect_machine(m, dir);
  ASSERT_EQ(t.gpus.size(), 8u);  // the reference design dropped them all
  for (const auto& g : t.gpus) EXPECT_EQ(g.numa, 0);
  expect_disjoint_local_groups(t, 1, 7);  // 56 cores of node 0 over 8 GPUs
  // 8 GPUs, 8 ConnectX-7, eno1 and both ConnectX-6 functions.
  EXPECT_TRUE(contains_text(t.warnings, "numa_node -1 for 19 device(s)"));
  EXPECT_EQ(t.warnings.size(), 1u) << t.warnings.back();
}

TEST(TopologyGrouping, NoNumaDirectoriesMeansOneNode) {
  FxMachine m = testing::p5_48xlarge();
  m.numa_dirs = false;
  m.report_numa = false;
  TempDir dir;
  Topology t = detect_machine(m, dir);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes.at(0).cpus.size(), 192u);
  EXPECT_EQ(t.numa_nodes.at(0).cores.size(), 96u);
  expect_disjoint_local_groups(t, 4, 12);
}

TEST(TopologyOrdinals, CudaOrderRenumbersAndHidesGpus) {
  TempDir dir;
  Topology t = detect_machine(testing::dgx_h100(), dir);
  const PciAddr g5 = t.gpus[5].pci, g2 = t.gpus[2].pci;
  const std::string nic5 = t.groups[5].nics[0].name;
  const std::vector<int> cpus5 = t.groups[5].cpus;
  assign_gpu_ordinals(t, {g5, g2});
  EXPECT_EQ(t.visible_gpu_count(), 2u);
  ASSERT_EQ(t.groups.size(), 3u);
  EXPECT_EQ(t.gpu(0)->pci, g5);
  EXPECT_EQ(t.gpu(1)->pci, g2);
  // Hidden GPUs keep their share: GPU 5's NIC and cores do not move.
  EXPECT_EQ(t.group(0)->nics[0].name, nic5);
  EXPECT_EQ(t.group(0)->cpus, cpus5);
  EXPECT_EQ(t.gpus.size(), 8u);
  EXPECT_EQ(t.gpus[2].ordinal, -1);

  try {
    assign_gpu_ordinals(t, {g2, g2});
    FAIL() << "duplicate accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
  }
  try {
    assign_gpu_ordinals(t, {*PciAddr::parse("0000:ff:00.0")});
    FAIL() << "unknown GPU accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kNotFound);
  }
}

// --- broken sysfs ------------------------------------------------------------------

TEST(TopologyRobustness, MissingRootThrowsNotFound) {
  try {
    detect({"/nonexistent/ferry-topo-root"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kNotFound);
  }
}

TEST(TopologyRobustness, EmptyRootGivesEmptyTopology) {
  TempDir dir;
  Topology t = detect({dir.path()});
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_TRUE(t.nics.empty());
  ASSERT_EQ(t.groups.size(), 1u);
  EXPECT_TRUE(t.groups[0].nics.empty());
  EXPECT_FALSE(t.warnings.empty());
}

TEST(TopologyRobustness, MalformedFilesAreWarningsNotCrashes) {
  TempDir dir;
  const fs::path& root = dir.path();
  testing::write_fixture(testing::dgx_h100(), root);
  Topology clean = detect({root});
  const std::string gpu0 = "sys/bus/pci/devices/" + clean.gpus[0].pci.to_string();
  const std::string gpu1 = "sys/bus/pci/devices/" + clean.gpus[1].pci.to_string();
  testing::write_file(root, gpu0 + "/vendor", "not hex\n");
  testing::write_file(root, gpu1 + "/numa_node", "banana\n");
  testing::write_file(root, "sys/class/infiniband/mlx5_2/ports/1/rate", "fast\n");
  fs::remove(root / "sys/class/infiniband/mlx5_3/device");
  testing::write_file(root, "sys/devices/system/node/node1/cpulist", "9-2\n");
  fs::remove(root / "sys/devices/system/cpu/cpu3/topology/core_id");
  fs::create_symlink("loop", root / "sys/class/net/loop");  // links to itself
  fs::create_directories(root / "sys/bus/pci/devices/garbage");
  fs::create_symlink("../../../devices/gone/0000:99:00.0",
                     root / "sys/bus/pci/devices/0000:99:00.0");

  Topology t;
  ASSERT_NO_THROW(t = detect({root}));
  EXPECT_EQ(t.gpus.size(), 7u);  // the unreadable one is not a GPU
  EXPECT_EQ(t.nic("mlx5_2")->link_speed_bps, 0u);
  EXPECT_FALSE(t.nic("mlx5_3")->pci.has_value());
  EXPECT_TRUE(t.numa_nodes.at(1).cpus.empty());
  EXPECT_EQ(t.numa_nodes.at(0).cores.size(), 57u);  // cpu3 now counts as its own core
  EXPECT_TRUE(contains_text(t.warnings, "vendor,device,class"));
  EXPECT_TRUE(contains_text(t.warnings, "cpulist"));
  EXPECT_TRUE(contains_text(t.warnings, "cannot parse \"fast\""));
  EXPECT_TRUE(contains_text(t.warnings, "garbage"));
  // GPUs of node 1 lost their cores, not their NICs.
  for (const auto& g : t.groups) {
    if (g.gpu < 0) continue;
    EXPECT_FALSE(g.nics.empty()) << "GPU " << g.gpu;
  }
}

TEST(TopologyRobustness, LiveMachineDoesNotCrash) {
  Topology t;
  ASSERT_NO_THROW(t = detect());
  EXPECT_FALSE(t.numa_nodes.empty());
  EXPECT_FALSE(t.groups.empty());
  EXPECT_FALSE(t.host_group().cpus.empty());
  // This build machine has no GPU; a GPU box may run the suite too.
  if (!fs::exists("/proc/driver/nvidia")) {
    EXPECT_TRUE(t.gpus.empty());
  }
}

// --- validation -------------------------------------------------------------------------

class TopologyValidation : public ::testing::Test {
 protected:
  void SetUp() override { t_ = detect_machine(testing::dgx_h100(), dir_); }
  TempDir dir_;
  Topology t_;
};

TEST_F(TopologyValidation, DefaultGroupIsClean) {
  const TopologyGroup& g = *t_.group(3);
  EXPECT_TRUE(validate_group(t_, 3, names(g.nics), g.cpus, false).empty());
}

TEST_F(TopologyValidation, ErrorsUnlessInsist) {
  // mlx5_0 is GPU 0's; cpu 60 is on node 1 while GPU 3 is on node 0; cpu 999 unknown.
  const std::vector<std::string> nics = {"mlx5_3", "mlx5_0", "mlx5_42"};
  const std::vector<int> cpus = {40, 60, 999};
  auto problems = validate_group(t_, 3, nics, cpus, false);
  ASSERT_EQ(problems.size(), 4u);
  for (const auto& p : problems) EXPECT_TRUE(p.is_error()) << p.message;
  EXPECT_NE(problems[0].message.find("mlx5_0 belongs to GPU 0"), std::string::npos);
  EXPECT_NE(problems[1].message.find("unknown NIC mlx5_42"), std::string::npos);
  EXPECT_NE(problems[2].message.find("CPU 60 is on NUMA node 1"), std::string::npos);
  EXPECT_NE(problems[3].message.find("unknown CPU 999"), std::string::npos);

  auto insisted = validate_group(t_, 3, nics, cpus, true);
  ASSERT_EQ(insisted.size(), 4u);
  for (const auto& p : insisted) EXPECT_FALSE(p.is_error()) << p.message;

  EXPECT_THROW(make_group(t_, 3, nics, cpus, false), Error);
  std::vector<Problem> warnings;
  TopologyGroup g = make_group(t_, 3, nics, cpus, true, &warnings);
  EXPECT_EQ(warnings.size(), 4u);
  EXPECT_EQ(g.locality, NicLocality::kOverride);
  EXPECT_EQ(names(g.nics), nics);
  EXPECT_EQ(g.cpus, cpus);
}

TEST_F(TopologyValidation, CrossNodeNicIsAWarningAndUnknownGpuAnError) {
  // mlx5_8 is the ConnectX-6 on node 1: in nobody's group, but remote.
  auto p = validate_group(t_, 0, {"mlx5_0", "mlx5_8"}, {0}, false);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_FALSE(p[0].is_error());
  EXPECT_NE(p[0].message.find("NUMA node 1"), std::string::npos);

  auto q = validate_group(t_, 8, {"mlx5_0"}, {}, true);
  ASSERT_FALSE(q.empty());
  EXPECT_TRUE(q[0].is_error());
  EXPECT_THROW(make_group(t_, 8, {"mlx5_0"}, {}, true), Error);
}

TEST_F(TopologyValidation, HostGroupMayUseAnyGpusNic) {
  EXPECT_TRUE(validate_group(t_, -1, {"mlx5_0", "mlx5_5"}, {0, 100}, false).empty());
  auto p = validate_group(t_, -1, {}, {0, 0}, false);
  ASSERT_EQ(p.size(), 2u);  // no NIC, CPU twice
}

}  // namespace
}  // namespace ferry::topo

// Provider "auto": the decision on fixture inputs, the sysfs description of
// RDMA devices on a fixture tree, and the engine's use of it on this host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/provider_select.h"
#include "ferry/engine.h"
#include "support/scoped_env.h"
#include "verbs/verbs_devinfo.h"

namespace ferry::verbs {
namespace {

namespace fs = std::filesystem;
using engine::ProviderChoice;
using engine::ProviderProbe;
using verbs::RdmaDevice;
using verbs::RdmaPort;

RdmaDevice connectx(const std::string& name, std::vector<RdmaPort> ports) {
  return {name, "mlx5_core", "0x15b3", "CA", std::move(ports)};
}
RdmaDevice efa_dev(const std::string& name) {
  return {name, "efa", "0x1d0f", "unspecified", {{1, "ACTIVE", "Unspecified"}}};
}

TEST(VerbsAutoProvider, ConnectXWithActivePortSelectsVerbs) {
  ProviderProbe p;
  p.verbs_devices = {connectx("mlx5_0", {{1, "ACTIVE", "Ethernet"}})};
  p.efa = true;  // even with efa present: a ConnectX port wins
  const ProviderChoice c = engine::choose_provider(p);
  ASSERT_TRUE(c.error.is_ok()) << c.error.message();
  EXPECT_EQ(c.provider, "verbs");
  EXPECT_EQ(c.reason, "mlx5_0 port 1 ACTIVE, Ethernet (RoCE), driver mlx5_core");
}

TEST(VerbsAutoProvider, FirstActivePortOfTheFirstQualifyingDevice) {
  ProviderProbe p;
  p.verbs_devices = {efa_dev("rdmap16s27"),
                     connectx("mlx5_0", {{1, "DOWN", "InfiniBand"}, {2, "ACTIVE", "InfiniBand"}}),
                     connectx("mlx5_1", {{1, "ACTIVE", "InfiniBand"}})};
  const ProviderChoice c = engine::choose_provider(p);
  EXPECT_EQ(c.provider, "verbs");
  EXPECT_EQ(c.reason, "mlx5_0 port 2 ACTIVE, InfiniBand, driver mlx5_core");
}

TEST(VerbsAutoProvider, OnlyEfaIbverbsDevicesSelectEfa) {
  // EFA shows up in libibverbs, but must go through libfabric "efa".
  ProviderProbe p;
  p.verbs_devices = {efa_dev("rdmap16s27"), efa_dev("rdmap32s27")};
  p.efa = true;
  p.efa_note = "fi_getinfo(efa): 2 domains (rdmap16s27-rdm, ...)";
  const ProviderChoice c = engine::choose_provider(p);
  ASSERT_TRUE(c.error.is_ok()) << c.error.message();
  EXPECT_EQ(c.provider, "efa");
  EXPECT_NE(c.reason.find("fi_getinfo(efa): 2 domains"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("rdmap16s27: EFA (driver efa)"), std::string::npos) << c.reason;
  // Recognised by the Amazon PCI vendor alone too (driver link unreadable).
  RdmaDevice d = efa_dev("rdmap16s27");
  d.driver.clear();
  EXPECT_TRUE(verbs::is_efa_device(d));
  EXPECT_FALSE(engine::choose_verbs({d}));
}

TEST(VerbsAutoProvider, EfaOnlyIbverbsWithoutLibfabricEfaIsAnError) {
  ProviderProbe p;
  p.verbs_devices = {efa_dev("rdmap16s27")};
  p.efa = false;
  p.efa_note = "fi_getinfo(efa): no domain";
  const ProviderChoice c = engine::choose_provider(p);
  EXPECT_EQ(c.error.code(), Code::kUnavailable);
  EXPECT_TRUE(c.provider.empty());
}

TEST(VerbsAutoProvider, NothingFoundIsUnavailableListingWhatWasProbed) {
  ProviderProbe p;
  p.verbs_note = "ibv_get_device_list returned 0 devices";
  p.efa = false;
  p.efa_note = "fi_getinfo(efa): no domain";
  const ProviderChoice c = engine::choose_provider(p);
  EXPECT_EQ(c.error.code(), Code::kUnavailable);
  const std::string& m = c.error.message();
  EXPECT_NE(m.find("provider auto"), std::string::npos) << m;
  EXPECT_NE(m.find("ibv_get_device_list returned 0 devices"), std::string::npos) << m;
  EXPECT_NE(m.find("fi_getinfo(efa): no domain"), std::string::npos) << m;
  EXPECT_NE(m.find("FERRY_PROVIDER"), std::string::npos) << m;
}

TEST(VerbsAutoProvider, ConnectXWithEveryPortDownIsNotVerbs) {
  ProviderProbe p;
  p.verbs_devices = {
      connectx("mlx5_0", {{1, "DOWN", "Ethernet"}, {2, "DOWN", "Ethernet"}}),
      connectx("mlx5_1", {{1, "INIT", "InfiniBand"}}),
      connectx("mlx5_2", {}),
  };
  EXPECT_FALSE(engine::choose_verbs(p.verbs_devices));
  p.efa = false;
  const ProviderChoice c = engine::choose_provider(p);
  EXPECT_EQ(c.error.code(), Code::kUnavailable);
  const std::string& m = c.error.message();
  EXPECT_NE(m.find("mlx5_0: no ACTIVE port (port 1 DOWN, port 2 DOWN)"), std::string::npos) << m;
  EXPECT_NE(m.find("mlx5_1: no ACTIVE port (port 1 INIT)"), std::string::npos) << m;
  EXPECT_NE(m.find("mlx5_2: no ports"), std::string::npos) << m;
  // ... and with libfabric efa present, efa is chosen instead.
  p.efa = true;
  EXPECT_EQ(engine::choose_provider(p).provider, "efa");
}

TEST(VerbsAutoProvider, EfaIsProbedOnlyWhenNoVerbsDeviceQualifies) {
  int efa_calls = 0;
  engine::ProviderProbes probes;
  probes.verbs = [](std::string*) {
    return std::vector<RdmaDevice>{connectx("mlx5_0", {{1, "ACTIVE", "Ethernet"}})};
  };
  probes.efa = [&efa_calls](std::string* note) {
    ++efa_calls;
    *note = "fi_getinfo(efa): 1 domain";
    return true;
  };
  EXPECT_EQ(engine::resolve_provider(probes).provider, "verbs");
  EXPECT_EQ(efa_calls, 0);
  probes.verbs = [](std::string* note) {
    *note = "ibv_get_device_list returned 0 devices";
    return std::vector<RdmaDevice>{};
  };
  const ProviderChoice c = engine::resolve_provider(probes);
  EXPECT_EQ(c.provider, "efa");
  EXPECT_EQ(efa_calls, 1);
  EXPECT_NE(c.reason.find("ibv_get_device_list returned 0 devices"), std::string::npos) << c.reason;
}

// What the engine reports when a worker cannot open its NIC.
const Status kVerbsOpenFailed(Code::kUnavailable,
                              "group 0 NIC 0 ('', provider 'verbs'): ibv_open_device(mlx5_0): "
                              "Permission denied");
const Status kEfaOpenFailed(Code::kUnavailable,
                            "group 0 NIC 0 ('', provider 'efa'): fi_domain(rdmap16s27-rdm): "
                            "Resource temporarily unavailable");

ProviderChoice verbs_choice() {
  ProviderProbe p;
  p.verbs_devices = {connectx("mlx5_0", {{1, "ACTIVE", "Ethernet"}})};
  return engine::choose_provider(p);
}

TEST(VerbsAutoProvider, VerbsThatFailsToOpenFallsBackToEfaWhenLibfabricHasIt) {
  const ProviderChoice c = engine::fallback_after_open_failure(
      verbs_choice(), kVerbsOpenFailed, true, "fi_getinfo(efa): 1 domain (rdmap16s27-rdm)");
  ASSERT_TRUE(c.error.is_ok()) << c.error.message();
  EXPECT_EQ(c.provider, "efa");
  EXPECT_NE(c.reason.find("verbs failed to open"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("fi_getinfo(efa): 1 domain (rdmap16s27-rdm)"), std::string::npos)
      << c.reason;
}

TEST(VerbsAutoProvider, VerbsThatFailsToOpenWithoutEfaNamesBoth) {
  // A GID index that names no entry: the verbs failure's code is kept.
  const Status gid(Code::kInvalidArgument,
                   "group 0 NIC 0 ('', provider 'verbs'): verbs NIC 'mlx5_0' port 1: GID index 9 "
                   "(EngineConfig::verbs_gid_index) names no populated GID entry");
  ProviderChoice c =
      engine::fallback_after_open_failure(verbs_choice(), gid, false, "fi_getinfo(efa): no domain");
  EXPECT_TRUE(c.provider.empty());
  EXPECT_EQ(c.error.code(), Code::kInvalidArgument);
  const std::string& m = c.error.message();
  EXPECT_NE(m.find("provider auto: verbs (mlx5_0 port 1 ACTIVE, Ethernet (RoCE), driver "
                   "mlx5_core) failed to open: group 0 NIC 0 ('', provider 'verbs'): verbs NIC "
                   "'mlx5_0' port 1: GID index 9"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("no efa to fall back to: fi_getinfo(efa): no domain"), std::string::npos) << m;
  // No efa probe at all: said so, not left blank.
  c = engine::fallback_after_open_failure(verbs_choice(), kVerbsOpenFailed, std::nullopt, "");
  EXPECT_EQ(c.error.code(), Code::kUnavailable);
  EXPECT_NE(c.error.message().find("fi_getinfo(efa) not run"), std::string::npos)
      << c.error.message();
}

TEST(VerbsAutoProvider, OnlyVerbsFallsBack) {
  ProviderChoice efa;
  efa.provider = "efa";
  efa.reason = "fi_getinfo(efa): 1 domain";
  const ProviderChoice c = engine::fallback_after_open_failure(efa, kEfaOpenFailed, true, "");
  EXPECT_TRUE(c.provider.empty());
  EXPECT_EQ(c.error.code(), kEfaOpenFailed.code());
  EXPECT_EQ(c.error.message(), kEfaOpenFailed.message());
}

// Drives open_auto_provider with scripted open results, recording what was
// opened, how often efa was probed and what was logged.
struct AutoOpenRun {
  std::vector<std::string> opened;
  std::vector<std::string> warnings;
  int efa_probes = 0;
  engine::AutoOpen result;

  AutoOpenRun(const ProviderChoice& choice, std::optional<bool> efa, Status verbs_open,
              Status efa_open) {
    engine::ProviderProbes probes;
    probes.verbs = [](std::string*) -> std::vector<RdmaDevice> {
      ADD_FAILURE() << "the verbs probe ran again";
      return {};
    };
    if (efa) {
      probes.efa = [this, has = *efa](std::string* note) {
        ++efa_probes;
        *note = has ? "fi_getinfo(efa): 1 domain (rdmap16s27-rdm)" : "fi_getinfo(efa): no domain";
        return has;
      };
    }
    result = engine::open_auto_provider(
        choice, probes,
        [&](const std::string& provider) {
          opened.push_back(provider);
          return provider == "verbs" ? verbs_open : efa_open;
        },
        [this](const std::string& m) { warnings.push_back(m); });
  }
};

TEST(VerbsAutoProvider, AutoOpenKeepsVerbsThatOpens) {
  const AutoOpenRun run(verbs_choice(), true, Status(), Status());
  ASSERT_TRUE(run.result.error.is_ok()) << run.result.error.message();
  EXPECT_EQ(run.result.provider, "verbs");
  EXPECT_EQ(run.opened, std::vector<std::string>{"verbs"});
  EXPECT_EQ(run.efa_probes, 0);
  EXPECT_TRUE(run.warnings.empty());
}

TEST(VerbsAutoProvider, AutoOpenFallsBackToEfaAndLogsBoth) {
  const AutoOpenRun run(verbs_choice(), true, kVerbsOpenFailed, Status());
  ASSERT_TRUE(run.result.error.is_ok()) << run.result.error.message();
  EXPECT_EQ(run.result.provider, "efa");
  EXPECT_EQ(run.opened, (std::vector<std::string>{"verbs", "efa"}));
  EXPECT_EQ(run.efa_probes, 1);
  ASSERT_EQ(run.warnings.size(), 2u);
  EXPECT_NE(run.warnings[0].find("verbs (mlx5_0 port 1 ACTIVE"), std::string::npos)
      << run.warnings[0];
  EXPECT_NE(run.warnings[0].find("ibv_open_device(mlx5_0): Permission denied"), std::string::npos)
      << run.warnings[0];
  EXPECT_NE(run.warnings[1].find("provider auto -> efa"), std::string::npos) << run.warnings[1];
  EXPECT_NE(run.warnings[1].find("fi_getinfo(efa): 1 domain"), std::string::npos)
      << run.warnings[1];
}

TEST(VerbsAutoProvider, AutoOpenWithoutEfaFailsNamingVerbsAndTheEfaProbe) {
  const AutoOpenRun run(verbs_choice(), false, kVerbsOpenFailed, Status());
  EXPECT_TRUE(run.result.provider.empty());
  EXPECT_EQ(run.opened, std::vector<std::string>{"verbs"});
  EXPECT_EQ(run.efa_probes, 1);
  EXPECT_EQ(run.result.error.code(), Code::kUnavailable);
  const std::string& m = run.result.error.message();
  EXPECT_NE(m.find("ibv_open_device(mlx5_0): Permission denied"), std::string::npos) << m;
  EXPECT_NE(m.find("no efa to fall back to: fi_getinfo(efa): no domain"), std::string::npos) << m;
  ASSERT_EQ(run.warnings.size(), 1u);
  EXPECT_NE(run.warnings[0].find("Permission denied"), std::string::npos) << run.warnings[0];
}

TEST(VerbsAutoProvider, AutoOpenWhenEfaFailsTooNamesBothAttempts) {
  const Status gid(Code::kInvalidArgument, "group 0 NIC 0 ('', provider 'verbs'): GID index 9");
  const AutoOpenRun run(verbs_choice(), true, gid, kEfaOpenFailed);
  EXPECT_TRUE(run.result.provider.empty());
  EXPECT_EQ(run.opened, (std::vector<std::string>{"verbs", "efa"}));
  EXPECT_EQ(run.result.error.code(), Code::kInvalidArgument);
  const std::string& m = run.result.error.message();
  EXPECT_NE(m.find("provider auto: verbs (mlx5_0 port 1 ACTIVE"), std::string::npos) << m;
  EXPECT_NE(m.find("('', provider 'verbs'): GID index 9"), std::string::npos) << m;
  EXPECT_NE(m.find("then efa ("), std::string::npos) << m;
  EXPECT_NE(m.find("('', provider 'efa'): fi_domain(rdmap16s27-rdm): Resource temporarily"),
            std::string::npos)
      << m;
  // The verbs attempt comes first.
  EXPECT_LT(m.find("provider 'verbs'"), m.find("provider 'efa'")) << m;
}

TEST(VerbsAutoProvider, AutoOpenOfEfaHasNoFallback) {
  ProviderChoice efa;
  efa.provider = "efa";
  efa.reason = "fi_getinfo(efa): 1 domain";
  const AutoOpenRun run(efa, true, Status(), kEfaOpenFailed);
  EXPECT_EQ(run.opened, std::vector<std::string>{"efa"});
  EXPECT_EQ(run.efa_probes, 0);
  EXPECT_EQ(run.result.error.message(), kEfaOpenFailed.message());
  EXPECT_TRUE(run.warnings.empty());
  // A failed choice opens nothing.
  ProviderProbe none;
  none.efa = false;
  const AutoOpenRun failed(engine::choose_provider(none), true, Status(), Status());
  EXPECT_TRUE(failed.opened.empty());
  EXPECT_EQ(failed.result.error.code(), Code::kUnavailable);
}

void write_file(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s << "\n";
}

// /sys/class/infiniband as on a host with a ConnectX (one port up), a second
// ConnectX with both ports down, an EFA device and a soft-RoCE device (no
// PCI parent: no device/driver).
fs::path make_fixture() {
  const fs::path root = fs::path(testing::TempDir()) / "ferry_auto_sysfs";
  fs::remove_all(root);
  const fs::path drivers = root / "drivers";
  fs::create_directories(drivers / "mlx5_core");
  fs::create_directories(drivers / "efa");
  const auto dev = [&](const std::string& name, const char* driver, const char* vendor,
                       const char* node_type) {
    const fs::path d = root / name;
    write_file(d / "node_type", node_type);
    if (driver != nullptr) {
      fs::create_directories(d / "device");
      fs::create_directory_symlink(drivers / driver, d / "device" / "driver");
      write_file(d / "device" / "vendor", vendor);
    }
    return d;
  };
  fs::path d = dev("mlx5_0", "mlx5_core", "0x15b3", "1: CA");
  write_file(d / "ports" / "1" / "state", "4: ACTIVE");
  write_file(d / "ports" / "1" / "link_layer", "Ethernet");
  d = dev("mlx5_1", "mlx5_core", "0x15b3", "1: CA");
  for (const char* p : {"2", "1"}) {
    write_file(d / "ports" / p / "state", "1: DOWN");
    write_file(d / "ports" / p / "link_layer", "InfiniBand");
  }
  write_file(d / "ports" / "not-a-port" / "state", "4: ACTIVE");
  d = dev("rdmap16s27", "efa", "0x1d0f", "7: unspecified");
  write_file(d / "ports" / "1" / "state", "4: ACTIVE");
  write_file(d / "ports" / "1" / "link_layer", "Unspecified");
  d = dev("rxe0", nullptr, nullptr, "1: CA");
  write_file(d / "ports" / "1" / "state", "4: ACTIVE");
  write_file(d / "ports" / "1" / "link_layer", "Ethernet");
  return root;
}

TEST(VerbsAutoProvider, DescribesDevicesFromSysfs) {
  EXPECT_EQ(strip_enum_number("4: ACTIVE"), "ACTIVE");
  EXPECT_EQ(strip_enum_number("1: CA"), "CA");
  EXPECT_EQ(strip_enum_number("ACTIVE"), "ACTIVE");
  EXPECT_EQ(strip_enum_number("fe80:0000"), "fe80:0000");  // not a number prefix

  const fs::path root = make_fixture();
  const auto devs =
      describe_rdma_devices(root.string(), {"rdmap16s27", "mlx5_1", "mlx5_0", "rxe0", "gone"});
  ASSERT_EQ(devs.size(), 5u);
  EXPECT_EQ(devs[0].driver, "efa");
  EXPECT_EQ(devs[0].vendor, "0x1d0f");
  EXPECT_EQ(devs[0].node_type, "unspecified");
  EXPECT_TRUE(verbs::is_efa_device(devs[0]));
  ASSERT_EQ(devs[1].ports.size(), 2u);
  EXPECT_EQ(devs[1].ports[0].number, 1);
  EXPECT_EQ(devs[1].ports[1].number, 2);
  EXPECT_EQ(devs[1].ports[0].state, "DOWN");
  EXPECT_EQ(devs[1].ports[0].link_layer, "InfiniBand");
  EXPECT_EQ(devs[2].driver, "mlx5_core");
  EXPECT_EQ(devs[2].node_type, "CA");
  ASSERT_EQ(devs[2].ports.size(), 1u);
  EXPECT_TRUE(devs[2].ports[0].active());
  EXPECT_TRUE(devs[3].driver.empty());
  EXPECT_FALSE(verbs::is_efa_device(devs[3]));
  EXPECT_TRUE(devs[4].ports.empty());

  // In libibverbs order: EFA skipped, mlx5_1 down, mlx5_0 chosen.
  ProviderProbe p;
  p.verbs_devices = devs;
  EXPECT_EQ(engine::choose_provider(p).reason,
            "mlx5_0 port 1 ACTIVE, Ethernet (RoCE), driver mlx5_core");
  // Only the EFA device and the downed ConnectX: not verbs.
  p.verbs_devices = describe_rdma_devices(root.string(), {"rdmap16s27", "mlx5_1"});
  EXPECT_FALSE(engine::choose_verbs(p.verbs_devices));
  p.efa = true;
  EXPECT_EQ(engine::choose_provider(p).provider, "efa");
  // Soft-RoCE is an RC-capable verbs device.
  p.verbs_devices = describe_rdma_devices(root.string(), {"rxe0"});
  EXPECT_EQ(engine::choose_provider(p).reason, "rxe0 port 1 ACTIVE, Ethernet (RoCE)");
  fs::remove_all(root);
}

using test::ScopedEnv;

EngineConfig shm_groups() {
  EngineConfig c;
  c.groups[0].nic_names = {"shm"};
  c.groups[0].insist = true;
  return c;
}

TEST(VerbsAutoProvider, EngineResolvesAutoOnThisHost) {
  const ProviderChoice host = engine::resolve_auto_provider();
  ScopedEnv env("FERRY_PROVIDER", nullptr);
  for (const char* provider : {"auto", ""}) {  // empty means auto
    EngineConfig c;
    c.provider = provider;
    if (!host.error.is_ok()) {
      try {
        TransferEngine e(c);
        ADD_FAILURE() << "engine started without any RDMA provider";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Code::kUnavailable);
        EXPECT_NE(std::string(e.what()).find("provider auto"), std::string::npos) << e.what();
      }
      continue;
    }
    // A host with ConnectX or EFA: the engine opens what was chosen.
    TransferEngine e(c);
    EXPECT_EQ(e.provider(), host.provider);
  }
}

TEST(VerbsAutoProvider, FerryProviderEnvironmentWinsOverAuto) {
  ScopedEnv env("FERRY_PROVIDER", "shm");
  EngineConfig c = shm_groups();
  c.provider = "";
  TransferEngine e(c);
  EXPECT_EQ(e.provider(), "shm");
}

TEST(VerbsAutoProvider, GidIndexKnobIsCheckedByTheEngine) {
  EngineConfig c = shm_groups();
  c.provider = "shm";
  c.verbs_gid_index = -2;
  try {
    TransferEngine e(c);
    ADD_FAILURE() << "verbs_gid_index -2 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("verbs_gid_index"), std::string::npos) << e.what();
  }
  // Rejected before provider "auto" probes anything: the same error on any host.
  c.provider = "auto";
  try {
    TransferEngine e(c);
    ADD_FAILURE() << "verbs_gid_index -2 accepted with provider auto";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument) << e.what();
  }
  c.provider = "shm";
  c.verbs_gid_index = 3;  // not verbs: ignored with a warning
  TransferEngine e(c);
  EXPECT_EQ(e.provider(), "shm");
}

}  // namespace
}  // namespace ferry::verbs

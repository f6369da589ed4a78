// NICs for GPU groups that name none (engine/placement.h), on the generated
// p5.48xlarge (EFA) and DGX H100 (ConnectX) trees.
#include "engine/placement.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "topo_fixtures.h"

namespace ferry::engine {
namespace {

using topo::testing::TempDir;

topo::Topology detect_machine(const topo::testing::FxMachine& m, const TempDir& dir) {
  topo::testing::write_fixture(m, dir.path());
  return topo::detect({dir.path()});
}

TEST(DefaultNics, EachGpuGetsItsOwnNearestEfaDomains) {
  TempDir dir;
  const topo::Topology t = detect_machine(topo::testing::p5_48xlarge(), dir);
  ASSERT_EQ(t.fabric_kind, topo::NicKind::kEfa);
  std::set<std::string> seen;
  for (int gpu = 0; gpu < 8; ++gpu) {
    const auto nics = topology_nics(t, Device::cuda(gpu), "efa", 4);
    ASSERT_EQ(nics.size(), 4u) << "GPU " << gpu;
    for (size_t i = 0; i < nics.size(); ++i) {
      // libfabric's efa domain of the device the topology put beside the GPU.
      EXPECT_EQ(nics[i], t.group(gpu)->nics[i].name + "-rdm") << "GPU " << gpu;
      EXPECT_TRUE(seen.insert(nics[i]).second) << nics[i] << " given to two GPUs";
    }
  }
  // Fewer than the GPU has: its first ones.
  EXPECT_EQ(topology_nics(t, Device::cuda(2), "efa", 1),
            std::vector<std::string>{t.group(2)->nics[0].name + "-rdm"});
}

TEST(DefaultNics, ConnectXDevicesForVerbs) {
  TempDir dir;
  const topo::Topology t = detect_machine(topo::testing::dgx_h100(), dir);
  ASSERT_EQ(t.fabric_kind, topo::NicKind::kVerbs);
  for (const char* provider : {"verbs", "verbs;ofi_rxm"}) {
    const auto nics = topology_nics(t, Device::cuda(5), provider, 1);
    ASSERT_EQ(nics.size(), 1u) << provider;
    EXPECT_EQ(nics[0], t.group(5)->nics[0].name) << provider;
  }
}

TEST(DefaultNics, OtherwiseTheProvidersOwnChoiceStands) {
  TempDir dir;
  const topo::Topology efa = detect_machine(topo::testing::p5_48xlarge(), dir);
  // Providers whose domains are not the topology's devices.
  for (const char* provider : {"tcp;ofi_rxm", "shm", "nvlink", "verbs"})
    EXPECT_TRUE(topology_nics(efa, Device::cuda(0), provider, 1).empty()) << provider;
  EXPECT_TRUE(topology_nics(efa, Device::host(), "efa", 1).empty());   // the host group
  EXPECT_TRUE(topology_nics(efa, Device::cuda(8), "efa", 1).empty());  // no such GPU
  EXPECT_TRUE(topology_nics(efa, Device::cuda(0), "efa", 5).empty());  // more than it has
  EXPECT_TRUE(topology_nics(efa, Device::cuda(0), "efa", 0).empty());
}

}  // namespace
}  // namespace ferry::engine

// The engine and the machine's topology: default placement, explicit
// overrides, and first-touch placement of each worker's state.
#include <gtest/gtest.h>
#include <numa.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "support/engine_config.h"

namespace ferry {
namespace {

TEST(TopologyEngine, WorkerStateLivesOnTheNodeOfItsCpu) {
  ASSERT_NE(numa_available(), -1);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  for (int cpu : {0, int(ncpu - 1)}) {
    auto cfg = test::config_for("shm");
    cfg.groups[0].worker_cpu = cpu;
    TransferEngine e(cfg);
    auto nodes = e.worker_state_numa_nodes();
    ASSERT_EQ(nodes.size(), 1u);
    EXPECT_EQ(nodes[0], numa_node_of_cpu(cpu)) << "worker pinned to CPU " << cpu;
  }
}

TEST(TopologyEngine, UnpinnedWorkerStaysOnItsGroupsNode) {
  TransferEngine e(test::config_for("shm"));
  auto nodes = e.worker_state_numa_nodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_GE(nodes[0], 0);
  EXPECT_LE(nodes[0], numa_max_node());
}

TEST(TopologyEngine, FromTopologyGivesTheHostGroupItsNicsAndACore) {
  EngineConfig c;
  try {
    c = EngineConfig::from_topology({}, 1, "tcp;ofi_rxm");
  } catch (const Error& e) {
    GTEST_SKIP() << "this machine has no NIC in its topology: " << e.what();
  }
  ASSERT_EQ(c.groups.size(), 1u);
  EXPECT_TRUE(c.groups[0].device.is_host());
  ASSERT_EQ(c.groups[0].nic_names.size(), 1u);
  EXPECT_GE(c.groups[0].worker_cpu, 0);
  EXPECT_THROW(EngineConfig::from_topology({}, 64), Error);
  EXPECT_THROW(EngineConfig::from_topology({99}, 1), Error);
}

TEST(TopologyEngine, WorkerCpuOffTheMachineIsRejectedUnlessInsisted) {
  auto cfg = test::config_for("shm");
  cfg.groups[0].worker_cpu = 100000;
  try {
    TransferEngine e(cfg);
    FAIL() << "accepted CPU 100000";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("100000"), std::string::npos) << e.what();
  }
  cfg.groups[0].insist = true;
  EXPECT_NO_THROW(TransferEngine e(cfg));
}

}  // namespace
}  // namespace ferry

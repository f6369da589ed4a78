// CUDA's device numbering from CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
// (topo/cuda_visible.h), on the generated DGX H100 tree: eight GPUs of one
// model, each under its own switch with its own NICs.
#include "topo/cuda_visible.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "engine/cuda_order.h"
#include "support/scoped_env.h"
#include "topo_fixtures.h"

namespace ferry::topo {
namespace {

using ferry::test::ScopedEnv;
using testing::TempDir;

class CudaVisible : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_fixture(testing::dgx_h100(), dir_.path());
    topo_ = detect({dir_.path()});
    ASSERT_EQ(topo_.gpus.size(), 8u);
    for (const auto& g : topo_.gpus) pci_.push_back(g.pci);
  }
  CudaOrder order(std::optional<std::string> visible, std::optional<std::string> device_order = {},
                  const std::map<PciAddr, std::string>& uuids = {}) {
    return cuda_order_from_env(topo_, CudaEnv{std::move(visible), std::move(device_order)}, uuids);
  }
  // A driver's GPU list under the fixture root: GPU i has UUID GPU-<i>abc-….
  void write_uuids() {
    for (size_t i = 0; i < pci_.size(); ++i)
      testing::write_file(
          dir_.path(), "proc/driver/nvidia/gpus/" + pci_[i].to_string() + "/information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t GPU-" +
              std::to_string(i) + "abc0000-1111-2222-3333-44445555" + std::to_string(i) +
              "\nBus Location: \t " + pci_[i].to_string() + "\n");
  }

  TempDir dir_;
  Topology topo_;
  std::vector<PciAddr> pci_;  // by PCI address, as sysfs numbers them
};

TEST_F(CudaVisible, UnsetMeansEveryGpuInPciOrder) {
  const CudaOrder o = order(std::nullopt);
  ASSERT_TRUE(o.order.has_value()) << o.note;
  EXPECT_EQ(*o.order, pci_);
  EXPECT_TRUE(o.note.empty());
}

TEST_F(CudaVisible, IndicesPickAndReorderGpus) {
  const CudaOrder o = order(" 3, 1 ");
  ASSERT_TRUE(o.order.has_value()) << o.note;
  EXPECT_EQ(*o.order, (std::vector<PciAddr>{pci_[3], pci_[1]}));
  EXPECT_TRUE(o.note.empty());
}

TEST_F(CudaVisible, AnEmptyListHidesEveryGpu) {
  const CudaOrder o = order("");
  ASSERT_TRUE(o.order.has_value());
  EXPECT_TRUE(o.order->empty());
}

TEST_F(CudaVisible, TheListEndsAtItsFirstInvalidEntry) {
  for (const char* list : {"1,9,2", "1,,2", "1,x7,2", "1,1,2", "1,-1,2"}) {
    const CudaOrder o = order(list);
    ASSERT_TRUE(o.order.has_value()) << list;
    EXPECT_EQ(*o.order, std::vector<PciAddr>{pci_[1]}) << list;
    EXPECT_NE(o.note.find("ends the list"), std::string::npos) << list << ": " << o.note;
  }
}

TEST_F(CudaVisible, UuidsAndTheirPrefixesNameGpus) {
  write_uuids();
  const auto uuids = read_gpu_uuids(dir_.path());
  ASSERT_EQ(uuids.size(), 8u);
  EXPECT_EQ(uuids.at(pci_[5]), "GPU-5abc0000-1111-2222-3333-444455555");
  // Full, with or without "GPU-", abbreviated, any case; mixed with an index.
  const CudaOrder o = order("GPU-5abc0000-1111-2222-3333-444455555,2ABC,gpu-7,0", {}, uuids);
  ASSERT_TRUE(o.order.has_value()) << o.note;
  EXPECT_EQ(*o.order, (std::vector<PciAddr>{pci_[5], pci_[2], pci_[7], pci_[0]}));
  // A prefix two UUIDs share names no single GPU: the list ends before it.
  const std::map<PciAddr, std::string> alike{
      {pci_[0], "GPU-aa11"}, {pci_[1], "GPU-aa22"}, {pci_[4], "GPU-4b"}};
  const CudaOrder ambiguous = order("GPU-4,GPU-aa,GPU-aa1", {}, alike);
  ASSERT_TRUE(ambiguous.order.has_value());
  EXPECT_EQ(*ambiguous.order, std::vector<PciAddr>{pci_[4]});
  EXPECT_NE(ambiguous.note.find("no single GPU"), std::string::npos) << ambiguous.note;
}

TEST_F(CudaVisible, WhatCannotBeMappedLeavesTheOrderUnsetAndSaysWhy) {
  const CudaOrder no_list = order("GPU-5abc");  // no driver files to read UUIDs from
  EXPECT_FALSE(no_list.order.has_value());
  EXPECT_NE(no_list.note.find("UUID"), std::string::npos) << no_list.note;
  const CudaOrder mig = order("MIG-1234abcd-0000-1111-2222-333344445555");
  EXPECT_FALSE(mig.order.has_value());
  EXPECT_NE(mig.note.find("MIG"), std::string::npos) << mig.note;
}

TEST_F(CudaVisible, MixedModelsNeedPciBusIdOrderForIndices) {
  topo_.gpus[6].device_id = uint16_t(topo_.gpus[6].device_id + 1);
  for (const std::optional<std::string>& list : {std::optional<std::string>{}, {"0,1"}}) {
    const CudaOrder o = order(list);
    EXPECT_FALSE(o.order.has_value());
    EXPECT_NE(o.note.find("PCI_BUS_ID"), std::string::npos) << o.note;
  }
  const CudaOrder pci = order("6,0", "PCI_BUS_ID");
  ASSERT_TRUE(pci.order.has_value()) << pci.note;
  EXPECT_EQ(*pci.order, (std::vector<PciAddr>{pci_[6], pci_[0]}));
  // UUIDs do not depend on the order.
  write_uuids();
  const CudaOrder by_uuid = order("GPU-6,GPU-0", {}, read_gpu_uuids(dir_.path()));
  ASSERT_TRUE(by_uuid.order.has_value()) << by_uuid.note;
  EXPECT_EQ(*by_uuid.order, (std::vector<PciAddr>{pci_[6], pci_[0]}));
}

// The engine's step: this test process has not loaded the CUDA driver, so the
// environment decides, and CUDA device 0 gets the NICs and cores of the GPU
// the list names first.
TEST_F(CudaVisible, TheEngineNumbersGroupsAsCudaDoes) {
  const std::string nic5 = topo_.group(5)->nics.at(0).name;
  const std::vector<int> cpus5 = topo_.group(5)->cpus;
  const std::string nic2 = topo_.group(2)->nics.at(0).name;
  {
    ScopedEnv visible("CUDA_VISIBLE_DEVICES", "5,2");
    const engine::CudaOrderApplied applied = engine::apply_cuda_order(topo_, dir_.path());
    EXPECT_EQ(applied.source, "environment") << applied.note;
    EXPECT_TRUE(applied.note.empty()) << applied.note;
  }
  EXPECT_EQ(topo_.visible_gpu_count(), 2u);
  EXPECT_EQ(topo_.gpu(0)->pci, pci_[5]);
  EXPECT_EQ(topo_.group(0)->nics.at(0).name, nic5);
  EXPECT_EQ(topo_.group(0)->cpus, cpus5);
  EXPECT_EQ(topo_.group(1)->nics.at(0).name, nic2);
  EXPECT_EQ(topo_.group(2), nullptr);
}

}  // namespace
}  // namespace ferry::topo

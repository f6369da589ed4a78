// CUDA's device order from the driver (cuda/device_order.h) against the
// runtime's own answer, and the topology numbered by it. SKIPPED where no GPU
// answers (CI), never passed.
#include "cuda/device_order.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/cuda_order.h"
#include "topo/topology.h"

namespace ferry {
namespace {

TEST(CudaDeviceOrder, TheDriversOrderIsTheRuntimesAndNumbersTheTopology) {
  int n = 0;
  // The runtime's first call loads and initialises the driver, as a PyTorch
  // process's first use of a GPU does.
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
  std::string why;
  const auto ids = cuda::driver_pci_bus_ids(&why);
  ASSERT_TRUE(ids.has_value()) << why;
  ASSERT_EQ(ids->size(), size_t(n));
  topo::Topology t = topo::detect();
  const engine::CudaOrderApplied applied = engine::apply_cuda_order(t);
  EXPECT_EQ(applied.source, "driver") << applied.note;
  EXPECT_TRUE(applied.note.empty()) << applied.note;
  for (int i = 0; i < n; ++i) {
    char bus[64] = {};
    ASSERT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, i), cudaSuccess);
    const auto runtime = topo::PciAddr::parse(bus);
    const auto driver = topo::PciAddr::parse((*ids)[size_t(i)]);
    ASSERT_TRUE(runtime.has_value()) << bus;
    ASSERT_TRUE(driver.has_value()) << (*ids)[size_t(i)];
    EXPECT_EQ(*driver, *runtime) << "device " << i;
    const topo::GpuInfo* gpu = t.gpu(i);
    ASSERT_NE(gpu, nullptr) << "device " << i << " not in the topology";
    EXPECT_EQ(gpu->pci, *runtime) << "device " << i;
  }
  EXPECT_EQ(t.visible_gpu_count(), size_t(n));
}

}  // namespace
}  // namespace ferry

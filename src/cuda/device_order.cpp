#include "cuda/device_order.h"

#include <fmt/format.h>

#include "cuda/driver_symbol.h"

namespace ferry::cuda {
namespace {

// From cuda.h (stable driver ABI).
constexpr int kErrNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED
constexpr int kBusIdLen = 64;

using GetCount = int (*)(int*);
using GetDevice = int (*)(int*, int);
using GetBusId = int (*)(char*, int, int);

}  // namespace

std::optional<std::vector<std::string>> driver_pci_bus_ids(std::string* why) {
  auto count_fn = reinterpret_cast<GetCount>(loaded_driver_symbol("cuDeviceGetCount"));
  auto device_fn = reinterpret_cast<GetDevice>(loaded_driver_symbol("cuDeviceGet"));
  auto bus_fn = reinterpret_cast<GetBusId>(loaded_driver_symbol("cuDeviceGetPCIBusId"));
  if (count_fn == nullptr || device_fn == nullptr || bus_fn == nullptr) {
    *why =
        "the CUDA driver is not loaded in this process (or lacks cuDeviceGetCount, cuDeviceGet or "
        "cuDeviceGetPCIBusId)";
    return std::nullopt;
  }
  int n = 0;
  if (const int r = count_fn(&n); r != 0) {
    *why = r == kErrNotInitialized ? "the CUDA driver is not initialised in this process"
                                   : fmt::format("cuDeviceGetCount failed: CUresult {}", r);
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    char bus[kBusIdLen] = {};
    if (const int r = device_fn(&dev, i); r != 0) {
      *why = fmt::format("cuDeviceGet({}) failed: CUresult {}", i, r);
      return std::nullopt;
    }
    if (const int r = bus_fn(bus, kBusIdLen, dev); r != 0) {
      *why = fmt::format("cuDeviceGetPCIBusId(device {}) failed: CUresult {}", i, r);
      return std::nullopt;
    }
    out.emplace_back(bus);
  }
  return out;
}

}  // namespace ferry::cuda

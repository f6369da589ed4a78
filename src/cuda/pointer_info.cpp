// cuPointerGetAttributes through dlsym: see pointer_info.h for why the driver
// and not the runtime (cudaPointerGetAttributes would create a context).
#include "cuda/pointer_info.h"

#include <fmt/format.h>

#include "cuda/driver_symbol.h"

namespace ferry::cuda {

#if defined(FERRY_HAS_CUDA)
namespace {

// Values from cuda.h (stable driver ABI since CUDA 9.2).
constexpr int kAttrMemoryType = 2;       // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrRangeStart = 11;      // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttrRangeSize = 12;       // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr int kAttrDeviceOrdinal = 9;    // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemTypeDevice = 2;   // CU_MEMORYTYPE_DEVICE
constexpr unsigned kMemTypeUnified = 4;  // CU_MEMORYTYPE_UNIFIED
constexpr int kErrNotInitialized = 3;    // CUDA_ERROR_NOT_INITIALIZED

using GetAttrs = int (*)(unsigned, int*, void**, unsigned long long);

GetAttrs get_attrs() {
  // If nothing in the process loaded the driver, no pointer can be device
  // memory, and loading it here would be a side effect.
  return reinterpret_cast<GetAttrs>(loaded_driver_symbol("cuPointerGetAttributes"));
}

}  // namespace

bool pointer_info(const void* p, PointerInfo* out, Status* error) {
  *out = PointerInfo{};
  if (error != nullptr) *error = Status::ok();
  GetAttrs f = get_attrs();
  if (f == nullptr) return false;
  unsigned mem_type = 0;
  int ordinal = -1;
  unsigned long long start = 0;
  size_t size = 0;
  int attrs[] = {kAttrMemoryType, kAttrDeviceOrdinal, kAttrRangeStart, kAttrRangeSize};
  void* data[] = {&mem_type, &ordinal, &start, &size};
  const int r = f(4, attrs, data, reinterpret_cast<unsigned long long>(p));
  if (r == kErrNotInitialized) return false;  // driver loaded, never initialised: no device memory
  if (r != 0) {
    // Not a pointer the driver knows in a way these attributes describe: retry
    // with the memory type only (host pointers have no range).
    int one[] = {kAttrMemoryType};
    void* one_data[] = {&mem_type};
    mem_type = 0;
    const int r2 = f(1, one, one_data, reinterpret_cast<unsigned long long>(p));
    if (r2 != 0 || (mem_type != kMemTypeDevice && mem_type != kMemTypeUnified)) return false;
    if (error != nullptr)
      *error = Status(Code::kInternal,
                      fmt::format("cuPointerGetAttributes({}) failed: CUresult {}", p, r));
    return false;
  }
  if (mem_type != kMemTypeDevice && mem_type != kMemTypeUnified) return false;
  out->device = true;
  out->ordinal = ordinal;
  out->range_start = start;
  out->range_size = size;
  return true;
}

#else

bool pointer_info(const void* p, PointerInfo* out, Status* error) {
  *out = PointerInfo{};
  if (error != nullptr)
    *error = Status(Code::kUnimplemented,
                    fmt::format("cannot tell whether {} is GPU memory: ferry was built without "
                                "CUDA (FERRY_CUDA=OFF or no toolkit)",
                                p));
  return false;
}

#endif

bool is_device_pointer(const void* p, int* ordinal, Status* error) {
  PointerInfo info;
  const bool dev = pointer_info(p, &info, error);
  if (ordinal != nullptr) *ordinal = info.ordinal;
  return dev;
}

}  // namespace ferry::cuda

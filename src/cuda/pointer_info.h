// What CUDA knows about a pointer, for registration checks. Resolved through
// the driver (libcuda.so.1, dlsym) so callers such as src/fabric need no CUDA
// headers, and so the check never initialises CUDA in a process that has not
// touched it: a process without the driver loaded and initialised cannot hold
// device memory, and forking test harnesses stay fork-safe.
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::cuda {

struct PointerInfo {
  bool device = false;  // device (or managed) memory of `ordinal`
  int ordinal = -1;
  uint64_t range_start = 0;  // the allocation holding the pointer (device memory only)
  uint64_t range_size = 0;
};

// True when `p` is CUDA device memory; *ordinal gets its device. False with an
// OK status for host memory (including pinned host memory). Without CUDA in
// the build: false and Status(kUnimplemented).
bool is_device_pointer(const void* p, int* ordinal, Status* error);

// Same, with the allocation range (for CUDA IPC: handles cover allocations).
bool pointer_info(const void* p, PointerInfo* out, Status* error);

}  // namespace ferry::cuda

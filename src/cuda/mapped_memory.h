// Memory that both the CPU and kernels address: the backing store of watcher
// words and GPU-visible immediate flags. The CUDA implementation lives in
// mapped_memory_cuda.cpp; builds without CUDA link mapped_memory_none.cpp,
// whose allocators throw Error(kUnimplemented).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ferry::cuda {

// One cache line per slot: a polled word never shares a line with another
// slot, so a GPU write to one never invalidates the line the CPU polls for
// another (and vice versa).
inline constexpr size_t kSlotBytes = 64;

struct MappedBlock {
  uint8_t* host = nullptr;  // CPU address
  uint64_t device = 0;      // address kernels use (equal to host under UVA for host memory)
  size_t bytes = 0;
  std::string kind;             // "cudaHostAlloc", "gdrcopy", "host (testing)"
  std::shared_ptr<void> owner;  // frees the memory (RAII) when the last block reference goes
};

// Pinned host memory mapped into every device (cudaHostAlloc Portable |
// Mapped), zeroed. Kernels write, the CPU polls its own cache: the right
// direction for watchers.
std::shared_ptr<MappedBlock> alloc_mapped_host(size_t bytes);

// Memory the CPU writes and kernels poll. With GDRCopy (/dev/gdrdrv present and
// libgdrapi.so loadable; FERRY_GDRCOPY=0 disables it) it is device memory the
// CPU writes through a BAR mapping, so the kernel polls its own memory;
// otherwise it is alloc_mapped_host().
std::shared_ptr<MappedBlock> alloc_flag_memory(size_t bytes);

// Plain host memory (device == host): lets tests drive the watcher machinery
// on machines without a GPU.
std::shared_ptr<MappedBlock> alloc_host_for_testing(size_t bytes);

// True when this build has CUDA (FERRY_HAS_CUDA).
bool cuda_built();

}  // namespace ferry::cuda

// Device-side helpers for the words ferry shares with kernels (docs/GPU.md):
// watcher words (kernel -> watcher thread, TransferEngine::alloc_uvm_watcher)
// and GPU-visible immediate flags (NIC worker -> kernel,
// TransferEngine::imm_counter_gpu). Header-only; include from .cu files.
//
// All accesses are at system scope: the other side is a CPU thread reading or
// writing pinned host memory (or, with GDRCopy, a BAR mapping of device
// memory), not another GPU thread.
#pragma once

#include <cstdint>

namespace ferry::device {

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Publishes v to the watcher thread. Every write this thread made before, and
// (after a __syncthreads()) every write of its block, is visible system-wide
// before the word changes: the fence makes it so for writes to any memory,
// the release store at system scope orders the word after them.
__device__ __forceinline__ void signal_watcher(uint64_t* w, uint64_t v) {
  __threadfence_system();
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(w), "l"(v) : "memory");
}

// Adds delta (several threads or kernels may bump one word); returns the value
// before. Atomic among GPU threads; the CPU only reads the word.
__device__ __forceinline__ uint64_t bump_watcher(uint64_t* w, uint64_t delta = 1) {
  __threadfence_system();
  uint64_t old;
  asm volatile("atom.release.sys.add.u64 %0, [%1], %2;"
               : "=l"(old)
               : "l"(w), "l"(delta)
               : "memory");
  return old;
}

// True once *flag has reached `expected` (wrap-safe: the NIC worker stores
// generations 1, 2, ... and never moves the flag backwards), false when
// timeout_cycles (clock64() of this SM) pass first: the caller decides what a
// timeout means instead of the kernel trapping. The acquire load orders the
// caller's later reads after the data the flag announces.
__device__ __forceinline__ bool wait_flag(const uint32_t* flag, uint32_t expected,
                                          uint64_t timeout_cycles) {
  const long long start = clock64();
  for (;;) {
    if (static_cast<int32_t>(load_acquire_sys(flag) - expected) >= 0) return true;
    if (static_cast<uint64_t>(clock64() - start) > timeout_cycles) return false;
  }
}

// Resets a flag to 0, for a flag whose counter is re-created
// (imm_counter_gpu again on the same immediate restarts at generation 1).
__device__ __forceinline__ void clear_flag(uint32_t* flag) {
  asm volatile("st.relaxed.sys.u32 [%0], 0;" ::"l"(flag) : "memory");
}

}  // namespace ferry::device

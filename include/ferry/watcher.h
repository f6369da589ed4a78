// GPU -> CPU and NIC -> GPU signalling words (docs/GPU.md).
//
// UVM watcher: TransferEngine::alloc_uvm_watcher(cb) returns a device-visible
// pointer to a 64-bit word, alone on its 64-byte cache line in pinned,
// device-mapped host memory. Kernels store increasing values into it; the
// engine's watcher thread polls every armed word and calls cb(old, new) when
// the value changes. Changes may coalesce (1 -> 3 without 2 when the kernel is
// faster than the poll) but the last value written is always delivered, and
// callbacks see values in the order the word took them. cb returns true to
// stay armed; false, or an exception (logged, never propagated), releases
// the word, after which the kernel must not touch it.
//
// GPU-visible immediate counter: TransferEngine::imm_counter_gpu(imm, n)
// returns a device-visible pointer to a 32-bit flag. Each time n more
// immediates `imm` have arrived, the NIC worker itself (no callback thread)
// stores the generation number k (1, 2, ...: arrivals / n) with a release
// store; the flag never goes backwards. Kernels wait with
// ferry::device::wait_flag(flag, k, timeout) from <ferry/device.cuh>.
//
// Memory ordering contract:
//  * kernel -> CPU: writes the CPU must see when the callback runs have to be
//    visible system-wide before the watcher word changes: __syncthreads() in
//    the writing block, then ferry::device::signal_watcher / bump_watcher
//    (__threadfence_system() followed by a release store at system scope).
//    The watcher thread reads the word with acquire loads.
//  * NIC -> kernel: the flag store happens after the worker counted the last
//    immediate, whose completion says the data is in place; the kernel reads
//    the flag with ld.acquire.sys, so its later loads see the data (host
//    memory providers; GPUDirect RDMA caveat in docs/GPU.md).
#pragma once

#include <cstdint>
#include <functional>

namespace ferry {

// Runs on the engine's watcher thread (or its first worker, WatchOn::kWorker).
// Return true to stay armed.
using WatcherCallback = std::function<bool(uint64_t old_value, uint64_t new_value)>;

// Where a watcher's word is polled and its callback runs.
//  * kWatcherThread: the engine's watcher thread (one for all such words).
//  * kWorker: the worker of the engine's first group, at the start of each turn
//    of its loop; what the callback submits is posted in that same turn, with
//    no hand-off to another thread (a host proxy relaying GPU signals to the
//    NIC). The callback must be short and must not block: it stalls that
//    group's NICs meanwhile. While such a word is armed the worker never
//    sleeps (it spins, yielding where CPUs are few), as the watcher thread does.
enum class WatchOn : uint8_t { kWatcherThread, kWorker };

}  // namespace ferry

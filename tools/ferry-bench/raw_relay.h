// The raw immediate ping-pong with the engine's thread layout and nothing
// else of it (--raw-relay): on each side a NIC thread owns the endpoint,
// polling its CQ and posting, and the application thread hands it each write
// and learns of each arrival through one cache line each way. It is the floor
// of any design where one thread owns a NIC and another asks it for work: two
// thread crossings per half round trip on top of the provider's own.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "raw_fabric.h"

namespace ferry_bench {

class RawRelay {
 public:
  // Starts the NIC thread, pinned to `cpu` (-1: not pinned). While it runs it
  // is the only user of `rf`; every requested write is a zero-byte write
  // from `src` of `imm` to (raddr, key) on NIC 0. With `yield` the thread
  // gives up its CPU after each poll that found nothing (adaptive polling:
  // threads may outnumber cores), else it spins.
  RawRelay(RawFabric& rf, int cpu, bool yield, const void* src, uint64_t raddr, uint64_t key,
           uint32_t imm);
  ~RawRelay();  // stops and joins the NIC thread
  RawRelay(const RawRelay&) = delete;
  RawRelay& operator=(const RawRelay&) = delete;

  // Application thread: one more write.
  void request() { requested_.store(++requests_, std::memory_order_release); }
  // Immediates that arrived so far.
  uint64_t arrived() const { return arrived_.load(std::memory_order_acquire); }
  // Empty, or the first post or completion error the NIC thread saw.
  std::string error() const;
  bool failed() const { return error_.load(std::memory_order_acquire) != 0; }

 private:
  void run(int cpu, bool yield);

  RawFabric& rf_;
  const void* const src_;
  const uint64_t raddr_, key_;
  const uint32_t imm_;
  uint64_t requests_ = 0;  // the application thread's own count
  // One line each: the application thread writes requested_, the NIC thread
  // arrived_; neither reads a line the other writes beyond these.
  alignas(64) std::atomic<uint64_t> requested_{0};
  alignas(64) std::atomic<uint64_t> arrived_{0};
  alignas(64) std::atomic<bool> stop_{false};
  std::atomic<int> error_{0};
  std::thread thread_;
};

}  // namespace ferry_bench

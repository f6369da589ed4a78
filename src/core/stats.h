// Engine statistics as the threads that do the work keep them: every counter
// has one writer (a worker, the callback thread, the watcher thread) and is
// read, relaxed, by a snapshot on any thread (engine/stats.cpp). A single
// writer needs no read-modify-write: load + store of a relaxed atomic is a
// plain add, so the hot path takes no lock and no locked instruction. Counts
// several threads share (counter waits) use fetch_add and stay off the
// worker's path.
//
// FERRY_STATS=0 (CMake -DFERRY_STATS=OFF) compiles every update out; the
// snapshot then reports enabled = false and zeros.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/sharding.h"
#include "ferry/status.h"

#ifndef FERRY_STATS
#define FERRY_STATS 1
#endif

namespace ferry::core {

inline constexpr bool kStatsEnabled = FERRY_STATS != 0;

// The engine's timestamps: steady_clock in nanoseconds. ns_of converts a clock
// reading a caller already holds, so one read serves a deadline and a statistic.
inline int64_t ns_of(std::chrono::steady_clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
inline int64_t now_ns() {
  return ns_of(std::chrono::steady_clock::now());
}

// One writer thread; readers see a value that is at most a little stale.
class StatCounter {
 public:
  void add(uint64_t n = 1) {
    if constexpr (kStatsEnabled)
      v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void set(uint64_t n) {
    if constexpr (kStatsEnabled) v_.store(n, std::memory_order_relaxed);
  }
  uint64_t get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Latencies in nanoseconds, log2 buckets: bucket i holds values below
// 2^(kFirstShift + i) ns (1.02 us, 2.05 us, ... 8.6 s), the last one the rest.
class StatHistogram {
 public:
  static constexpr int kFirstShift = 10;
  static constexpr int kBuckets = 25;  // 24 bounded + overflow
  static int bucket_of(uint64_t ns) {
    const int b = ns == 0 ? 0 : 64 - std::countl_zero(ns) - kFirstShift;
    return b < 0 ? 0 : (b >= kBuckets ? kBuckets - 1 : b);
  }
  // Upper bound of bucket i in nanoseconds (the last one is unbounded).
  static uint64_t upper_ns(int i) { return uint64_t(1) << (kFirstShift + i); }

  // Single writer.
  void record(uint64_t ns) {
    if constexpr (kStatsEnabled) {
      bump(buckets_[size_t(bucket_of(ns))], 1);
      bump(sum_, ns);
    }
  }
  // Any number of writers.
  void record_shared(uint64_t ns) {
    if constexpr (kStatsEnabled) {
      buckets_[size_t(bucket_of(ns))].fetch_add(1, std::memory_order_relaxed);
      sum_.fetch_add(ns, std::memory_order_relaxed);
    }
  }
  uint64_t bucket(int i) const { return buckets_[size_t(i)].load(std::memory_order_relaxed); }
  uint64_t sum_ns() const { return sum_.load(std::memory_order_relaxed); }

 private:
  static void bump(std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> sum_{0};
};

// Counts of one (NIC, peer) pair of a worker.
struct PeerCounters {
  std::string name;  // written before the entry is published, never after
  uint8_t nic = 0;
  StatCounter writes_posted, bytes_posted, sends_posted;
  StatCounter backpressure;  // posts the provider refused for now (-FI_EAGAIN, queue full)
  StatCounter post_errors;
  StatCounter transfers_ok, transfers_failed, bytes_ok;
};

struct NicCounters {
  StatCounter writes_completed, completion_errors;
  StatCounter bytes_completed;  // bytes of transfers that finished OK, per NIC they used
  StatCounter imms_received, imm_errors, recvs;
  StatCounter outstanding, pending;  // gauges: posted not completed; cursors waiting to post
};

// Immediates received per value: an open-addressed table of the first
// kSlots values seen (by far the common case: a few counters per layer or
// step); later values are counted together as "other".
class ImmValueCounts {
 public:
  static constexpr size_t kSlots = 128;
  void add(uint32_t imm, uint64_t n) {
    if constexpr (kStatsEnabled) {
      const uint64_t key = uint64_t(imm) + 1;
      size_t i = (imm * 2654435761u) % kSlots;
      for (size_t probe = 0; probe < 8; ++probe, i = (i + 1) % kSlots) {
        const uint64_t k = keys_[i].load(std::memory_order_relaxed);
        if (k == key) {
          counts_[i].add(n);
          return;
        }
        if (k == 0) {
          counts_[i].add(n);
          keys_[i].store(key, std::memory_order_release);
          return;
        }
      }
      other_.add(n);
    }
  }
  // Reader: value + 1 (0 = empty) and count of slot i.
  uint64_t key(size_t i) const { return keys_[i].load(std::memory_order_acquire); }
  uint64_t count(size_t i) const { return counts_[i].get(); }
  uint64_t other() const { return other_.get(); }

 private:
  std::array<std::atomic<uint64_t>, kSlots> keys_{};
  std::array<StatCounter, kSlots> counts_{};
  StatCounter other_;
};

inline constexpr size_t kCodeCount = size_t(Code::kAborted) + 1;

// Everything one worker counts. Peers are appended by the worker (the first
// time it resolves an address on a NIC) and published with a release store
// of their number; a snapshot reads only published entries.
class WorkerCounters {
 public:
  static constexpr size_t kMaxPeers = 256;  // the last entry collects the rest
  static constexpr uint32_t kNoPeer = UINT32_MAX;

  WorkerCounters() : peers_(std::make_unique<PeerCounters[]>(kMaxPeers)) {}

  // --- worker thread ---------------------------------------------------
  void peer_resolved(uint8_t nic, uint64_t peer_id, std::string name) {
    if constexpr (!kStatsEnabled) return;
    auto& index = by_peer_[nic];
    if (index.count(peer_id)) return;
    uint32_t n = published_.load(std::memory_order_relaxed);
    uint32_t at = n;
    if (n >= kMaxPeers - 1) {
      at = kMaxPeers - 1;
      if (n == kMaxPeers - 1) {
        peers_[at].name = "other";
        peers_[at].nic = nic;
        published_.store(kMaxPeers, std::memory_order_release);
      }
    } else {
      peers_[at].name = std::move(name);
      peers_[at].nic = nic;
      published_.store(n + 1, std::memory_order_release);
    }
    index[peer_id] = at;
  }
  // Null when the peer was never resolved on that NIC (or stats are off).
  PeerCounters* peer(uint8_t nic, uint64_t peer_id) {
    if constexpr (!kStatsEnabled) return nullptr;
    // One cached lookup: consecutive posts almost always go to the same peer.
    if (nic == last_nic_ && peer_id == last_id_ && last_ != nullptr) return last_;
    auto& index = by_peer_[nic];
    auto it = index.find(peer_id);
    if (it == index.end()) return nullptr;
    last_nic_ = nic;
    last_id_ = peer_id;
    last_ = &peers_[it->second];
    return last_;
  }
  void forget_peer(uint8_t nic, uint64_t peer_id) {
    by_peer_[nic].erase(peer_id);
    last_ = nullptr;
  }

  std::array<NicCounters, kMaxNics> nic;
  ImmValueCounts imms;
  std::array<StatCounter, kCodeCount> outcomes;  // transfers finished, by code (kOk = 0)
  StatHistogram transfer_latency;                // submit -> the user is told
  StatHistogram queue_delay;                     // submit -> the worker takes it
  StatCounter registrations, registered_bytes;
  StatHistogram registration_time;

  // --- any thread --------------------------------------------------------
  size_t peer_count() const { return published_.load(std::memory_order_acquire); }
  const PeerCounters& peer_at(size_t i) const { return peers_[i]; }

 private:
  std::unique_ptr<PeerCounters[]> peers_;
  std::atomic<uint32_t> published_{0};
  std::array<std::unordered_map<uint64_t, uint32_t>, kMaxNics> by_peer_;
  uint8_t last_nic_ = 0;
  uint64_t last_id_ = 0;
  PeerCounters* last_ = nullptr;
};

// The timeline (engine/trace.cpp writes it as Chrome trace-event JSON).
struct TraceEvent {
  enum Kind : uint8_t { kTransfer, kImm, kError };
  int64_t start_ns = 0, first_post_ns = 0, end_ns = 0;
  int64_t picked_ns = 0;  // the worker (or a thread posting for it) took the command up
  uint64_t id = 0;        // transfer id; immediate value
  uint64_t bytes = 0;     // transfer bytes; immediate count
  uint32_t writes = 0;
  Kind kind = kTransfer;
  uint8_t nic = 0;
  uint8_t code = 0;  // Code of the outcome
  uint8_t op = 0;    // TransferReq alternative (requests.h)
};

// Bounded: once full, each event overwrites the oldest (counted as dropped).
// Written by one thread, read only after that thread has stopped; dropped()
// may be read at any time.
class TraceRing {
 public:
  explicit TraceRing(size_t capacity) : events_(capacity == 0 ? 1 : capacity) {}
  void push(const TraceEvent& e) {
    const uint64_t n = next_.load(std::memory_order_relaxed);
    events_[size_t(n % events_.size())] = e;
    next_.store(n + 1, std::memory_order_relaxed);
  }
  uint64_t dropped() const {
    const uint64_t n = next_.load(std::memory_order_relaxed);
    return n > events_.size() ? n - events_.size() : 0;
  }
  template <typename F>
  void for_each(F&& f) const {
    const uint64_t end = next_.load(std::memory_order_relaxed);
    for (uint64_t i = dropped(); i < end; ++i) f(events_[size_t(i % events_.size())]);
  }

 private:
  std::vector<TraceEvent> events_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace ferry::core

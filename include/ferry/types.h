// Value types of the public API (seed Figure 2, rendered in C++).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/status.h"

namespace ferry {

using TransferId = uint64_t;

// Where a registered region lives.
struct Device {
  enum class Kind : uint8_t { kHost = 0, kCuda = 1 };
  Kind kind = Kind::kHost;
  int ordinal = 0;

  static Device host() { return {}; }
  static Device cuda(int ordinal) { return {Kind::kCuda, ordinal}; }
  bool is_host() const { return kind == Kind::kHost; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

// Transport family of one NIC endpoint; part of every address so that an
// address of one family is never handed to a domain of another.
enum class Transport : uint8_t {
  kFabric = 1,
  kVerbs = 2,
  kNvlink = 3,
  kFake = 4
};  // kFake: src/testing

// The address of one NIC endpoint of one engine incarnation. Opaque bytes:
//   u8 version | u8 transport | u64 incarnation (LE) | u16 raw length (LE) | raw
// The incarnation is random per engine start, so an address (or descriptor)
// of a previous run of a peer is recognisably stale.
class NetAddr {
 public:
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kHeaderSize = 12;
  static constexpr size_t kMaxRawSize = 1024;

  NetAddr() = default;
  NetAddr(Transport t, uint64_t incarnation, std::span<const uint8_t> raw);

  // Validating decoders: throw Error(kInvalidArgument) with the reason.
  static NetAddr from_bytes(std::span<const uint8_t> bytes);
  static NetAddr from_hex(std::string_view hex);

  std::span<const uint8_t> bytes() const {
    return bytes_ ? std::span<const uint8_t>(*bytes_) : std::span<const uint8_t>();
  }
  std::string to_hex() const;
  bool empty() const { return !bytes_; }
  Transport transport() const;
  uint64_t incarnation() const;
  std::span<const uint8_t> raw() const;
  // Short human form for log and error messages: "fabric:1a2b…(inc 3f…)".
  std::string brief() const;

  bool operator==(const NetAddr& o) const {
    return bytes_ == o.bytes_ || (hash_ == o.hash_ && bytes_ && o.bytes_ && *bytes_ == *o.bytes_);
  }
  size_t hash() const noexcept { return hash_; }

 private:
  // Immutable and shared: addresses are copied into every request, so a copy
  // is a reference-count increment and the hash is computed once.
  std::shared_ptr<const std::vector<uint8_t>> bytes_;
  size_t hash_ = 0;
};

// Local handle of a registered region: the base pointer plus a generation-
// tagged id, so a handle used after unreg_mr is detected instead of reused.
struct MrHandle {
  void* ptr = nullptr;
  uint64_t id = 0;
  bool operator==(const MrHandle&) const = default;
};

// Serialisable remote descriptor of a registered region: everything a peer
// needs to write into it through any of the owner's NICs.
struct MrDesc {
  struct Nic {
    NetAddr addr;       // the owning engine's NIC endpoint
    uint64_t rkey = 0;  // remote key on that NIC
    uint64_t base = 0;  // remote address of byte 0 (ptr in virtual-address mode, 0 in offset mode)
    bool operator==(const Nic&) const = default;
  };
  // Version 1: writable regions (the form every build reads); version 2 adds
  // a flags byte, written only for regions that are not write targets.
  static constexpr uint8_t kVersion = 1;
  static constexpr uint8_t kVersionFlags = 2;
  static constexpr uint8_t kFlagReadOnly = 1;

  uint64_t ptr = 0;  // owner's virtual base address (informational)
  uint64_t len = 0;  // bytes; writes past it are rejected before posting
  Device device;
  // False when the owner registered memory it cannot write (PROT_READ pages,
  // a read-only array): every write to it (immediates and barriers included)
  // fails on the sender with kFailedPrecondition before anything is posted,
  // and the NICs' keys grant no remote write either.
  bool writable = true;
  std::vector<Nic> nics;  // one per NIC of the owner's group, in NIC order

  std::vector<uint8_t> to_bytes() const;
  static MrDesc from_bytes(std::span<const uint8_t> bytes);  // throws Error(kInvalidArgument)
  std::string to_hex() const;
  static MrDesc from_hex(std::string_view hex);
  bool operator==(const MrDesc&) const = default;
};

// Page i covers [offset + indices[i] * stride, + page_len) of its region.
struct Pages {
  std::vector<uint32_t> indices;
  uint64_t stride = 0;
  uint64_t offset = 0;
};

struct ScatterDst {
  uint64_t len = 0;
  uint64_t src_offset = 0;
  MrDesc dst;
  uint64_t dst_offset = 0;
};

// How a single write (or an immediate) is placed on the group's NICs.
struct WriteRoute {
  enum class Kind : uint8_t {
    kSplit,       // cut into up to max_shards pieces of >= min_piece bytes, one per NIC
    kPinned,      // whole write on NIC `nic`
    kRoundRobin,  // whole write on the next NIC of a per-group rotation
  };
  Kind kind = Kind::kSplit;
  uint8_t nic = 0;
  uint8_t max_shards = 0;          // 0 = all NICs of the group
  uint64_t min_piece = 256 << 10;  // below this a write is not split further

  static WriteRoute split(uint8_t max_shards = 0, uint64_t min_piece = 256 << 10) {
    return {Kind::kSplit, 0, max_shards, min_piece};
  }
  static WriteRoute pinned(uint8_t nic) { return {Kind::kPinned, nic, 0, 0}; }
  static WriteRoute round_robin() { return {Kind::kRoundRobin, 0, 0, 0}; }
};

// How scatter and barrier spread their targets over the group's NICs.
struct GroupRoute {
  enum class Kind : uint8_t {
    kShardPeers,  // targets divided into contiguous runs, one run per NIC; 1 write per target
    kShardBytes,  // every target's bytes divided over all NICs; up to N writes per target
    kPinned,      // everything on NIC `nic`
  };
  Kind kind = Kind::kShardPeers;
  uint8_t nic = 0;
  static GroupRoute shard_peers() { return {Kind::kShardPeers, 0}; }
  static GroupRoute shard_bytes() { return {Kind::kShardBytes, 0}; }
  static GroupRoute pinned(uint8_t nic) { return {Kind::kPinned, nic}; }
};

using PeerGroupHandle = uint32_t;

// Completion of a transfer on the initiator: all local work done (the NICs
// reported every piece). Remote visibility is signalled only by immediates.
class OnDone {
 public:
  using Callback = std::function<void(const Status&)>;
  struct Counter {
    std::atomic<uint64_t>* done = nullptr;    // +1 when the transfer ends, success or not
    std::atomic<uint64_t>* errors = nullptr;  // +1 (before done) when it failed; may be null
  };
  struct Flag {
    std::atomic<bool>* done = nullptr;    // set when the transfer ends
    std::atomic<bool>* failed = nullptr;  // set (before done) when it failed; may be null
  };

  OnDone() = default;
  OnDone(Callback cb) : v_(std::move(cb)) {}  // NOLINT: implicit from a lambda is the point
  template <typename F, typename = std::enable_if_t<std::is_invocable_v<F, const Status&>>>
  OnDone(F f) : v_(Callback(std::move(f))) {}  // NOLINT

  static OnDone callback(Callback cb) { return OnDone(std::move(cb)); }
  static OnDone counter(std::atomic<uint64_t>& done, std::atomic<uint64_t>* errors = nullptr) {
    OnDone d;
    d.v_ = Counter{&done, errors};
    return d;
  }
  static OnDone flag(std::atomic<bool>& done, std::atomic<bool>* failed = nullptr) {
    OnDone d;
    d.v_ = Flag{&done, failed};
    return d;
  }
  static OnDone none() { return {}; }

  bool empty() const { return std::holds_alternative<std::monostate>(v_); }
  bool needs_callback_thread() const { return std::holds_alternative<Callback>(v_); }
  // Counters and flags are updated in place (by the worker, no thread hop);
  // callbacks must be run on the callback thread via invoke().
  void signal_inline(const Status& s) const;
  void invoke(const Status& s) const;

 private:
  std::variant<std::monostate, Callback, Counter, Flag> v_;
};

using RecvCallback = std::function<void(std::span<const uint8_t> msg)>;
using ImmCallback = std::function<void(uint32_t imm)>;
using ImmCountCallback = std::function<void()>;

}  // namespace ferry

template <>
struct std::hash<ferry::NetAddr> {
  size_t operator()(const ferry::NetAddr& a) const noexcept { return a.hash(); }
};

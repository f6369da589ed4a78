// Completion accounting for the verbs domain, free of verbs calls:
//  - wr_id tags: every work request says what it is (kind), which slot it
//    used and that slot's generation. The kind comes from the tag, never from
//    wc.opcode, which verbs leaves undefined on error completions.
//  - CqCredits: every posted WR (send queue or receive queue, user or
//    internal) yields at most one CQE on the one shared CQ, so taking one
//    credit per WR before posting and returning it per CQE keeps the CQ from
//    ever overflowing (an overflow is a fatal async event on ConnectX).
//  - OpTable: fixed pool of slots carrying the engine's ctx, allocated once.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/domain.h"

namespace ferry::verbs {

enum class WrKind : uint8_t {
  kNone = 0,
  kWrite = 1,    // RDMA write (with or without immediate) on a peer's rma QP
  kSend = 2,     // send on a peer's msg QP
  kRecv = 3,     // user receive on the msg SRQ
  kRmaRecv = 4,  // internal zero-length receive on the rma SRQ (consumed by write-with-imm)
  kUdRecv = 5,   // internal handshake receive on the UD QP
  kUdSend = 6,   // internal handshake send on the UD QP
};
const char* wr_kind_name(WrKind k) noexcept;

// wr_id = kind (8 bits) | generation (24 bits) | index (32 bits)
inline constexpr uint64_t make_wr_id(WrKind kind, uint32_t gen, uint32_t index) noexcept {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(gen & 0xFFFFFF) << 32) |
         index;
}
inline constexpr WrKind wr_kind(uint64_t wr_id) noexcept {
  return static_cast<WrKind>(wr_id >> 56);
}
inline constexpr uint32_t wr_gen(uint64_t wr_id) noexcept {
  return static_cast<uint32_t>(wr_id >> 32) & 0xFFFFFF;
}
inline constexpr uint32_t wr_index(uint64_t wr_id) noexcept {
  return static_cast<uint32_t>(wr_id);
}

class CqCredits {
 public:
  explicit CqCredits(size_t capacity) noexcept : capacity_(capacity) {}
  // Takes up to `want`; returns how many were granted (back-pressure below).
  size_t take(size_t want) noexcept {
    const size_t got = want < available() ? want : available();
    used_ += got;
    return got;
  }
  void give(size_t n) noexcept { used_ = n > used_ ? 0 : used_ - n; }
  size_t available() const noexcept { return capacity_ - used_; }
  size_t used() const noexcept { return used_; }
  size_t capacity() const noexcept { return capacity_; }

 private:
  size_t capacity_;
  size_t used_ = 0;
};

struct OpSlot {
  uint64_t user_ctx = 0;
  uint32_t owner = 0;  // QP slot of a write/send, for per-QP outstanding counts
  uint32_t gen = 0;
  WrKind kind = WrKind::kNone;  // kNone = free
};

class OpTable {
 public:
  explicit OpTable(size_t capacity);
  OpTable(const OpTable&) = delete;
  OpTable& operator=(const OpTable&) = delete;

  // 0 when every slot is in flight (0 is never a valid tag: kind >= 1).
  uint64_t acquire(WrKind kind, uint64_t user_ctx, uint32_t owner) noexcept;
  // The slot a tag names, or nullptr when it is stale, free or not a slot tag.
  OpSlot* lookup(uint64_t wr_id) noexcept;
  void release(uint64_t wr_id) noexcept;
  size_t in_use() const noexcept { return capacity_ - free_count_; }
  size_t capacity() const noexcept { return capacity_; }

 private:
  size_t capacity_;
  std::unique_ptr<OpSlot[]> slots_;
  std::unique_ptr<uint32_t[]> free_;
  size_t free_count_;
};

// What the datapath must do with one CQE besides handing *out to the engine.
struct WcOutcome {
  bool emit = false;  // *out holds a Completion
  WrKind kind = WrKind::kNone;
  uint32_t index = 0;       // internal buffer of kRmaRecv / kUdRecv / kUdSend
  uint32_t owner = 0;       // QP slot of a kWrite / kSend (valid when slot_found)
  bool slot_found = false;  // a kWrite / kSend / kRecv tag matched a live slot
  bool repost = false;      // re-post internal receive `index` (it was consumed)
  bool ud_payload = false;  // kUdRecv success: a handshake datagram is in buffer `index`
};

class CompletionTracker {
 public:
  CompletionTracker(std::string nic_name, size_t cq_capacity, size_t op_capacity);

  CqCredits& credits() noexcept { return credits_; }
  OpTable& ops() noexcept { return ops_; }

  // Maps one CQE: returns its credit, releases its slot, fills *out when the
  // engine must hear about it. Allocates only to build an error message.
  WcOutcome on_wc(const ibv_wc& wc, core::Completion* out);

 private:
  Status wc_error(const ibv_wc& wc, const char* what) const;

  std::string nic_;
  CqCredits credits_;
  OpTable ops_;
};

}  // namespace ferry::verbs

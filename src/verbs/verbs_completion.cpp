#include "verbs/verbs_completion.h"

#include <arpa/inet.h>

#include <fmt/format.h>

#include "core/log.h"

namespace ferry::verbs {

const char* wr_kind_name(WrKind k) noexcept {
  switch (k) {
    case WrKind::kWrite:
      return "write";
    case WrKind::kSend:
      return "send";
    case WrKind::kRecv:
      return "recv";
    case WrKind::kRmaRecv:
      return "immediate receive";
    case WrKind::kUdRecv:
      return "handshake receive";
    case WrKind::kUdSend:
      return "handshake send";
    case WrKind::kNone:
      break;
  }
  return "unknown work request";
}

OpTable::OpTable(size_t capacity)
    : capacity_(capacity),
      slots_(std::make_unique<OpSlot[]>(capacity)),
      free_(std::make_unique<uint32_t[]>(capacity)),
      free_count_(capacity) {
  // Lowest index on top: recently used slots stay warm in cache.
  for (size_t i = 0; i < capacity; ++i) free_[i] = static_cast<uint32_t>(capacity - 1 - i);
}

uint64_t OpTable::acquire(WrKind kind, uint64_t user_ctx, uint32_t owner) noexcept {
  if (free_count_ == 0) return 0;
  const uint32_t idx = free_[--free_count_];
  OpSlot& s = slots_[idx];
  s.user_ctx = user_ctx;
  s.owner = owner;
  s.kind = kind;
  s.gen = (s.gen + 1) & 0xFFFFFF;
  return make_wr_id(kind, s.gen, idx);
}

OpSlot* OpTable::lookup(uint64_t wr_id) noexcept {
  const uint32_t idx = wr_index(wr_id);
  if (idx >= capacity_) return nullptr;
  OpSlot& s = slots_[idx];
  if (s.kind == WrKind::kNone || s.kind != wr_kind(wr_id) || s.gen != wr_gen(wr_id)) {
    return nullptr;
  }
  return &s;
}

void OpTable::release(uint64_t wr_id) noexcept {
  OpSlot* s = lookup(wr_id);
  if (s == nullptr) return;
  s->kind = WrKind::kNone;
  free_[free_count_++] = wr_index(wr_id);
}

CompletionTracker::CompletionTracker(std::string nic_name, size_t cq_capacity, size_t op_capacity)
    : nic_(std::move(nic_name)), credits_(cq_capacity), ops_(op_capacity) {}

Status CompletionTracker::wc_error(const ibv_wc& wc, const char* what) const {
  // Only status, vendor_err, wr_id and qp_num are defined on an error CQE.
  const Code code = wc.status == IBV_WC_WR_FLUSH_ERR ? Code::kAborted : Code::kUnavailable;
  return Status(code, fmt::format("verbs NIC '{}': {} failed: {} (wc status {}, vendor_err {:#x}, "
                                  "qp {:#x})",
                                  nic_, what, ibv_wc_status_str(wc.status),
                                  static_cast<int>(wc.status), wc.vendor_err, wc.qp_num));
}

namespace {

void fill(core::Completion* out, core::Completion::Kind kind, uint64_t ctx, uint64_t len,
          uint32_t imm) {
  out->kind = kind;
  out->ctx = ctx;
  out->len = len;
  out->imm = imm;
  out->count = 1;  // the worker reuses its entries: every field is set
  out->status = Status();
}

}  // namespace

WcOutcome CompletionTracker::on_wc(const ibv_wc& wc, core::Completion* out) {
  credits_.give(1);
  WcOutcome r;
  r.kind = wr_kind(wc.wr_id);
  const bool ok = wc.status == IBV_WC_SUCCESS;
  switch (r.kind) {
    case WrKind::kWrite:
    case WrKind::kSend:
    case WrKind::kRecv: {
      OpSlot* s = ops_.lookup(wc.wr_id);
      if (s == nullptr) {
        core::log().warn("verbs NIC '{}': completion for unknown {} tag {:#x} (status {}) ignored",
                         nic_, wr_kind_name(r.kind), wc.wr_id, ibv_wc_status_str(wc.status));
        return r;
      }
      r.slot_found = true;
      r.owner = s->owner;
      const auto kind = r.kind == WrKind::kWrite  ? core::Completion::Kind::kWrite
                        : r.kind == WrKind::kSend ? core::Completion::Kind::kSend
                                                  : core::Completion::Kind::kRecv;
      fill(out, kind, s->user_ctx, ok && r.kind == WrKind::kRecv ? wc.byte_len : 0, 0);
      if (!ok) out->status = wc_error(wc, wr_kind_name(r.kind));
      ops_.release(wc.wr_id);
      r.emit = true;
      return r;
    }
    case WrKind::kRmaRecv:
      r.index = wr_index(wc.wr_id);
      if (!ok) {
        // A flush means the SRQ is going away: the buffer must not come back.
        r.repost = wc.status != IBV_WC_WR_FLUSH_ERR;
        fill(out, core::Completion::Kind::kRemoteImm, 0, 0, 0);
        out->status = wc_error(wc, wr_kind_name(r.kind));
        r.emit = wc.status != IBV_WC_WR_FLUSH_ERR;
        return r;
      }
      r.repost = true;
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
        fill(out, core::Completion::Kind::kRemoteImm, 0, 0, ntohl(wc.imm_data));
        r.emit = true;
      } else {
        // Peers only write on the rma QP; a send there is a protocol bug.
        core::log().warn(
            "verbs NIC '{}': unexpected opcode {} ({} bytes) on the rma SRQ from qp "
            "{:#x}",
            nic_, static_cast<int>(wc.opcode), wc.byte_len, wc.src_qp);
      }
      return r;
    case WrKind::kUdRecv:
      r.index = wr_index(wc.wr_id);
      if (ok) {
        r.ud_payload = true;
        r.repost = true;
      } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        core::log().warn("{}", wc_error(wc, wr_kind_name(r.kind)).message());
        r.repost = true;
      }
      return r;
    case WrKind::kUdSend:
      r.index = wr_index(wc.wr_id);
      if (!ok) core::log().debug("{}", wc_error(wc, wr_kind_name(r.kind)).message());
      return r;
    case WrKind::kNone:
      break;
  }
  core::log().warn("verbs NIC '{}': completion with foreign wr_id {:#x} (status {}) ignored", nic_,
                   wc.wr_id, ibv_wc_status_str(wc.status));
  return r;
}

}  // namespace ferry::verbs

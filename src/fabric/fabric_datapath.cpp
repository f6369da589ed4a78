// libfabric Domain data path: post_writes / post_send / post_recv / poll.
// Nothing here allocates except to build the message of an error Status.
//
// What libfabric 1.17 providers do (measured by tests/unit/fabric_domain_test.cpp,
// asking with mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA):
// - tcp;ofi_rxm and shm return mode 0: neither needs FI_CONTEXT(2) nor sets
//   FI_RX_CQ_DATA, so a peer's write with remote CQ data does NOT consume a
//   posted receive; it arrives as FI_REMOTE_CQ_DATA|FI_RMA|FI_REMOTE_WRITE
//   with op_context == NULL. We still pass a pooled fi_context2 with every op
//   and keep the FI_RX_CQ_DATA path (internal zero-byte receives, re-posting
//   a caller's receive that remote CQ data consumed) for providers that set
//   it.
// - mr_mode granted: tcp;ofi_rxm 0 (offset addressing, caller-chosen keys, no
//   local descriptors needed); shm FI_MR_VIRT_ADDR only (caller-chosen keys).
// - Zero-byte writes with msg_iov = NULL / iov_count = 0 work on both; the
//   1-entry empty iovec fallback below exists for providers answering EINVAL.
// - Writes complete at transmit on both: a write to a bad rkey is rejected
//   and logged at the target but the initiator gets a successful completion
//   (no data, no immediate lands). FI_DELIVERY_COMPLETE would turn that into
//   an error on tcp but never completes zero-byte or bad-key writes on shm,
//   so it is not used.
// - FI_WAIT_FD: tcp;ofi_rxm supports it; shm's fi_cq_open refuses it
//   (FI_ENOSYS), so shm domains report wait_fd() == -1.
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>

#include <fmt/format.h>
#include "core/log.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

namespace {

constexpr size_t kCqBatch = 16;

core::Completion::Kind completion_kind(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kSend:
      return core::Completion::Kind::kSend;
    case OpKind::kRecv:
    case OpKind::kInternalRecv:
      return core::Completion::Kind::kRecv;
    case OpKind::kWrite:
    case OpKind::kFree:
      break;
  }
  return core::Completion::Kind::kWrite;
}

// A completion is the target side of a peer's write-with-data when the flags
// say so; op_context is then null unless the provider consumed one of our
// receives for it (FI_RX_CQ_DATA), in which case FI_RECV may be set too.
bool is_remote_write(uint64_t flags, const OpEntry* op) noexcept {
  if ((flags & FI_REMOTE_WRITE) != 0) return true;
  if ((flags & FI_REMOTE_CQ_DATA) == 0) return false;
  return (flags & FI_RMA) != 0 || op == nullptr || (flags & FI_RECV) == 0;
}

void fill(core::Completion* out, core::Completion::Kind kind, uint64_t ctx, uint64_t len,
          uint32_t imm) {
  out->kind = kind;
  out->ctx = ctx;
  out->len = len;
  out->imm = imm;
  out->count = 1;
  out->status = Status();
}

}  // namespace

Status FabricDomain::post_error(const char* call, ssize_t ret) const {
  return Status(Code::kUnavailable,
                fmt::format("fabric NIC '{}': {} failed: {} ({})", res_->nic_name, call,
                            fi_strerror(static_cast<int>(-ret)), ret));
}

core::PostResult FabricDomain::post_writes(std::span<const core::WriteDesc> writes) {
  core::PostResult result;
  for (const core::WriteDesc& w : writes) {
    OpEntry* op = pool_->acquire(OpKind::kWrite, w.ctx);
    if (op == nullptr) break;  // every context in flight: back-pressure

    // FI_COMPLETION: the engine counts a local completion for every write,
    // even on an endpoint bound with selective completion.
    uint64_t flags = FI_COMPLETION;
    msg_.data = 0;
    if (w.has_imm) {
      flags |= FI_REMOTE_CQ_DATA;
      msg_.data = w.imm;
    }
    msg_.addr = w.peer;
    msg_.context = op;
    iov_.iov_base = const_cast<void*>(w.src);
    iov_.iov_len = w.len;
    desc_[0] = w.local_desc;
    // The target side always gets a valid rma_iov (EFA checks key and address
    // even for zero bytes).
    rma_iov_.addr = w.remote_addr;
    rma_iov_.len = w.len;
    rma_iov_.key = w.rkey;
    const bool no_iov = w.len == 0 && !zero_len_needs_iov_;
    msg_.msg_iov = no_iov ? nullptr : &iov_;
    msg_.desc = no_iov ? nullptr : desc_;
    msg_.iov_count = no_iov ? 0 : 1;

    ssize_t ret = fi_writemsg(ep_, &msg_, flags);
    if (ret == -FI_EINVAL && no_iov) {
      // Remember the provider's preference and retry with an empty iovec.
      core::log().debug("fabric NIC '{}': zero-length write needs a 1-entry iovec", res_->nic_name);
      zero_len_needs_iov_ = true;
      msg_.msg_iov = &iov_;
      msg_.desc = desc_;
      msg_.iov_count = 1;
      ret = fi_writemsg(ep_, &msg_, flags);
    }
    if (ret == 0) {
      ++result.posted;
      continue;
    }
    pool_->release(op);
    // -FI_EAGAIN: queue full; the caller's next poll drives progress.
    if (ret != -FI_EAGAIN) result.error = post_error("fi_writemsg", ret);
    break;
  }
  return result;
}

core::PostResult FabricDomain::post_send(core::PeerId peer, const void* buf, size_t len,
                                         void* local_desc, uint64_t ctx) {
  core::PostResult result;
  OpEntry* op = pool_->acquire(OpKind::kSend, ctx);
  if (op == nullptr) return result;
  const ssize_t ret = fi_send(ep_, buf, len, local_desc, peer, op);
  if (ret == 0) {
    result.posted = 1;
    return result;
  }
  pool_->release(op);
  if (ret != -FI_EAGAIN) result.error = post_error("fi_send", ret);
  return result;
}

ssize_t FabricDomain::post_recv_entry(OpEntry* op) noexcept {
  return fi_recv(ep_, op->buf, op->len, op->desc, FI_ADDR_UNSPEC, op);
}

core::PostResult FabricDomain::post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) {
  core::PostResult result;
  OpEntry* op = pool_->acquire(OpKind::kRecv, ctx);
  if (op == nullptr) return result;
  op->buf = buf;
  op->len = len;
  op->desc = local_desc;
  const ssize_t ret = post_recv_entry(op);
  if (ret == 0) {
    result.posted = 1;
    return result;
  }
  pool_->release(op);
  if (ret != -FI_EAGAIN) result.error = post_error("fi_recv", ret);
  return result;
}

bool FabricDomain::post_internal_recvs() {
  for (size_t i = 0; i < kInternalRecvs; ++i) {
    OpEntry* op = pool_->acquire(OpKind::kInternalRecv, 0);
    if (op == nullptr) return false;
    const ssize_t ret = post_recv_entry(op);
    if (ret != 0) {
      pool_->release(op);
      return false;
    }
  }
  return true;
}

void FabricDomain::repost_or_defer(OpEntry* op) {
  if (post_recv_entry(op) != 0) repost_[repost_count_++] = op;  // never exceeds pool capacity
}

size_t FabricDomain::retry_reposts(std::span<core::Completion> out) {
  size_t n = 0;
  while (repost_count_ > 0) {
    OpEntry* op = repost_[repost_count_ - 1];
    const ssize_t ret = post_recv_entry(op);
    if (ret == -FI_EAGAIN) break;
    if (ret != 0) {
      // The buffer is no longer posted: tell its owner instead of losing it.
      if (op->kind == OpKind::kRecv) {
        if (n == out.size()) break;
        fill(&out[n], core::Completion::Kind::kRecv, op->user_ctx, 0, 0);
        out[n].status = post_error("fi_recv (re-post after remote CQ data)", ret);
        ++n;
      } else {
        core::log().warn("fabric NIC '{}': internal receive re-post failed: {}", res_->nic_name,
                         fi_strerror(static_cast<int>(-ret)));
      }
      pool_->release(op);
    }
    --repost_count_;
  }
  return n;
}

bool FabricDomain::map_completion(const fi_cq_data_entry& e, core::Completion* out) {
  OpEntry* op = pool_->from_context(e.op_context);
  if (is_remote_write(e.flags, op)) {
    fill(out, core::Completion::Kind::kRemoteImm, 0, 0, static_cast<uint32_t>(e.data));
    // FI_RX_CQ_DATA: the write consumed one of our receives; put it back so
    // the caller's receive (or our internal one) stays posted.
    if (op != nullptr && (op->kind == OpKind::kRecv || op->kind == OpKind::kInternalRecv)) {
      repost_or_defer(op);
    }
    return true;
  }
  if (op == nullptr || op->kind == OpKind::kFree) {
    core::log().warn("fabric NIC '{}': completion with unknown context {} flags {:#x} ignored",
                     res_->nic_name, e.op_context, e.flags);
    return false;
  }
  switch (op->kind) {
    case OpKind::kInternalRecv:
      // Only possible when a peer sends a message while no caller receive is
      // ahead of ours: the payload does not fit a zero-byte buffer.
      fill(out, core::Completion::Kind::kRecv, 0, e.len, 0);
      out->status =
          Status(Code::kInternal, fmt::format("fabric NIC '{}': a message of {} bytes landed in an "
                                              "internal remote-CQ-data receive",
                                              res_->nic_name, e.len));
      repost_or_defer(op);
      return true;
    case OpKind::kRecv:
      fill(out, core::Completion::Kind::kRecv, op->user_ctx, e.len, 0);
      break;
    case OpKind::kWrite:
    case OpKind::kSend:
    case OpKind::kFree:
      fill(out, completion_kind(op->kind), op->user_ctx, 0, 0);
      break;
  }
  pool_->release(op);
  return true;
}

int FabricDomain::map_error(core::Completion* out) {
  fi_cq_err_entry err{};
  const ssize_t ret = fi_cq_readerr(cq_, &err, 0);
  if (ret < 0) {
    if (ret != -FI_EAGAIN) {
      core::log().warn("fabric NIC '{}': fi_cq_readerr failed: {}", res_->nic_name,
                       fi_strerror(static_cast<int>(-ret)));
    }
    return -1;
  }
  OpEntry* op = pool_->from_context(err.op_context);
  if (op != nullptr && op->kind == OpKind::kFree) op = nullptr;
  char buf[256];
  const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
  const char* what = op != nullptr                         ? op_kind_name(op->kind)
                     : is_remote_write(err.flags, nullptr) ? "remote write"
                                                           : "operation";
  Status status(Code::kUnavailable,
                fmt::format("fabric NIC '{}': {} failed: {} (err {} '{}', prov_errno {})",
                            res_->nic_name, what, text != nullptr ? text : "?", err.err,
                            fi_strerror(err.err), err.prov_errno));

  if (op == nullptr) {
    const auto kind = is_remote_write(err.flags, nullptr) ? core::Completion::Kind::kRemoteImm
                      : (err.flags & FI_SEND) != 0        ? core::Completion::Kind::kSend
                      : (err.flags & FI_RECV) != 0        ? core::Completion::Kind::kRecv
                                                          : core::Completion::Kind::kWrite;
    fill(out, kind, 0, 0, static_cast<uint32_t>(err.data));
    out->status = std::move(status);
    return 1;
  }
  if (op->kind == OpKind::kInternalRecv) {
    // Cancelled on close, or a truncated message: keep the receive posted.
    if (err.err != FI_ECANCELED) {
      core::log().warn("{}", status.message());
      repost_or_defer(op);
    } else {
      pool_->release(op);
    }
    return 0;
  }
  fill(out, completion_kind(op->kind), op->user_ctx, 0, 0);
  out->status = std::move(status);
  pool_->release(op);
  return 1;
}

size_t FabricDomain::poll(std::span<core::Completion> out) {
  size_t n = repost_count_ > 0 ? retry_reposts(out) : 0;
  while (n < out.size()) {
    fi_cq_data_entry entries[kCqBatch];
    // Each CQ entry yields at most one Completion, so never read more than fits.
    const size_t want = std::min(kCqBatch, out.size() - n);
    const ssize_t ret = fi_cq_read(cq_, entries, want);
    if (ret > 0) {
      for (ssize_t i = 0; i < ret; ++i) {
        if (map_completion(entries[i], &out[n])) ++n;
      }
      if (static_cast<size_t>(ret) < want) break;  // drained
      continue;
    }
    if (ret == -FI_EAGAIN) break;
    if (ret == -FI_EAVAIL) {
      const int r = map_error(&out[n]);
      if (r < 0) break;  // nothing readable after all: do not spin on it
      n += static_cast<size_t>(r);
      continue;
    }
    if (!cq_failure_logged_) {
      cq_failure_logged_ = true;
      core::log().error("fabric NIC '{}': fi_cq_read failed: {} ({})", res_->nic_name,
                        fi_strerror(static_cast<int>(-ret)), ret);
    }
    break;
  }
  return n;
}

}  // namespace ferry::fabric

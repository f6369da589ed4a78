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
#include <chrono>

#include <fmt/format.h>
#include "core/coarse_clock.h"
#include "core/cpu_relax.h"
#include "core/log.h"
#include "core/stats.h"

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
    case OpKind::kOrphan:
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
  if (!out->status.is_ok()) out->status = Status();  // the entry is reused: mostly ok already
}

}  // namespace

Status FabricDomain::post_error(const char* call, ssize_t ret) const {
  return Status(Code::kUnavailable,
                fmt::format("fabric NIC '{}': {} failed: {} ({})", res_->nic_name, call,
                            fi_strerror(static_cast<int>(-ret)), ret));
}

namespace {

// Liveness of an shm peer is asked at most this often while posting to it,
// always before a write of at least kLargeWrite bytes, and at most every
// kBusyPeriod while its region lock is taken or posts would block.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);
constexpr auto kBusyPeriod = std::chrono::milliseconds(1);
constexpr uint64_t kLargeWrite = 1 << 20;
constexpr uint32_t kEagainStreak = 16;
constexpr auto kUnstickPeriod = std::chrono::milliseconds(10);
// How long to wait, polling the word, for a peer's region lock before
// treating it as back-pressure.
constexpr auto kLockSpin = std::chrono::microseconds(20);

using core::cpu_relax;
using core::ns_of;

}  // namespace

void FabricDomain::check_shm_peer(ShmPeer& p, Clock::time_point now, Clock::duration period) {
  if (p.dead || !p.watch) return;
  if (period > Clock::duration::zero() && now - p.last_check < period) return;
  p.last_check = now;
  if (!p.watch->exited()) return;
  p.dead = true;
  orphan_scan_ = true;
  orphan_pos_ = 0;
  core::log().warn(
      "fabric NIC '{}': shm peer {} (pid {}) has exited; failing what is in flight to "
      "it and refusing further work",
      res_->nic_name, p.name, p.pid);
}

[[gnu::always_inline]] inline bool FabricDomain::shm_peer_postable(ShmPeer& p, uint64_t len,
                                                                   const char* call, Status* error,
                                                                   Clock::time_point* when) {
  // Coarse: it times the liveness period and, for the rescuer, how long this
  // post has been under way (both in milliseconds); the lock wait below
  // reads the precise clock.
  auto now = core::coarse_now();
  *when = now;
  // What the steps below find for nearly every post, in one look: alive, its
  // liveness asked within its period, its region lock free.
  if (!p.dead && len < kLargeWrite && (!p.watch || now - p.last_check < kLivenessPeriod) &&
      (p.lock == nullptr || __atomic_load_n(p.lock, __ATOMIC_RELAXED) == spin_unlocked_))
    return true;
  if (!p.dead) {
    check_shm_peer(p, now, len >= kLargeWrite ? Clock::duration::zero() : kLivenessPeriod);
    if (!p.dead && p.lock != nullptr) {
      // The provider would spin on this lock with no way out should its
      // holder die: wait for it here instead, a bounded while.
      const int unlocked = spin_unlocked_value();
      Clock::time_point give_up{};
      while (__atomic_load_n(p.lock, __ATOMIC_RELAXED) != unlocked) {
        if (give_up == Clock::time_point{}) give_up = Clock::now() + kLockSpin;
        cpu_relax();
        if ((*when = now = Clock::now()) < give_up) continue;
        check_shm_peer(p, now, kBusyPeriod);
        if (!p.dead) return false;  // back-pressure
        break;
      }
    }
  }
  if (p.dead) {
    *error = dead_peer_status(p, call);
    return false;
  }
  return true;
}

[[gnu::always_inline]] inline bool FabricDomain::peer_postable(fi_addr_t peer, uint64_t len,
                                                               const char* call, Status* error,
                                                               ShmPeer** sp,
                                                               Clock::time_point* when) {
  *sp = shm_peer(peer);
  if (*sp != nullptr && !shm_peer_postable(**sp, len, call, error, when)) return false;
  return dead_socket_peers_ == 0 || !peer_dead(peer, call, error);
}

bool FabricDomain::begin_watched_post(ShmPeer* sp, Clock::time_point now) noexcept {
  if (sp == nullptr || sp->lock == nullptr) return false;
  posting_peer_.store(sp, std::memory_order_relaxed);
  posting_since_ns_.store(ns_of(now), std::memory_order_release);
  return true;
}

void FabricDomain::end_watched_post(bool watched) noexcept {
  if (watched) posting_since_ns_.store(0, std::memory_order_release);
}

void FabricDomain::note_shm_post(ShmPeer* sp, ssize_t ret) {
  if (sp == nullptr) return;
  if (ret == -FI_EAGAIN && ++sp->eagain_streak >= kEagainStreak) {
    sp->eagain_streak = 0;
    check_shm_peer(*sp, Clock::now(), kBusyPeriod);
  } else if (ret != -FI_EAGAIN) {
    sp->eagain_streak = 0;
  }
}

// An injected write has no local completion and so no operation context: it
// is done when the call returns, and shm reports no error for it later (a
// dead peer is caught by the liveness check before the post).
[[gnu::always_inline]] inline bool FabricDomain::inject_imm(uint32_t imm, fi_addr_t peer,
                                                            uint64_t remote_addr, uint64_t rkey,
                                                            ShmPeer* sp, Clock::time_point now,
                                                            Status* error) {
  const bool watched = begin_watched_post(sp, now);
  const ssize_t ret = fi_inject_writedata(ep_, nullptr, 0, imm, peer, remote_addr, rkey);
  end_watched_post(watched);
  note_shm_post(sp, ret);
  if (ret == 0) return true;
  if (ret != -FI_EAGAIN) *error = post_error("fi_inject_writedata", ret);
  return false;
}

core::PostResult FabricDomain::post_imm_at_post(core::PeerId peer, uint32_t imm,
                                                uint64_t remote_addr, uint64_t rkey) {
  core::PostResult result;
  ShmPeer* sp = nullptr;
  Clock::time_point now{};
  if (peer_postable(peer, 0, "fi_inject_writedata to", &result.error, &sp, &now) &&
      inject_imm(imm, peer, remote_addr, rkey, sp, now, &result.error))
    result.posted = 1;
  return result;
}

core::PostResult FabricDomain::post_writes(std::span<const core::WriteDesc> writes) {
  core::PostResult result;
  for (const core::WriteDesc& w : writes) {
    ShmPeer* sp = nullptr;
    Clock::time_point now{};
    if (!peer_postable(w.peer, w.len, "fi_writemsg to", &result.error, &sp, &now)) break;
    OpEntry* op = pool_->acquire(OpKind::kWrite, w.ctx);
    if (op == nullptr) break;  // every context in flight: back-pressure
    op->peer = w.peer;

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

    const bool watched = begin_watched_post(sp, now);
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
    end_watched_post(watched);
    note_shm_post(sp, ret);
    if (socket_probe_) note_socket_post(w.peer, ret);
    if (ret == 0) {
      ++result.posted;
      ++tx_in_flight_;
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
  ShmPeer* sp = nullptr;
  Clock::time_point now{};
  if (!peer_postable(peer, len, "fi_send to", &result.error, &sp, &now)) return result;
  OpEntry* op = pool_->acquire(OpKind::kSend, ctx);
  if (op == nullptr) return result;
  op->peer = peer;
  const bool watched = begin_watched_post(sp, now);
  const ssize_t ret = fi_send(ep_, buf, len, local_desc, peer, op);
  end_watched_post(watched);
  note_shm_post(sp, ret);
  if (socket_probe_) note_socket_post(peer, ret);
  if (ret == 0) {
    result.posted = 1;
    ++tx_in_flight_;
    return result;
  }
  pool_->release(op);
  if (ret != -FI_EAGAIN) result.error = post_error("fi_send", ret);
  return result;
}

core::PostResult FabricDomain::post_send_at_post(core::PeerId peer, const void* buf, size_t len) {
  core::PostResult result;
  ShmPeer* sp = nullptr;
  Clock::time_point now{};
  if (!peer_postable(peer, len, "fi_inject to", &result.error, &sp, &now)) return result;
  const bool watched = begin_watched_post(sp, now);
  const ssize_t ret = fi_inject(ep_, buf, len, peer);
  end_watched_post(watched);
  note_shm_post(sp, ret);
  if (ret == 0) {
    result.posted = 1;
  } else if (ret != -FI_EAGAIN) {
    result.error = post_error("fi_inject", ret);
  }
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
  if (op->kind == OpKind::kOrphan) {  // already failed towards the caller
    if (orphans_ > 0) --orphans_;
    pool_->release(op);
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
      if (tx_in_flight_ > 0) --tx_in_flight_;
      fill(out, completion_kind(op->kind), op->user_ctx, 0, 0);
      break;
    case OpKind::kFree:
    case OpKind::kOrphan:
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
  if (op != nullptr && op->kind == OpKind::kOrphan) {  // already failed towards the caller
    if (orphans_ > 0) --orphans_;
    pool_->release(op);
    return 0;
  }
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
  if ((op->kind == OpKind::kWrite || op->kind == OpKind::kSend) && tx_in_flight_ > 0)
    --tx_in_flight_;
  fill(out, completion_kind(op->kind), op->user_ctx, 0, 0);
  out->status = std::move(status);
  pool_->release(op);
  return 1;
}

size_t FabricDomain::fail_orphans(std::span<core::Completion> out) {
  size_t n = 0;
  for (; orphan_pos_ < pool_->capacity() && n < out.size(); ++orphan_pos_) {
    OpEntry* op = pool_->at(orphan_pos_);
    if (op->kind != OpKind::kWrite && op->kind != OpKind::kSend) continue;
    // The provider completes nothing aimed at a process that is gone (shm:
    // until unstick_responses answers for it; tcp: it retries the connect for
    // ever); the entry stays taken until then (its completion then just
    // releases it).
    Status why;
    if (!peer_dead(op->peer,
                   op->kind == OpKind::kWrite ? "write abandoned:" : "send abandoned:", &why))
      continue;
    fill(&out[n], completion_kind(op->kind), op->user_ctx, 0, 0);
    out[n].status = std::move(why);
    ++n;
    op->kind = OpKind::kOrphan;
    ++orphans_;
    if (tx_in_flight_ > 0) --tx_in_flight_;
  }
  if (orphan_pos_ >= pool_->capacity()) orphan_scan_ = false;
  return n;
}

void FabricDomain::check_shm_peers(Clock::time_point now) {
  for (auto& [addr, p] : shm_peers_) check_shm_peer(*p, now, kLivenessPeriod);
}

void FabricDomain::orphan_dead_peers(Clock::time_point now) {
  for (auto& [addr, p] : shm_peers_) check_shm_peer(*p, now, Clock::duration::zero());
  for (size_t i = 0; i < pool_->capacity(); ++i) {
    OpEntry* op = pool_->at(i);
    if (op->kind != OpKind::kWrite && op->kind != OpKind::kSend) continue;
    if (!peer_dead(op->peer, "", nullptr)) continue;
    op->kind = OpKind::kOrphan;
    ++orphans_;
    if (tx_in_flight_ > 0) --tx_in_flight_;
  }
  orphan_scan_ = false;
}

size_t FabricDomain::upkeep(std::span<core::Completion> out) {
  size_t n = repost_count_ > 0 ? retry_reposts(out) : 0;
  if (shm_ && (tx_in_flight_ > 0 || orphans_ > 0) && !shm_peers_.empty()) {
    // Coarse: these checks run every 10-100 ms, and a precise read on every
    // poll with a write in flight would be on the way of every completion.
    const auto now = core::coarse_now();
    // Writes in flight to a peer that died would never complete.
    if (tx_in_flight_ > 0 && now >= next_peer_check_) {
      next_peer_check_ = now + kLivenessPeriod;
      check_shm_peers(now);
    }
    if (orphans_ > 0 && own_region_ != nullptr && now >= next_unstick_) {
      next_unstick_ = now + kUnstickPeriod;
      unstick_responses(now);
    }
  }
  if (socket_probe_ && tx_in_flight_ > 0) {
    const auto now = core::coarse_now();
    if (now >= next_stall_scan_) scan_for_stalled_peers(now);
  }
  if (orphan_scan_) n += fail_orphans(out.subspan(n));
  return n;
}

size_t FabricDomain::poll(std::span<core::Completion> out) {
  // One test for the whole upkeep: a poll with nothing in flight and nothing
  // to retry (a waiter's poll for immediates) goes straight to the CQ.
  size_t n = (repost_count_ | tx_in_flight_ | orphans_) != 0 || orphan_scan_ ? upkeep(out) : 0;
  while (n < out.size()) {
    fi_cq_data_entry entries[kCqBatch];
    // Each CQ entry yields at most one Completion, so never read more than fits.
    const size_t want = std::min(kCqBatch, out.size() - n);
    const bool watched = watch_polls_.load(std::memory_order_relaxed);
    if (watched) polling_call_.store(++polls_, std::memory_order_release);
    const ssize_t ret = fi_cq_read(cq_, entries, want);
    if (watched) polling_call_.store(0, std::memory_order_release);
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

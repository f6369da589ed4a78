// NVLink Domain, data path: posting writes (copy engine for large or lone
// writes, ops of the gather kernel's next batch otherwise), launching batches,
// and poll(): retiring batches in launch order, pushing their immediates into
// the targets' mailboxes before reporting the writes, and draining our own
// mailbox into kRemoteImm completions. docs/NVLINK.md gives the design.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "core/coarse_clock.h"
#include "core/log.h"
#include "nvlink/nvlink_domain_impl.h"

namespace ferry::nvlink {

core::PostResult NvlinkDomain::post_writes(std::span<const core::WriteDesc> writes) {
  cudaSetDevice(device_);
  posted_since_poll_ = true;
  const auto now = core::coarse_now();  // for a liveness period of 100 ms
  for (size_t i = 0; i < writes.size(); ++i) {
    const core::WriteDesc& w = writes[i];
    Status err;
    Peer* pp = live_peer(w.peer, now, &err);
    if (pp == nullptr) return {i, err};
    Peer& p = *pp;
    const Item item{w.ctx, uint32_t(w.peer), w.imm, w.has_imm, 1};
    Target* t = resolve(p, w.rkey, &err);
    if (t == nullptr) return {i, err};
    if (outside(*t, w.remote_addr, w.len))
      return {i, Status(Code::kOutOfRange,
                        fmt::format("nvlink {}: write of {} bytes at {:#x} outside the region "
                                    "[{:#x}, +{}) of {}",
                                    info_.name, w.len, w.remote_addr, t->reg_ptr, t->len,
                                    peer_name(p)))};
    if (w.len == 0) {  // immediate only: no data to wait for
      add_done(item, Status::ok());
      continue;
    }
    uint8_t* dst = t->base + (w.remote_addr - t->reg_ptr);
    Batch* b = open_batch();
    if (b == nullptr) return {i, Status::ok()};  // every launch slot in flight
    // A lone write on an idle GPU is a latency question, and the copy engine
    // answers it sooner than a launch (4 KiB: 7.1 vs 11.4 us to the event,
    // ferry-nvlink-probe); several writes are a throughput one, for the kernel.
    const bool lone = i + 1 == writes.size() && issued_ == 0 && b->items.empty();
    if (w.len >= copy_engine_min_ || (lone && w.len <= kLoneCopyMax)) {
      const cudaError_t e = cudaMemcpyAsync(dst, w.src, w.len, cudaMemcpyDefault, stream_of(*b));
      if (e != cudaSuccess) {
        cudaGetLastError();
        return {i, Status(Code::kInternal,
                          fmt::format("nvlink {}: cudaMemcpyAsync of {} bytes to {}: {}",
                                      info_.name, w.len, peer_name(p), cuda_msg(e)))};
      }
    } else {
      if (b->nops + ops_for(w.len) > kMaxBatchOps) {
        flush();
        b = open_batch();
        if (b == nullptr) return {i, Status::ok()};
      }
      append_ops(*b, reinterpret_cast<uint64_t>(w.src), reinterpret_cast<uint64_t>(dst), w.len);
    }
    b->bytes += w.len;
    add_item(b->items, item);
    if (b->nops >= kFlushOps || b->bytes >= kFlushBytes) flush();
  }
  if (issued_ == 0) flush();  // the GPU is idle: waiting would only add latency
  return {writes.size(), Status::ok()};
}

// Pages straight into the batch's op list: per page two index loads, a bounds
// check and one or two CopyOps; the run is one Item however many pages it has.
core::PostResult NvlinkDomain::post_paged(const core::PagedDesc& pd) {
  if (pd.page_len == 0 || pd.page_len >= copy_engine_min_) return Domain::post_paged(pd);
  cudaSetDevice(device_);
  posted_since_poll_ = true;
  Status err;
  Peer* pp = live_peer(pd.peer, core::coarse_now(), &err);
  if (pp == nullptr) return {0, err};
  Peer& p = *pp;
  Target* t = resolve(p, pd.rkey, &err);
  if (t == nullptr) return {0, err};
  Batch* b = open_batch();
  if (b == nullptr) return {0, Status::ok()};  // every launch slot in flight
  const uint32_t need = ops_for(pd.page_len);
  Item run{pd.ctx, uint32_t(pd.peer), pd.imm, pd.has_imm, 0};
  auto close_run = [&] {
    if (run.count > 0) add_item(b->items, run);
    run.count = 0;
  };
  for (uint32_t k = 0; k < pd.count; ++k) {
    const uint64_t ra = pd.remote_base + uint64_t(pd.dst_idx[k]) * pd.dst_stride;
    if (outside(*t, ra, pd.page_len)) {
      close_run();
      return {
          k, Status(Code::kOutOfRange,
                    fmt::format("nvlink {}: page {} ({} bytes at {:#x}) outside the region "
                                "[{:#x}, +{}) of {}",
                                info_.name, k, pd.page_len, ra, t->reg_ptr, t->len, peer_name(p)))};
    }
    if (b->nops + need > kMaxBatchOps || b->nops >= kFlushOps || b->bytes >= kFlushBytes) {
      close_run();
      flush();
      b = open_batch();
      if (b == nullptr) return {k, Status::ok()};
    }
    append_ops(*b, reinterpret_cast<uint64_t>(pd.src + uint64_t(pd.src_idx[k]) * pd.src_stride),
               reinterpret_cast<uint64_t>(t->base + (ra - t->reg_ptr)), pd.page_len);
    b->bytes += pd.page_len;
    run.count++;
  }
  close_run();
  if (b->nops >= kFlushOps || b->bytes >= kFlushBytes || issued_ == 0) flush();
  return {pd.count, Status::ok()};
}

void NvlinkDomain::fail_batch(Batch& b, const Status& s) {
  for (const Item& it : b.items) add_done(it, s);
  b.items.clear();
  b.nops = 0;
  b.bytes = 0;
}

void NvlinkDomain::flush() {
  Batch* b = open_batch();
  if (b == nullptr || b->items.empty()) return;
  cudaError_t e = launch_gather(b->ops, b->nops, stream_of(*b));
  if (e == cudaSuccess) e = cudaEventRecord(b->event, stream_of(*b));
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail_batch(*b, Status(Code::kInternal, fmt::format("nvlink {}: launching {} copies: {}",
                                                       info_.name, b->nops, cuda_msg(e))));
    return;
  }
  ++issued_;
}

size_t NvlinkDomain::poll(std::span<core::Completion> out) {
  if (armed_) {
    armed_ = false;
    shm_->woken();
  }
  if (!posted_since_poll_) {
    if (Batch* b = open_batch(); b != nullptr && !b->items.empty()) {
      cudaSetDevice(device_);
      flush();
    }
  }
  posted_since_poll_ = false;
  while (issued_ > 0) {
    Batch& b = batches_[head_];
    const cudaError_t e = cudaEventQuery(b.event);
    if (e == cudaErrorNotReady) break;
    if (e == cudaSuccess) {
      for (const Item& it : b.items) add_done(it, Status::ok());
      b.items.clear();
      b.nops = 0;
      b.bytes = 0;
    } else {
      cudaGetLastError();
      // The immediates of failed copies are never sent: the target must not
      // count data that did not land.
      fail_batch(b, Status(Code::kInternal,
                           fmt::format("nvlink {}: copy of {} bytes failed on the GPU: {}",
                                       info_.name, b.bytes, cuda_msg(e))));
    }
    head_ = (head_ + 1) % kBatches;
    --issued_;
  }
  size_t n = 0;
  while (n < out.size() && !done_.empty()) {
    Done& d = done_.front();
    if (d.status.is_ok() && d.item.has_imm) {
      Peer* p = d.item.peer < peers_.size() ? peers_[d.item.peer].get() : nullptr;
      if (p != nullptr) {
        // The whole run is one mailbox cell and one completion.
        if (!p->shm->push_run(d.item.imm, d.item.count)) break;  // full: retry next poll
        core::Completion& c = out[n++];
        c = core::Completion{};
        c.kind = core::Completion::Kind::kWrite;
        c.ctx = d.item.ctx;
        c.count = d.item.count;
        done_.pop_front();
        continue;
      }
      d.status = Status(Code::kUnavailable, fmt::format("nvlink {}: peer removed before its "
                                                        "immediate could be delivered",
                                                        info_.name));
    }
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kWrite;
    c.ctx = d.item.ctx;
    c.count = d.item.count;
    c.status = std::move(d.status);
    done_.pop_front();
  }
  n = poll_messages(out, n);
  // Incoming runs, equal neighbours folded: the pages of paged writes that
  // arrive together cost one counter update.
  while (n < out.size()) {
    if (inbox_pos_ == inbox_len_) {
      inbox_pos_ = 0;
      inbox_len_ = shm_->pop_runs(std::span(inbox_));
      if (inbox_len_ == 0) break;
    }
    ImmRun r = inbox_[inbox_pos_++];
    if (r.count == 0) continue;  // a run of nothing: only a faulty writer sends one
    while (inbox_pos_ < inbox_len_ && inbox_[inbox_pos_].imm == r.imm && r.count < UINT32_MAX / 2 &&
           inbox_[inbox_pos_].count < UINT32_MAX / 2 - r.count)
      r.count += inbox_[inbox_pos_++].count;
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kRemoteImm;
    c.imm = r.imm;
    c.count = r.count;
  }
  if (shm_->lost_runs() != lost_runs_seen_ || shm_->lost_msgs() != lost_msgs_seen_) report_lost();
  return n;
}

// A writer killed between claiming a slot of our mailbox or message ring and
// publishing it: the slot was skipped (ShmSegment::skip_dead_claim), and what
// it would have carried is gone with the writer.
void NvlinkDomain::report_lost() {
  core::log().warn(
      "ferry nvlink: {}: a writer (pid {}) died while pushing into this domain's segment; "
      "lost so far: {} immediate run(s), {} message(s)",
      info_.name, shm_->last_lost_claimant(), shm_->lost_runs(), shm_->lost_msgs());
  lost_runs_seen_ = shm_->lost_runs();
  lost_msgs_seen_ = shm_->lost_msgs();
}

}  // namespace ferry::nvlink

// Immediates and sends with no OnDone (FastImm, FastSend: the one-line
// commands of submit_imm and submit_send) posted as soon as the worker picks
// them up: one post straight from the command, no slot, plan or cursor. Such
// a request is one write or send that nobody waits for, so what a slot would
// give it (sharding, an OnDone, a place in a NIC's turn-taking) has nothing to
// do; on the 2-core machine the slot path cost more than the post itself.
// Whatever is not the plain case takes the slot path: tracing on, posts
// queued for the NIC, the NIC full, a peer that failed, an address to check,
// a post the NIC refuses.
//
// What the slot path keeps, this keeps too: admission lasts until the post's
// completion, a completion releases one posting credit once (a send, its
// buffer too), a failure with kUnavailable marks the peer failed, and the
// deadline is counted as DEADLINE_EXCEEDED once (nobody waits for it) while
// the post stays in flight.
#include <algorithm>

#include "core/ctx.h"
#include "core/worker.h"
#include "core/worker_thread.h"

namespace ferry::core {

using worker_thread::AsWorker;

bool Worker::post_fast(const Command& cmd) {
  // Immediates of FastImm go to a group of one NIC; sends always use NIC 0.
  Nic& nic = nics_[0];
  if (trace_ || !nic.pending.empty() || nic.outstanding >= infos_[0].max_outstanding ||
      fast_tail_ - fast_head_ >= kFastPosts)
    return false;
  const bool send = cmd.fast.kind() == FastKind::kSend;
  const NetAddr* addr = send ? cmd.fast.send.addr : cmd.fast.imm.addr;
  PeerId peer = fast_peer_;
  if (addr != fast_addr_ || fast_epoch_ != stale_epoch_ || !dead_.empty()) {
    Status err;
    peer = resolve(0, *addr, &err);
    if (!err.is_ok()) return false;  // the slot path fails it with this error
    fast_addr_ = addr;
    fast_peer_ = peer;
    fast_epoch_ = stale_epoch_;
  }
  const uint64_t pos = fast_tail_;
  const uint32_t idx = uint32_t(pos % kFastPosts);
  const uint32_t gen = uint32_t(pos / kFastPosts) & 0xFFFFFF;
  const uint64_t ctx = make_ctx(kTagFast, gen, idx);
  PostResult r;
  uint64_t bytes = 0;
  uint32_t buffer = FastPost::kNoBuffer;
  if (send) {
    const FastSend& f = cmd.fast.send;
    if (infos_[0].send_at_post_max > 0 && f.len <= infos_[0].send_at_post_max) {
      r = nic.domain->post_send_at_post(peer, send_pool->buffer(f.buffer), f.len);
      if (r.posted != 1) return false;
      send_free->release(f.buffer);
      finish_at_post(cmd, peer, true, f.len);
      return true;
    }
    r = nic.domain->post_send(peer, send_pool->buffer(f.buffer), f.len,
                              send_pool->reg->local_desc[0], ctx);
    bytes = f.len;
    buffer = f.buffer;
  } else {
    const FastImm& f = cmd.fast.imm;
    const bool at_post = infos_[0].imm_at_post;
    r = at_post ? nic.domain->post_imm_at_post(peer, f.imm, f.base, f.rkey)
                : post_one_imm(f, peer, ctx);
    if (at_post && r.posted == 1) {
      finish_at_post(cmd, peer, false, 0);
      return true;
    }
  }
  if (r.posted != 1) return false;  // refused or full: the slot path retries or fails it
  // Field by field: built as a temporary, the record was copied out with wide
  // loads that spanned the temporary's narrower stores (a store-forwarding stall).
  FastPost& fp = fast_[idx];
  fp.gen = gen;
  fp.live = true;
  fp.reported = false;
  fp.addr = addr;
  fp.peer = peer;
  fp.deadline = cmd.deadline;
  fp.submit_ns = cmd.submit_ns;
  fp.bytes = bytes;
  fp.buffer = buffer;
  ++fast_tail_;
  ++nic.outstanding;
  note_picked_up(cmd.submit_ns);
  if constexpr (kStatsEnabled) {
    if (PeerCounters* p = stats_.peer(0, peer)) {
      (send ? p->sends_posted : p->writes_posted).add();
      p->bytes_posted.add(bytes);
    }
  }
  return true;
}

// The one zero-byte write of an immediate, on NIC 0, with a completion.
PostResult Worker::post_one_imm(const FastImm& f, PeerId peer, uint64_t ctx) {
  const Registration& src = **send_reg;
  WriteDesc& w = post_batch_[0];
  w.ctx = ctx;
  w.has_imm = true;
  w.imm = f.imm;
  w.local_desc = src.local_desc[0];
  w.len = 0;
  w.src = src.ptr;
  w.peer = peer;
  w.remote_addr = f.base;
  w.rkey = f.rkey;
  return nics_[0].domain->post_writes(std::span<WriteDesc>(post_batch_).first(1));
}

// Done at its post (DomainInfo::imm_at_post): no record, no credit taken; what
// on_fast_done would count, counted now.
void Worker::finish_at_post(const Command& cmd, PeerId peer, bool send, uint64_t bytes) {
  note_picked_up(cmd.submit_ns);
  note_done_at_post(peer, send, bytes, cmd.submit_ns);
  release_admission();
}

// What a post and its completion would each count, in one pass over the
// counters: one peer lookup, no additions of zero.
void Worker::note_done_at_post(PeerId peer, bool send, uint64_t bytes, int64_t submit_ns) {
  if constexpr (!kStatsEnabled) return;
  NicCounters& n = stats_.nic[0];
  n.writes_completed.add();
  stats_.outcomes[size_t(Code::kOk)].add();
  if (submit_ns != 0)
    stats_.transfer_latency.record(uint64_t(std::max<int64_t>(0, turn_ns() - submit_ns)));
  if (bytes != 0) n.bytes_completed.add(bytes);
  if (PeerCounters* p = stats_.peer(0, peer)) {
    (send ? p->sends_posted : p->writes_posted).add();
    p->transfers_ok.add();
    if (bytes != 0) {
      p->bytes_posted.add(bytes);
      p->bytes_ok.add(bytes);
    }
  }
}

// An immediate that is done when its post returns is never in flight, so it
// takes no admission, and needs no command: the submitting thread posts it
// as the worker would, where the worker would post it at once too (the loop
// lock free or held by this very thread answering a completion, nothing
// queued, the peer resolved already). Everything else takes the command path,
// which posts it the same way or fails it with the reason. A small send that
// the NIC copies out inside its post goes the same way.
template <typename Post>
[[gnu::always_inline]] inline bool Worker::post_here_now(Post&& post) {
  if (answering_inline()) {
    if (!post()) return false;
    wake_counters().inline_replies.add();
    return true;
  }
  if (!may_post_direct()) return false;
  std::unique_lock<LoopLock> loop(loop_mu_, std::try_to_lock);
  if (!loop.owns_lock() || !direct_ready()) return false;
  {
    AsWorker as_worker(this);
    if (!post()) return false;
  }
  wake_counters().inline_posts.add();
  // As post_direct, for a worker blocked in poll(2) (posted_all_here).
  if (!busy_mode_) wake_unless_posted_all(posted_all_here());
  return true;
}

bool Worker::try_imm_at_post(const FastImm& f, int64_t submit_ns) {
  if (!infos_[0].imm_at_post) return false;
  return post_here_now([&] { return post_imm_at_post(f, submit_ns); });
}

bool Worker::try_send_at_post(const NetAddr* to, std::span<const uint8_t> msg, int64_t submit_ns) {
  const uint64_t max = infos_[0].send_at_post_max;
  if (max == 0 || msg.size() > max) return false;
  return post_here_now([&] { return post_send_at_post(to, msg, submit_ns); });
}

[[gnu::always_inline]] inline bool Worker::at_post_ready(const NetAddr* to) const {
  return !trace_ && nics_[0].pending.empty() && to == fast_addr_ && fast_epoch_ == stale_epoch_ &&
         dead_.empty();
}

bool Worker::post_imm_at_post(const FastImm& f, int64_t submit_ns) {
  if (!at_post_ready(f.addr) ||
      nics_[0].domain->post_imm_at_post(fast_peer_, f.imm, f.base, f.rkey).posted != 1)
    return false;
  count_at_post(false, 0, submit_ns);
  return true;
}

bool Worker::post_send_at_post(const NetAddr* to, std::span<const uint8_t> msg, int64_t submit_ns) {
  if (!at_post_ready(to) ||
      nics_[0].domain->post_send_at_post(fast_peer_, msg.data(), msg.size()).posted != 1)
    return false;
  count_at_post(true, msg.size(), submit_ns);
  return true;
}

[[gnu::always_inline]] inline void Worker::count_at_post(bool send, uint64_t bytes,
                                                         int64_t submit_ns) {
  if constexpr (!kStatsEnabled) return;
  if (submit_ns != 0) {
    // A sampled request: the clock read after its post, as end_turn would.
    begin_turn();
    stats_.queue_delay.record(uint64_t(std::max<int64_t>(0, turn_ns() - submit_ns)));
  }
  note_done_at_post(fast_peer_, send, bytes, submit_ns);
}

bool Worker::on_fast_done(uint64_t ctx, const Status& st, uint32_t count) {
  const uint32_t idx = ctx_idx(ctx);
  if (idx >= kFastPosts) return false;
  FastPost& p = fast_[idx];
  if (!p.live || p.gen != ctx_gen(ctx)) return false;  // not one of ours, or seen already
  note_local_done(st, count);
  p.live = false;
  if (p.buffer != FastPost::kNoBuffer) send_free->release(p.buffer);
  if (!st.is_ok() && st.code() == Code::kUnavailable) mark_dead(*p.addr, st);
  if (!p.reported) note_fast_finished(p, st);
  release_admission();
  while (fast_head_ < fast_tail_ && !fast_[fast_head_ % kFastPosts].live) ++fast_head_;
  return true;
}

void Worker::note_fast_finished(const FastPost& p, const Status& st) {
  if constexpr (!kStatsEnabled) return;
  if (st.is_ok()) return note_finished_ok(p.peer, p.submit_ns, p.bytes);
  note_outcome(st, p.submit_ns, p.submit_ns != 0 ? turn_ns() : 0);
  if (PeerCounters* c = stats_.peer(0, p.peer)) c->transfers_failed.add();
}

void Worker::note_finished_ok(PeerId peer, int64_t submit_ns, uint64_t bytes) {
  if constexpr (!kStatsEnabled) return;
  note_outcome(Status(), submit_ns, submit_ns != 0 ? turn_ns() : 0);
  stats_.nic[0].bytes_completed.add(bytes);
  if (PeerCounters* c = stats_.peer(0, peer)) {
    c->bytes_ok.add(bytes);
    c->transfers_ok.add();
  }
}

// Deadlines come from one default (EngineConfig::default_deadline) in the
// order the posts were made, up to the coarse clock's tick: the oldest posts
// are the first to expire, so the scan stops at the first one that has not.
void Worker::check_fast_deadlines(Clock::time_point now) {
  for (uint64_t pos = fast_head_; pos < fast_tail_; ++pos) {
    FastPost& p = fast_[pos % kFastPosts];
    if (!p.live || p.reported) continue;
    if (p.deadline == Clock::time_point{} || p.deadline > now) break;
    p.reported = true;
    note_fast_finished(p, Status(Code::kDeadlineExceeded, "passed its deadline"));
  }
}

void Worker::cancel_fast_posts() {
  for (uint64_t pos = fast_head_; pos < fast_tail_; ++pos) {
    FastPost& p = fast_[pos % kFastPosts];
    if (p.live && !p.reported) note_fast_finished(p, Status(Code::kCancelled, "engine stopped"));
    p.live = false;
  }
  fast_head_ = fast_tail_;
}

}  // namespace ferry::core

// What the worker counts (core/stats.h) and records for the timeline, at the
// few points of its loop where a transfer starts, posts, completes and ends.
#include <algorithm>

#include "core/worker.h"

namespace ferry::core {

void Worker::note_started(Slot& s, const Command& cmd) {
  s.stat_p2p = false;
  s.stat_nic = UINT8_MAX;
  s.stat_bytes = {};
  s.first_post_ns = 0;
  s.submit_ns = cmd.submit_ns;
  s.picked_ns = trace_ ? now_ns() : 0;
  note_picked_up(cmd.submit_ns);
}

void Worker::note_picked_up(int64_t submit_ns) {
  if constexpr (!kStatsEnabled) return;
  if (submit_ns == 0) return;
  if (picked_up_n_ < picked_up_.size()) {
    picked_up_[picked_up_n_++] = submit_ns;
  } else {
    stats_.queue_delay.record(uint64_t(std::max<int64_t>(0, turn_ns() - submit_ns)));
  }
}

void Worker::note_outcome(const Status& st, int64_t submit_ns, int64_t now) {
  if constexpr (!kStatsEnabled) return;
  stats_.outcomes[size_t(st.code()) < kCodeCount ? size_t(st.code()) : size_t(Code::kInternal)]
      .add();
  if (submit_ns != 0)
    stats_.transfer_latency.record(uint64_t(std::max<int64_t>(0, now - submit_ns)));
}

void Worker::end_turn() {
  if constexpr (!kStatsEnabled) return;
  if (picked_up_n_ == 0) return;
  const int64_t now = turn_ns();
  for (uint32_t i = 0; i < picked_up_n_; ++i)
    stats_.queue_delay.record(uint64_t(std::max<int64_t>(0, now - picked_up_[i])));
  picked_up_n_ = 0;
}

void Worker::note_posted(Slot& s, uint8_t k, const PostStep& step, const WriteDesc* batch) {
  if constexpr (!kStatsEnabled) return;
  const size_t posted = step.result.posted;
  const bool send = std::holds_alternative<SendReq>(s.req);
  if (posted > 0) {
    s.stat_bytes[k] += step.bytes;
    if (s.stat_nic == UINT8_MAX) {
      s.stat_nic = k;
      if (trace_) s.first_post_ns = now_ns();
    }
  }
  if (s.stat_p2p) {
    if (PeerCounters* p = stats_.peer(k, s.peer[k])) {
      if (send) {
        p->sends_posted.add(posted);
      } else {
        p->writes_posted.add(posted);
      }
      p->bytes_posted.add(step.bytes);
      if (posted < step.tried) (step.result.error.is_ok() ? p->backpressure : p->post_errors).add();
    }
    return;
  }
  // Group kinds: every write names its own peer.
  for (size_t i = 0; i < posted; ++i)
    if (PeerCounters* p = stats_.peer(k, batch[i].peer)) {
      p->writes_posted.add();
      p->bytes_posted.add(batch[i].len);
    }
  if (posted < step.tried)
    if (PeerCounters* p = stats_.peer(k, batch[posted].peer))
      (step.result.error.is_ok() ? p->backpressure : p->post_errors).add();
}

void Worker::note_completion(uint8_t k, const Completion& c) {
  if constexpr (!kStatsEnabled) return;
  NicCounters& n = stats_.nic[k];
  switch (c.kind) {
    case Completion::Kind::kRemoteImm:
      if (!c.status.is_ok()) {
        n.imm_errors.add();
        return;
      }
      n.imms_received.add(c.count);
      stats_.imms.add(c.imm, c.count);
      if (trace_) {
        TraceEvent e;
        e.kind = TraceEvent::kImm;
        e.start_ns = e.end_ns = now_ns();
        e.id = c.imm;
        e.bytes = c.count;
        e.nic = k;
        trace_->push(e);
      }
      return;
    case Completion::Kind::kWrite:
    case Completion::Kind::kSend:
      return;  // note_local_done, once the worker knows it is no stale duplicate
    case Completion::Kind::kRecv:
      n.recvs.add();
      return;
  }
}

// Before the completion can finish its transfer: a user told "done" reads
// counts that include it.
void Worker::note_local_done(const Status& st, uint32_t count) {
  if constexpr (!kStatsEnabled) return;
  NicCounters& n = stats_.nic[current_nic_];
  n.writes_completed.add(count);
  if (!st.is_ok()) n.completion_errors.add(count);
}

void Worker::note_finished(const Slot& s, const Status& st) {
  if constexpr (!kStatsEnabled) return;
  const int64_t now = s.submit_ns != 0 || trace_ ? turn_ns() : 0;
  note_outcome(st, s.submit_ns, now);
  if (st.is_ok())
    for (uint8_t k = 0; k < nics_.size(); ++k) stats_.nic[k].bytes_completed.add(s.stat_bytes[k]);
  if (s.stat_p2p) {
    if (st.is_ok()) {
      for (uint8_t k = 0; k < nics_.size(); ++k)
        if (s.stat_bytes[k] != 0)
          if (PeerCounters* p = stats_.peer(k, s.peer[k])) p->bytes_ok.add(s.stat_bytes[k]);
    }
    const uint8_t k = s.stat_nic == UINT8_MAX ? 0 : s.stat_nic;
    if (PeerCounters* p = stats_.peer(k, s.peer[k]))
      (st.is_ok() ? p->transfers_ok : p->transfers_failed).add();
  }
  if (!trace_) return;
  TraceEvent e;
  e.kind = TraceEvent::kTransfer;
  e.start_ns = s.submit_ns != 0 ? s.submit_ns : now;
  e.first_post_ns = s.first_post_ns;
  e.picked_ns = s.picked_ns;
  e.end_ns = now;
  e.id = s.id;
  for (uint64_t b : s.stat_bytes) e.bytes += b;
  e.writes = uint32_t(s.posted);
  e.nic = s.stat_nic == UINT8_MAX ? 0 : s.stat_nic;
  e.code = uint8_t(st.code());
  e.op = uint8_t(s.req.index());
  trace_->push(e);
  if (!st.is_ok()) {
    e.kind = TraceEvent::kError;
    e.start_ns = now;
    trace_->push(e);
  }
}

void Worker::note_gauges() {
  if constexpr (!kStatsEnabled) return;
  for (size_t k = 0; k < nics_.size(); ++k) {
    stats_.nic[k].outstanding.set(nics_[k].outstanding);
    stats_.nic[k].pending.set(nics_[k].pending.size());
  }
}

}  // namespace ferry::core

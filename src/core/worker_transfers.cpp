// A worker's transfers from start to end: a command becomes a slot, its shards
// are posted NIC by NIC as the NICs take them, local completions are counted
// back to the slot, and a slot ends once everything posted completed, on the
// first error, or at its deadline.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/ctx.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "core/worker.h"

namespace ferry::core {

uint32_t Worker::alloc_slot() {
  if (free_slots_.empty()) {
    // Grow: existing slots keep their indices; contexts stay valid.
    uint32_t old = slots_.size();
    slots_.resize(old * 2);
    for (uint32_t i = slots_.size(); i-- > old;) free_slots_.push_back(i);
  }
  uint32_t idx = free_slots_.back();
  free_slots_.pop_back();
  return idx;
}

void Worker::start_transfer(Command& cmd) {
  if (cmd.fast.postable() && post_fast(cmd)) return;
  uint32_t idx = alloc_slot();
  Slot& s = slots_[idx];
  s.gen = (s.gen + 1) & 0xFFFFFF;
  s.active = true;
  s.finished = false;
  s.id = cmd.id;
  s.deadline = cmd.deadline;
  if (s.deadline != Clock::time_point{}) deadline_insert(idx);
  s.cursors_live = 0;
  s.posted = s.completed = 0;
  s.error = Status();
  if (cmd.fast.kind() == FastKind::kImm) {
    // Only the command's first line is read: one NIC, no OnDone.
    const FastImm& f = cmd.fast.imm;
    s.on_done = OnDone();
    s.admitted = true;
    auto& r = s.req.template emplace<SingleReq>();
    r.dst.count = 1;
    r.dst.nics[0] = DstRef::Nic{f.addr, f.rkey, f.base};
    r.imm = f.imm;
    r.route = WriteRoute::pinned(0);
  } else if (cmd.fast.kind() == FastKind::kSend) {
    const FastSend& f = cmd.fast.send;
    s.on_done = OnDone();
    s.admitted = true;
    s.req.template emplace<SendReq>(SendReq{f.addr, f.buffer, f.len});
  } else {
    s.on_done = std::move(cmd.on_done);
    s.admitted = cmd.admitted;
    std::visit(
        [&](auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (!std::is_same_v<T, RecvPostReq> && !std::is_same_v<T, ControlReq>)
            s.req.template emplace<T>(std::move(r));  // handle() never starts the others
        },
        cmd.req);
  }
  s.imm = std::visit([](const auto& r) { return ops::imm_of(r); }, s.req);
  s.peers.clear();
  s.group_peers = nullptr;
  ++active_;
  note_started(s, cmd);

  // Everything a transfer needs per NIC is resolved once, so posting only
  // patches addresses; user input was validated on the submitting thread.
  Status st = std::visit([&](auto& r) { return ops::prepare(s, r, *this); }, s.req);
  if (!st.is_ok()) {
    finish(s, std::move(st));
    maybe_finish(idx);
    return;
  }
  s.stat_p2p = std::visit([](const auto& r) { return ops::peer(r, 0) != nullptr; }, s.req);
  const ShardPlan plan = std::visit([&](auto& r) { return ops::plan(s, r, *this); }, s.req);
  enqueue_plan(idx, plan);
  maybe_finish(idx);  // empty requests complete at once
}

void Worker::enqueue_plan(uint32_t idx, const ShardPlan& plan) {
  Slot& s = slots_[idx];
  for (uint32_t i = 0; i < plan.num_shards; ++i) {
    const Shard& sh = plan.shards[i];
    if (sh.begin == sh.end) continue;
    s.cursors_live++;
    nics_[sh.nic].pending.push_back(Cursor{idx, s.gen, sh, sh.begin});
  }
}

bool Worker::progress_queued_posts() {
  bool did = false;
  const std::span<WriteDesc> batch(post_batch_);
  uint32_t* const units = post_units_.data();
  for (uint8_t k = 0; k < nics_.size(); ++k) {
    Nic& nic = nics_[k];
    size_t budget = infos_[k].post_budget;
    const size_t max_outstanding = infos_[k].max_outstanding;
    // Back-pressure can be per peer (a connection still being made, or to a
    // peer that died): a stalled cursor goes to the back and the others get
    // their turn; the NIC is left alone only once every cursor stalled.
    size_t stalled = 0;
    auto stall = [&] {
      Cursor turn = nic.pending.front();
      nic.pending.pop_front();
      nic.pending.push_back(turn);
      return ++stalled >= nic.pending.size();
    };
    auto retire_front = [&] {
      const uint32_t slot = nic.pending.front().slot;
      nic.pending.pop_front();
      slots_[slot].cursors_live--;
      maybe_finish(slot);
    };
    while (!nic.pending.empty() && budget > 0 && nic.outstanding < max_outstanding) {
      Cursor& c = nic.pending.front();
      Slot& s = slots_[c.slot];
      if (!s.active || s.gen != c.gen || s.finished || !s.error.is_ok()) {
        // Transfer already ended (error or deadline): drop the rest.
        if (s.active && s.gen == c.gen)
          retire_front();
        else
          nic.pending.pop_front();
        continue;
      }
      PostTarget t{nic.domain.get(),
                   &infos_[k],
                   k,
                   std::min(budget, max_outstanding - nic.outstanding),
                   batch,
                   units};
      const PostStep step =
          std::visit([&](const auto& r) { return ops::post(s, r, c, t, *this); }, s.req);
      const PostResult& r = step.result;
      note_posted(s, k, step, batch.data());
      did |= r.posted > 0;
      s.posted += r.posted;
      nic.outstanding += r.posted;
      budget -= std::min(budget, r.posted);
      if (r.posted < step.tried) {
        if (!r.error.is_ok()) {
          if (r.error.code() == Code::kUnavailable)
            if (const NetAddr* a =
                    std::visit([&](const auto& q) { return ops::peer(q, k); }, s.req))
              mark_dead(*a, r.error);
          s.error = r.error;  // stop posting this transfer; wait for what is posted
          retire_front();
          continue;
        }
        if (stall()) break;
        continue;
      }
      if (c.next >= c.shard.end) {
        retire_front();
      } else if (nic.pending.size() > 1) {
        // Take turns: a 100 000-page transfer must not starve a small one
        // queued behind it.
        Cursor turn = c;
        nic.pending.pop_front();
        nic.pending.push_back(turn);
      }
    }
  }
  return did;
}

bool Worker::poll_completions() {
  bool did = false;
  std::span<Completion> comps(polled_);
  // Callbacks run here may post their answers at once (answering_inline).
  in_completions_ = true;
  struct Leave {
    bool& flag;
    ~Leave() { flag = false; }
  } leave{in_completions_};
  for (uint8_t k = 0; k < nics_.size(); ++k) {
    Nic& nic = nics_[k];
    current_nic_ = k;
    size_t n = nic.domain->poll(comps);
    did |= n > 0;
    for (size_t i = 0; i < n; ++i) {
      Completion& c = comps[i];
      switch (c.kind) {
        case Completion::Kind::kRemoteImm:
          note_completion(k, c);
          if (c.status.is_ok()) {
            shared_->imms->on_arrival(*imm_cache_, c.imm, c.count,
                                      ArrivalClock(&Worker::turn_ns_of, this));
            ++arrivals_;
          } else
            log().warn("NIC {}: incoming immediate failed: {}", infos_[k].name, c.status.message());
          break;
        case Completion::Kind::kWrite:
        case Completion::Kind::kSend:
          // Only a completion of a live transfer releases a posting credit:
          // a stale duplicate must not let the NIC be over-filled.
          if (ctx_tag(c.ctx) == kTagFast ? on_fast_done(c.ctx, c.status, c.count)
                                         : on_local_done(c.ctx, c.status, c.count))
            nic.outstanding -= std::min<uint64_t>(nic.outstanding, c.count);
          break;
        case Completion::Kind::kRecv:
          note_completion(k, c);
          on_recv_done(c.ctx, c.len, c.status);
          ++arrivals_;
          break;
      }
    }
  }
  return did;
}

bool Worker::on_local_done(uint64_t ctx, const Status& st, uint32_t count) {
  uint32_t idx = ctx_idx(ctx);
  uint64_t tag = ctx_tag(ctx);
  if ((tag != kTagWrite && tag != kTagSend) || idx >= slots_.size()) {
    log().error("worker {}: completion with unknown context {:#x}", index_, ctx);
    return false;
  }
  Slot& s = slots_[idx];
  if (!s.active || s.gen != ctx_gen(ctx)) return false;  // stale: the slot was recycled
  note_local_done(st, count);
  s.completed += count;
  if (!st.is_ok()) {
    if (st.code() == Code::kUnavailable)
      if (const NetAddr* a = std::visit(
              [&](const auto& r) { return ops::peer(r, tag == kTagSend ? 0 : current_nic_); },
              s.req))
        mark_dead(*a, st);
    if (s.error.is_ok()) s.error = st;
  }
  maybe_finish(idx);
  return true;
}

void Worker::maybe_finish(uint32_t idx) {
  Slot& s = slots_[idx];
  if (!s.active) return;
  // A failure is reported at once; the slot stays until every posted write
  // completed, so late completions cannot be mistaken for a new transfer's.
  if (!s.error.is_ok()) finish(s, s.error);
  if (s.cursors_live > 0 || s.completed < s.posted) return;
  finish(s, s.error);
  std::visit([&](auto& r) { ops::release(r, *this); }, s.req);
  if (s.on_deadline_list) deadline_remove(idx);
  s.active = false;
  s.req = TransferReq{};
  s.peers.clear();
  free_slots_.push_back(idx);
  --active_;
  if (std::exchange(s.admitted, false)) release_admission();
}

// Deadlines are almost always "now + the default", so a new one belongs at
// the tail: insertion walks back from there, removal is O(1), and the scan
// looks only at the head, whatever the number of transfers in flight.
void Worker::deadline_insert(uint32_t idx) {
  Slot& s = slots_[idx];
  uint32_t after = dl_tail_;
  while (after != kNone && slots_[after].deadline > s.deadline) after = slots_[after].dl_prev;
  s.dl_prev = after;
  s.dl_next = after == kNone ? dl_head_ : slots_[after].dl_next;
  if (s.dl_next != kNone)
    slots_[s.dl_next].dl_prev = idx;
  else
    dl_tail_ = idx;
  if (after != kNone)
    slots_[after].dl_next = idx;
  else
    dl_head_ = idx;
  s.on_deadline_list = true;
}

void Worker::deadline_remove(uint32_t idx) {
  Slot& s = slots_[idx];
  if (s.dl_prev != kNone)
    slots_[s.dl_prev].dl_next = s.dl_next;
  else
    dl_head_ = s.dl_next;
  if (s.dl_next != kNone)
    slots_[s.dl_next].dl_prev = s.dl_prev;
  else
    dl_tail_ = s.dl_prev;
  s.dl_prev = s.dl_next = kNone;
  s.on_deadline_list = false;
}

void Worker::finish(Slot& s, Status st) {
  if (s.finished) return;
  s.finished = true;
  if (!st.is_ok() && s.error.is_ok()) s.error = st;
  note_finished(s, st);
  signal(std::exchange(s.on_done, OnDone()), std::move(st));
}

void Worker::check_deadlines() {
  // Registrations retired by unreg_mr die here once no transfer holds them.
  if (!retired_.empty())
    std::erase_if(retired_, [](const RegRef& r) { return r.use_count() == 1; });
  const auto now = Clock::now();
  if (fast_head_ < fast_tail_) check_fast_deadlines(now);
  while (dl_head_ != kNone && slots_[dl_head_].deadline <= now) {
    const uint32_t i = dl_head_;
    Slot& s = slots_[i];
    deadline_remove(i);
    if (!s.active || s.finished) continue;
    const NetAddr* peer = std::visit([](const auto& r) { return ops::peer(r, 0); }, s.req);
    std::string who = peer ? peer->brief() : std::string("its peers");
    // A peer known to have failed is the reason, not the clock.
    if (peer && !dead_.empty()) {
      if (auto d = dead_.find(*peer); d != dead_.end()) {
        finish(s, Status(Code::kUnavailable,
                         fmt::format("transfer {} to {} via NIC {}: peer failed: {}", s.id, who,
                                     infos_[0].name, d->second.why.message())));
        maybe_finish(i);
        continue;
      }
    }
    const std::string progress =
        s.posted == 0 ? std::string(
                            "the provider accepted none of its writes (peer unreachable, "
                            "or the NIC stayed full)")
                      : fmt::format("{} of {} posted writes completed", s.completed, s.posted);
    finish(s, Status(Code::kDeadlineExceeded,
                     fmt::format("transfer {} to {} via NIC {} passed its deadline: {}", s.id, who,
                                 infos_[0].name, progress)));
    maybe_finish(i);
  }
}
}  // namespace ferry::core

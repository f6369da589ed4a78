#include "testing/fault_domain.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "core/ctx.h"

namespace ferry::testing {

namespace {

// The engine's context layout (core/ctx.h); our own pooled records use kOwnTag.
using core::ctx_gen;
using core::ctx_tag;
constexpr uint64_t kOwnTag = 0xFE;
uint32_t ctx_slot(uint64_t ctx) {
  return core::ctx_idx(ctx);
}
uint64_t own_ctx(uint32_t gen, uint32_t idx) {
  return core::make_ctx(kOwnTag, gen, idx);
}

constexpr uint32_t kNoGen = 0xFFFFFFFF;
// Engine slot tables start at 4096 and double; beyond this, duplicates of a
// slot are simply not made (memory stays bounded).
constexpr uint32_t kMaxTrackedSlots = 1u << 22;
constexpr size_t kMaxStale = 4096;
// Pieces waiting for the inner domain: beyond this, new writes see
// back-pressure instead of growing the queue.
constexpr size_t kMaxBacklog = 1024;
constexpr size_t kPollScratch = 64;

struct GlobalStats {
  std::atomic<uint64_t> completions{0}, delayed{0}, held_back{0}, short_posts{0}, split_writes{0},
      split_pieces{0}, failed_completions{0}, failed_posts{0}, stale_delivered{0}, stale_dropped{0},
      coalesced{0};
};
GlobalStats& global_stats() {
  static GlobalStats g;
  return g;
}

Status injected(std::string_view what, size_t nic) {
  return Status(Code::kUnavailable, fmt::format("injected fault ({}, NIC {})", what, nic));
}

Status bad(std::string_view key, std::string_view why) {
  return Status(Code::kInvalidArgument, fmt::format("fault spec: key '{}': {}", key, why));
}

bool parse_u64(std::string_view v, uint64_t* out) {
  if (v.empty()) return false;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && p == v.data() + v.size();
}

bool parse_prob(std::string_view v, double* out) {
  if (v.empty()) return false;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
  return ec == std::errc() && p == v.data() + v.size() && std::isfinite(*out) && *out >= 0 &&
         *out <= 1;
}

}  // namespace

Status parse_fault_spec(std::string_view spec, FaultSpec* out) {
  FaultSpec s;
  std::vector<std::string_view> seen;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (comma != std::string_view::npos && spec.empty()) return bad(item, "trailing comma");
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad(item, "expected key=value");
    std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    if (key.empty()) return bad(item, "empty key");
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) return bad(key, "given twice");
    seen.push_back(key);
    bool ok = true;
    if (key == "seed")
      ok = parse_u64(val, &s.seed);
    else if (key == "delay_us")
      ok = parse_u64(val, &s.delay_us) && s.delay_us <= 10'000'000;
    else if (key == "stale_us")
      ok = parse_u64(val, &s.stale_us) && s.stale_us <= 60'000'000;
    else if (key == "reorder")
      ok = parse_prob(val, &s.reorder);
    else if (key == "eagain")
      ok = parse_prob(val, &s.eagain);
    else if (key == "coalesce")
      ok = parse_prob(val, &s.coalesce);
    else if (key == "paged")
      ok = (val == "0" || val == "1") && ((s.paged = val == "1"), true);
    else if (key == "split")
      ok = parse_prob(val, &s.split);
    else if (key == "fail")
      ok = parse_prob(val, &s.fail);
    else if (key == "stale")
      ok = parse_prob(val, &s.stale);
    else
      return bad(key,
                 "unknown (known: seed, delay_us, reorder, eagain, coalesce, paged, split, "
                 "fail, stale, stale_us)");
    if (!ok) {
      bool dur = key == "seed" || key == "delay_us" || key == "stale_us";
      return bad(key, fmt::format("malformed value '{}' (expected {})", val,
                                  key == "paged" ? "0 or 1"
                                  : dur          ? "an unsigned integer in range"
                                                 : "a probability in [0, 1]"));
    }
  }
  *out = s;
  return {};
}

FaultStats process_fault_stats() {
  auto& g = global_stats();
  FaultStats s;
  s.completions = g.completions.load();
  s.delayed = g.delayed.load();
  s.held_back = g.held_back.load();
  s.short_posts = g.short_posts.load();
  s.split_writes = g.split_writes.load();
  s.split_pieces = g.split_pieces.load();
  s.failed_completions = g.failed_completions.load();
  s.failed_posts = g.failed_posts.load();
  s.stale_delivered = g.stale_delivered.load();
  s.stale_dropped = g.stale_dropped.load();
  s.coalesced = g.coalesced.load();
  return s;
}

FaultDomain::FaultDomain(std::unique_ptr<core::Domain> inner, const FaultSpec& spec,
                         size_t nic_index, NowFn now)
    : inner_(std::move(inner)),
      spec_(spec),
      nic_(nic_index),
      now_(std::move(now)),
      rng_(spec.seed ^ nic_index) {
  info_ = inner_->info();
  if (spec.paged) info_.native_paged = true;
  // Every write here has a completion to delay, reorder or fail.
  info_.imm_at_post = false;
  info_.send_at_post_max = 0;
  held_.reserve(1024);
  ready_.reserve(1024);
  backlog_.reserve(256);
}

FaultDomain::~FaultDomain() {
  // Publish this domain's counts once; the datapath never touches atomics.
  auto& g = global_stats();
  g.completions += stats_.completions;
  g.delayed += stats_.delayed;
  g.held_back += stats_.held_back;
  g.short_posts += stats_.short_posts;
  g.split_writes += stats_.split_writes;
  g.split_pieces += stats_.split_pieces;
  g.failed_completions += stats_.failed_completions;
  g.failed_posts += stats_.failed_posts;
  g.stale_delivered += stats_.stale_delivered;
  g.coalesced += stats_.coalesced;
  g.stale_dropped += stats_.stale_dropped + stale_.size();
}

uint64_t FaultDomain::now() const {
  if (now_) return now_();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ posts

void FaultDomain::note_post(uint64_t ctx) {
  if (spec_.stale <= 0) return;
  uint64_t tag = ctx_tag(ctx);
  if (tag != core::kTagWrite && tag != core::kTagSend) return;
  uint32_t slot = ctx_slot(ctx);
  if (slot >= kMaxTrackedSlots) return;
  if (slot >= slot_gen_.size())
    slot_gen_.resize(std::max<size_t>(slot + 1, 2 * slot_gen_.size()), kNoGen);
  slot_gen_[slot] = ctx_gen(ctx);
}

bool FaultDomain::slot_reused(uint64_t ctx) const {
  uint32_t slot = ctx_slot(ctx);
  return slot < slot_gen_.size() && slot_gen_[slot] != kNoGen && slot_gen_[slot] != ctx_gen(ctx);
}

uint32_t FaultDomain::alloc_rec() {
  if (free_recs_.empty()) {
    uint32_t old = recs_.size();
    recs_.resize(std::max<size_t>(64, old * 2));
    for (uint32_t i = recs_.size(); i-- > old;) free_recs_.push_back(i);
  }
  uint32_t idx = free_recs_.back();
  free_recs_.pop_back();
  return idx;
}

void FaultDomain::queue_split(const core::WriteDesc& w) {
  uint32_t idx = alloc_rec();
  SplitRec& r = recs_[idx];
  r.gen = (r.gen + 1) & 0xFFFFFF;
  r.active = true;
  r.has_imm = w.has_imm;
  r.imm_posted = false;
  r.outstanding = 0;
  r.ctx = w.ctx;
  r.error = Status();
  const uint64_t ctx = own_ctx(r.gen, idx);
  // 2-4 pieces at distinct random cut points, never empty.
  uint64_t pieces = 2 + below(std::min<uint64_t>(3, w.len - 1));
  uint64_t cuts[5] = {0, 0, 0, 0, 0};
  size_t n = 0;
  while (n < pieces - 1) {
    uint64_t c = 1 + below(w.len - 1);
    if (std::find(cuts + 1, cuts + 1 + n, c) == cuts + 1 + n) cuts[1 + n++] = c;
  }
  // Insertion sort of at most 3 cuts (std::sort trips GCC 12's -Warray-bounds here).
  for (size_t a = 2; a < pieces; ++a)
    for (size_t b = a; b > 1 && cuts[b - 1] > cuts[b]; --b) std::swap(cuts[b - 1], cuts[b]);
  cuts[pieces] = w.len;
  for (uint64_t k = 0; k < pieces; ++k) {
    core::WriteDesc p = w;
    p.src = static_cast<const uint8_t*>(w.src) + cuts[k];
    p.len = cuts[k + 1] - cuts[k];
    p.remote_addr = w.remote_addr + cuts[k];
    p.has_imm = false;
    p.imm = 0;
    p.ctx = ctx;
    backlog_.push_back(p);
  }
  r.unposted = pieces;
  // The immediate travels alone, after the data, at the write's start address.
  r.imm_write = w;
  r.imm_write.len = 0;
  r.imm_write.ctx = ctx;
  stats_.split_writes++;
  stats_.split_pieces += pieces;
}

void FaultDomain::flush_backlog() {
  while (backlog_head_ < backlog_.size()) {
    // Pieces of a write that already failed are not posted.
    const core::WriteDesc& front = backlog_[backlog_head_];
    SplitRec& fr = recs_[ctx_slot(front.ctx)];
    if (!fr.error.is_ok()) {
      fr.unposted--;
      backlog_head_++;
      maybe_complete_rec(ctx_slot(front.ctx));
      continue;
    }
    size_t n = 1;
    while (backlog_head_ + n < backlog_.size() && n < 64 &&
           recs_[ctx_slot(backlog_[backlog_head_ + n].ctx)].error.is_ok())
      ++n;
    auto r = inner_->post_writes(std::span(backlog_.data() + backlog_head_, n));
    for (size_t i = 0; i < r.posted; ++i) {
      SplitRec& rec = recs_[ctx_slot(backlog_[backlog_head_ + i].ctx)];
      rec.unposted--;
      rec.outstanding++;
    }
    backlog_head_ += r.posted;
    if (!r.error.is_ok() && r.posted < n) {
      uint32_t idx = ctx_slot(backlog_[backlog_head_].ctx);
      recs_[idx].error = r.error;
      recs_[idx].unposted--;
      backlog_head_++;
      maybe_complete_rec(idx);
      continue;
    }
    if (r.posted < n) break;  // back-pressure from the inner domain
  }
  if (backlog_head_ == backlog_.size()) {
    backlog_.clear();
    backlog_head_ = 0;
  } else if (backlog_head_ > 256 && backlog_head_ * 2 > backlog_.size()) {
    backlog_.erase(backlog_.begin(), backlog_.begin() + backlog_head_);
    backlog_head_ = 0;
  }
}

core::PostResult FaultDomain::post_writes(std::span<const core::WriteDesc> writes) {
  flush_backlog();
  core::PostResult res;
  if (writes.empty()) return res;
  // Our own back-pressure: pieces waiting for the inner domain stay bounded.
  if (backlog_.size() - backlog_head_ > kMaxBacklog) return res;
  size_t limit = writes.size();
  if (chance(spec_.eagain)) {
    limit = below(limit);
    stats_.short_posts++;
  }
  bool fail = false;
  if (limit && chance(spec_.fail)) {
    limit = below(limit);  // the writes before it are posted, then the call fails
    fail = true;
  }

  // Runs of unsplit writes go down in one call; a split write is queued.
  size_t i = 0;
  while (i < limit) {
    size_t j = i;
    while (j < limit && !(writes[j].len > 1 && chance(spec_.split))) ++j;
    if (j > i) {
      auto r = inner_->post_writes(writes.subspan(i, j - i));
      for (size_t k = 0; k < r.posted; ++k) note_post(writes[i + k].ctx);
      res.posted += r.posted;
      if (!r.error.is_ok() || r.posted < j - i) {
        res.error = std::move(r.error);
        return res;
      }
    }
    if (j < limit) {  // writes[j] drew "split" in the loop above
      note_post(writes[j].ctx);
      queue_split(writes[j]);
      res.posted++;
    }
    i = j + 1;
  }
  flush_backlog();
  if (fail) {
    res.error = injected("post_writes", nic_);
    stats_.failed_posts++;
  }
  return res;
}

core::PostResult FaultDomain::post_send(core::PeerId peer, const void* buf, size_t len,
                                        void* local_desc, uint64_t ctx) {
  flush_backlog();
  if (chance(spec_.eagain)) {
    stats_.short_posts++;
    return {};
  }
  if (chance(spec_.fail)) {
    stats_.failed_posts++;
    return {0, injected("post_send", nic_)};
  }
  auto r = inner_->post_send(peer, buf, len, local_desc, ctx);
  if (r.posted) note_post(ctx);
  return r;
}

core::PostResult FaultDomain::post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) {
  if (chance(spec_.eagain)) {
    stats_.short_posts++;
    return {};
  }
  return inner_->post_recv(buf, len, local_desc, ctx);
}

// ------------------------------------------------------------ completions

void FaultDomain::on_own_completion(const core::Completion& c) {
  uint32_t idx = ctx_slot(c.ctx);
  if (idx >= recs_.size() || !recs_[idx].active || recs_[idx].gen != ctx_gen(c.ctx)) return;
  SplitRec& r = recs_[idx];
  r.outstanding--;
  if (!c.status.is_ok() && r.error.is_ok()) r.error = c.status;
  maybe_complete_rec(idx);
}

void FaultDomain::maybe_complete_rec(uint32_t idx) {
  SplitRec& r = recs_[idx];
  if (!r.active || r.unposted > 0 || r.outstanding > 0) return;
  if (r.error.is_ok() && r.has_imm && !r.imm_posted) {
    // Every piece completed locally: only now may the immediate follow.
    r.imm_posted = true;
    r.unposted = 1;
    backlog_.push_back(r.imm_write);
    return;
  }
  core::Completion up;
  up.kind = core::Completion::Kind::kWrite;
  up.ctx = r.ctx;
  up.status = std::move(r.error);
  r.active = false;
  r.error = Status();
  free_recs_.push_back(idx);
  intake(std::move(up));
}

void FaultDomain::intake(core::Completion c) {
  const bool local =
      c.kind == core::Completion::Kind::kWrite || c.kind == core::Completion::Kind::kSend;
  if (local && c.status.is_ok() && chance(spec_.fail)) {
    c.status = injected("completion", nic_);
    stats_.failed_completions++;
  }
  uint64_t hold_us = spec_.delay_us ? below(spec_.delay_us + 1) : 0;
  if (hold_us) stats_.delayed++;
  if (chance(spec_.reorder)) {
    hold_us += 1 + below(std::max<uint64_t>(1, 4 * spec_.delay_us));
    stats_.held_back++;
  }
  held_.push_back(Held{std::move(c), now() + hold_us * 1000});
}

bool FaultDomain::stale_ready(const Stale& s, uint64_t t) const {
  return t >= s.not_before_ns && slot_reused(s.c.ctx);
}

size_t FaultDomain::release(std::span<core::Completion> out) {
  const uint64_t t = now();
  // Stable split: due completions to ready_, the rest keep their order.
  size_t keep = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].release_ns <= t)
      ready_.push_back(std::move(held_[i].c));
    else if (keep != i)
      held_[keep++] = std::move(held_[i]);
    else
      ++keep;
  }
  held_.resize(keep);
  if (spec_.reorder > 0)
    for (size_t i = ready_.size(); i > 1; --i) std::swap(ready_[i - 1], ready_[below(i)]);
  const size_t take = std::min(out.size(), ready_.size());
  size_t n = 0;
  for (size_t i = 0; i < take; ++i) {
    core::Completion& c = ready_[i];
    const bool local =
        c.kind == core::Completion::Kind::kWrite || c.kind == core::Completion::Kind::kSend;
    if (local && chance(spec_.stale)) {
      if (stale_.size() >= kMaxStale) {
        stale_.erase(stale_.begin());
        stats_.stale_dropped++;
      }
      stale_.push_back(Stale{c, t + spec_.stale_us * 1000});
    }
    // coalesce: report a run the way batching domains (NVLink) do, one entry
    // with a count for equal neighbours.
    if (n > 0 && spec_.coalesce > 0 && c.status.is_ok() && out[n - 1].status.is_ok() &&
        out[n - 1].kind == c.kind && out[n - 1].count < UINT32_MAX - c.count &&
        ((c.kind == core::Completion::Kind::kRemoteImm && out[n - 1].imm == c.imm) ||
         (c.kind == core::Completion::Kind::kWrite && out[n - 1].ctx == c.ctx)) &&
        chance(spec_.coalesce)) {
      out[n - 1].count += c.count;
      stats_.coalesced++;
      continue;
    }
    out[n++] = std::move(c);
  }
  // Due but no room: they stay due and leave first next time.
  for (size_t i = take; i < ready_.size(); ++i) held_.push_back(Held{std::move(ready_[i]), t});
  ready_.clear();
  // Duplicates whose transfer has ended, oldest first.
  for (size_t i = 0; i < stale_.size() && n < out.size();) {
    if (stale_ready(stale_[i], t)) {
      out[n++] = std::move(stale_[i].c);
      stale_.erase(stale_.begin() + i);
      stats_.stale_delivered++;
    } else {
      ++i;
    }
  }
  return n;
}

size_t FaultDomain::poll(std::span<core::Completion> out) {
  flush_backlog();
  // Drain more than `out` holds: a held completion must not stall the ones
  // behind it in the inner CQ.
  core::Completion scratch[kPollScratch];
  for (int round = 0; round < 4; ++round) {
    size_t got = inner_->poll(scratch);
    stats_.completions += got;
    for (size_t i = 0; i < got; ++i) {
      if (ctx_tag(scratch[i].ctx) == kOwnTag && scratch[i].kind == core::Completion::Kind::kWrite)
        on_own_completion(scratch[i]);
      else
        intake(std::move(scratch[i]));
    }
    if (got < kPollScratch) break;
  }
  // A trailing immediate queued just now goes out without waiting a round.
  flush_backlog();
  return release(out);
}

int FaultDomain::wait_fd() {
  // While anything is held the worker must keep polling: nothing would make
  // the inner fd readable when a held completion falls due.
  if (!can_block_now()) return -1;
  return inner_->wait_fd();
}

bool FaultDomain::can_block() {
  return can_block_now() && inner_->can_block();
}

bool FaultDomain::can_block_now() const {
  if (!held_.empty() || backlog_head_ < backlog_.size()) return false;
  // A pending duplicate whose slot was reused is due now or within stale_us.
  for (const Stale& s : stale_)
    if (slot_reused(s.c.ctx)) return false;
  return true;
}

std::unique_ptr<core::Domain> wrap_with_faults(std::unique_ptr<core::Domain> inner,
                                               const std::string& spec, size_t nic_index,
                                               Status* error) {
  FaultSpec s;
  Status st = parse_fault_spec(spec, &s);
  if (!st.is_ok()) {
    *error = std::move(st);
    return nullptr;
  }
  return std::make_unique<FaultDomain>(std::move(inner), s, nic_index);
}

}  // namespace ferry::testing

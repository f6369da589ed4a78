// Scatter and barrier: one write per target (scatter's kShardBytes: up to
// one per NIC per target) to a list of peers, resolved per request or taken
// from a peer group.
#include "core/ctx.h"
#include "core/ops.h"

namespace ferry::core::ops {

namespace {

template <typename Desc>
Status resolve_group(Slot& s, std::optional<PeerGroupHandle> group, size_t targets, Desc&& desc_of,
                     OpHost& h) {
  Status err;
  if (group) {
    s.group_peers = h.group_peers(*group, targets, &err);
    return err;
  }
  s.peers.resize(targets * kMaxNics);
  for (size_t t = 0; t < targets && err.is_ok(); ++t) {
    const MrDesc& d = desc_of(t);
    for (uint8_t k = 0; k < h.nic_count && err.is_ok(); ++k)
      s.peers[t * kMaxNics + k] = h.resolve(k, d.nics[k].addr, &err);
  }
  return err;
}

const std::vector<PeerId>& peers_of(const Slot& s) {
  return s.group_peers ? *s.group_peers : s.peers;
}

ShardPlan plan_targets(uint32_t targets, const GroupRoute& route, OpHost& h, bool bytes_ok) {
  if (route.kind == GroupRoute::Kind::kPinned) return plan_pinned(targets, route.nic);
  if (bytes_ok && route.kind == GroupRoute::Kind::kShardBytes)
    return plan_shard_bytes(targets, h.nic_count);
  return plan_runs(targets, h.nic_count, *h.rr);
}

}  // namespace

Status prepare(Slot& s, const ScatterReq& r, OpHost& h) {
  for (uint8_t k = 0; k < h.nic_count; ++k) s.src_desc[k] = r.src->local_desc[k];
  return resolve_group(
      s, r.group, r.dsts.size(), [&](size_t t) -> const MrDesc& { return r.dsts[t].dst; }, h);
}

Status prepare(Slot& s, BarrierReq& r, OpHost& h) {
  return resolve_group(
      s, r.group, r.dsts.size(), [&](size_t t) -> const MrDesc& { return r.dsts[t]; }, h);
}

ShardPlan plan(Slot&, const ScatterReq& r, OpHost& h) {
  return plan_targets(uint32_t(r.dsts.size()), r.route, h, true);
}

ShardPlan plan(Slot&, const BarrierReq& r, OpHost& h) {
  return plan_targets(uint32_t(r.dsts.size()), r.route, h, false);
}

PostStep post(Slot& s, const ScatterReq& r, Cursor& c, const PostTarget& t, OpHost& h) {
  const auto& peers = peers_of(s);
  const bool bytes = r.route.kind == GroupRoute::Kind::kShardBytes;
  const uint64_t ctx = make_ctx(kTagWrite, s.gen, c.slot);
  return post_filled(c, t, [&](std::span<WriteDesc> out, uint32_t* units) {
    size_t n = 0;
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      const ScatterDst& d = r.dsts[c.next];
      uint64_t off = 0, len = d.len;
      if (bytes) {
        Split sp = split_bytes(d.len, h.nic_count, kMinScatterPiece);
        if (c.shard.part >= sp.count) continue;  // this target needs fewer pieces
        off = sp.piece_offset(c.shard.part);
        len = sp.piece_len(c.shard.part, d.len);
      }
      units[n] = c.next;
      WriteDesc& w = out[n++];
      w.ctx = ctx;
      w.has_imm = s.imm.has_value();
      w.imm = s.imm.value_or(0);
      w.local_desc = s.src_desc[t.nic];
      w.len = len;
      w.src = r.src->ptr + d.src_offset + off;
      w.peer = peers[c.next * kMaxNics + t.nic];
      w.remote_addr = d.dst.nics[t.nic].base + d.dst_offset + off;
      w.rkey = d.dst.nics[t.nic].rkey;
    }
    return n;
  });
}

PostStep post(Slot& s, const BarrierReq& r, Cursor& c, const PostTarget& t, OpHost&) {
  const auto& peers = peers_of(s);
  const uint64_t ctx = make_ctx(kTagWrite, s.gen, c.slot);
  return post_filled(c, t, [&](std::span<WriteDesc> out, uint32_t* units) {
    size_t n = 0;
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      const MrDesc& d = r.dsts[c.next];
      units[n] = c.next;
      WriteDesc& w = out[n++];
      w.ctx = ctx;
      w.has_imm = s.imm.has_value();
      w.imm = s.imm.value_or(0);
      w.len = 0;
      w.src = nullptr;
      w.local_desc = nullptr;
      w.peer = peers[c.next * kMaxNics + t.nic];
      w.remote_addr = d.nics[t.nic].base;
      w.rkey = d.nics[t.nic].rkey;
    }
    return n;
  });
}

}  // namespace ferry::core::ops

// Single writes (and immediates: a zero-byte single write), optionally split
// into pieces over the group's NICs.
#include "core/ctx.h"
#include "core/ops.h"

namespace ferry::core::ops {

namespace {

// An immediate names no source (SingleReq::src is null): its zero-byte write
// uses the engine's send pool, which every worker holds for the engine's life,
// so the submitter copies no reference that the worker would then drop.
const Registration& source(const RegRef& src, const OpHost& h) {
  return src ? *src : **h.send_reg;
}

// Local descriptors of the source and peers of the destination, per NIC.
Status resolve_point(Slot& s, const Registration& src, const DstRef& dst, OpHost& h) {
  Status err;
  for (uint8_t k = 0; k < h.nic_count; ++k) {
    s.src_desc[k] = src.local_desc[k];
    s.peer[k] = h.resolve(k, *dst.nics[k].addr, &err);
    if (!err.is_ok()) break;
  }
  return err;
}

}  // namespace

Status prepare(Slot& s, const SingleReq& r, OpHost& h) {
  return resolve_point(s, source(r.src, h), r.dst, h);
}

Status prepare(Slot& s, const PagedReq& r, OpHost& h) {
  return resolve_point(s, *r.src, r.dst, h);
}

ShardPlan plan(Slot& s, const SingleReq& r, OpHost& h) {
  ShardPlan p = plan_single(r.len, r.route, h.nic_count, *h.rr);
  s.split = p.split;
  return p;
}

PostStep post(Slot& s, const SingleReq& r, Cursor& c, const PostTarget& t, OpHost& h) {
  const auto& d = r.dst.nics[t.nic];
  const uint8_t* const src = source(r.src, h).ptr + r.src_offset;
  const uint64_t ctx = make_ctx(kTagWrite, s.gen, c.slot);
  return post_filled(c, t, [&](std::span<WriteDesc> out, uint32_t* units) {
    size_t n = 0;
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      units[n] = c.next;
      WriteDesc& w = out[n++];
      w.ctx = ctx;
      w.has_imm = s.imm.has_value();
      w.imm = s.imm.value_or(0);
      w.local_desc = s.src_desc[t.nic];
      uint64_t off = s.split.piece_offset(c.next);
      w.len = s.split.piece_len(c.next, r.len);
      // A zero-length write still needs an in-bounds address and valid key.
      if (w.len == 0) off = 0;
      w.src = src + off;
      w.peer = s.peer[t.nic];
      w.remote_addr = d.base + r.dst_offset + off;
      w.rkey = d.rkey;
    }
    return n;
  });
}

}  // namespace ferry::core::ops

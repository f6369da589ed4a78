// Paged writes: page lists sharded into contiguous runs, one per NIC; handed
// to the NIC as page lists where it takes them (DomainInfo::native_paged),
// else spelled out one WriteDesc per page.
#include "core/ctx.h"
#include "core/ops.h"

namespace ferry::core::ops {

namespace {

// The pages of cursor c still to post on NIC `nic`, as page lists.
PagedDesc paged_desc(const Slot& s, const PagedReq& r, const Cursor& c, uint8_t nic) {
  const auto& d = r.dst.nics[nic];
  PagedDesc p;
  p.src = r.src->ptr + r.src_pages.offset;
  p.src_stride = r.src_pages.stride;
  p.src_idx = r.src_pages.indices.data() + c.next;
  p.remote_base = d.base + r.dst_pages.offset;
  p.dst_stride = r.dst_pages.stride;
  p.dst_idx = r.dst_pages.indices.data() + c.next;
  p.count = c.shard.end - c.next;
  p.page_len = r.page_len;
  p.local_desc = s.src_desc[nic];
  p.peer = s.peer[nic];
  p.rkey = d.rkey;
  p.imm = s.imm.value_or(0);
  p.has_imm = s.imm.has_value();
  p.ctx = make_ctx(kTagWrite, s.gen, c.slot);
  return p;
}

}  // namespace

ShardPlan plan(Slot&, const PagedReq& r, OpHost& h) {
  return plan_runs(r.src_pages.indices.size(), h.nic_count, *h.rr);
}

PostStep post(Slot& s, const PagedReq& r, Cursor& c, const PostTarget& t, OpHost&) {
  PagedDesc p = paged_desc(s, r, c, t.nic);
  if (t.info->native_paged) {
    // The domain does the per-page work.
    PostStep step;
    step.tried = std::min(t.want, size_t(p.count));
    p.count = uint32_t(step.tried);
    step.result = t.domain->post_paged(p);
    c.next += uint32_t(std::min(step.result.posted, step.tried));
    step.bytes = std::min(step.result.posted, step.tried) * r.page_len;
    return step;
  }
  return post_filled(c, t, [&](std::span<WriteDesc> out, uint32_t* units) {
    const size_t n = spell_out_pages(p, 0, out);
    for (size_t i = 0; i < n; ++i) units[i] = c.next + uint32_t(i);
    c.next += uint32_t(n);
    return n;
  });
}

}  // namespace ferry::core::ops

// Two-sided sends from the engine's send-buffer pool, on NIC 0.
#include "core/ctx.h"
#include "core/ops.h"
#include "core/worker.h"

namespace ferry::core::ops {

Status prepare(Slot& s, SendReq& r, OpHost& h) {
  Status err;
  s.peer[0] = h.resolve(0, *r.addr, &err);
  return err;
}

ShardPlan plan(Slot&, const SendReq&, OpHost&) {
  return plan_pinned(1, 0);
}

PostStep post(Slot& s, const SendReq& r, Cursor& c, const PostTarget& t, OpHost& h) {
  PostStep step;
  step.tried = 1;
  step.result =
      t.domain->post_send(s.peer[0], h.send_pool->buffer(r.buffer), r.len,
                          h.send_pool->reg->local_desc[0], make_ctx(kTagSend, s.gen, c.slot));
  if (step.result.posted > 0) {
    c.next = c.shard.end;
    step.bytes = r.len;
  }
  return step;
}

void release(SendReq& r, OpHost& h) {
  h.send_free->release(r.buffer);
}

}  // namespace ferry::core::ops

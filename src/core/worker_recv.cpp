// Receives of a worker: posting the engine's receive buffers and handing
// filled ones to the user (on the callback thread, or inline), re-posting
// each once the user saw the bytes.
#include <fmt/format.h>

#include "core/callback_thread.h"
#include "core/ctx.h"
#include "core/log.h"
#include "core/recv_queue_state.h"
#include "core/worker.h"

namespace ferry::core {

void Worker::post_recv_buffer(uint32_t pool, uint32_t buffer) {
  auto& p = *(*shared_->recv_pools)[pool];
  auto r = nics_[0].domain->post_recv(p.buffer(buffer), p.buf_len, p.reg->local_desc[0],
                                      make_ctx(kTagRecv, pool, buffer));
  if (!r.error.is_ok() || r.posted == 0) {
    // Receives are posted rarely; a full queue is retried from the command queue.
    if (r.error.is_ok()) {
      Command c;
      c.req = RecvPostReq{pool, buffer};
      enqueue(std::move(c));
    } else {
      log().error("NIC {}: cannot post receive buffer {} of pool {}: {}", infos_[0].name, buffer,
                  pool, r.error.message());
    }
  }
}

void Worker::on_recv_done(uint64_t ctx, uint64_t len, const Status& st) {
  uint32_t pool = ctx_gen(ctx), buffer = ctx_idx(ctx);
  if (ctx_tag(ctx) != kTagRecv || pool >= shared_->recv_pools->size() ||
      !(*shared_->recv_pools)[pool])
    return;
  if (!st.is_ok()) {
    if (!stop_.load())
      log().warn("NIC {}: receive failed: {} (buffer re-posted)", infos_[0].name, st.message());
    if (!stop_.load()) post_recv_buffer(pool, buffer);
    return;
  }
  RecvPool& p = *(*shared_->recv_pools)[pool];
  len = std::min<uint64_t>(len, p.buf_len);
  if (p.queue) {
    p.queue->push(buffer, len);
    return;
  }
  if (!p.on_worker) {
    shared_->callbacks->push(RecvEvent{&Worker::deliver_recv, this, pool, buffer, len}, turn_ns());
    return;
  }
  // Inline (CallbackOn::kWorker): no hop either way, and the buffer goes
  // straight back to the NIC. An exception must not reach the worker's loop.
  shared_->callbacks->run_user("inline receive callback",
                               [&] { p.on_recv(std::span<const uint8_t>(p.buffer(buffer), len)); });
  repost_after_posts(pool, buffer);
}

void Worker::repost_after_posts(uint32_t pool, uint32_t buffer) {
  if (reposts_n_ == kDeferredReposts) {
    if (!stop_.load()) post_recv_buffer(pool, buffer);
    return;
  }
  reposts_[reposts_n_++] = {pool, buffer};
}

bool Worker::flush_reposts() {
  if (reposts_n_ == 0) return false;
  const uint32_t n = reposts_n_;
  reposts_n_ = 0;
  if (!stop_.load())
    for (uint32_t i = 0; i < n; ++i) post_recv_buffer(reposts_[i].first, reposts_[i].second);
  return true;
}

void Worker::deliver_recv(void* self, uint32_t pool, uint32_t buffer, uint64_t len) {
  // On the callback thread. The user sees the bytes in place; the buffer goes
  // back to the NIC after, even when the callback throws.
  auto* w = static_cast<Worker*>(self);
  RecvPool* p = (*w->shared_->recv_pools)[pool].get();
  struct Repost {
    Worker* w;
    uint32_t pool, buffer;
    ~Repost() {
      if (w->stop_.load(std::memory_order_acquire)) return;  // nobody will receive into it
      w->submit_with([&](Command& c) {
        c.fast.recv_post = FastRecvPost{FastKind::kRecvPost, pool, buffer};
      });
    }
  } repost{w, pool, buffer};
  p->on_recv(std::span<const uint8_t>(p->buffer(buffer), len));
}

}  // namespace ferry::core

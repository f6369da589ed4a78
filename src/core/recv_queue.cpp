// RecvQueue and RecvMessage (ferry/recv_queue.h) over core/recv_queue_state.h.
#include <fmt/format.h>

#include "core/log.h"
#include "core/recv_queue_state.h"
#include "core/worker.h"

namespace ferry {

void RecvQueue::State::push(uint32_t buffer, uint64_t len) {
  if (!ring.try_push(Item{buffer, len})) {
    // Cannot happen while at most `count` buffers are out (see the
    // constructor); were it to, the message is lost but the buffer is not.
    core::log().error("receive queue of {} buffers is full; message of {} bytes dropped", count,
                      len);
    give_back(buffer);
    return;
  }
  signal.notify();
}

void RecvQueue::State::give_back(uint32_t buffer) {
  engine.run([&] {
    try {
      worker->submit_with([&](core::Command& c) {
        c.fast.recv_post = core::FastRecvPost{core::FastKind::kRecvPost, pool, buffer};
      });
    } catch (const std::exception& e) {
      // Only the overflow queue's allocation can throw: the buffer stays out.
      core::log().error("receive buffer {} not given back: {}", buffer, e.what());
    }
  });
}

bool RecvQueue::take(RecvMessage& out) {
  State::Item it;
  if (!s_->try_take(it)) return false;
  out.release();
  out.q_ = s_;
  out.data_ = s_->mem.get() + size_t(it.buffer) * s_->buf_len;
  out.len_ = it.len;
  out.buffer_ = it.buffer;
  return true;
}

RecvMessage RecvQueue::try_pop() {
  RecvMessage m;
  if (!s_ || take(m)) return m;
  // Nothing yet: poll for it here if the worker idles (progress_help.h).
  if (s_->help && s_->help->try_help()) take(m);
  return m;
}

Status RecvQueue::pop(RecvMessage& out, std::chrono::nanoseconds timeout,
                      ImmCounter::WaitMode mode) {
  if (!s_) return Status(Code::kFailedPrecondition, "RecvQueue::pop on an empty queue");
  out.release();
  const core::WaitEnd end = core::wait_arrival(
      s_->signal, [&] { return take(out); }, s_->help.get(),
      core::deadline_after(std::chrono::steady_clock::now(), timeout),
      mode == ImmCounter::WaitMode::kSpin);
  if (end == core::WaitEnd::kCancelled)
    return Status(Code::kCancelled, "RecvQueue::pop: the engine stopped and no message is left");
  if (end == core::WaitEnd::kExpired)
    return Status(Code::kDeadlineExceeded, "RecvQueue::pop: no message arrived in time");
  return {};
}

size_t RecvQueue::size_approx() const {
  return s_ ? s_->ring.size_approx() : 0;
}
size_t RecvQueue::buffer_len() const {
  return s_ ? s_->buf_len : 0;
}
size_t RecvQueue::buffer_count() const {
  return s_ ? s_->count : 0;
}

RecvMessage& RecvMessage::operator=(RecvMessage&& o) noexcept {
  if (this != &o) {
    release();
    q_ = std::move(o.q_);
    data_ = std::exchange(o.data_, nullptr);
    len_ = std::exchange(o.len_, 0);
    buffer_ = o.buffer_;
  }
  return *this;
}

void RecvMessage::release() noexcept {
  if (!q_) return;
  q_->give_back(buffer_);
  q_.reset();
  data_ = nullptr;
  len_ = 0;
}

}  // namespace ferry

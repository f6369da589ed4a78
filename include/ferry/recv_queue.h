// Receiving by polling (TransferEngine::recv_queue): the worker that received
// a message puts it on a queue the application takes it from, with no
// callback and no callback thread between them. The bytes stay in the
// engine's receive buffer, not copied, until the application lets go of the
// message; then the buffer goes back to the NIC.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace ferry {

class RecvMessage;

class RecvQueue {
 public:
  struct State;  // the library's
  RecvQueue() = default;
  explicit RecvQueue(std::shared_ptr<State> s) : s_(std::move(s)) {}
  bool valid() const { return s_ != nullptr; }

  // The oldest message not yet taken, or an empty (invalid) one; never
  // blocks. As ImmCounter::try_consume, a call that finds nothing polls the
  // engine's NICs itself when their worker is yielding or asleep, or has
  // stepped aside (busy polling).
  RecvMessage try_pop();
  // Waits for a message until the timeout: kDeadlineExceeded, or kCancelled
  // once the engine has stopped and nothing is left to take (messages that
  // arrived before the stop are still handed out). `mode` as ImmCounter::wait.
  Status pop(RecvMessage& out, std::chrono::nanoseconds timeout,
             ImmCounter::WaitMode mode = ImmCounter::WaitMode::kSleep);
  // Messages waiting to be taken (approximate while the worker adds more).
  size_t size_approx() const;
  size_t buffer_len() const;
  size_t buffer_count() const;

 private:
  bool take(RecvMessage& out);
  std::shared_ptr<State> s_;
};

// One received message. Move-only; its buffer is given back (re-posted) by
// release() or the destructor. While it is held the buffer receives nothing,
// so a queue of `count` buffers stalls its senders once the application holds
// all of them. A message may outlive its queue and its engine: its bytes stay
// readable, and giving it back after the engine stopped does nothing.
class RecvMessage {
 public:
  RecvMessage() = default;
  RecvMessage(RecvMessage&& o) noexcept { *this = std::move(o); }
  RecvMessage& operator=(RecvMessage&& o) noexcept;
  RecvMessage(const RecvMessage&) = delete;
  RecvMessage& operator=(const RecvMessage&) = delete;
  ~RecvMessage() { release(); }

  bool valid() const { return data_ != nullptr; }
  std::span<const uint8_t> data() const { return {data_, len_}; }
  size_t size() const { return len_; }
  void release() noexcept;

 private:
  friend class RecvQueue;
  std::shared_ptr<RecvQueue::State> q_;
  const uint8_t* data_ = nullptr;
  size_t len_ = 0;
  uint32_t buffer_ = 0;
};

}  // namespace ferry

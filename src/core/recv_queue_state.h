// The shared state of a RecvQueue: a lock-free ring that one worker (the
// main group's, which posts every receive) fills and any application thread
// empties, the signal sleeping takers wait on, and the way back to the NIC
// for a released buffer, open only while the engine runs.
#pragma once

#include <cstdint>
#include <memory>

#include "core/arrival_wait.h"
#include "core/lifeline.h"
#include "core/message_ring.h"
#include "core/progress_help.h"
#include "ferry/recv_queue.h"

namespace ferry::core {
class Worker;
}

namespace ferry {

struct RecvQueue::State {
  using Item = core::MessageRing::Item;

  // Room for every buffer at once, taken up front: at most `count` messages
  // are ever queued (a buffer is posted again only after its message was
  // taken), so the worker's push never allocates and never fails.
  State(size_t count, size_t buf_len, std::shared_ptr<uint8_t> mem, core::Worker* worker,
        uint32_t pool)
      : ring(count),
        mem(std::move(mem)),
        buf_len(buf_len),
        count(count),
        worker(worker),
        pool(pool) {}

  // Worker side: a message of `len` bytes is in `buffer`.
  void push(uint32_t buffer, uint64_t len);
  // Any thread: the oldest message, if any.
  bool try_take(Item& out) { return ring.try_take(out); }
  // Any thread: the buffer goes back to the NIC, unless the engine stopped.
  void give_back(uint32_t buffer);
  // Engine stop: takers waiting on an empty queue return kCancelled, and no
  // buffer goes back from here on.
  void close() {
    signal.cancel();
    engine.close();
  }

  core::MessageRing ring;
  std::shared_ptr<uint8_t> mem;  // the buffers: a message may outlive the engine
  size_t buf_len, count;
  core::ArrivalSignal signal;
  std::shared_ptr<core::ProgressHelp> help;
  core::Lifeline engine;  // open while `worker` may be given buffers
  core::Worker* worker;
  uint32_t pool;
};

}  // namespace ferry

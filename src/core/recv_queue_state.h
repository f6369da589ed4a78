// The shared state of a RecvQueue: a lock-free queue that one worker (the
// main group's, which posts every receive) fills and any application thread
// empties, the signal sleeping takers wait on, and the way back to the NIC
// for a released buffer, open only while the engine runs.
#pragma once

#include <concurrentqueue/concurrentqueue.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "core/arrival_wait.h"
#include "core/lifeline.h"
#include "core/progress_help.h"
#include "ferry/recv_queue.h"

namespace ferry::core {
class Worker;
}

namespace ferry {

struct RecvQueue::State {
  struct Item {
    uint32_t buffer = 0;
    uint64_t len = 0;
  };

  // Room for every buffer at once, taken up front: at most `count` messages
  // are ever queued (a buffer is re-posted only after it was taken and let
  // go), so the worker's push never allocates and never fails. That holds
  // for one taker at a time only: the queue reuses a block once every slot
  // of it was emptied, and a taker stalled between claiming a slot and
  // emptying it lets other takers move on, buffers come back, and the
  // producer laps onto the unemptied block. Takers therefore take in turn
  // (`take_mu`): a stalled taker then also holds back the buffers behind it.
  State(size_t count, size_t buf_len, std::shared_ptr<uint8_t> mem, core::Worker* worker,
        uint32_t pool)
      : q(count, 1, 0),
        producer(q),
        mem(std::move(mem)),
        buf_len(buf_len),
        count(count),
        worker(worker),
        pool(pool) {}

  // Worker side: a message of `len` bytes is in `buffer`.
  void push(uint32_t buffer, uint64_t len);
  // Any thread: the oldest message, if any; takers take in turn (see above).
  bool try_take(Item& out) {
    std::lock_guard lock(take_mu);
    return q.try_dequeue(out);
  }
  // Any thread: the buffer goes back to the NIC, unless the engine stopped.
  void give_back(uint32_t buffer);
  // Engine stop: takers waiting on an empty queue return kCancelled, and no
  // buffer goes back from here on.
  void close() {
    signal.cancel();
    engine.close();
  }

  moodycamel::ConcurrentQueue<Item> q;
  moodycamel::ProducerToken producer;  // the receiving worker's
  std::mutex take_mu;                  // one taker at a time (see above)
  std::shared_ptr<uint8_t> mem;        // the buffers: a message may outlive the engine
  size_t buf_len, count;
  core::ArrivalSignal signal;
  std::shared_ptr<core::ProgressHelp> help;
  core::Lifeline engine;  // open while `worker` may be given buffers
  core::Worker* worker;
  uint32_t pool;
};

}  // namespace ferry

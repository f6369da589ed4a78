#include "core/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "core/worker_thread.h"

// How work reaches a worker: admission, the paths a submission takes to the
// NIC (posted by the worker, by the submitter itself, or answered inline), and
// the threads that drive a napping worker's NICs while they wait.
namespace ferry::core {

using worker_thread::AsWorker;
using worker_thread::t_doing_work_of;

namespace {

// Requests that calls made on a worker thread may admit beyond
// max_requests_in_flight (at least this many, else an eighth of the limit).
constexpr uint64_t kWorkerReserveMin = 64;

}  // namespace

Status Worker::admit(Clock::time_point deadline) {
  const uint64_t limit = shared_->config.max_requests_in_flight;
  auto try_admit = [&](uint64_t cap) {
    // released_seen_ <= released_ <= admitted_ at every moment, so a stale
    // copy only overstates what is in flight. Released is read before
    // admitted, so their difference never underflows.
    uint64_t seen = released_seen_.load(std::memory_order_relaxed);
    uint64_t cur = admitted_.load(std::memory_order_acquire);
    for (;;) {
      if (cur - seen >= cap) {
        seen = released_.load(std::memory_order_acquire);
        cur = admitted_.load(std::memory_order_acquire);
        if (cur - seen >= cap) return false;
        released_seen_.store(seen, std::memory_order_relaxed);
      }
      if (admitted_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) return true;
    }
  };
  if (room_.closed()) return RoomWait::stopped();
  if (try_admit(limit)) return {};
  auto full = [&] {
    return Status(Code::kResourceExhausted,
                  fmt::format("group {}: {} requests in flight (EngineConfig::"
                              "max_requests_in_flight)",
                              index_, limit));
  };
  if (on_worker_thread()) {
    // A worker (or a thread doing a worker's work: a callback run there) cannot
    // wait: it is what makes room. It gets a bounded reserve beyond the limit,
    // so a callback that answers a completion with a submission is not refused
    // just because the application filled the group.
    const uint64_t reserve = std::max<uint64_t>(kWorkerReserveMin, limit / 8);
    if (try_admit(limit + reserve)) return {};
    return Status(Code::kResourceExhausted,
                  fmt::format("group {}: {} requests in flight: max_requests_in_flight ({}) and "
                              "the reserve of calls made on a worker ({}) are used up",
                              index_, limit + reserve, limit, reserve));
  }
  if (shared_->config.queue_full == QueueFull::kRefuse) return full();
  return room_.wait(
      deadline, [&] { return try_admit(limit); }, full);
}

void Worker::release_admission() {
  // Sequentially consistent, as RoomWait asks of a give-back: on x86 one
  // locked instruction, and released()'s load a plain one.
  released_.fetch_add(1, std::memory_order_seq_cst);
  room_.released();
}

void Worker::close_admission() {
  room_.close();
}

void Worker::submit(Command&& cmd) {
  enqueue(std::move(cmd));
  after_enqueue();
}

void Worker::after_enqueue() {
  if (busy_mode_) {
    // A busy worker spins and takes the command at its next turn, unless it
    // stepped aside for threads that spin on its counters: then post it here.
    // Whatever is left (a slot's completion, a command behind another
    // thread's hold of the loop lock) those threads' polls do, since they
    // drain the ring too, and the worker takes its NICs back within kAsideNs
    // of their last poll. So neither a fence nor a wake: a command that races
    // the worker's stepping aside waits for the next poll.
    if (may_post_direct()) {
      std::unique_lock loop(loop_mu_, std::try_to_lock);
      if (loop.owns_lock() && !stop_.load(std::memory_order_acquire)) post_inline();
    }
    return;
  }
  // The store of the command and the load of sleeping_ must not be
  // reordered (idle_wait has the mirror fence): otherwise the worker can go
  // to sleep with this command queued and nobody to wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The worker yields or sleeps: post this request here rather than wait for
  // it to be scheduled (on a machine with fewer cores than threads, that wait
  // is a context switch).
  bool posted_all = false;  // here, with nothing left that needs the worker
  if (may_post_direct()) {
    std::unique_lock loop(loop_mu_, std::try_to_lock);
    if (loop.owns_lock() && !stop_.load(std::memory_order_acquire)) {
      post_inline();  // stopped: the domains may be gone
      posted_all = posted_all_here();
    }
  }
  wake_unless_posted_all(posted_all);
}

bool Worker::posted_all_here() {
  // Under the loop lock the worker naps, blocks in poll(2) or waits to take
  // the lock back; it sets and clears both flags holding it. One blocked in
  // poll(2) is woken all the same: its fi_trywait came before this post.
  return nothing_for_worker() &&
         !(sleeping_.load(std::memory_order_relaxed) && !napping_.load(std::memory_order_relaxed));
}

void Worker::wake_unless_posted_all(bool posted_all) {
  // A napping worker (a NIC without a wait object) is not woken for what was
  // posted here in full: its nap ends by itself, and a thread waiting for the
  // answer polls meanwhile. Waking it would put a third thread on the wire's
  // path: an eventfd write, then the worker taking a core from the very
  // thread that waits for the answer.
  // Nor is one that stepped aside: the threads it stepped aside for poll
  // what was left, as for a busy worker.
  if (!posted_all && sleeping_.load(std::memory_order_acquire) &&
      !(aside_in_spin_ && aside_active_.load(std::memory_order_relaxed)))
    wake_up();
}

bool Worker::nothing_for_worker() {
  // Under loop_mu_. A slot's OnDone would wait for the end of the nap, and so
  // would a submitter waiting for room, a post the NIC refused or a deferred
  // re-post; a slotless post's completion only gives back a credit.
  return active_ == 0 && reposts_n_ == 0 && !has_commands() && room_.waiting() == 0 &&
         !posts_queued();
}

void Worker::post_direct() {
  // Under loop_mu_, with nothing queued: direct_ is the only command, so no
  // submitter's own order is passed. As post_inline, but without the ring.
  {
    AsWorker as_worker(this);
    begin_turn();
    handle_in_place(direct_);
    progress_posts();
    flush_reposts();
    end_turn();
  }
  wake_counters().inline_posts.add();
  if (busy_mode_) return;  // the helpers poll what is left (after_enqueue)
  wake_unless_posted_all(posted_all_here());
}

void Worker::post_reply() {
  if (reply_.fast.postable() && post_fast(reply_)) {
    wake_counters().inline_replies.add();
    return;
  }
  submit(std::move(reply_));
}

void Worker::post_inline() {
  AsWorker as_worker(this);
  post_queued();
  wake_counters().inline_posts.add();
}

void Worker::post_queued() {
  begin_turn();
  drain_commands();
  progress_posts();
  flush_reposts();
  end_turn();
}

bool Worker::help_progress() {
  if (!can_help() || worker_thread::t_worker) return false;
  if (busy_mode_ && !napping_.load(std::memory_order_relaxed)) {
    // A busy worker holds its loop lock while it spins: a try_lock here would
    // only pull the lock's line away from it. Ask it to step aside instead.
    if (!want_aside_.load(std::memory_order_relaxed))
      want_aside_.store(true, std::memory_order_relaxed);
    return false;
  }
  // An adaptive worker spinning without yields holds the lock the same way,
  // but only for its spin phase: ask, and try as before (it may be about to
  // block).
  if (aside_in_spin_ && !sleeping_.load(std::memory_order_relaxed) &&
      !want_aside_.load(std::memory_order_relaxed))
    want_aside_.store(true, std::memory_order_relaxed);
  std::unique_lock loop(loop_mu_, std::try_to_lock);
  if (!loop.owns_lock() || stop_.load(std::memory_order_acquire)) return false;
  AsWorker as_worker(this);
  begin_turn();
  // A helper's poll mostly finds no command: looked at inline, as next() would.
  bool busy = commands_published() && drain_commands();
  busy |= progress_posts();
  const bool polled = poll_completions();
  // What an inline callback just submitted goes out now, not at the worker's
  // next turn.
  if (polled && has_commands()) {
    drain_commands();
    progress_posts();
  }
  if (reposts_n_ != 0) flush_reposts();
  if (picked_up_n_ != 0) end_turn();
  helped_.store(helped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (busy || polled) {
    helped_found_.store(helped_found_.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
    wake_counters().helped_polls.add();
  }
  return busy || polled;
}

Status Worker::call(std::function<Status()> fn, std::chrono::milliseconds timeout) {
  if (stop_.load()) return Status(Code::kFailedPrecondition, "engine is stopped");
  auto run = [index = index_](const std::function<Status()>& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      return Status(Code::kInternal,
                    fmt::format("worker {}: control call threw: {}", index, e.what()));
    } catch (...) {
      return Status(Code::kInternal, fmt::format("worker {}: control call threw", index));
    }
  };
  // A callback run by this worker, or by a thread doing its work under its loop
  // lock (CallbackOn::kWorker, WatchOn::kWorker): the queue would only be
  // drained once the callback returned, i.e. after the wait.
  if (t_doing_work_of == this) return run(fn);
  // The promise is shared so a caller that gave up leaves nothing dangling.
  auto done = std::make_shared<std::promise<Status>>();
  auto fut = done->get_future();
  Command cmd;
  cmd.req = ControlReq{[fn = std::move(fn), done, run] { done->set_value(run(fn)); }};
  submit(std::move(cmd));
  if (fut.wait_for(timeout) != std::future_status::ready)
    return Status(Code::kDeadlineExceeded,
                  fmt::format("worker {} did not answer a control call within {} ms", index_,
                              timeout.count()));
  return fut.get();
}

}  // namespace ferry::core

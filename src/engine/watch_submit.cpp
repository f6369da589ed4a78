// StepSubmits (ferry/step_submits.h): prepared transfers posted when a step
// counter passes their values. Built only on the engine's public API
// (alloc_uvm_watcher, submit), so the watcher thread's callback is the only
// code between a kernel's bump and the engine's submission queue.
#include "ferry/step_submits.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <utility>

namespace ferry {

struct StepJob::State {
  TransferEngine* engine = nullptr;
  uint64_t base = 0;
  std::vector<std::vector<StepTransfer>> steps;
  StepSubmits::Finished on_finished;
  std::atomic<size_t>* live = nullptr;  // the owner's count of unfinished jobs
  std::shared_ptr<std::atomic<size_t>> live_keep;

  std::mutex post_mu;      // held while a step is posted; cancel() takes it
  bool cancelled = false;  // guarded by post_mu
  std::atomic<uint64_t> posted{0}, tposted{0}, tdone{0}, tfailed{0}, inflight{0};
  std::atomic<bool> ended{false};  // no step will be posted any more
  std::atomic<bool> fired{false};  // on_finished claimed
  std::atomic<bool> done{false};   // on_finished returned
  std::mutex err_mu;
  Status first_error;
  mutable std::mutex wait_mu;
  mutable std::condition_variable wait_cv;
  // Completions carry a raw pointer (a std::function of one pointer needs no
  // allocation); the job keeps itself alive until the last one came back.
  std::shared_ptr<State> self;

  void record(const Status& s) {
    std::lock_guard lk(err_mu);
    if (first_error.is_ok()) first_error = s;
  }

  void on_done(const Status& s) {
    if (!s.is_ok()) {
      tfailed.fetch_add(1, std::memory_order_relaxed);
      record(s);
    }
    tdone.fetch_add(1, std::memory_order_release);
    if (inflight.fetch_sub(1, std::memory_order_acq_rel) == 1) maybe_finish();
  }

  // Posts the steps whose value `v` reached; post_mu held by the caller.
  void post_until(uint64_t v) {
    while (!cancelled && posted.load(std::memory_order_relaxed) < steps.size() &&
           base + posted.load(std::memory_order_relaxed) + 1 <= v) {
      for (const StepTransfer& t : steps[posted.load(std::memory_order_relaxed)]) {
        inflight.fetch_add(1, std::memory_order_acq_rel);
        tposted.fetch_add(1, std::memory_order_relaxed);
        try {
          engine->submit(t.prepared, t.imm,
                         OnDone([s = this](const Status& st) { s->on_done(st); }));
        } catch (const Error& e) {
          // Refused at submission (engine stopping, source unregistered): the
          // job cannot complete, so nothing more of it is posted.
          tposted.fetch_sub(1, std::memory_order_relaxed);
          inflight.fetch_sub(1, std::memory_order_acq_rel);
          record(Status(e.code(), e.what()));
          cancelled = true;
          break;
        }
      }
      if (cancelled) break;
      posted.fetch_add(1, std::memory_order_release);
    }
    if (cancelled || posted.load(std::memory_order_relaxed) == steps.size())
      ended.store(true, std::memory_order_release);
  }

  void maybe_finish() {
    if (!ended.load(std::memory_order_acquire) || inflight.load(std::memory_order_acquire) != 0)
      return;
    if (fired.exchange(true, std::memory_order_acq_rel)) return;
    std::shared_ptr<State> keep = std::move(self);  // released last, below
    Status err;
    {
      std::lock_guard lk(err_mu);
      err = first_error;
    }
    if (on_finished) {
      try {
        on_finished(err);
      } catch (...) {  // a user bug must not unwind into the engine's threads
      }
    }
    steps.clear();  // the prepared transfers' registrations go now
    live->fetch_sub(1, std::memory_order_acq_rel);
    {
      std::lock_guard lk(wait_mu);
      done.store(true, std::memory_order_release);
    }
    wait_cv.notify_all();
  }
};

struct StepSubmits::Impl {
  explicit Impl(TransferEngine* e) : engine(e) {}
  TransferEngine* engine;
  std::mutex mu;                                      // jobs, value
  std::vector<std::shared_ptr<StepJob::State>> jobs;  // not yet ended
  std::atomic<uint64_t> value{0};
  std::shared_ptr<std::atomic<size_t>> live = std::make_shared<std::atomic<size_t>>(0);
  uint64_t* word = nullptr;
  std::atomic<bool> closed{false};

  // Posts what `v` reached; returns the jobs that ended (to finish outside mu,
  // whose on_finished may call back into this object).
  void advance(uint64_t v, std::vector<std::shared_ptr<StepJob::State>>* ended) {
    std::lock_guard lk(mu);
    if (v > value.load(std::memory_order_relaxed)) value.store(v, std::memory_order_release);
    v = value.load(std::memory_order_relaxed);
    for (auto& j : jobs) {
      std::lock_guard jl(j->post_mu);
      j->post_until(v);
    }
    for (auto& j : jobs)
      if (j->ended.load(std::memory_order_acquire)) ended->push_back(j);
    std::erase_if(jobs, [](const auto& j) { return j->ended.load(std::memory_order_acquire); });
  }
};

namespace {
void finish_all(const std::vector<std::shared_ptr<StepJob::State>>& ended) {
  for (const auto& j : ended) j->maybe_finish();
}
}  // namespace

// --- StepJob ----------------------------------------------------------------

uint64_t StepJob::cancel() {
  uint64_t n;
  {
    std::lock_guard lk(s_->post_mu);
    s_->cancelled = true;
    s_->ended.store(true, std::memory_order_release);
    n = s_->posted.load(std::memory_order_acquire);
  }
  s_->maybe_finish();
  return n;
}

size_t StepJob::num_steps() const {
  return s_->steps.size();
}
uint64_t StepJob::steps_posted() const {
  return s_->posted.load(std::memory_order_acquire);
}
uint64_t StepJob::transfers_posted() const {
  return s_->tposted.load(std::memory_order_acquire);
}
uint64_t StepJob::transfers_done() const {
  return s_->tdone.load(std::memory_order_acquire);
}
uint64_t StepJob::transfers_failed() const {
  return s_->tfailed.load(std::memory_order_acquire);
}
bool StepJob::finished() const {
  return s_->done.load(std::memory_order_acquire);
}

Status StepJob::wait(std::chrono::nanoseconds timeout) const {
  std::unique_lock lk(s_->wait_mu);
  if (s_->wait_cv.wait_for(lk, timeout, [&] { return s_->done.load(); })) return {};
  return Status(Code::kDeadlineExceeded,
                "step job still running: " + std::to_string(steps_posted()) + " of " +
                    std::to_string(s_->steps.size()) + " steps posted, " +
                    std::to_string(transfers_done()) + " of " + std::to_string(transfers_posted()) +
                    " transfers ended");
}

// --- StepSubmits --------------------------------------------------------------

std::shared_ptr<StepSubmits> StepSubmits::host(TransferEngine& engine) {
  return std::make_shared<StepSubmits>(std::make_shared<Impl>(&engine));
}

StepSubmits::~StepSubmits() {
  close();
}

StepJob StepSubmits::add(uint64_t base, std::vector<std::vector<StepTransfer>> steps,
                         Finished on_finished) {
  if (impl_->closed.load(std::memory_order_acquire))
    throw Error(Code::kFailedPrecondition, "StepSubmits::add after close()");
  for (const auto& step : steps)
    for (const auto& t : step)
      if (!t.prepared.valid())
        throw Error(Code::kInvalidArgument, "StepSubmits::add: an empty PreparedTransfer");
  auto s = std::make_shared<StepJob::State>();
  s->engine = impl_->engine;
  s->base = base;
  s->steps = std::move(steps);
  s->on_finished = std::move(on_finished);
  s->live_keep = impl_->live;
  s->live = impl_->live.get();
  s->self = s;
  impl_->live->fetch_add(1, std::memory_order_acq_rel);
  std::vector<std::shared_ptr<StepJob::State>> ended;
  {
    std::lock_guard lk(impl_->mu);
    impl_->jobs.push_back(s);
  }
  impl_->advance(0, &ended);  // steps the counter already passed
  finish_all(ended);
  return StepJob(s);
}

void StepSubmits::advance(uint64_t value) {
  std::vector<std::shared_ptr<StepJob::State>> ended;
  impl_->advance(value, &ended);
  finish_all(ended);
}

uint64_t StepSubmits::value() const {
  return impl_->value.load(std::memory_order_acquire);
}
uint64_t* StepSubmits::word() const {
  return impl_->word;
}
size_t StepSubmits::live_jobs() const {
  return impl_->live->load(std::memory_order_acquire);
}

void StepSubmits::close() {
  if (!impl_ || impl_->closed.exchange(true, std::memory_order_acq_rel)) return;
  std::vector<std::shared_ptr<StepJob::State>> jobs;
  {
    std::lock_guard lk(impl_->mu);
    jobs.swap(impl_->jobs);
  }
  for (auto& j : jobs) {
    std::lock_guard jl(j->post_mu);
    j->cancelled = true;
    j->ended.store(true, std::memory_order_release);
  }
  finish_all(jobs);
}

std::shared_ptr<StepSubmits> TransferEngine::alloc_uvm_watcher_submits(WatchOn on) {
  auto impl = std::make_shared<StepSubmits::Impl>(this);
  std::weak_ptr<StepSubmits::Impl> weak = impl;
  impl->word = alloc_uvm_watcher(
      [weak](uint64_t, uint64_t now) {
        auto i = weak.lock();
        if (!i || i->closed.load(std::memory_order_acquire)) return false;
        std::vector<std::shared_ptr<StepJob::State>> ended;
        i->advance(now, &ended);
        finish_all(ended);
        return true;
      },
      on);
  return std::make_shared<StepSubmits>(std::move(impl));
}

}  // namespace ferry

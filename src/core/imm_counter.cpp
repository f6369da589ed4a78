#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/callback_thread.h"
#include "core/cpu_relax.h"
#include "core/imm_table.h"
#include "core/log.h"

namespace ferry {

int64_t ImmCounter::value() const {
  return s_ ? s_->value.load(std::memory_order_acquire) : 0;
}

namespace {

bool consume(ImmCounter::State& s, int64_t n) {
  int64_t v = s.value.load(std::memory_order_acquire);
  while (v >= n) {
    if (s.value.compare_exchange_weak(v, v - n, std::memory_order_acq_rel)) return true;
  }
  return false;
}

}  // namespace

bool ImmCounter::try_consume(int64_t n) {
  if (!s_) return false;
  if (consume(*s_, n)) return true;
  // Not there yet: poll for it here if the worker idles (progress_help.h).
  return s_->help && s_->help->try_help() && consume(*s_, n);
}

Status ImmCounter::wait(int64_t n, std::chrono::nanoseconds timeout, WaitMode mode) {
  if (!s_) return Status(Code::kFailedPrecondition, "ImmCounter::wait on an empty counter");
  if (n < 0) return Status(Code::kInvalidArgument, "ImmCounter::wait: negative count");
  const auto now = std::chrono::steady_clock::now();
  // A timed wait records its length at every return below: call to the
  // arrival that satisfied it, as the counting worker timed that arrival (no
  // clock read on the way out, which is on the waiter's way to its next
  // submit), or to the return when no arrival time is known (a timeout, a
  // cancel, arrivals counted before this wait began). One wait in
  // sample_every per thread is timed, and the workers time arrivals only
  // while a timed wait is in progress on the counter.
  static thread_local uint32_t t_until_timed = 0;
  bool time_it = false;
  if (core::kStatsEnabled && s_->waits) {
    if (t_until_timed == 0) {
      time_it = true;
      t_until_timed = s_->sample_every > 1 ? s_->sample_every - 1 : 0;
    } else {
      --t_until_timed;
    }
  }
  struct Timed {
    ImmCounter::State* s;
    int64_t t0;
    bool arrived = false;
    Timed(ImmCounter::State* state, int64_t start) : s(state), t0(start) {
      if (s) s->timed_waiters.fetch_add(1, std::memory_order_seq_cst);
    }
    ~Timed() {
      if (!s) return;
      const int64_t at = arrived ? s->last_arrival_ns.load(std::memory_order_relaxed) : 0;
      const int64_t end = at != 0 ? std::max(at, t0) : core::now_ns();
      s->timed_waiters.fetch_sub(1, std::memory_order_relaxed);
      s->waits->record_shared(uint64_t(end - t0));
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;
  } timed{time_it ? s_.get() : nullptr, core::ns_of(now)};
  const core::WaitEnd end = core::wait_arrival(
      s_->signal, [&] { return consume(*s_, n); }, s_->help.get(),
      core::deadline_after(now, timeout), mode == WaitMode::kSpin);
  timed.arrived = end == core::WaitEnd::kTaken;
  if (end == core::WaitEnd::kCancelled)
    return Status(Code::kCancelled,
                  "ImmCounter::wait: the engine stopped or the counter was removed (have " +
                      std::to_string(value()) + " of " + std::to_string(n) + ")");
  if (end == core::WaitEnd::kExpired)
    return Status(Code::kDeadlineExceeded, "ImmCounter::wait: " + std::to_string(n) +
                                               " arrivals not reached (have " +
                                               std::to_string(value()) + ")");
  return {};
}

namespace core {

namespace {

const char* kind_of(const std::shared_ptr<ImmCounter::State>& c,
                    const std::shared_ptr<ExpectedCount>& e) {
  return c   ? "an ImmCounter (imm_counter)"
         : e ? "a callback (expect_imm_count)"
             : "a GPU flag (imm_counter_gpu)";
}

[[noreturn]] void conflict(uint32_t imm, const char* existing, const char* wanted) {
  throw Error(Code::kAlreadyExists,
              fmt::format("immediate {} is already counted by {}; remove_imm_count({}) before "
                          "counting it with {}",
                          imm, existing, imm, wanted));
}

}  // namespace

void ImmTable::expect(uint32_t imm, uint32_t count, ImmCountCallback cb, CallbackOn on) {
  auto e = std::make_shared<ExpectedCount>();
  e->every = count;
  e->cb = std::move(cb);
  e->on_worker = on == CallbackOn::kWorker;
  std::unique_lock lk(mu_);
  auto it = map_.find(imm);
  if (it != map_.end() && !it->second.expected)
    conflict(imm, kind_of(it->second.counter, it->second.expected), "expect_imm_count");
  map_[imm] = Entry{nullptr, std::move(e), nullptr};
  changed();
}

void ImmTable::expect_gpu_flag(uint32_t imm, uint32_t count, uint32_t* flag,
                               std::shared_ptr<void> keep) {
  auto g = std::make_shared<GpuFlagCount>();
  g->every = count;
  g->flag = flag;
  g->keep = std::move(keep);
  std::unique_lock lk(mu_);
  auto it = map_.find(imm);
  if (it != map_.end() && !it->second.gpu)
    conflict(imm, kind_of(it->second.counter, it->second.expected), "imm_counter_gpu");
  map_[imm] = Entry{nullptr, nullptr, std::move(g)};
  changed();
}

ImmCounter ImmTable::counter(uint32_t imm) {
  {
    // The common case, a counter that exists: no exclusive lock, so workers
    // counting arrivals are not held up.
    std::shared_lock lk(mu_);
    auto it = map_.find(imm);
    if (it != map_.end() && it->second.counter) return ImmCounter(it->second.counter);
  }
  std::unique_lock lk(mu_);
  auto& e = map_[imm];
  if (!e.counter) {
    if (e.expected || e.gpu) conflict(imm, kind_of(nullptr, e.expected), "imm_counter");
    e = Entry{std::make_shared<ImmCounter::State>(), nullptr, nullptr};
    e.counter->waits = waits_;
    e.counter->help = help_;
    e.counter->sample_every = wait_sample_every_;
    changed();
  }
  return ImmCounter(e.counter);
}

bool ImmTable::remove(uint32_t imm) {
  std::shared_ptr<ImmCounter::State> gone;
  {
    std::unique_lock lk(mu_);
    auto it = map_.find(imm);
    if (it == map_.end()) return false;
    gone = std::move(it->second.counter);
    map_.erase(it);
    changed();
  }
  if (gone) gone->cancel();
  return true;
}

void ImmTable::cancel_all() {
  std::vector<std::shared_ptr<ImmCounter::State>> counters;
  {
    std::shared_lock lk(mu_);
    for (auto& [imm, e] : map_)
      if (e.counter) counters.push_back(e.counter);
  }
  for (auto& c : counters) c->cancel();
}

void ImmTable::add_plain_callback(ImmCallback cb) {
  std::lock_guard lk(plain_mu_);
  auto next = plain_ ? std::make_shared<std::vector<ImmCallback>>(*plain_)
                     : std::make_shared<std::vector<ImmCallback>>();
  next->push_back(std::move(cb));
  plain_ = std::move(next);
}

void ImmTable::on_arrival(uint32_t imm, uint32_t n, const ArrivalClock& clock) {
  if (n == 0) return;
  std::shared_lock lk(mu_);
  dispatch(lk, map_.find(imm), imm, n, clock);
}

void ImmTable::dispatch(std::shared_lock<std::shared_mutex>& lk, Map::iterator it, uint32_t imm,
                        uint32_t n, const ArrivalClock& clock) {
  if (it == map_.end()) {
    lk.unlock();
    // Plain callbacks still see every immediate: the event carries the count.
    // A peer flooding immediates nobody counts must not grow the queue
    // without bound: past kMaxPlainEvents queued events, arrivals are dropped
    // (and counted).
    if (plain_queued_.fetch_add(1, std::memory_order_relaxed) >= kMaxPlainEvents) {
      plain_queued_.fetch_sub(1, std::memory_order_relaxed);
      dropped_plain_.fetch_add(n, std::memory_order_relaxed);
      return;
    }
    callbacks_->push(PlainImmEvent{imm, n}, clock.now());
    return;
  }
  if (auto& c = it->second.counter) {
    count(*c, n, clock);
    return;
  }
  if (auto& g = it->second.gpu) {
    count(*g, n);
    return;
  }
  // A reference, not the map's entry: an inline callback may remap imm.
  std::shared_ptr<ExpectedCount> ex = it->second.expected;
  lk.unlock();
  // Each arrival run sees a distinct range of the monotonic count, so exactly
  // one worker observes each multiple of `every`: once per `every` arrivals.
  const uint64_t before = ex->arrived.fetch_add(n, std::memory_order_acq_rel);
  const uint64_t fires = (before + n) / ex->every - before / ex->every;
  if (ex->on_worker) {
    run_inline(*ex, fires);
    return;
  }
  if (fires > 0 && ex->pending.fetch_add(fires, std::memory_order_acq_rel) == 0)
    callbacks_->push(ImmCountEvent{ex}, clock.now());
}

void ImmTable::count(ImmCounter::State& c, uint32_t n, const ArrivalClock& clock) {
  const bool timed =
      core::kStatsEnabled && (clock.known() || c.timed_waiters.load(std::memory_order_relaxed) > 0);
  c.add(n, timed ? clock.now() : 0);
}

void ImmTable::count(GpuFlagCount& g, uint32_t n) {
  // Ordering (docs/GPU.md): this worker read the completion of this
  // immediate before counting it, and with the libfabric host-memory
  // providers the data is already in host memory when its completion is
  // read (shm copies before it writes the completion; a NIC's DMA writes
  // precede its CQE on the same PCIe path). The acq_rel add chains every
  // earlier arrival's count (from any worker) before ours, so the release
  // store below is ordered after all their data; a kernel that observes the
  // flag with ld.acquire.sys therefore reads the data, not older bytes.
  const uint64_t before = g.arrived.fetch_add(n, std::memory_order_acq_rel);
  const uint64_t now = before + n;
  if (now / g.every != before / g.every) {  // crossed at least one multiple
    auto gen = uint32_t(now / g.every);
    std::atomic_ref<uint32_t> f(*g.flag);
    // Two workers can reach generations k and k+1 and store out of order: a
    // wrap-safe max keeps the flag from going backwards.
    uint32_t cur = f.load(std::memory_order_relaxed);
    while (int32_t(gen - cur) > 0 && !f.compare_exchange_weak(cur, gen, std::memory_order_release,
                                                              std::memory_order_relaxed)) {
    }
  }
}

struct ImmArrivalCache::Line {
  uint32_t imm = 0;
  uint64_t version = 0;  // 0: empty
  std::shared_ptr<ImmCounter::State> counter;
  std::shared_ptr<GpuFlagCount> gpu;
};

ImmArrivalCache::ImmArrivalCache() : lines_(std::make_unique<Line[]>(kLines)) {}
ImmArrivalCache::~ImmArrivalCache() = default;

void ImmArrivalCache::drop_stale(const ImmTable& table) {
  const uint64_t v = table.version_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < kLines; ++i)
    if (lines_[i].version != 0 && lines_[i].version != v) lines_[i] = Line{};
}

void ImmTable::on_arrival(ImmArrivalCache& cache, uint32_t imm, uint32_t n,
                          const ArrivalClock& clock) {
  if (n == 0) return;
  ImmArrivalCache::Line& line = cache.lines_[imm % ImmArrivalCache::kLines];
  // Loaded before the lookup below: a change between the two leaves the line
  // tagged older than the table, so the next arrival looks again.
  const uint64_t v = version_.load(std::memory_order_acquire);
  if (line.version != v || line.imm != imm) {
    std::shared_lock lk(mu_);
    auto it = map_.find(imm);
    if (it == map_.end() || it->second.expected) {
      dispatch(lk, it, imm, n, clock);  // plain callbacks or a callback: not cached
      return;
    }
    line.imm = imm;
    line.version = v;
    line.counter = it->second.counter;
    line.gpu = it->second.gpu;
  }
  if (line.counter)
    count(*line.counter, n, clock);
  else
    count(*line.gpu, n);
}

void ImmTable::run_inline(ExpectedCount& e, uint64_t fires) {
  // No hop to the callback thread; an exception must still not reach the
  // worker's loop.
  for (uint64_t k = 0; k < fires; ++k) callbacks_->run_user("inline immediate callback", e.cb);
}

void ImmTable::run_expected(ExpectedCount& e) {
  // Firings that arrive while these run queue a new event (pending was 0).
  for (uint64_t k = e.pending.exchange(0, std::memory_order_acq_rel); k > 0; --k)
    if (e.cb) e.cb();
}

void ImmTable::run_plain_callbacks(uint32_t imm, uint32_t count) {
  plain_queued_.fetch_sub(1, std::memory_order_relaxed);
  std::shared_ptr<const std::vector<ImmCallback>> cbs;
  {
    std::lock_guard lk(plain_mu_);
    cbs = plain_;
  }
  if (!cbs) return;
  for (uint32_t i = 0; i < count; ++i)
    for (auto& cb : *cbs) cb(imm);
}

}  // namespace core
}  // namespace ferry

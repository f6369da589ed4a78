#include "core/worker.h"

#include <fmt/format.h>
#include <numaif.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/callback_thread.h"
#include "core/cpu_relax.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "core/worker_thread.h"

namespace ferry::core {

namespace {

// Idle workers whose NIC has no wait object (shm; NVLink while its copies are
// in flight) poll yielding the CPU this long, then nap (worker_idle.cpp).
constexpr auto kYieldBeforeNap = std::chrono::microseconds(200);
// A napping worker whose NICs a waiting thread polled this recently leaves
// them to it (help_progress): such threads poll every microsecond or so.
constexpr auto kHelpersDrive = std::chrono::microseconds(50);
// Worker::await_reply: how long a busy worker watches for an answer to what
// it handed the application, and the most a run of empty windows thins them
// out (one arrival turn in 2^10).
constexpr int64_t kReplyWindowNs = 2'000;
constexpr uint32_t kMaxWindowBackoff = 10;

// This thread is a worker's own (not one doing its work for a while).
thread_local bool t_worker_main = false;

}  // namespace

using worker_thread::t_doing_work_of;

IdleSpin resolve_idle_spin(std::chrono::microseconds configured, SpinYield yield) {
  const auto spin = configured.count() >= 0 ? configured : std::chrono::microseconds(200);
  if (yield != SpinYield::kAuto) return IdleSpin{spin, yield == SpinYield::kYield};
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return IdleSpin{spin, cpus < 8};
}

bool Worker::on_worker_thread() {
  return worker_thread::t_worker;
}

Worker::Worker(EngineShared* shared, size_t index, GroupConfig group, std::vector<int> affinity)
    : shared_(shared), index_(index), group_(std::move(group)), affinity_(std::move(affinity)) {}

Worker::~Worker() {
  stop();
}

Status Worker::start() {
  std::promise<Status> init;
  auto fut = init.get_future();
  thread_ = std::thread([this, &init] { run(&init); });
  Status st = fut.get();
  if (!st.is_ok()) {
    thread_.join();
  }
  return st;
}

void Worker::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  wake_.notify();
  thread_.join();
}

// ------------------------------------------------------------------ thread

void Worker::run(std::promise<Status>* init) {
  name_current_thread(fmt::format("ferry-worker{}", index_).c_str());
  if (group_.worker_cpu >= 0)
    pin_current_thread(group_.worker_cpu, "worker");
  else
    pin_current_thread(affinity_, "worker");
  // Everything the datapath touches is allocated after pinning, so it lands
  // on the NUMA node of the worker's CPU (first touch).
  slots_.resize(4096);
  {
    int node = -1;
    if (::get_mempolicy(&node, nullptr, 0, slots_.data(), MPOL_F_NODE | MPOL_F_ADDR) == 0)
      state_numa_.store(node);
  }
  free_slots_.reserve(slots_.size());
  for (uint32_t i = slots_.size(); i-- > 0;) free_slots_.push_back(i);
  fast_ = std::make_unique<FastPost[]>(kFastPosts);
  imm_cache_ = std::make_unique<ImmArrivalCache>();
  if (!shared_->config.trace_file.empty())
    trace_ = std::make_unique<TraceRing>(shared_->config.trace_events);
  Status st = open_nics();
  nic_count = uint8_t(nics_.size());
  rr = &rr_;
  send_pool = shared_->send_pool;
  send_free = shared_->send_free;
  send_reg = &shared_->send_pool->reg;
  std::unique_lock loop(loop_mu_);
  init->set_value(st);
  if (!st.is_ok()) return;

  worker_thread::t_worker = true;
  t_worker_main = true;
  t_doing_work_of = this;
  auto yield_cpu = [&] {
    loop.unlock();
    ::sched_yield();
    relock(loop);
  };
  // Naps and poll(2) timeouts are short; the default 50 µs of slack would
  // make a 20 µs nap last 70.
  ::prctl(PR_SET_TIMERSLACK, 5'000UL, 0, 0, 0);
  const IdleSpin spin =
      resolve_idle_spin(shared_->config.spin_before_block, shared_->config.spin_yield);
  auto last_busy = Clock::now();
  auto last_helped = Clock::time_point{};
  uint32_t quiet_turns = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    begin_turn();
    // Hooks first: what their callbacks submit is drained and posted below.
    bool awake = false;
    bool busy = !hooks_.empty() && run_hooks(&awake);
    busy |= drain_commands();
    busy |= progress_posts();
    busy |= flush_reposts();
    busy |= poll_completions();
    if (arrivals_ != 0) {
      arrivals_ = 0;
      if (busy_mode_) await_reply();
    }
    note_gauges();
    end_turn();
    // A spinning worker's idle turn is a few polls; a clock read in each
    // would be a large part of it, and of the delay before it sees the next
    // submission. Deadlines are checked every millisecond at most anyway.
    if (busy_mode_ && !busy && !awake && (++quiet_turns & 63) != 0) continue;
    const auto now = Clock::time_point(std::chrono::nanoseconds(turn_ns()));
    if (now - last_deadline_scan_ > std::chrono::milliseconds(1)) {
      last_deadline_scan_ = now;
      check_deadlines();
      imm_cache_->drop_stale(*shared_->imms);
    }
    // Threads waiting for arrivals polled for this worker lately
    // (help_progress): they drive the NICs, and a worker that kept spinning
    // for what they would have found takes a core from one of them, so it
    // naps at once instead, on its eventfd alone (idle_wait). A submitter
    // that woke it needs it (nothing_for_worker), and so does a waiter that
    // stops helping. Where spinning threads outnumber the CPUs (spin.yield)
    // this holds even for a worker that last blocked on its CQs: one that
    // kept its spin phase alive with what it found while its helpers were
    // off the CPU would stay one more runnable thread per hand-off, and the
    // scheduler then ran whole ping-pongs at 70-110 µs per round trip. With
    // CPUs to spare only a worker that napped or stepped aside counts its
    // helpers as driving.
    if (const uint32_t h = helped_.load(std::memory_order_relaxed); h != helped_seen_) {
      helped_seen_ = h;
      last_helped = now;
    }
    const bool helpers_drive =
        (napped_ || (spin.yield && !busy_mode_)) && now - last_helped < kHelpersDrive;
    if (busy_mode_) {
      // A busy worker steps aside, not to sleep: for threads spinning on
      // counters and queues that asked (want_aside_) or keep polling. Turn
      // hooks (watchers run on the worker) need its turns.
      if (step_aside_ && !awake && !std::exchange(called_, false) && hooks_.empty() &&
          (helpers_drive || want_aside_.load(std::memory_order_relaxed))) {
        step_aside(loop);
        // The turn after a step aside decides at once whether to step aside
        // again, not after 64 quiet turns holding the NICs.
        quiet_turns = 63;
      }
      continue;
    }
    // Adaptive polling from here on. Spinning without yields, the worker
    // steps aside as a busy one does for threads that spin for its
    // arrivals, but only in its spin phase, which their finds prolong.
    if (aside_in_spin_ && !awake && !called_ && hooks_.empty() && now - last_busy < spin.spin &&
        (helpers_drive || want_aside_.load(std::memory_order_relaxed))) {
      const uint32_t found = helped_found_.load(std::memory_order_relaxed);
      step_aside(loop);
      if (helped_found_.load(std::memory_order_relaxed) != found) {
        last_busy = Clock::now();
        naps_in_row_ = 0;
      }
      continue;
    }
    if ((busy && !helpers_drive) || awake || std::exchange(called_, false)) {
      last_busy = now;
      naps_in_row_ = 0;
      if (!busy && spin.yield) yield_cpu();
    } else if (helpers_drive || now - last_busy >= spin.spin) {
      // A NIC that cannot block is polled, yielding, before the worker naps.
      if (!idle_wait(helpers_drive || now - last_busy >= spin.spin + kYieldBeforeNap, helpers_drive,
                     loop))
        yield_cpu();
    } else if (spin.yield) {
      yield_cpu();
    }
  }

  end_turn();
  // Shutdown: everything still queued or in flight ends as cancelled.
  auto cancel = [&](Command& cmd) {
    if (!cmd.is_fast() && std::holds_alternative<ControlReq>(cmd.req))
      std::get<ControlReq>(cmd.req).fn();
    else
      fail_command(cmd, Status(Code::kCancelled, "engine stopped"));
  };
  // Every position claimed so far is cancelled, including those behind a
  // cell still being filled: a thread outside the API (the callback thread
  // giving a receive buffer back) may have claimed one and been preempted
  // before publishing it, with submitters' commands published after it.
  // Stopping at that cell lost their OnDones. Filling cannot block, so the
  // wait ends; what is claimed after this is a buffer's re-post, for nobody.
  for (const uint64_t claimed = ring_.claimed(); ring_.head() < claimed;) {
    uint64_t pos = 0;
    Command* cmd = ring_.next(&pos);
    if (cmd == nullptr) {
      std::this_thread::yield();
      continue;
    }
    cancel(*cmd);
    *cmd = Command{};
    ring_.pop(pos);
  }
  Command cmd;
  while (overflow_.try_dequeue(cmd)) {
    overflow_out_.fetch_add(1, std::memory_order_relaxed);
    cancel(cmd);
  }
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    if (s.active && !s.finished) finish(s, Status(Code::kCancelled, "engine stopped"));
  }
  cancel_fast_posts();
  groups_.clear();
  hooks_.clear();  // their callbacks may hold engine state: let go here, on this thread
  // Unregistered regions still held elsewhere (a PreparedTransfer) close
  // their NIC registrations here, on this thread, before the domains go.
  for (auto& r : retired_) r->mrs.clear();
  retired_.clear();
  // Domains close on this thread, after their registrations (held by the
  // engine table) are released by the engine on stop.
}

Status Worker::open_nics() {
  const auto& cfg = shared_->config;
  size_t count = group_.nic_names.empty() ? cfg.nics_per_group : group_.nic_names.size();
  if (count != 1 && count != 2 && count != 4)
    return Status(Code::kInvalidArgument,
                  fmt::format("group {}: {} NICs per group (1, 2 or 4 supported)", index_, count));
  for (size_t i = 0; i < count; ++i) {
    DomainOptions opt;
    opt.provider = cfg.provider;
    opt.nic_name = group_.nic_names.empty() ? "" : group_.nic_names[i];
    opt.nic_index = group_.nic_names.empty() ? i : 0;
    opt.position = i;
    opt.device = group_.device;
    opt.gid_index = cfg.verbs_gid_index;
    opt.fault_injection = cfg.fault_injection;
    Status err;
    auto d = shared_->open_domain(opt, &err);
    if (!d) {
      if (err.is_ok()) err = Status(Code::kUnavailable, "cannot open NIC");
      return Status(err.code(), fmt::format("group {} NIC {} ('{}', provider '{}'): {}", index_, i,
                                            opt.nic_name, opt.provider, err.message()));
    }
    infos_.push_back(d->info());
    addrs_.emplace_back(d->info().transport, shared_->incarnation, d->raw_address());
    Nic nic;
    nic.domain = std::move(d);
    nics_.push_back(std::move(nic));
  }
  const bool any_thread =
      std::all_of(infos_.begin(), infos_.end(), [](const DomainInfo& i) { return i.any_thread; });
  busy_mode_ = cfg.poll_mode == PollMode::kBusy;
  inline_posts_ = !busy_mode_ && any_thread;
  step_aside_ = busy_mode_ && any_thread && cfg.busy_step_aside;
  aside_in_spin_ = inline_posts_ && cfg.busy_step_aside &&
                   !resolve_idle_spin(cfg.spin_before_block, cfg.spin_yield).yield;
  std::string names;
  for (auto& i : infos_) names += (names.empty() ? "" : ", ") + i.name;
  log().info("worker {} ({}): provider {}, fabric {}, NICs [{}], poll mode {}", index_,
             group_.device.to_string(), infos_[0].provider, infos_[0].fabric, names,
             !busy_mode_
                 ? (aside_in_spin_ ? "adaptive, stepping aside for spinning waiters" : "adaptive")
             : step_aside_ ? "busy, stepping aside for spinning waiters"
                           : "busy");
  return {};
}

// --------------------------------------------------------------- commands

// The application's answer to an arrival (the other half of a ping-pong, a
// proxy forwarding what it got) is often a fraction of a microsecond away. A
// spinning worker that went straight back into the provider would find it
// only after that poll (over tcp a system call or two: 1-2 µs), so after a
// turn that handed arrivals to the application it watches the submission ring
// for up to kReplyWindowNs first. A window that saw no submission makes the
// next ones rarer (one arrival turn in 2, 4, ... 1024), so a receiver that
// only counts what comes in (a stream of writes) soon pays nothing for them.
void Worker::await_reply() {
  if (skip_windows_ != 0) {
    --skip_windows_;
    return;
  }
  if (posts_queued()) return;  // posts to make: no time to watch
  auto& wc = wake_counters();
  wc.reply_windows.add();
  // The window starts at the first clock read, eight polls in: a reply that
  // comes sooner costs no read at all.
  int64_t t0 = 0;
  for (uint32_t i = 1;; ++i) {
    if (uint64_t pos = 0; ring_.next(&pos) != nullptr) {
      wc.reply_hits.add();
      window_misses_ = 0;
      return;
    }
    if (i % 8 == 0) {
      const int64_t now = now_ns();
      if (t0 == 0) t0 = now;
      if (now - t0 > kReplyWindowNs) break;
    }
    cpu_relax();
  }
  window_misses_ = std::min<uint32_t>(window_misses_ + 1, kMaxWindowBackoff);
  skip_windows_ = (1u << window_misses_) - 1;
}

bool Worker::run_hooks(bool* awake) {
  bool did = false;
  for (auto& h : hooks_) {
    did |= h->run_wt();
    *awake |= h->keeps_awake();
  }
  return did;
}

void Worker::enqueue(Command&& cmd) {
  if (!ring_.try_push(std::move(cmd))) to_overflow(std::move(cmd));
}

bool Worker::has_commands() {
  return ring_.size_approx() != 0 || overflow_pending();
}

bool Worker::drain_commands() {
  // Under loop_mu_ (the worker, or a submitter posting for it). Commands are
  // handled where they lie in the ring; what a handled transfer held was moved
  // into its slot, and what a control call still holds (its captures) goes
  // before the cell is given back.
  size_t n = 0;
  for (; n < kCommandsPerStep; ++n) {
    uint64_t pos = 0;
    Command* cmd = ring_.next(&pos);
    if (cmd == nullptr) break;
    handle_in_place(*cmd);
    ring_.pop(pos);
  }
  size_t m = 0;
  if (overflow_pending()) {
    m = overflow_.try_dequeue_bulk(drained_.begin(), drained_.size());
    overflow_out_.store(overflow_out_.load(std::memory_order_relaxed) + m,
                        std::memory_order_relaxed);
  }
  for (size_t i = 0; i < m; ++i) {
    handle(drained_[i]);
    drained_[i] = Command{};
  }
  return n + m > 0;
}

void Worker::handle_in_place(Command& cmd) {
  handle(cmd);
  // What a handled transfer held was moved into its slot; what a control call
  // still holds (its captures) goes before the command's place is reused.
  if (!cmd.is_fast() && std::holds_alternative<ControlReq>(cmd.req)) cmd.req = RecvPostReq{};
}

void Worker::handle(Command& cmd) {
  switch (cmd.fast.kind()) {
    case FastKind::kImm:
    case FastKind::kSend:
      start_transfer(cmd);
      return;
    case FastKind::kRecvPost:
      repost_after_posts(cmd.fast.recv_post.pool, cmd.fast.recv_post.buffer);
      return;
    case FastKind::kNone:
      break;
  }
  if (auto* c = std::get_if<ControlReq>(&cmd.req)) {
    c->fn();
    return;
  }
  if (auto* r = std::get_if<RecvPostReq>(&cmd.req)) {
    post_recv_buffer(r->pool, r->buffer);
    return;
  }
  start_transfer(cmd);
}

void Worker::fail_command(Command& cmd, Status s) {
  switch (cmd.fast.kind()) {  // nothing to signal
    case FastKind::kSend:
      shared_->send_free->release(cmd.fast.send.buffer);
      [[fallthrough]];
    case FastKind::kImm:
      release_admission();
      return;
    case FastKind::kRecvPost:
      return;
    case FastKind::kNone:
      break;
  }
  if (auto* send = std::get_if<SendReq>(&cmd.req)) shared_->send_free->release(send->buffer);
  if (std::holds_alternative<RecvPostReq>(cmd.req)) return;
  signal(std::move(cmd.on_done), std::move(s));
  if (cmd.admitted) release_admission();
}

// Counters and flags are updated here, with no thread hop; callbacks run on
// the callback thread.
void Worker::signal(OnDone on_done, Status st) {
  // Whoever learns a transfer ended may read the statistics next: the queue
  // delays held for the turn's end are in them by then.
  end_turn();
  if (on_done.needs_callback_thread())
    shared_->callbacks->push(
        TransferDoneEvent{std::move(on_done), std::move(st)}, turn_ns(),
        t_worker_main ? CallbackThread::kFromWorkerThread : CallbackThread::kFromHelper);
  else
    on_done.signal_inline(st);
}

// ------------------------------------------------------------ control plane

void Worker::register_wt(Registration& reg, bool remote, Status* err) {
  const int64_t t0 = now_ns();
  reg.mrs.clear();
  for (size_t k = 0; k < nics_.size(); ++k) {
    auto mr = nics_[k].domain->register_mr(reg.ptr, reg.len, reg.device, remote, err);
    if (!mr) {
      if (err->is_ok()) *err = Status(Code::kUnavailable, "registration failed");
      *err = Status(err->code(), fmt::format("reg_mr({} bytes at {}, {}) on NIC {}: {}", reg.len,
                                             static_cast<void*>(reg.ptr), reg.device.to_string(),
                                             infos_[k].name, err->message()));
      reg.mrs.clear();
      return;
    }
    reg.local_desc[k] = mr->local_desc;
    reg.mrs.push_back(std::move(mr));
  }
  stats_.registrations.add();
  stats_.registered_bytes.add(reg.len);
  stats_.registration_time.record(uint64_t(now_ns() - t0));
}

}  // namespace ferry::core

#include "core/worker.h"

#include <fmt/format.h>
#include <numaif.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/callback_thread.h"
#include "core/ctx.h"
#include "core/imm_table.h"
#include "core/log.h"

namespace ferry::core {

namespace {

constexpr size_t kCommandsPerStep = 32;
// Per NIC limits come from DomainInfo (post_budget, max_outstanding); this is
// only the size of one post_writes call.
constexpr size_t kPostsPerCall = 64;
constexpr size_t kPollBatch = 32;
constexpr auto kSpinBeforeBlock = std::chrono::microseconds(200);
constexpr auto kDeadPeerCooldown = std::chrono::seconds(1);

}  // namespace

// Transport errors of point-to-point transfers name their peer; group
// operations fail only their transfer.
static const NetAddr* failed_peer(const Request& req, uint8_t nic) {
  if (auto* r = std::get_if<SingleReq>(&req)) return &r->dst.nics[nic].addr;
  if (auto* r = std::get_if<PagedReq>(&req)) return &r->dst.nics[nic].addr;
  if (auto* r = std::get_if<SendReq>(&req)) return &r->addr;
  return nullptr;
}

Worker::Worker(EngineShared* shared, size_t index, GroupConfig group, std::vector<int> affinity)
    : shared_(shared), index_(index), group_(std::move(group)), affinity_(std::move(affinity)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Worker::~Worker() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
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
  uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

Status SendBuffers::acquire(Clock::time_point deadline, bool wait, uint32_t* out) {
  std::unique_lock lk(mu_);
  ++waiters_;
  Status st;
  for (;;) {
    if (closed_) {
      st = Status(Code::kFailedPrecondition, "the transfer engine is stopped");
      break;
    }
    if (!free_.empty()) {
      *out = free_.back();
      free_.pop_back();
      break;
    }
    const Status none(Code::kResourceExhausted,
                      "submit_send: every send buffer is in flight "
                      "(EngineConfig::send_buffer_count)");
    if (!wait) {
      st = none;
      break;
    }
    if (deadline == Clock::time_point{}) {
      cv_.wait(lk);
    } else if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && free_.empty() &&
               !closed_) {
      st = none;
      break;
    }
  }
  --waiters_;
  return st;
}

Status Worker::admit(Clock::time_point deadline) {
  const uint64_t limit = shared_->config.max_requests_in_flight;
  auto try_admit = [&] {
    uint64_t cur = inflight_.load(std::memory_order_relaxed);
    while (cur < limit)
      if (inflight_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) return true;
    return false;
  };
  auto stopped = [] { return Status(Code::kFailedPrecondition, "the transfer engine is stopped"); };
  if (closed_.load(std::memory_order_acquire)) return stopped();
  if (try_admit()) return {};
  auto full = [&] {
    return Status(Code::kResourceExhausted,
                  fmt::format("group {}: {} requests in flight (EngineConfig::"
                              "max_requests_in_flight)",
                              index_, limit));
  };
  if (shared_->config.queue_full == QueueFull::kRefuse) return full();
  blocked_.fetch_add(1, std::memory_order_seq_cst);
  std::unique_lock lk(space_mu_);
  Status st;
  for (;;) {
    if (closed_.load(std::memory_order_acquire)) {
      st = stopped();
      break;
    }
    if (try_admit()) break;
    if (deadline == Clock::time_point{}) {
      space_cv_.wait(lk);
    } else if (space_cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      if (!try_admit()) st = full();
      break;
    }
  }
  lk.unlock();
  blocked_.fetch_sub(1, std::memory_order_seq_cst);
  return st;
}

void Worker::release_admission() {
  inflight_.fetch_sub(1, std::memory_order_acq_rel);
  // Pairs with admit(): a waiter registers in blocked_ before re-checking.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (blocked_.load(std::memory_order_relaxed) > 0) {
    std::lock_guard lk(space_mu_);
    space_cv_.notify_one();
  }
}

void Worker::close_admission() {
  closed_.store(true, std::memory_order_seq_cst);
  std::lock_guard lk(space_mu_);
  space_cv_.notify_all();
}

void Worker::submit(Command&& cmd) {
  queue_.enqueue(std::move(cmd));
  // The store of the command and the load of sleeping_ must not be
  // reordered (idle_wait has the mirror fence): otherwise the worker can go
  // to sleep with this command queued and nobody to wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_relaxed)) {
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof(one));
  }
}

Status Worker::call(std::function<Status()> fn, std::chrono::milliseconds timeout) {
  if (stop_.load()) return Status(Code::kFailedPrecondition, "engine is stopped");
  // The promise is shared so a caller that gave up leaves nothing dangling.
  auto done = std::make_shared<std::promise<Status>>();
  auto fut = done->get_future();
  Command cmd;
  cmd.req = ControlReq{[fn = std::move(fn), done, index = index_] {
    Status st;
    try {
      st = fn();
    } catch (const std::exception& e) {
      st = Status(Code::kInternal,
                  fmt::format("worker {}: control call threw: {}", index, e.what()));
    } catch (...) {
      st = Status(Code::kInternal, fmt::format("worker {}: control call threw", index));
    }
    done->set_value(std::move(st));
  }};
  submit(std::move(cmd));
  if (fut.wait_for(timeout) != std::future_status::ready)
    return Status(Code::kDeadlineExceeded,
                  fmt::format("worker {} did not answer a control call within {} ms", index_,
                              timeout.count()));
  return fut.get();
}

// ------------------------------------------------------------------ thread

void Worker::run(std::promise<Status>* init) {
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
  Status st = open_nics();
  init->set_value(st);
  if (!st.is_ok()) return;

  auto last_busy = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    bool busy = drain_commands();
    busy |= progress_posts();
    busy |= poll_completions();
    auto now = Clock::now();
    if (now - last_deadline_scan_ > std::chrono::milliseconds(1)) {
      last_deadline_scan_ = now;
      check_deadlines();
    }
    if (busy) {
      last_busy = now;
    } else if (shared_->config.poll_mode == PollMode::kAdaptive &&
               now - last_busy > kSpinBeforeBlock) {
      idle_wait();
    }
  }

  // Shutdown: everything still queued or in flight ends as cancelled.
  Command cmd;
  while (queue_.try_dequeue(cmd)) {
    if (auto* c = std::get_if<ControlReq>(&cmd.req)) {
      c->fn();
      continue;
    }
    fail_command(cmd, Status(Code::kCancelled, "engine stopped"));
  }
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    if (s.active && !s.finished) finish(s, Status(Code::kCancelled, "engine stopped"));
  }
  groups_.clear();
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
  std::string names;
  for (auto& i : infos_) names += (names.empty() ? "" : ", ") + i.name;
  log().info("worker {} ({}): provider {}, fabric {}, NICs [{}], poll mode {}", index_,
             group_.device.to_string(), infos_[0].provider, infos_[0].fabric, names,
             cfg.poll_mode == PollMode::kBusy ? "busy" : "adaptive");
  return {};
}

void Worker::idle_wait() {
  sleeping_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // mirror of submit()
  if (queue_.size_approx() != 0 || stop_.load()) {
    sleeping_.store(false);
    return;
  }
  // Block on the command wakeup and every CQ when all CQs allow it; otherwise
  // nap briefly so providers with manual progress still move data.
  pollfd fds[1 + kMaxNics];
  nfds_t n = 0;
  fds[n++] = {wake_fd_, POLLIN, 0};
  bool all_blockable = true;
  for (auto& nic : nics_) {
    int fd = nic.domain->wait_fd();
    if (fd < 0 || !nic.domain->can_block()) {
      all_blockable = false;
      break;
    }
    fds[n++] = {fd, POLLIN, 0};
  }
  if (all_blockable) {
    ::poll(fds, n, 2);
  } else {
    ::poll(fds, 1, 0);
    timespec ts{0, 20'000};
    ::nanosleep(&ts, nullptr);
  }
  uint64_t v;
  [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof(v));
  sleeping_.store(false, std::memory_order_seq_cst);
}

// --------------------------------------------------------------- commands

bool Worker::drain_commands() {
  Command cmds[kCommandsPerStep];
  size_t n = queue_.try_dequeue_bulk(cmds, kCommandsPerStep);
  for (size_t i = 0; i < n; ++i) handle(cmds[i]);
  return n > 0;
}

void Worker::handle(Command& cmd) {
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
  if (auto* send = std::get_if<SendReq>(&cmd.req)) shared_->send_free->release(send->buffer);
  if (std::holds_alternative<RecvPostReq>(cmd.req)) return;
  signal(std::move(cmd.on_done), std::move(s));
  if (cmd.admitted) release_admission();
}

// Counters and flags are updated here, with no thread hop; callbacks run on
// the callback thread.
void Worker::signal(OnDone on_done, Status st) {
  if (on_done.needs_callback_thread())
    shared_->callbacks->push(TransferDoneEvent{std::move(on_done), std::move(st)});
  else
    on_done.signal_inline(st);
}

uint32_t Worker::alloc_slot() {
  if (free_slots_.empty()) {
    // Grow: existing slots keep their indices; contexts stay valid.
    uint32_t old = slots_.size();
    slots_.resize(old * 2);
    for (uint32_t i = slots_.size(); i-- > old;) free_slots_.push_back(i);
  }
  uint32_t idx = free_slots_.back();
  free_slots_.pop_back();
  return idx;
}

PeerId Worker::resolve(uint8_t nic, const NetAddr& addr, Status* err) {
  auto& n = nics_[nic];
  if (!dead_.empty()) {
    if (auto d = dead_.find(addr); d != dead_.end()) {
      // Fail fast for a while, then let the transport try again: an error
      // may have been transient, and a real loss shows up again at once.
      if (Clock::now() - d->second.since < kDeadPeerCooldown) {
        *err = Status(Code::kUnavailable, fmt::format("peer {} failed earlier: {}", addr.brief(),
                                                      d->second.why.message()));
        return 0;
      }
      dead_.erase(d);
    }
  }
  auto it = n.peers.find(addr);
  if (it != n.peers.end()) return it->second;
  if (addr.transport() != infos_[nic].transport) {
    *err = Status(Code::kInvalidArgument,
                  fmt::format("address {} is not a {} address (NIC {})", addr.brief(),
                              infos_[nic].provider, infos_[nic].name));
    return 0;
  }
  if (n.stale.count(addr)) {
    *err = Status(Code::kAborted,
                  fmt::format("address {} belongs to a previous incarnation of a peer that has "
                              "restarted; use its new address or descriptor",
                              addr.brief()));
    return 0;
  }
  std::string raw(reinterpret_cast<const char*>(addr.raw().data()), addr.raw().size());
  if (auto old = n.latest.find(raw); old != n.latest.end() && !(old->second == addr)) {
    // Same endpoint bytes, new incarnation: the peer restarted. Retire the old
    // entry so nothing resolves to it any more.
    log().info("NIC {}: peer {} restarted (was {}); the old address is now stale", infos_[nic].name,
               addr.brief(), old->second.brief());
    if (auto p = n.peers.find(old->second); p != n.peers.end()) {
      n.domain->remove_peer(p->second);
      n.peers.erase(p);
    }
    n.stale.insert(old->second);
    stale_epoch_++;
  }
  PeerId id = n.domain->add_peer(addr.raw(), err);
  if (!err->is_ok()) {
    *err = Status(err->code(), fmt::format("peer {} via NIC {}: {}", addr.brief(), infos_[nic].name,
                                           err->message()));
    return 0;
  }
  n.peers.emplace(addr, id);
  n.latest[raw] = addr;
  return id;
}

void Worker::mark_dead(const NetAddr& addr, const Status& why) {
  auto [it, fresh] = dead_.try_emplace(addr, DeadPeer{why, Clock::now()});
  if (fresh)
    log().warn("worker {}: peer {} marked failed: {}", index_, addr.brief(), why.message());
  it->second.since = Clock::now();
}

void Worker::start_transfer(Command& cmd) {
  uint32_t idx = alloc_slot();
  Slot& s = slots_[idx];
  s.gen = (s.gen + 1) & 0xFFFFFF;
  s.active = true;
  s.finished = false;
  s.id = cmd.id;
  s.on_done = std::move(cmd.on_done);
  s.deadline = cmd.deadline;
  s.admitted = cmd.admitted;
  if (s.deadline != Clock::time_point{}) deadline_insert(idx);
  s.cursors_live = 0;
  s.posted = s.completed = 0;
  s.error = Status();
  s.req = std::move(cmd.req);
  s.peers.clear();
  s.group_peers = nullptr;
  ++active_;

  Status st = prepare(s);
  if (!st.is_ok()) {
    finish(s, std::move(st));
    maybe_finish(idx);
    return;
  }
  ShardPlan plan;
  uint32_t n = nics_.size();
  std::visit(
      [&](auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, SingleReq>) {
          plan = plan_single(r.len, r.route, n, rr_);
          s.split = plan.split;
        } else if constexpr (std::is_same_v<T, PagedReq>) {
          plan = plan_runs(r.src_pages.indices.size(), n, rr_);
        } else if constexpr (std::is_same_v<T, ScatterReq>) {
          uint32_t t = r.dsts.size();
          if (r.route.kind == GroupRoute::Kind::kPinned)
            plan = plan_pinned(t, r.route.nic);
          else if (r.route.kind == GroupRoute::Kind::kShardBytes)
            plan = plan_shard_bytes(t, n);
          else
            plan = plan_runs(t, n, rr_);
        } else if constexpr (std::is_same_v<T, BarrierReq>) {
          uint32_t t = r.dsts.size();
          if (r.route.kind == GroupRoute::Kind::kPinned)
            plan = plan_pinned(t, r.route.nic);
          else
            plan = plan_runs(t, n, rr_);
        } else if constexpr (std::is_same_v<T, SendReq>) {
          plan = plan_pinned(1, 0);
        }
      },
      s.req);
  enqueue_plan(idx, plan);
  maybe_finish(idx);  // empty requests complete at once
}

// Resolves everything a transfer needs per NIC once, so posting only patches
// addresses. Validation of user input happened on the submitting thread.
Status Worker::prepare(Slot& s) {
  Status err;
  auto resolve_desc = [&](const auto& d, PeerId* out) {
    for (uint8_t k = 0; k < nics_.size(); ++k) {
      out[k] = resolve(k, d.nics[k].addr, &err);
      if (!err.is_ok()) return false;
    }
    return true;
  };
  auto set_src = [&](const RegRef& r) {
    for (size_t k = 0; k < nics_.size(); ++k) s.src_desc[k] = r->local_desc[k];
  };
  if (auto* r = std::get_if<SingleReq>(&s.req)) {
    set_src(r->src);
    resolve_desc(r->dst, s.peer.data());
  } else if (auto* r = std::get_if<PagedReq>(&s.req)) {
    set_src(r->src);
    resolve_desc(r->dst, s.peer.data());
  } else if (auto* r = std::get_if<SendReq>(&s.req)) {
    s.peer[0] = resolve(0, r->addr, &err);
  } else {
    std::optional<PeerGroupHandle> group;
    size_t targets = 0;
    if (auto* sc = std::get_if<ScatterReq>(&s.req)) {
      set_src(sc->src);
      group = sc->group;
      targets = sc->dsts.size();
    } else if (auto* b = std::get_if<BarrierReq>(&s.req)) {
      group = b->group;
      targets = b->dsts.size();
    }
    if (group) {
      if (*group >= groups_.size())
        return Status(Code::kNotFound, fmt::format("peer group {} not found", *group));
      auto& g = *groups_[*group];
      if (g.epoch != stale_epoch_) {
        // A peer restarted since the group was made: refuse groups naming it.
        for (auto& peer : g.addrs)
          for (uint8_t k = 0; k < nics_.size(); ++k)
            if (nics_[k].stale.count(peer[k]))
              return Status(Code::kAborted,
                            fmt::format("peer group {} names {}, a peer that has restarted; "
                                        "make a new group from its new descriptor",
                                        *group, peer[k].brief()));
        g.epoch = stale_epoch_;
      }
      if (g.addrs.size() != targets)
        return Status(Code::kInvalidArgument,
                      fmt::format("peer group {} has {} peers but the request has {} targets",
                                  *group, g.addrs.size(), targets));
      s.group_peers = &g.peers;
    } else {
      s.peers.resize(targets * kMaxNics);
      for (size_t t = 0; t < targets && err.is_ok(); ++t) {
        const MrDesc& d = std::holds_alternative<ScatterReq>(s.req)
                              ? std::get<ScatterReq>(s.req).dsts[t].dst
                              : std::get<BarrierReq>(s.req).dsts[t];
        resolve_desc(d, &s.peers[t * kMaxNics]);
      }
    }
  }
  return err;
}

void Worker::enqueue_plan(uint32_t idx, const ShardPlan& plan) {
  Slot& s = slots_[idx];
  for (uint32_t i = 0; i < plan.num_shards; ++i) {
    const Shard& sh = plan.shards[i];
    if (sh.begin == sh.end) continue;
    s.cursors_live++;
    nics_[sh.nic].pending.push_back(Cursor{idx, s.gen, sh, sh.begin});
  }
}

// Fills up to out.size() writes of cursor c and the unit each came from;
// advances c.next past the last unit used.
size_t Worker::fill_writes(Slot& s, Cursor& c, uint8_t nic, std::span<WriteDesc> out,
                           uint32_t* units) {
  size_t n = 0;
  const uint64_t ctx = make_ctx(kTagWrite, s.gen, c.slot);
  auto base = [&](WriteDesc& w, std::optional<uint32_t> imm) {
    w.ctx = ctx;
    w.has_imm = imm.has_value();
    w.imm = imm.value_or(0);
    w.local_desc = s.src_desc[nic];
  };
  if (auto* r = std::get_if<SingleReq>(&s.req)) {
    const auto& d = r->dst.nics[nic];
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      units[n] = c.next;
      WriteDesc& w = out[n++];
      base(w, r->imm);
      uint64_t off = s.split.piece_offset(c.next);
      w.len = s.split.piece_len(c.next, r->len);
      // A zero-length write still needs an in-bounds address and valid key.
      if (w.len == 0) off = 0;
      w.src = r->src->ptr + r->src_offset + off;
      w.peer = s.peer[nic];
      w.remote_addr = d.base + r->dst_offset + off;
      w.rkey = d.rkey;
    }
  } else if (auto* r = std::get_if<PagedReq>(&s.req)) {
    n = spell_out_pages(paged_desc(s, *r, c, nic), 0, out);
    for (size_t i = 0; i < n; ++i) units[i] = c.next + uint32_t(i);
    c.next += uint32_t(n);
  } else if (auto* r = std::get_if<ScatterReq>(&s.req)) {
    const auto& peers = s.group_peers ? *s.group_peers : s.peers;
    const bool bytes = r->route.kind == GroupRoute::Kind::kShardBytes;
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      const ScatterDst& t = r->dsts[c.next];
      uint64_t off = 0, len = t.len;
      if (bytes) {
        Split sp = split_bytes(t.len, nics_.size(), kMinScatterPiece);
        if (c.shard.part >= sp.count) continue;  // this target needs fewer pieces
        off = sp.piece_offset(c.shard.part);
        len = sp.piece_len(c.shard.part, t.len);
      }
      units[n] = c.next;
      WriteDesc& w = out[n++];
      base(w, r->imm);
      w.len = len;
      w.src = r->src->ptr + t.src_offset + off;
      w.peer = peers[c.next * kMaxNics + nic];
      w.remote_addr = t.dst.nics[nic].base + t.dst_offset + off;
      w.rkey = t.dst.nics[nic].rkey;
    }
  } else if (auto* r = std::get_if<BarrierReq>(&s.req)) {
    const auto& peers = s.group_peers ? *s.group_peers : s.peers;
    for (; c.next < c.shard.end && n < out.size(); ++c.next) {
      const MrDesc& d = r->dsts[c.next];
      units[n] = c.next;
      WriteDesc& w = out[n++];
      base(w, r->imm);
      w.len = 0;
      w.src = nullptr;
      w.local_desc = nullptr;
      w.peer = peers[c.next * kMaxNics + nic];
      w.remote_addr = d.nics[nic].base;
      w.rkey = d.nics[nic].rkey;
    }
  }
  return n;
}

// The pages of cursor c still to post on NIC `nic`, as page lists.
PagedDesc Worker::paged_desc(const Slot& s, const PagedReq& r, const Cursor& c, uint8_t nic) const {
  const auto& d = r.dst.nics[nic];
  PagedDesc p;
  p.src = r.src->ptr + r.src_pages.offset;
  p.src_stride = r.src_pages.stride;
  p.src_idx = r.src_pages.indices.data() + c.next;
  p.remote_base = d.base + r.dst_pages.offset;
  p.dst_stride = r.dst_pages.stride;
  p.dst_idx = r.dst_pages.indices.data() + c.next;
  p.count = c.shard.end - c.next;
  p.page_len = r.page_len;
  p.local_desc = s.src_desc[nic];
  p.peer = s.peer[nic];
  p.rkey = d.rkey;
  p.imm = r.imm.value_or(0);
  p.has_imm = r.imm.has_value();
  p.ctx = make_ctx(kTagWrite, s.gen, c.slot);
  return p;
}

bool Worker::progress_posts() {
  bool did = false;
  WriteDesc batch[kPostsPerCall];
  uint32_t units[kPostsPerCall];
  for (uint8_t k = 0; k < nics_.size(); ++k) {
    Nic& nic = nics_[k];
    size_t budget = infos_[k].post_budget;
    const size_t max_outstanding = infos_[k].max_outstanding;
    // Back-pressure can be per peer (a connection still being made, or to a
    // peer that died): a stalled cursor goes to the back and the others get
    // their turn; the NIC is left alone only once every cursor stalled.
    size_t stalled = 0;
    auto stall = [&] {
      Cursor turn = nic.pending.front();
      nic.pending.pop_front();
      nic.pending.push_back(turn);
      return ++stalled >= nic.pending.size();
    };
    while (!nic.pending.empty() && budget > 0 && nic.outstanding < max_outstanding) {
      Cursor& c = nic.pending.front();
      Slot& s = slots_[c.slot];
      if (!s.active || s.gen != c.gen || s.finished || !s.error.is_ok()) {
        // Transfer already ended (error or deadline): drop the rest.
        uint32_t slot = c.slot;
        bool live = s.active && s.gen == c.gen;
        nic.pending.pop_front();
        if (live) {
          s.cursors_live--;
          maybe_finish(slot);
        }
        continue;
      }
      if (auto* send = std::get_if<SendReq>(&s.req)) {
        auto r = nic.domain->post_send(s.peer[0], shared_->send_pool->buffer(send->buffer),
                                       send->len, shared_->send_pool->reg->local_desc[0],
                                       make_ctx(kTagSend, s.gen, c.slot));
        if (r.posted == 0 && r.error.is_ok()) {  // back-pressure
          if (stall()) break;
          continue;
        }
        uint32_t slot = c.slot;
        nic.pending.pop_front();
        s.cursors_live--;
        did = true;
        if (!r.error.is_ok()) {
          finish(s, r.error);
          maybe_finish(slot);
        } else {
          s.posted++;
          nic.outstanding++;
        }
        --budget;
        continue;
      }
      size_t n = 0;
      PostResult r;
      auto* paged = std::get_if<PagedReq>(&s.req);
      if (paged && infos_[k].native_paged) {
        // Hand the run over as page lists: the domain does the per-page work.
        PagedDesc p = paged_desc(s, *paged, c, k);
        n = std::min({budget, max_outstanding - nic.outstanding, size_t(p.count)});
        p.count = uint32_t(n);
        r = nic.domain->post_paged(p);
        c.next += uint32_t(std::min(r.posted, n));
      } else {
        size_t want = std::min({budget, max_outstanding - nic.outstanding, kPostsPerCall});
        n = fill_writes(s, c, k, std::span(batch, want), units);
        r = n ? nic.domain->post_writes(std::span(batch, n)) : PostResult{};
        if (r.posted < n) c.next = units[r.posted];  // resume at the first write not taken
      }
      did |= r.posted > 0;
      s.posted += r.posted;
      nic.outstanding += r.posted;
      budget -= std::min(budget, r.posted);
      if (r.posted < n) {
        if (!r.error.is_ok()) {
          if (r.error.code() == Code::kUnavailable)
            if (const NetAddr* a = failed_peer(s.req, k)) mark_dead(*a, r.error);
          s.error = r.error;  // stop posting this transfer; wait for what is posted
          uint32_t slot = c.slot;
          nic.pending.pop_front();
          s.cursors_live--;
          maybe_finish(slot);
          continue;
        }
        if (stall()) break;
        continue;
      }
      if (c.next >= c.shard.end) {
        uint32_t slot = c.slot;
        nic.pending.pop_front();
        s.cursors_live--;
        maybe_finish(slot);
      } else if (nic.pending.size() > 1) {
        // Take turns: a 100 000-page transfer must not starve a small one
        // queued behind it.
        Cursor turn = c;
        nic.pending.pop_front();
        nic.pending.push_back(turn);
      }
    }
  }
  return did;
}

bool Worker::poll_completions() {
  bool did = false;
  Completion comps[kPollBatch];
  for (uint8_t k = 0; k < nics_.size(); ++k) {
    Nic& nic = nics_[k];
    current_nic_ = k;
    size_t n = nic.domain->poll(comps);
    did |= n > 0;
    for (size_t i = 0; i < n; ++i) {
      Completion& c = comps[i];
      switch (c.kind) {
        case Completion::Kind::kRemoteImm:
          if (c.status.is_ok())
            shared_->imms->on_arrival(c.imm, c.count);
          else
            log().warn("NIC {}: incoming immediate failed: {}", infos_[k].name, c.status.message());
          break;
        case Completion::Kind::kWrite:
        case Completion::Kind::kSend:
          // Only a completion of a live transfer releases a posting credit:
          // a stale duplicate must not let the NIC be over-filled.
          if (on_local_done(c.ctx, c.status, c.count))
            nic.outstanding -= std::min<uint64_t>(nic.outstanding, c.count);
          break;
        case Completion::Kind::kRecv:
          on_recv_done(c.ctx, c.len, c.status);
          break;
      }
    }
  }
  return did;
}

bool Worker::on_local_done(uint64_t ctx, const Status& st, uint32_t count) {
  uint32_t idx = ctx_idx(ctx);
  uint64_t tag = ctx_tag(ctx);
  if ((tag != kTagWrite && tag != kTagSend) || idx >= slots_.size()) {
    log().error("worker {}: completion with unknown context {:#x}", index_, ctx);
    return false;
  }
  Slot& s = slots_[idx];
  if (!s.active || s.gen != ctx_gen(ctx)) return false;  // stale: the slot was recycled
  s.completed += count;
  if (!st.is_ok()) {
    if (st.code() == Code::kUnavailable)
      if (const NetAddr* a = failed_peer(s.req, tag == kTagSend ? 0 : current_nic_))
        mark_dead(*a, st);
    if (s.error.is_ok()) s.error = st;
  }
  maybe_finish(idx);
  return true;
}

void Worker::maybe_finish(uint32_t idx) {
  Slot& s = slots_[idx];
  if (!s.active) return;
  // A failure is reported at once; the slot stays until every posted write
  // completed, so late completions cannot be mistaken for a new transfer's.
  if (!s.error.is_ok()) finish(s, s.error);
  if (s.cursors_live > 0 || s.completed < s.posted) return;
  finish(s, s.error);
  if (auto* send = std::get_if<SendReq>(&s.req)) shared_->send_free->release(send->buffer);
  if (s.on_deadline_list) deadline_remove(idx);
  s.active = false;
  s.req = Request{};
  s.peers.clear();
  free_slots_.push_back(idx);
  --active_;
  if (std::exchange(s.admitted, false)) release_admission();
}

// Deadlines are almost always "now + the default", so a new one belongs at
// the tail: insertion walks back from there, removal is O(1), and the scan
// looks only at the head, whatever the number of transfers in flight.
void Worker::deadline_insert(uint32_t idx) {
  Slot& s = slots_[idx];
  uint32_t after = dl_tail_;
  while (after != kNone && slots_[after].deadline > s.deadline) after = slots_[after].dl_prev;
  s.dl_prev = after;
  s.dl_next = after == kNone ? dl_head_ : slots_[after].dl_next;
  if (s.dl_next != kNone)
    slots_[s.dl_next].dl_prev = idx;
  else
    dl_tail_ = idx;
  if (after != kNone)
    slots_[after].dl_next = idx;
  else
    dl_head_ = idx;
  s.on_deadline_list = true;
}

void Worker::deadline_remove(uint32_t idx) {
  Slot& s = slots_[idx];
  if (s.dl_prev != kNone)
    slots_[s.dl_prev].dl_next = s.dl_next;
  else
    dl_head_ = s.dl_next;
  if (s.dl_next != kNone)
    slots_[s.dl_next].dl_prev = s.dl_prev;
  else
    dl_tail_ = s.dl_prev;
  s.dl_prev = s.dl_next = kNone;
  s.on_deadline_list = false;
}

void Worker::finish(Slot& s, Status st) {
  if (s.finished) return;
  s.finished = true;
  if (!st.is_ok() && s.error.is_ok()) s.error = st;
  signal(std::exchange(s.on_done, OnDone()), std::move(st));
}

void Worker::check_deadlines() {
  // Registrations retired by unreg_mr die here once no transfer holds them.
  if (!retired_.empty())
    std::erase_if(retired_, [](const RegRef& r) { return r.use_count() == 1; });
  const auto now = Clock::now();
  while (dl_head_ != kNone && slots_[dl_head_].deadline <= now) {
    const uint32_t i = dl_head_;
    Slot& s = slots_[i];
    deadline_remove(i);
    if (!s.active || s.finished) continue;
    const NetAddr* peer = failed_peer(s.req, 0);
    std::string who = peer ? peer->brief() : std::string("its peers");
    // A peer known to have failed is the reason, not the clock.
    if (peer && !dead_.empty()) {
      if (auto d = dead_.find(*peer); d != dead_.end()) {
        finish(s, Status(Code::kUnavailable,
                         fmt::format("transfer {} to {} via NIC {}: peer failed: {}", s.id, who,
                                     infos_[0].name, d->second.why.message())));
        maybe_finish(i);
        continue;
      }
    }
    const std::string progress =
        s.posted == 0 ? std::string(
                            "the provider accepted none of its writes (peer unreachable, "
                            "or the NIC stayed full)")
                      : fmt::format("{} of {} posted writes completed", s.completed, s.posted);
    finish(s, Status(Code::kDeadlineExceeded,
                     fmt::format("transfer {} to {} via NIC {} passed its deadline: {}", s.id, who,
                                 infos_[0].name, progress)));
    maybe_finish(i);
  }
}

// ------------------------------------------------------------ send / recv

void Worker::post_recv_buffer(uint32_t pool, uint32_t buffer) {
  auto& p = *(*shared_->recv_pools)[pool];
  auto r = nics_[0].domain->post_recv(p.buffer(buffer), p.buf_len, p.reg->local_desc[0],
                                      make_ctx(kTagRecv, pool, buffer));
  if (!r.error.is_ok() || r.posted == 0) {
    // Receives are posted rarely; a full queue is retried from the command queue.
    if (r.error.is_ok()) {
      Command c;
      c.req = RecvPostReq{pool, buffer};
      queue_.enqueue(std::move(c));
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
  RecvPool* p = (*shared_->recv_pools)[pool].get();
  len = std::min<uint64_t>(len, p->buf_len);
  // The user sees the bytes in place; the buffer goes back to the NIC after.
  shared_->callbacks->push(TaskEvent{[this, p, pool, buffer, len] {
    struct Repost {
      Worker* w;
      uint32_t pool, buffer;
      ~Repost() {
        Command c;
        c.req = RecvPostReq{pool, buffer};
        w->submit(std::move(c));
      }
    } repost{this, pool, buffer};
    p->on_recv(std::span<const uint8_t>(p->buffer(buffer), len));
  }});
}

// ------------------------------------------------------------ control plane

void Worker::register_wt(Registration& reg, bool remote, Status* err) {
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
}

PeerGroupHandle Worker::add_peer_group_wt(const std::vector<std::vector<NetAddr>>& peers,
                                          Status* err) {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g]->addrs == peers) return g;
  auto pgp = std::make_unique<PeerGroup>();
  auto& pg = *pgp;
  pg.addrs = peers;
  pg.epoch = stale_epoch_;
  pg.peers.resize(peers.size() * kMaxNics);
  for (size_t t = 0; t < peers.size(); ++t) {
    for (uint8_t k = 0; k < nics_.size(); ++k) {
      pg.peers[t * kMaxNics + k] = resolve(k, peers[t][k], err);
      if (!err->is_ok()) return 0;
    }
  }
  groups_.push_back(std::move(pgp));
  return groups_.size() - 1;
}

}  // namespace ferry::core

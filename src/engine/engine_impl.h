// Private: the state behind TransferEngine (include/ferry/engine.h), shared by
// engine.cpp (construction, stop, identity, memory, immediates, observability)
// and engine_submit.cpp (the submit_* and prepare_* calls, peer groups).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "core/callback_thread.h"
#include "core/calls_in_progress.h"
#include "core/coarse_clock.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "core/worker.h"
#include "cuda/watcher.h"
#include "engine/domain_families.h"
#include "engine/memory_access.h"
#include "engine/placement.h"
#include "engine/provider_select.h"
#include "engine/stats.h"
#include "ferry/engine.h"

namespace ferry {
namespace engine {

inline constexpr auto kControlTimeout = std::chrono::seconds(30);
inline constexpr size_t kMaxRecvPools = 64;

// offset + len <= limit without overflow.
inline bool fits(uint64_t offset, uint64_t len, uint64_t limit) {
  return offset <= limit && len <= limit - offset;
}

}  // namespace engine

using core::Clock;
using core::Command;
using core::RegRef;
using engine::fits;
using engine::kControlTimeout;
using engine::kMaxRecvPools;

struct TransferEngine::Impl {
  core::EngineShared shared;
  // Before the workers: requests in flight point into it until they are gone.
  std::shared_ptr<core::AddrTable> addrs = std::make_shared<core::AddrTable>();
  // Null unless every worker can be helped; outlives the threads that use it.
  std::shared_ptr<core::ProgressHelp> help;
  std::unique_ptr<core::ImmTable> imms;
  std::unique_ptr<core::CallbackThread> callbacks;
  std::vector<std::unique_ptr<core::Worker>> workers;
  cuda::GpuServices gpu;      // watcher thread and GPU flags, created on first use
  engine::Observability obs;  // statistics, metrics endpoint, timeline

  std::shared_mutex reg_mu;
  std::unordered_map<uint64_t, RegRef> regs;
  std::atomic<uint64_t> next_reg_id{1};
  // Transfer ids are unique per engine, not ordered across threads: each
  // submitting thread takes them in blocks, so a submission's id costs no
  // locked instruction on a line that every submitter shares.
  std::atomic<TransferId> next_transfer{1};
  static constexpr TransferId kIdBlock = 256;
  TransferId next_id() {
    struct Block {
      uint64_t incarnation = 0;  // whose block; a thread may submit to several engines
      TransferId next = 0, end = 0;
    };
    static thread_local Block t;
    if (t.next == t.end || t.incarnation != shared.incarnation) {
      t.next = next_transfer.fetch_add(kIdBlock, std::memory_order_relaxed);
      t.end = t.next + kIdBlock;
      t.incarnation = shared.incarnation;
    }
    return t.next++;
  }

  core::BufferPool send_pool;
  core::SendBuffers send_free;
  std::mutex recv_mu;
  std::vector<std::unique_ptr<core::RecvPool>> recv_pools;
  size_t num_recv_pools = 0;

  std::atomic<bool> stopped{false};
  // The statistics as stop() left them, for stats() after stop (guarded by final_mu).
  std::mutex final_mu;
  std::optional<EngineStats> final_stats;
  // The callback thread and the workers, fixed once the constructor returns.
  std::vector<std::thread::id> own_threads;
  // API calls in progress: stop() waits for them before it stops the
  // workers, so no call can touch a worker that stop() is tearing down.
  core::CallsInProgress api_calls;
  std::mutex stop_mu;

  // Held for the length of every public call.
  class Entered {
   public:
    // Counted before the flag is read; a throw below leaves again (the
    // member's destructor runs).
    explicit Entered(Impl& im) : counted_(im.api_calls) {
      if (im.stopped.load(std::memory_order_seq_cst))
        throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
    }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    core::CallsInProgress::Counted counted_;
  };
  Entered enter() { return Entered(*this); }

  core::Worker& worker_for(Device d) {
    if (d.is_host()) return *workers[0];
    for (auto& w : workers)
      if (w->index() < shared.config.groups.size() && shared.config.groups[w->index()].device == d)
        return *w;
    throw Error(Code::kNotFound, fmt::format("no group serves device {}", d.to_string()));
  }

  RegRef lookup(MrHandle h, const char* what) {
    std::shared_lock lk(reg_mu);
    auto it = regs.find(h.id);
    if (it == regs.end() || it->second->ptr != h.ptr)
      throw Error(Code::kNotFound,
                  fmt::format("{}: memory region {} (id {}) is not registered (never registered, "
                              "or unregistered)",
                              what, h.ptr, h.id));
    return it->second;
  }

  void check_desc(const MrDesc& d, size_t nics, const char* what) {
    if (d.nics.size() != nics)
      throw Error(Code::kFailedPrecondition,
                  fmt::format("{}: descriptor has {} NICs but this group has {} (all peers must "
                              "use the same number of NICs per GPU)",
                              what, d.nics.size(), nics));
    for (const auto& n : d.nics) {
      if (n.addr.empty())
        throw Error(Code::kInvalidArgument,
                    fmt::format("{}: descriptor with an empty address", what));
    }
  }

  // A read-only region is no target for any write, immediates and barriers
  // included: some providers refuse zero-byte writes to a key without
  // remote write, so refusing all of them here gives one rule everywhere.
  static void check_writable(const MrDesc& d, const char* what) {
    if (!d.writable)
      throw Error(Code::kFailedPrecondition,
                  fmt::format("{}: the destination region ({} bytes at {:#x}) was registered "
                              "read-only by its owner",
                              what, d.len, d.ptr));
  }

  // When a submission was made, for its deadline and the statistics. A
  // precise clock read costs 20-45 ns on the caller's way to the wire, so it
  // is taken only for the statistics' submit time (queueing delay, transfer
  // latency), of one submission in EngineConfig::latency_sample_every per
  // thread and of every one while tracing; the deadline otherwise comes from
  // the coarse clock, one tick later so that it is never early (the worker
  // checks deadlines once a millisecond anyway).
  struct SubmitTime {
    Clock::time_point deadline;  // `dl`, or the default deadline
    int64_t submit_ns = 0;       // 0: not sampled
  };
  SubmitTime submit_time(Clock::time_point dl = Clock::time_point::max()) const {
    SubmitTime t{dl, sampled_submit_ns()};
    if (dl == Clock::time_point::max()) t.deadline = default_deadline(t.submit_ns);
    return t;
  }
  // The submission's time when this one is sampled, else 0.
  int64_t sampled_submit_ns() const {
    static thread_local uint32_t t_until_sample = 0;  // submissions before the next timed one
    if constexpr (!core::kStatsEnabled) return 0;
    if (t_until_sample != 0 && shared.config.trace_file.empty()) {
      --t_until_sample;
      return 0;
    }
    const uint32_t every = shared.config.latency_sample_every;
    t_until_sample = every > 1 ? every - 1 : 0;
    return core::now_ns();
  }
  // EngineConfig::default_deadline from the submission's time (`submit_ns`, or
  // the coarse clock's next tick when it was not sampled).
  Clock::time_point default_deadline(int64_t submit_ns) const {
    const auto d = shared.config.default_deadline;
    if (d.count() <= 0) return Clock::time_point{};
    const Clock::time_point from = submit_ns != 0
                                       ? Clock::time_point(std::chrono::nanoseconds(submit_ns))
                                       : core::coarse_now() + core::coarse_tick();
    return from + d;
  }

  // A request the caller cannot have queued (its group is full, or the engine
  // stops) throws, and its OnDone never runs; one that is queued has its
  // OnDone run exactly once.
  template <typename Req>
  TransferId submit(core::Worker& w, OnDone on_done, Req&& req,
                    Clock::time_point dl = Clock::time_point::max()) {
    return submit(w, std::move(on_done), std::forward<Req>(req), submit_time(dl));
  }
  // The same with the submission's time taken already (submit_send's wait for
  // a buffer counts as queueing).
  template <typename Req>
  TransferId submit(core::Worker& w, OnDone on_done, Req&& req, const SubmitTime& t) {
    // A submit that waits for admission counts that wait as queueing.
    const Clock::time_point deadline_at = t.deadline;
    Status st = w.admit(deadline_at);
    if (!st.is_ok()) throw Error(st);
    const TransferId id = next_id();
    static_assert(std::is_nothrow_move_constructible_v<std::decay_t<Req>> &&
                  std::is_nothrow_move_assignable_v<OnDone>);
    // Written once, into the cell the worker reads it from.
    w.submit_with([&](Command& cmd) {
      cmd.id = id;
      cmd.fast.tag.kind = core::FastKind::kNone;  // the cell may hold a one-line command's remains
      cmd.admitted = true;
      cmd.on_done = std::move(on_done);
      cmd.deadline = deadline_at;
      cmd.submit_ns = t.submit_ns;
      cmd.req.template emplace<std::decay_t<Req>>(std::forward<Req>(req));
    });
    return id;
  }

  // An immediate with no OnDone to a group of one NIC: the whole command in
  // the first line of its cell (core::FastImm).
  TransferId submit_fast_imm(core::Worker& w, uint32_t imm, const MrDesc::Nic& dst) {
    const NetAddr* addr = addrs->intern(dst.addr);
    const core::FastImm f{core::FastKind::kImm, imm, addr, dst.rkey, dst.base};
    // Done at its post, an immediate needs no deadline: taken only for the command.
    const int64_t submit_ns = sampled_submit_ns();
    if (w.try_imm_at_post(f, submit_ns)) return next_id();
    return submit_one_line(w, SubmitTime{default_deadline(submit_ns), submit_ns},
                           [&](core::FastCmd& c) { c.imm = f; });
  }

  // A send with no OnDone: the whole command in the first line of its cell
  // (core::FastSend). `buffer` holds the message already.
  TransferId submit_fast_send(core::Worker& w, const NetAddr& to, uint32_t buffer, uint64_t len,
                              const SubmitTime& t) {
    const NetAddr* addr = addrs->intern(to);
    return submit_one_line(w, t, [&](core::FastCmd& f) {
      f.send = core::FastSend{core::FastKind::kSend, buffer, addr, len};
    });
  }

  // The steps every one-line command shares; `fill` writes its body.
  template <typename Fill>
  TransferId submit_one_line(core::Worker& w, const SubmitTime& t, Fill&& fill) {
    Status st = w.admit(t.deadline);
    if (!st.is_ok()) throw Error(st);
    const TransferId id = next_id();
    w.submit_with([&](Command& cmd) {
      cmd.id = id;
      cmd.deadline = t.deadline;
      cmd.submit_ns = t.submit_ns;
      fill(cmd.fast);
    });
    return id;
  }

  std::shared_ptr<PreparedTransfer::State> prepared_state() {
    auto st = std::make_shared<PreparedTransfer::State>();
    st->engine = this;
    st->incarnation = shared.incarnation;
    st->addrs = addrs;
    return st;
  }

  // fn runs on w's thread and must own its captures (shared state): after a
  // timeout it may still run.
  void call(core::Worker& w, std::function<Status()> fn) {
    Status st = w.call(std::move(fn), kControlTimeout);
    if (!st.is_ok()) throw Error(st);
  }
};

}  // namespace ferry

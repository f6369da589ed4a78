// One worker thread per DomainGroup (one GPU or the host): it owns the
// group's NICs, turns commands into writes, posts them, polls completions and
// bumps immediate counters. Only this thread touches its Domains.
#pragma once

#include <concurrentqueue/concurrentqueue.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "core/domain.h"
#include "core/loop_lock.h"
#include "core/ops.h"
#include "core/requests.h"
#include "core/ring.h"
#include "core/room_wait.h"
#include "core/send_buffers.h"
#include "core/sharding.h"
#include "core/stats.h"
#include "core/submit_ring.h"
#include "core/transfer.h"
#include "core/turn_hook.h"
#include "core/wake.h"
#include "core/worker_thread.h"
#include "ferry/engine.h"
#include "ferry/recv_queue.h"

namespace ferry::core {

class CallbackThread;
class ImmTable;
class ImmArrivalCache;

using Clock = std::chrono::steady_clock;

// An immediate or send in flight that post_fast posted (worker_fast_posts.cpp).
struct FastPost {
  static constexpr uint32_t kNoBuffer = UINT32_MAX;
  uint32_t gen = 0;
  bool live = false;      // posted, its completion not seen yet
  bool reported = false;  // its deadline passed: counted as kDeadlineExceeded
  const NetAddr* addr = nullptr;
  PeerId peer = 0;
  Clock::time_point deadline{};
  int64_t submit_ns = 0;
  uint64_t bytes = 0;
  uint32_t buffer = kNoBuffer;  // a send's buffer, released at its completion
};

// Host buffers used by sends and receives; registered on NIC 0 of group 0.
struct BufferPool {
  static constexpr std::align_val_t kAlign{64};
  // Shared: a received message (RecvMessage) may outlive the engine.
  std::shared_ptr<uint8_t> mem;
  size_t buf_len = 0, count = 0;
  RegRef reg;
  uint8_t* buffer(uint32_t i) const { return mem.get() + size_t(i) * buf_len; }
  // `count` buffers of `buf_len` bytes, cache-line aligned.
  void allocate(size_t len, size_t n) {
    buf_len = len;
    count = n;
    // Aligned new[] must be paired with the aligned delete[].
    mem = std::shared_ptr<uint8_t>(new (kAlign) uint8_t[len * n],
                                   [](uint8_t* p) { ::operator delete[](p, kAlign); });
  }
};
struct RecvPool : BufferPool {
  RecvCallback on_recv;
  bool on_worker = false;  // CallbackOn::kWorker: on_recv runs where the message arrived
  // Set for a RecvQueue's pool: messages go to the queue, not to on_recv.
  std::shared_ptr<RecvQueue::State> queue;
};

struct EngineShared {
  EngineConfig config;
  uint64_t incarnation = 0;
  ImmTable* imms = nullptr;
  CallbackThread* callbacks = nullptr;
  SendBuffers* send_free = nullptr;
  BufferPool* send_pool = nullptr;
  // Fixed size, never resized; a slot is filled before its buffers are posted.
  std::vector<std::unique_ptr<RecvPool>>* recv_pools = nullptr;
  // Opens the NICs: the engine decides which family serves the provider.
  DomainOpener open_domain;
};

class Worker final : public OpHost {
 public:
  // `affinity`: CPUs the worker may run on when the group names no worker_cpu.
  Worker(EngineShared* shared, size_t index, GroupConfig group, std::vector<int> affinity = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts the thread; returns once the NICs are open (or failed to open).
  Status start();
  void stop();

  // Admission (EngineConfig::max_requests_in_flight): a request counts from
  // admit() until its OnDone is signalled. Full: kResourceExhausted at once
  // (QueueFull::kRefuse) or after waiting until `deadline` (kBlock; epoch =
  // wait until space or stop). kFailedPrecondition once the engine stops.
  Status admit(Clock::time_point deadline);
  // A one-line immediate posted here and now, with no admission and no
  // command, where the NIC completes it inside its post (imm_at_post) and
  // nothing stands before it; false: submit it the usual way.
  bool try_imm_at_post(const FastImm& f, int64_t submit_ns);
  // The same for a send of at most DomainInfo::send_at_post_max bytes to the
  // interned `to`: the NIC copies `msg` out inside the post, so no send
  // buffer is taken either.
  bool try_send_at_post(const NetAddr* to, std::span<const uint8_t> msg, int64_t submit_ns);
  // Queues an admitted request (or an internal one: receive posts, control).
  void submit(Command&& cmd);
  // The same, with fill(Command&) writing the command where the worker will
  // read it: a ring cell, or (ring full) a command for the overflow queue.
  // The cell holds an earlier command's moved-from remains; fill assigns
  // every field. fill must not throw.
  template <typename Fill>
  void submit_with(Fill&& fill) {
    // The worker idles or stepped aside and nothing is queued before this
    // command: start it here, with no trip through the ring (post_direct).
    if (may_post_direct()) {
      std::unique_lock<LoopLock> loop(loop_mu_, std::try_to_lock);
      if (loop.owns_lock() && direct_ready()) {
        fill(direct_);
        post_direct();
        return;
      }
    }
    // A callback run inline for a completion answers it: post the answer
    // now, not at the worker's next turn through its own ring.
    if (answering_inline()) {
      fill(reply_);
      post_reply();
      return;
    }
    if (!ring_.try_emplace(fill)) {
      Command c;
      fill(c);
      to_overflow(std::move(c));
    }
    after_enqueue();
  }
  // Runs fn on the worker thread and waits for its Status (control plane).
  // fn must own what it captures: after a timeout it may still run. An
  // exception thrown by fn comes back as kInternal, never past the worker.
  // Called on the worker itself (from a callback it runs), fn runs at once.
  Status call(std::function<Status()> fn, std::chrono::milliseconds timeout);
  // A thread waiting for arrivals polls for the worker while the worker yields
  // or blocks, or steps aside (busy polling); false when it could not or found
  // nothing (progress_help.h). Immediate callbacks declared CallbackOn::kWorker
  // then run on that thread.
  bool help_progress();
  // Whether help_progress can ever help (NICs any thread may call; adaptive
  // polling, or busy polling with EngineConfig::busy_step_aside); known once
  // start() returned.
  bool can_help() const { return inline_posts_ || step_aside_; }
  // A thread that helped stops: a worker napping or stepped aside meanwhile is woken.
  void help_leaves() {
    if (napping_.load(std::memory_order_acquire)) wake_up();
  }
  // Wakes submitters blocked in admit(); they return kFailedPrecondition.
  void close_admission();
  uint64_t in_flight() const {
    const uint64_t released = released_.load(std::memory_order_acquire);
    return admitted_.load(std::memory_order_relaxed) - released;
  }
  // True on any engine's worker thread: there, admission never blocks (a
  // worker waiting for room would wait for itself).
  static bool on_worker_thread();

  size_t index() const { return index_; }
  int state_numa_node() const { return state_numa_.load(); }
  size_t nics() const { return addrs_.size(); }
  const std::vector<NetAddr>& addresses() const { return addrs_; }
  const std::vector<DomainInfo>& nic_infos() const { return infos_; }
  std::thread::id thread_id() const { return thread_.get_id(); }
  // Statistics (core/stats.h): read by snapshots on any thread.
  const WorkerCounters& counters() const { return stats_; }
  size_t queued() const { return ring_.size_approx() + overflow_.size_approx(); }
  // The timeline of this worker, or null when tracing is off; read it only
  // once the worker has stopped.
  const TraceRing* trace_ring() const { return trace_.get(); }

  // --- worker thread only (suffix _wt) -----------------------------------
  void register_wt(Registration& reg, bool remote, Status* err);
  // The first NIC whose transport maps dst's [offset, +len) into this process.
  MappedRemote map_remote_wt(const MrDesc& dst, uint64_t offset, size_t len, Status* err);
  PeerGroupHandle add_peer_group_wt(const std::vector<std::vector<NetAddr>>& peers, Status* err);
  // Deregisters an unregistered region now, or once no transfer in flight
  // holds it (then it waits in retired_).
  void retire_wt(RegRef reg) {
    if (reg.use_count() > 1) retired_.push_back(std::move(reg));
  }
  // Runs `hook` at the start of every turn from now on, until the worker stops.
  void add_turn_hook_wt(std::shared_ptr<TurnHook> hook) { hooks_.push_back(std::move(hook)); }

 private:
  static constexpr uint32_t kNone = kNoSlot;
  using Slot = core::Slot;
  using Cursor = core::Cursor;
  struct Nic {
    std::unique_ptr<Domain> domain;
    Ring<Cursor> pending;
    std::unordered_map<NetAddr, PeerId> peers;
    // Latest incarnation seen per raw endpoint address: an address whose raw
    // bytes come back with a new incarnation belongs to a restarted peer, and
    // the old one is stale from then on.
    std::unordered_map<std::string, NetAddr> latest;
    std::unordered_set<NetAddr> stale;
    uint64_t outstanding = 0;
  };
  struct PeerGroup {
    std::vector<std::vector<NetAddr>> addrs;
    uint64_t epoch = 0;         // stale_epoch_ when last checked
    std::vector<PeerId> peers;  // [peer * kMaxNics + nic]
  };

  void run(std::promise<Status>* init);
  Status open_nics();
  // Queues a command: the ring, or the overflow queue when the ring is full.
  void enqueue(Command&& cmd);
  // A submitter's part once its command is queued: wake or post for an idle worker.
  void after_enqueue();
  bool has_commands();
  bool drain_commands();
  // Whether drain_commands would find a command (claimed but unfilled ones aside).
  bool commands_published() const { return !ring_.idle() || overflow_pending(); }
  // submit_with's way around the ring: whether to try the loop lock, then,
  // holding it, whether nothing stands before the command (stopping, queued
  // commands); post_direct starts direct_ as the worker would and wakes the
  // worker if what it started needs it.
  bool may_post_direct() const {
    if (worker_thread::t_worker) return false;
    // A busy worker holds its lock unless it stepped aside; an adaptive one
    // releases it whenever it yields or sleeps.
    if (busy_mode_) return step_aside_ && napping_.load(std::memory_order_acquire);
    return inline_posts_;
  }
  bool direct_ready() { return !stop_.load(std::memory_order_acquire) && !has_commands(); }
  void post_direct();
  // submit_with from a callback that poll_completions runs on the thread
  // holding the loop lock, with nothing queued before it; post_reply posts
  // reply_ at once if it is a one-line immediate or send the NIC takes, and
  // queues it otherwise (the slot path may run an OnDone whose own
  // submission would reuse reply_).
  bool answering_inline() {
    // t_doing_work_of first: only the thread holding the loop lock may read
    // in_completions_.
    return worker_thread::t_doing_work_of == this && in_completions_ && !has_commands();
  }
  void post_reply();
  // After a post under the loop lock: whether it left nothing the worker must
  // do now; then the wake-up of a sleeping worker unless it did.
  bool posted_all_here();
  void wake_unless_posted_all(bool posted_all);
  // handle(), then what a command that stays in its place must let go.
  void handle_in_place(Command& cmd);
  // After arrivals, a busy worker's short watch for the application's answer.
  void await_reply();
  // The turn hooks; *awake set when one of them keeps the worker from sleeping.
  bool run_hooks(bool* awake);
  // A submitter holding loop_mu_: start queued requests and post them; never
  // polls (no user callback runs on the submitter's thread).
  void post_inline();
  // Under loop_mu_: one turn that starts and posts what is queued, no polling.
  void post_queued();
  // After post_inline: nothing it left needs the worker before its nap ends.
  bool nothing_for_worker();
  void handle(Command& cmd);
  // Whether a NIC's queue holds posts it refused for now.
  bool posts_queued() const {
    for (const Nic& nic : nics_)
      if (!nic.pending.empty()) return true;
    return false;
  }
  // Posts what the NICs' queues hold; first one look whether any holds
  // anything, which is cheaper than the call that posts (a helper's poll and a
  // direct post both come here, nearly always with nothing queued).
  bool progress_posts() { return posts_queued() && progress_queued_posts(); }
  bool progress_queued_posts();
  bool poll_completions();
  // Blocks (or naps) until a submission, a completion or the next deadline;
  // false when it did neither (a NIC cannot block and !may_nap). With
  // helpers_drive it naps, whether or not the NICs can block.
  // `loop` (loop_mu_) is released while it blocks.
  bool idle_wait(bool may_nap, bool helpers_drive, std::unique_lock<LoopLock>& loop);
  // A spinning worker (busy, or adaptive in its spin phase without yields)
  // whose NICs threads spinning for arrivals poll themselves:
  // it sleeps without its loop lock (napping_ set), so that they poll and post
  // without waiting for it, until woken (a helper left), stopped, no helper
  // polled for kAsideNs, or kAsideTurnNs passed (a turn of its own is due).
  void step_aside(std::unique_lock<LoopLock>& loop);
  // Ends a nap, a block in poll(2) or a step aside (sleeping_ was seen set).
  void wake_up() {
    // A worker aside sleeps on its eventfd between looks at the flag: both,
    // while it is aside. One that has just come back finds what the waker
    // left in its ring at its next turn, or before it sleeps; a flag left set
    // is cleared when it next steps aside. A busy worker sleeps nowhere else;
    // an adaptive one steps aside only now and then, and blocks or naps on
    // its eventfd otherwise.
    if (step_aside_ || aside_in_spin_) aside_wake_.store(true, std::memory_order_seq_cst);
    if (!step_aside_ || aside_active_.load(std::memory_order_seq_cst)) wake_.notify();
  }
  // The worker takes its loop lock back after yielding or blocking. A
  // submitter or a helping waiter holds it for a few microseconds: yield until
  // it is free (the lock has no sleeping waiters, core/loop_lock.h).
  static void relock(std::unique_lock<LoopLock>& loop);
  void check_deadlines();
  void deadline_insert(uint32_t idx);
  void deadline_remove(uint32_t idx);
  void release_admission();

  uint32_t alloc_slot();
  void fail_command(Command& cmd, Status s);
  void start_transfer(Command& cmd);
  void enqueue_plan(uint32_t slot, const ShardPlan& plan);
  // A local write or send completion; false when it belonged to no live transfer.
  bool on_local_done(uint64_t ctx, const Status& st, uint32_t count = 1);
  // One-line immediates and sends (FastImm, FastSend) posted at once, without
  // a slot, a plan or a cursor: worker_fast_posts.cpp. False: the command
  // takes the slot path.
  bool post_fast(const Command& cmd);
  bool on_fast_done(uint64_t ctx, const Status& st, uint32_t count);
  void note_fast_finished(const FastPost& p, const Status& st);
  void note_finished_ok(PeerId peer, int64_t submit_ns, uint64_t bytes);  // NIC 0
  void finish_at_post(const Command& cmd, PeerId peer, bool send, uint64_t bytes);
  // Where the submitting thread may post for the worker at once: answering
  // inline, or holding the loop lock with nothing queued; post() under it.
  template <typename Post>
  bool post_here_now(Post&& post);
  // Under the loop lock: the posts of try_imm_at_post and try_send_at_post.
  bool post_imm_at_post(const FastImm& f, int64_t submit_ns);
  bool post_send_at_post(const NetAddr* to, std::span<const uint8_t> msg, int64_t submit_ns);
  // The counters of a post done at its return, and whether `to` is the
  // resolved peer such a post may go to now.
  bool at_post_ready(const NetAddr* to) const;
  void count_at_post(bool send, uint64_t bytes, int64_t submit_ns);
  PostResult post_one_imm(const FastImm& f, PeerId peer, uint64_t ctx);
  void note_done_at_post(PeerId peer, bool send, uint64_t bytes, int64_t submit_ns);
  void check_fast_deadlines(Clock::time_point now);
  void cancel_fast_posts();
  void maybe_finish(uint32_t idx);
  void finish(Slot& s, Status st);
  void signal(OnDone on_done, Status st);
  // OpHost (ops.h): worker_peers.cpp.
  PeerId resolve(uint8_t nic, const NetAddr& addr, Status* err) override;
  const std::vector<PeerId>* group_peers(PeerGroupHandle group, size_t targets,
                                         Status* err) override;
  void mark_dead(const NetAddr& addr, const Status& why);
  void post_recv_buffer(uint32_t pool, uint32_t buffer);
  // A buffer the user has seen goes back to the NIC after this turn's posts
  // (flush_reposts), so that a reply the user's callback submitted is posted
  // first; at most kDeferredReposts wait, the rest are posted at once.
  void repost_after_posts(uint32_t pool, uint32_t buffer);
  bool flush_reposts();
  void on_recv_done(uint64_t ctx, uint64_t len, const Status& st);
  // RecvEvent::run: the callback thread hands a filled buffer to the user.
  static void deliver_recv(void* self, uint32_t pool, uint32_t buffer, uint64_t len);
  // Statistics and timeline hooks: worker_stats.cpp.
  void note_started(Slot& s, const Command& cmd);
  // A request taken up this turn: its queue delay (submit_ns 0: not timed).
  void note_picked_up(int64_t submit_ns);
  // A request's outcome, and its latency to `now` when it was timed.
  void note_outcome(const Status& st, int64_t submit_ns, int64_t now);
  void note_posted(Slot& s, uint8_t nic, const PostStep& step, const WriteDesc* batch);
  void note_completion(uint8_t nic, const Completion& c);  // immediates, receives
  void note_local_done(const Status& st, uint32_t count);  // on current_nic_
  void note_finished(const Slot& s, const Status& st);
  // One clock read per turn of the loop, shared by the loop's own timing and
  // every statistic taken in that turn (a read costs 20-45 ns, as much as the
  // rest of the statistics of a transfer). Statistics from it are as early as
  // the turn's first use: sub-microsecond, under the histograms' first bucket.
  // With a trace every call reads the clock: spans must nest exactly.
  int64_t turn_ns() {
    if (trace_ || turn_ns_ == 0) turn_ns_ = now_ns();
    return turn_ns_;
  }
  void begin_turn() { turn_ns_ = 0; }
  static int64_t turn_ns_of(void* worker) { return static_cast<Worker*>(worker)->turn_ns(); }
  // Records the queue delays of the commands picked up in this turn, at the
  // turn's end: the clock is then read after their posts, not before.
  void end_turn();
  void note_gauges();

  EngineShared* shared_;
  size_t index_;
  GroupConfig group_;
  std::vector<int> affinity_;
  std::atomic<int> state_numa_{-1};
  std::vector<NetAddr> addrs_;
  std::vector<DomainInfo> infos_;

  // Submissions: the ring first (one hand-off moves the command's own cache
  // lines, submit_ring.h); when it is full, the unbounded queue behind it.
  // Only a full ring can reorder two submissions of one thread, which the
  // engine never promised to keep in order.
  static constexpr size_t kRingCells = 256;
  SubmitRing<Command> ring_{kRingCells};
  moodycamel::ConcurrentQueue<Command> overflow_;
  // Commands put into overflow_ and taken out of it: has_commands() on every
  // turn compares the two rather than ask the queue, whose emptiness check
  // walks its producers.
  std::atomic<uint64_t> overflow_in_{0};
  std::atomic<uint64_t> overflow_out_{0};  // written under loop_mu_
  void to_overflow(Command&& cmd) {
    overflow_.enqueue(std::move(cmd));
    overflow_in_.fetch_add(1, std::memory_order_release);
  }
  bool overflow_pending() const {
    return overflow_in_.load(std::memory_order_acquire) !=
           overflow_out_.load(std::memory_order_relaxed);
  }
  // drain_commands' landing area for the overflow queue, kept rather than
  // built on each call: an array of Commands on the stack is value-initialised
  // (a memset of every Command) and destroyed on every turn of the loop.
  static constexpr size_t kCommandsPerStep = 32;
  std::array<Command, kCommandsPerStep> drained_;
  // The command a submitter holding the loop lock starts without the ring
  // (submit_with); only touched under the lock.
  Command direct_;
  // The command such a callback submits (answering_inline), and whether the
  // lock holder is inside poll_completions; both only touched under the lock.
  Command reply_;
  bool in_completions_ = false;
  // poll_completions' landing area, kept for the same reason (each Completion
  // holds a Status, whose string is built and destroyed with it).
  static constexpr size_t kPollBatch = 32;
  std::array<Completion, kPollBatch> polled_;
  // progress_posts' batch of writes for one post call, kept for the same
  // reason: WriteDesc's member initialisers made a 4.6 KiB memset per turn.
  static constexpr size_t kPostsPerCall = 64;
  std::array<WriteDesc, kPostsPerCall> post_batch_;
  std::array<uint32_t, kPostsPerCall> post_units_;
  // Admission without a line that both sides write: submitters count what
  // they admitted (and keep a possibly stale copy of released_ beside it,
  // re-read only when that copy says the group is full); the worker counts
  // what it released on a line of its own. in flight = admitted_ - released_.
  alignas(64) std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> released_seen_{0};
  alignas(64) std::atomic<uint64_t> released_{0};
  RoomWait room_;  // submitters waiting for admission (QueueFull::kBlock)
  WakeFd wake_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> napping_{false};  // sleeping_ in a timed nap, not in poll(2)
  // Held by the worker while it works; released while it yields or blocks, so
  // that a submitter can post its own request at once (post_inline) instead of
  // waiting for the worker to be scheduled. Only when every NIC allows it.
  LoopLock loop_mu_;
  bool inline_posts_ = false;
  // Busy polling with NICs any thread may call: the worker steps aside while
  // threads spinning for arrivals poll them (step_aside).
  bool busy_mode_ = false;
  bool step_aside_ = false;
  // Adaptive polling whose idle polls do not yield (many CPUs): the worker
  // steps aside the same way during its spin phase.
  bool aside_in_spin_ = false;
  // A spinning thread found the worker holding its NICs: step aside.
  alignas(64) std::atomic<bool> want_aside_{false};
  // Ends a step aside (wake_up), with an eventfd write while the worker sleeps there.
  alignas(64) std::atomic<bool> aside_wake_{false};
  // The worker is in step_aside: wakers set aside_wake_ and write its eventfd.
  std::atomic<bool> aside_active_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // help_progress calls, written under loop_mu_ (with the worker state
  // helpers touch, not on the lines a worker that stepped aside spins on); it
  // reads it every kAsideNs to see whether helpers still poll.
  alignas(64) std::atomic<uint32_t> helped_{0};
  // Of those, the calls that found work: an adaptive worker stepped aside
  // stays in its spin phase while they do.
  std::atomic<uint32_t> helped_found_{0};

  // Worker-thread state (allocated after pinning).
  std::vector<Nic> nics_;
  // What poll_completions counted last (imm_table.h): no lock per arrival.
  std::unique_ptr<ImmArrivalCache> imm_cache_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t rr_ = 0;
  std::vector<std::unique_ptr<PeerGroup>> groups_;  // stable: transfers point into them
  std::vector<RegRef> retired_;
  std::vector<std::shared_ptr<TurnHook>> hooks_;
  // Peers that failed with a transport error: later requests fail at once
  // instead of waiting for their deadline. A restarted peer has a new
  // incarnation, hence a new address, and is not affected.
  struct DeadPeer {
    Status why;
    Clock::time_point since;
  };
  std::unordered_map<NetAddr, DeadPeer> dead_;
  uint64_t active_ = 0;
  uint64_t stale_epoch_ = 0;  // bumped whenever an address becomes stale
  uint8_t current_nic_ = 0;   // NIC whose completions are being handled
  Clock::time_point last_deadline_scan_{};
  uint32_t dl_head_ = kNone, dl_tail_ = kNone;
  uint32_t helped_seen_ = 0;  // helped_ at the worker's last look
  bool called_ = false;       // the last idle_wait ended by a submitter's wake
  bool napped_ = false;       // the last idle_wait napped (a NIC without a wait object,
                              // or helpers drove), or the worker last stepped aside
  uint32_t naps_in_row_ = 0;  // naps since the last useful work: each one longer
  uint32_t arrivals_ = 0;     // immediates and receives handed up this turn
  // post_fast's posts in flight, oldest first: a ring of kFastPosts
  // entries, [fast_head_, fast_tail_) in positions that only grow (a
  // position's entry is position % kFastPosts, its generation the rest).
  static constexpr uint32_t kFastPosts = 1024;
  std::unique_ptr<FastPost[]> fast_;
  uint64_t fast_head_ = 0, fast_tail_ = 0;
  // The peer post_fast resolved last on NIC 0, by the interned address's
  // pointer (stable for the engine's life): a ping-pong's every post names
  // the same peer, and the peer table's hash lookup is one of the larger
  // parts of the post. Valid while stale_epoch_ is and no peer is dead.
  const NetAddr* fast_addr_ = nullptr;
  PeerId fast_peer_ = 0;
  uint64_t fast_epoch_ = 0;
  uint32_t window_misses_ = 0;           // await_reply windows in a row that saw no submission
  uint32_t skip_windows_ = 0;            // arrival turns left before the next window
  int64_t turn_ns_ = 0;                  // turn_ns(); 0: not read in this turn yet
  std::array<int64_t, 64> picked_up_{};  // submit times of this turn's new commands
  uint32_t picked_up_n_ = 0;
  static constexpr uint32_t kDeferredReposts = 64;
  std::array<std::pair<uint32_t, uint32_t>, kDeferredReposts> reposts_{};  // pool, buffer
  uint32_t reposts_n_ = 0;
  WorkerCounters stats_;
  std::unique_ptr<TraceRing> trace_;  // EngineConfig::trace_file set
};

}  // namespace ferry::core

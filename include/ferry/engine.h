// TransferEngine: RDMA-style point-to-point transfers with no ordering
// guarantees; completion is tracked only through immediate counters.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/stats.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "ferry/watcher.h"

namespace ferry {

enum class PollMode : uint8_t {
  kAdaptive,  // spin, then back off and block on the CQ / command wakeup (default)
  kBusy,      // spin forever: lowest latency; one core per worker and one for the
              // callback thread, which spins too while callbacks come (it sleeps
              // after a second without one)
};

enum class QueueFull : uint8_t { kBlock, kRefuse };

// Whether an adaptive worker yields the CPU between idle polls
// (EngineConfig::spin_yield). kAuto: where the process may run on fewer than
// 8 CPUs. A container whose CPU quota is smaller than the CPUs its
// affinity shows wants kYield.
enum class SpinYield : uint8_t { kAuto, kYield, kNoYield };

// Where an immediate-count callback runs. kWorker: inline on the NIC worker
// that counted the arrival, with no hop to the callback thread; for callbacks
// that return within microseconds and never block, typically posting a reply
// (a submit from a worker never waits for admission: a full group throws
// kResourceExhausted). With several groups it may run on two workers at once.
// With adaptive polling it may also run on a thread that polls for an idle
// worker from ImmCounter::try_consume or wait (see there), and with busy
// polling on one the worker stepped aside for (EngineConfig::busy_step_aside),
// never at the same time as that worker.
enum class CallbackOn : uint8_t { kCallbackThread, kWorker };

// One worker thread and its NICs, serving one GPU (or the host).
struct GroupConfig {
  Device device = Device::host();
  // NIC names: libfabric domain names (efa: "rdmap16s27-rdm"; tcp: an
  // interface name such as "lo" or "veth0"; shm: "shm"). Empty = for a GPU
  // group on "efa" or "verbs", the `nics` NICs the topology puts closest to
  // its GPU (docs/TOPOLOGY.md); otherwise the first `nics` domains the
  // provider reports.
  std::vector<std::string> nic_names;
  // CPU the worker pins itself to. -1 = every CPU of the NUMA node the
  // group's devices hang off (from the topology), so its memory is node-local.
  int worker_cpu = -1;
  // Accept NICs and CPUs the topology places elsewhere (logged as warnings).
  bool insist = false;
};

struct EngineConfig {
  // Groups for `gpus` (empty: one host group) with `nics_per_gpu` NICs each,
  // taken from the detected topology: the NICs closest to each GPU and a
  // physical core of its NUMA node for its worker.
  static EngineConfig from_topology(const std::vector<int>& gpus, size_t nics_per_gpu,
                                    std::string provider = "");

  // Which NIC family: "verbs" (ferry's libibverbs domain: ConnectX over
  // InfiniBand or RoCE), "nvlink" (GPUs of one host), or a libfabric provider
  // ("efa", "tcp;ofi_rxm", "shm", ...). "auto" picks at start-up: "verbs" when
  // libibverbs lists a device with an ACTIVE port that is not EFA, else "efa"
  // when libfabric reports it, else the constructor throws kUnavailable
  // listing what it probed; the choice and its reason are logged at info and
  // provider() returns it. A "verbs" choice whose domains fail to open falls
  // back to "efa" when libfabric reports it (both logged at warn); when there
  // is no efa or it fails too, the constructor throws with the verbs
  // failure's code, naming both attempts. Empty = the FERRY_PROVIDER
  // environment variable (which may say "auto"), else "auto". A named
  // provider is never silently replaced.
  std::string provider;
  // Provider "verbs" only: the GID table index every NIC uses (`show_gids`
  // lists them). -1 = FERRY_VERBS_GID_INDEX if set, else automatic (on RoCE
  // the RoCEv2 GID of the interface's IP address, on InfiniBand index 0). An
  // index that names no populated entry fails start-up with kInvalidArgument
  // naming the NIC and the index.
  int verbs_gid_index = -1;
  std::vector<GroupConfig> groups = {GroupConfig{}};
  size_t nics_per_group = 1;  // used when a group names no NICs
  PollMode poll_mode = PollMode::kAdaptive;
  // kAdaptive: how long an idle worker keeps polling before it blocks on the
  // submission eventfd and its NICs' completion wait objects (a NIC without
  // one: then polls yielding the CPU for 200 µs more, then naps). -1 = 200 µs.
  // Where the process may use fewer than 8 CPUs, these polls yield the CPU
  // between iterations (with fewer cores than spinning threads, a plain spin
  // delays the very threads being waited for).
  std::chrono::microseconds spin_before_block{-1};
  SpinYield spin_yield = SpinYield::kAuto;
  // kBusy, NICs any thread may call (libfabric): while a thread spins on an
  // ImmCounter or a RecvQueue (try_consume, wait, try_pop, pop) or the
  // callback thread spins for events, the worker steps aside (sleeps on its
  // eventfd, leaving its NICs and its core) and lets that thread poll them and post its
  // submissions itself, as an idle adaptive worker does: no thread crossing on
  // the way to or from the wire. Meanwhile the worker runs a turn of its own
  // every millisecond (deadlines), and takes the NICs back when the thread
  // stops spinning (left, or no poll for 50 µs). A worker with turn hooks
  // (WatchOn::kWorker) never steps aside. kAdaptive, where its idle polls do
  // not yield (spin_yield): the same during its spin_before_block phase,
  // which lasts while those callers find arrivals; then it blocks as before.
  bool busy_step_aside = true;
  int callback_cpu = -1;
  // CPU the UVM watcher thread pins itself to (-1 = do not pin). The thread
  // starts with the first alloc_uvm_watcher and spins only while one is armed.
  int watcher_cpu = -1;
  // Deadline of every transfer and send, from submission: one that has not
  // finished by then ends with kDeadlineExceeded (kUnavailable when its peer
  // is known to have failed), never earlier and at most a few milliseconds
  // later (the kernel's coarse clock, and the worker's scan every
  // millisecond). 0 = none, when asked for explicitly. Waits
  // (ImmCounter::wait) take their own.
  std::chrono::milliseconds default_deadline{30'000};
  // Requests per group admitted and not yet finished (queued, or in flight on
  // the NICs). Bounds the command queue, the transfer table and the NIC rings.
  size_t max_requests_in_flight = 65'536;
  // What a submit does when its group is full: wait for room until the
  // request's deadline (kBlock; no deadline: until room or stop), or throw
  // kResourceExhausted at once (kRefuse). Either way the request is not queued.
  // A submit made on an engine thread (a callback on the worker, a worker-run
  // watcher) cannot wait: it may use a reserve beyond the limit (an eighth of
  // it, at least 64) and throws kResourceExhausted once that is used up too.
  QueueFull queue_full = QueueFull::kBlock;
  // Testing only: wrap every NIC in the seeded fault injector, e.g.
  // "seed=7,reorder=0.2,delay_us=50,eagain=0.05,split=0.1,fail=0.001".
  // Empty = the FERRY_FAULT_INJECTION environment variable, else off.
  std::string fault_injection;
  // Buffers of the internal pool copying submit_send payloads. With every
  // buffer in flight, submit_send waits (kBlock) or refuses (kRefuse) as above.
  size_t send_buffer_size = 64 << 10;
  size_t send_buffer_count = 256;
  // Observability (docs/OBSERVABILITY.md). Prometheus text exposition on
  // http://<host:port>/metrics, off when empty; port 0 picks a free port
  // (metrics_address() says which). Empty = FERRY_METRICS, else off.
  std::string metrics_address;
  // Chrome trace-event JSON (Perfetto, chrome://tracing) written at stop():
  // transfers, immediates, errors and trace_span()s. Empty = FERRY_TRACE,
  // else off; "%p" in it becomes the process id (one setting for all the
  // processes of a job). Each worker keeps its last trace_events events (a
  // ring), and the engine as many spans of its users.
  std::string trace_file;
  size_t trace_events = 1 << 16;
  // The statistics time a transfer's latency and queueing delay
  // (EngineStats::workers[].transfer_latency, queue_delay) for one submission
  // in this many per submitting thread, the first included, and for every one
  // while tracing: the precise clock read it takes costs 20-45 ns on the way
  // to the wire. 0 or 1 = every submission. Counts of transfers are exact
  // either way. ImmCounter::wait (EngineStats::counter_wait) is timed for one
  // wait in this many per waiting thread, the same way.
  uint32_t latency_sample_every = 16;
};

// Counts arrivals of one immediate value. wait(n) consumes n arrivals; arrivals
// beyond what was waited for carry over to the next wait.
class ImmCounter {
 public:
  struct State;
  ImmCounter() = default;
  explicit ImmCounter(std::shared_ptr<State> s) : s_(std::move(s)) {}
  bool valid() const { return s_ != nullptr; }
  // Arrivals not yet consumed.
  int64_t value() const;
  // Consume n arrivals if they are there; never blocks. With adaptive polling
  // (NICs any thread may drive: libfabric), a call that finds too few polls
  // the engine's NICs itself when their worker is yielding or asleep, or has
  // stepped aside for spinning callers (busy polling, busy_step_aside), so an
  // arrival is counted without waiting for that worker to be scheduled; the
  // worker's work found on the way (CallbackOn::kWorker callbacks among it)
  // then runs on the calling thread.
  bool try_consume(int64_t n);
  // How wait passes the time. kSleep spins briefly, then sleeps until an
  // arrival wakes it. kSpin never sleeps: one core busy for the whole wait, in
  // exchange for no wake-up (tens to hundreds of microseconds on an idle host,
  // whose cores are in deep idle states); like PollMode::kBusy.
  enum class WaitMode : uint8_t { kSleep, kSpin };
  // Wait until n arrivals can be consumed, then consume them. Returns
  // kDeadlineExceeded (consuming nothing) when the deadline passes first, and
  // kCancelled once the engine stops. Polls like try_consume while it spins,
  // not once it sleeps.
  Status wait(int64_t n, std::chrono::nanoseconds timeout, WaitMode mode = WaitMode::kSleep);

 private:
  std::shared_ptr<State> s_;
};

// Number of immediates the receiver gets for a request, for both sides to use.
struct ImmPlan {
  // single write of `len` bytes routed `route` over a group of `nics` NICs
  static uint64_t single_write(uint64_t len, const WriteRoute& route, size_t nics);
  static uint64_t paged_writes(size_t pages) { return pages; }
  // scatter: per target (index into dsts) and total
  static uint64_t scatter_target(uint64_t len, const GroupRoute& route, size_t nics);
  static uint64_t barrier_target() { return 1; }
  static uint64_t imm() { return 1; }
};

// A transfer shape validated, resolved and templated once (prepare_*) and
// posted many times with submit(prepared, imm, on_done): KV pages of a layer,
// an MoE combine, the same every step. Copies share one shape. A prepared
// transfer whose source region was unregistered fails with
// kFailedPrecondition; one whose peer failed or restarted fails as a plain
// transfer to it would (kUnavailable, kAborted).
class PreparedTransfer {
 public:
  struct State;  // the library's
  PreparedTransfer() = default;
  bool valid() const { return s_ != nullptr; }

 private:
  friend class TransferEngine;
  explicit PreparedTransfer(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

// A peer's registered memory mapped into this process (map_remote): stores
// through data() land in the peer's region, as a one-sided write's bytes
// would, but with no transfer, completion or immediate; the writer says when
// they are done (an immediate after its kernel finished, for example). The
// mapping stays open while any copy of this object lives.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* ptr, size_t len, std::shared_ptr<const void> keep)
      : ptr_(ptr), len_(len), keep_(std::move(keep)) {}
  void* data() const { return ptr_; }
  size_t size() const { return len_; }
  bool valid() const { return ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t len_ = 0;
  std::shared_ptr<const void> keep_;
};

class StepSubmits;  // ferry/step_submits.h
class RecvQueue;    // ferry/recv_queue.h

class TransferEngine {
 public:
  explicit TransferEngine(EngineConfig config = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // --- identity -----------------------------------------------------------
  NetAddr main_address() const;                            // NIC 0 of group 0
  std::vector<NetAddr> addresses(size_t group = 0) const;  // every NIC of a group
  size_t num_groups() const;
  size_t nics_per_group() const;
  std::string provider() const;
  uint64_t incarnation() const;
  // NUMA node holding each worker's state (measured with get_mempolicy on the
  // memory the worker first touched after pinning itself); -1 if unknown.
  std::vector<int> worker_state_numa_nodes() const;

  // --- memory -------------------------------------------------------------
  // Registers [ptr, ptr+len) on every NIC of the group serving `device`.
  std::pair<MrHandle, MrDesc> reg_mr(void* ptr, size_t len, Device device = Device::host());
  // Returns once the group's NICs have deregistered the region (if a transfer in
  // flight still reads from it, once that transfer ends). From then on peers'
  // writes with its descriptor are refused where the transport checks keys
  // (nvlink, shm; tcp;ofi_rxm checks none) and the memory may be freed.
  void unreg_mr(MrHandle handle);

  // --- two-sided ----------------------------------------------------------
  // Copies `msg` into an internal buffer: the caller may reuse it at once.
  TransferId submit_send(const NetAddr& addr, std::span<const uint8_t> msg, OnDone on_done);
  // Posts `count` receive buffers of `len` bytes each; every message is
  // handed to on_recv without a copy (on the callback thread, or with
  // CallbackOn::kWorker inline on the worker that received it, under the
  // rules of CallbackOn), then the buffer is re-posted. A submit_send made
  // from an inline on_recv never waits for a send buffer: with none free it
  // throws kResourceExhausted.
  void submit_recvs(size_t len, size_t count, RecvCallback on_recv);
  void submit_recvs(size_t len, size_t count, RecvCallback on_recv, CallbackOn on);
  // Posts `count` receive buffers of `len` bytes whose messages the
  // application takes from the returned queue (ferry/recv_queue.h) instead of
  // a callback: no callback thread between the worker and the taker.
  //
  // Messages carry no tag: every pool posted on an engine (each submit_recvs
  // and each recv_queue) receives from the same NIC, and a message lands in
  // whichever pool's buffer the NIC picks. Use one receive pool per engine,
  // or pools whose consumers treat any message alike.
  RecvQueue recv_queue(size_t len, size_t count);

  // --- one-sided ----------------------------------------------------------
  TransferId submit_single_write(uint64_t len, std::optional<uint32_t> imm, MrHandle src,
                                 uint64_t src_offset, const MrDesc& dst, uint64_t dst_offset,
                                 OnDone on_done, WriteRoute route = {});
  TransferId submit_paged_writes(uint64_t page_len, std::optional<uint32_t> imm, MrHandle src,
                                 Pages src_pages, const MrDesc& dst, Pages dst_pages,
                                 OnDone on_done);
  // Zero-byte write carrying only an immediate.
  TransferId submit_imm(uint32_t imm, const MrDesc& dst, OnDone on_done,
                        WriteRoute route = WriteRoute::pinned(0));

  // --- load/store access to a peer's memory ---------------------------------
  // dst's [offset, +len) as an address of this process, for kernels (GPU
  // memory of a peer on the same node, over the nvlink provider) or the CPU
  // (the in-process fake NIC) to store into, through the group serving
  // `near`. Throws kUnimplemented where the transport cannot map a peer's
  // memory (tcp, shm, efa, verbs: use the one-sided writes), kFailedPrecondition
  // for a read-only region, kOutOfRange past its end, kNotFound for a region
  // the peer has unregistered. The mapping does not follow later changes: a
  // region unregistered while mapped is not written by the engine any more,
  // but stores through data() still reach the memory, which its owner must
  // therefore not free while peers may store into it.
  MappedRegion map_remote(const MrDesc& dst, uint64_t offset, uint64_t len,
                          Device near = Device::host());

  // --- prepared transfers (PreparedTransfer) --------------------------------
  // The same arguments and checks as the submit_* of the same name, less the
  // immediate and OnDone; throw what they would throw.
  PreparedTransfer prepare_single_write(uint64_t len, MrHandle src, uint64_t src_offset,
                                        const MrDesc& dst, uint64_t dst_offset,
                                        WriteRoute route = {});
  PreparedTransfer prepare_paged_writes(uint64_t page_len, MrHandle src, Pages src_pages,
                                        const MrDesc& dst, Pages dst_pages);
  PreparedTransfer prepare_scatter(std::optional<PeerGroupHandle> group, MrHandle src,
                                   std::vector<ScatterDst> dsts, GroupRoute route = {});
  // Posts a prepared transfer with `imm` on every write (as its submit_*
  // would). No per-page validation, lookup or allocation.
  TransferId submit(const PreparedTransfer& prepared, std::optional<uint32_t> imm, OnDone on_done);

  // --- peer groups ----------------------------------------------------------
  // peers[i] = every NIC address of peer i (as in its MrDesc). Idempotent.
  PeerGroupHandle add_peer_group(const std::vector<std::vector<NetAddr>>& peers);
  PeerGroupHandle add_peer_group(const std::vector<MrDesc>& peers);
  TransferId submit_scatter(std::optional<PeerGroupHandle> group, OnDone on_done,
                            std::optional<uint32_t> imm, MrHandle src, std::vector<ScatterDst> dsts,
                            GroupRoute route = {});
  TransferId submit_barrier(std::optional<PeerGroupHandle> group, OnDone on_done, uint32_t imm,
                            std::vector<MrDesc> dsts, GroupRoute route = {});

  // --- immediates -----------------------------------------------------------
  // cb fires on the callback thread each time `count` arrivals accumulated.
  void expect_imm_count(uint32_t imm, uint32_t count, ImmCountCallback cb);
  void expect_imm_count(uint32_t imm, uint32_t count, ImmCountCallback cb, CallbackOn on);
  ImmCounter imm_counter(uint32_t imm);
  void remove_imm_count(uint32_t imm);
  // Called for every immediate nobody counts.
  void on_imm(ImmCallback cb);

  // --- GPU signalling (ferry/watcher.h, docs/GPU.md) -------------------------
  // Both throw Error(kUnimplemented) in builds without CUDA.
  // A zeroed 64-bit word kernels write (device-visible); cb(old, new) runs on
  // the watcher thread (or the first group's worker: WatchOn, ferry/watcher.h)
  // when it changes, until cb returns false or throws.
  uint64_t* alloc_uvm_watcher(WatcherCallback cb, WatchOn on = WatchOn::kWatcherThread);
  // A device-visible 32-bit flag: each time `count` more immediates `imm`
  // arrived, the NIC worker stores the generation (1, 2, ...) with a release
  // store. Replaces any prior mapping of imm; remove_imm_count(imm) frees it.
  uint32_t* imm_counter_gpu(uint32_t imm, uint32_t count);
  // A watcher word bound to prepared transfers (ferry/step_submits.h): when a
  // kernel moves it from old to new, the watcher thread (or, WatchOn::kWorker,
  // the first group's worker, in that turn) posts the steps bound to
  // old+1..new; jobs' Finished callbacks then run there too. The StepSubmits
  // must not outlive the engine.
  std::shared_ptr<StepSubmits> alloc_uvm_watcher_submits(WatchOn on = WatchOn::kWatcherThread);

  // --- observability (ferry/stats.h, docs/OBSERVABILITY.md) -----------------
  // Counters and gauges now; cheap enough to call every second. After stop(),
  // the figures as stop() left them.
  EngineStats stats() const;
  // "host:port" the metrics endpoint listens on; empty when it is off.
  std::string metrics_address() const;
  // Whether a trace file will be written (EngineConfig::trace_file).
  bool tracing() const;
  // The clock of the timeline: steady_clock (CLOCK_MONOTONIC) nanoseconds,
  // as Python's time.monotonic_ns().
  static int64_t trace_clock_ns();
  // Adds a span [start_ns, end_ns] (trace_clock_ns()) on the track `track`
  // of this engine's trace: layer pushed, pipeline stage, dispatch phase. A
  // no-op when tracing is off; thread-safe; bounded like the workers' rings.
  void trace_span(std::string_view name, int64_t start_ns, int64_t end_ns,
                  std::string_view track = "user");
  // A point in time on `track`.
  void trace_instant(std::string_view name, int64_t at_ns, std::string_view track = "user");

  // Stops the workers and the callback thread; outstanding transfers complete
  // with kCancelled and counter waiters return kCancelled. Idempotent; also run
  // by the destructor. From one of this engine's callbacks it throws
  // kFailedPrecondition (it would have to join the thread it runs on).
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry

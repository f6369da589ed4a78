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

using core::Clock;
using core::Command;
using core::RegRef;

namespace {

constexpr auto kControlTimeout = std::chrono::seconds(30);
constexpr size_t kMaxRecvPools = 64;

uint64_t random_incarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t(rd()) << 32) ^ rd();
  return v;
}

// a + b <= limit without overflow.
bool fits(uint64_t offset, uint64_t len, uint64_t limit) {
  return offset <= limit && len <= limit - offset;
}

}  // namespace

struct TransferEngine::Impl {
  core::EngineShared shared;
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
  std::atomic<TransferId> next_transfer{1};

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
  std::atomic<int64_t> api_calls{0};
  std::mutex stop_mu;

  // Held for the length of every public call.
  class Entered {
   public:
    explicit Entered(Impl& im) : im_(im) {
      im_.api_calls.fetch_add(1, std::memory_order_seq_cst);
      if (im_.stopped.load(std::memory_order_seq_cst)) {
        im_.api_calls.fetch_sub(1, std::memory_order_seq_cst);
        throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
      }
    }
    ~Entered() { im_.api_calls.fetch_sub(1, std::memory_order_seq_cst); }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    Impl& im_;
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

  Clock::time_point deadline(Clock::time_point now = Clock::now()) const {
    auto d = shared.config.default_deadline;
    return d.count() > 0 ? now + d : Clock::time_point{};
  }

  // A request the caller cannot have queued (its group is full, or the engine
  // stops) throws, and its OnDone never runs; one that is queued has its
  // OnDone run exactly once.
  TransferId submit(core::Worker& w, OnDone on_done, core::Request req,
                    Clock::time_point dl = Clock::time_point::max()) {
    Command cmd;
    // One clock read for the deadline and the statistics' submit time (a read
    // is 20-45 ns, on the caller's way to the wire). A submit that waits for
    // admission counts that wait as queueing.
    const bool default_dl = dl == Clock::time_point::max();
    const auto now = default_dl || core::kStatsEnabled ? Clock::now() : Clock::time_point{};
    cmd.deadline = default_dl ? deadline(now) : dl;
    Status st = w.admit(cmd.deadline);
    if (!st.is_ok()) throw Error(st);
    cmd.admitted = true;
    if constexpr (core::kStatsEnabled) cmd.submit_ns = core::ns_of(now);
    cmd.id = next_transfer.fetch_add(1, std::memory_order_relaxed);
    cmd.on_done = std::move(on_done);
    cmd.req = std::move(req);
    TransferId id = cmd.id;
    w.submit(std::move(cmd));
    return id;
  }

  // fn runs on w's thread and must own its captures (shared state): after a
  // timeout it may still run.
  void call(core::Worker& w, std::function<Status()> fn) {
    Status st = w.call(std::move(fn), kControlTimeout);
    if (!st.is_ok()) throw Error(st);
  }
};

TransferEngine::TransferEngine(EngineConfig config) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  if (config.provider.empty()) {
    const char* env = std::getenv("FERRY_PROVIDER");
    config.provider = env && *env ? env : engine::kAutoProvider;
  }
  // Before the auto probe: a malformed knob is the caller's error on any host.
  if (config.verbs_gid_index < -1)
    throw Error(Code::kInvalidArgument,
                fmt::format("EngineConfig: verbs_gid_index {} (-1 = automatic, else a GID table "
                            "index)",
                            config.verbs_gid_index));
  const bool auto_provider = config.provider == engine::kAutoProvider;
  engine::ProviderProbes probes;
  engine::ProviderChoice choice;
  if (auto_provider) {
    probes = engine::host_provider_probes();
    choice = engine::resolve_provider(probes);
    if (!choice.error.is_ok()) throw Error(choice.error);
    core::log().info("provider auto -> {} ({})", choice.provider, choice.reason);
    config.provider = choice.provider;
  }
  if (config.fault_injection.empty()) {
    const char* env = std::getenv("FERRY_FAULT_INJECTION");
    if (env && *env) config.fault_injection = env;
  }
  if (!config.fault_injection.empty())
    core::log().warn("fault injection is on: {}", config.fault_injection);
  engine::Observability::from_environment(config);
  if (config.groups.empty()) throw Error(Code::kInvalidArgument, "EngineConfig: no groups");
  for (size_t i = 0; i < config.groups.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (config.groups[i].device == config.groups[j].device)
        throw Error(Code::kInvalidArgument,
                    fmt::format("EngineConfig: groups {} and {} both serve {}", j, i,
                                config.groups[i].device.to_string()));
  if (config.send_buffer_count == 0 || config.send_buffer_size == 0)
    throw Error(Code::kInvalidArgument, "EngineConfig: empty send buffer pool");

  im.shared.config = config;
  im.shared.incarnation = random_incarnation();
  im.imms = std::make_unique<core::ImmTable>(nullptr);
  im.callbacks = std::make_unique<core::CallbackThread>(im.imms.get(), config.callback_cpu,
                                                        config.poll_mode == PollMode::kBusy);
  im.imms->set_callbacks(im.callbacks.get());
  im.recv_pools.resize(kMaxRecvPools);
  im.shared.imms = im.imms.get();
  im.shared.callbacks = im.callbacks.get();
  im.shared.send_free = &im.send_free;
  im.shared.send_pool = &im.send_pool;
  im.shared.recv_pools = &im.recv_pools;
  im.shared.open_domain = engine::domain_opener();
  im.obs.start_trace(im.shared.config);
  if (!im.obs.tracing()) im.shared.config.trace_file.clear();

  engine::validate_against_topology(config);
  // Every group on one provider, or none open: a failed attempt leaves
  // nothing behind for the next one (the auto fallback).
  const auto start_workers = [&](const std::string& provider) -> Status {
    im.shared.config.provider = provider;
    for (size_t g = 0; g < config.groups.size(); ++g) {
      auto w = std::make_unique<core::Worker>(&im.shared, g, config.groups[g],
                                              engine::default_affinity(config.groups[g]));
      Status st = w->start();
      if (!st.is_ok()) {
        for (auto& started : im.workers) started->stop();
        im.workers.clear();
        return st;
      }
      im.workers.push_back(std::move(w));
    }
    return {};
  };
  Status started;
  if (auto_provider) {
    const engine::AutoOpen opened = engine::open_auto_provider(
        choice, probes, start_workers, [](const std::string& m) { core::log().warn("{}", m); });
    started = opened.error;
  } else {
    started = start_workers(config.provider);
  }
  if (!started.is_ok()) {
    stop();
    throw Error(started);
  }
  if (config.verbs_gid_index >= 0 && im.shared.config.provider != "verbs")
    core::log().warn("EngineConfig::verbs_gid_index {} ignored: provider is '{}'",
                     config.verbs_gid_index, im.shared.config.provider);
  for (size_t g = 1; g < im.workers.size(); ++g) {
    if (im.workers[g]->nics() != im.workers[0]->nics()) {
      stop();
      throw Error(Code::kInvalidArgument, "every group must have the same number of NICs");
    }
  }

  // Send buffers: registered once on NIC 0 of the main group.
  auto& sp = im.send_pool;
  sp.buf_len = config.send_buffer_size;
  sp.count = config.send_buffer_count;
  sp.mem.reset(new (core::BufferPool::kAlign) uint8_t[sp.buf_len * sp.count]);
  auto reg = std::make_shared<core::Registration>();
  reg->ptr = sp.mem.get();
  reg->len = sp.buf_len * sp.count;
  // Waiters on counters poll for idle workers (core/progress_help.h).
  if (std::all_of(im.workers.begin(), im.workers.end(), [](auto& w) { return w->can_help(); })) {
    im.help = std::make_shared<core::ProgressHelp>([workers = &im.workers] {
      bool any = false;
      for (auto& w : *workers) any |= w->help_progress();
      return any;
    });
    im.imms->set_progress_help(im.help);
    im.callbacks->set_progress_help(im.help.get(),
                                    core::resolve_idle_spin(config.spin_before_block).spin);
  }
  core::Worker* w0 = im.workers[0].get();
  Status err = w0->call(
      [w0, reg] {
        Status e;
        w0->register_wt(*reg, false, &e);
        return e;
      },
      kControlTimeout);
  if (!err.is_ok()) {
    stop();
    throw Error(err);
  }
  sp.reg = reg;
  im.own_threads.push_back(im.callbacks->thread_id());
  for (auto& w : im.workers) im.own_threads.push_back(w->thread_id());
  im.send_free.reserve(sp.count);
  for (uint32_t i = 0; i < sp.count; ++i) im.send_free.release(i);
  try {
    im.obs.start_metrics(config, [this] { return stats(); });
  } catch (...) {
    stop();
    throw;
  }
}

TransferEngine::~TransferEngine() {
  try {
    stop();
  } catch (const std::exception& e) {
    core::log().error("stop() failed in destructor: {}", e.what());
  }
}

void TransferEngine::stop() {
  auto& im = *impl_;
  // stop() joins these threads: from one of them it could only deadlock.
  const auto self = std::this_thread::get_id();
  const bool own =
      std::find(im.own_threads.begin(), im.own_threads.end(), self) != im.own_threads.end() ||
      im.gpu.on_watcher_thread();
  if (own && !im.stopped.load())
    throw Error(Code::kFailedPrecondition,
                "stop() called from a callback or worker of the same engine; stop it from "
                "another thread");
  std::lock_guard lk(im.stop_mu);
  im.obs.stop_metrics();  // its scrapes call stats(): none from here on
  if (im.stopped.exchange(true, std::memory_order_seq_cst)) return;
  // New calls now throw kFailedPrecondition; calls waiting for room or for a
  // send buffer give up; then every call in progress has returned before a
  // worker goes away.
  for (auto& w : im.workers) w->close_admission();
  im.send_free.close();
  while (im.api_calls.load(std::memory_order_seq_cst) > 0) std::this_thread::yield();
  im.gpu.stop();                  // watcher callbacks may submit: stop them while the workers run
  if (im.help) im.help->close();  // no waiter polls a worker from here on
  for (auto& w : im.workers) w->stop();
  // Waiters on counters return kCancelled (transfers were cancelled above).
  if (im.imms) im.imms->cancel_all();
  if (im.callbacks) im.callbacks->stop();
  im.obs.write_trace(im.workers);
  {
    EngineStats last =
        im.obs.stats({&im.workers, im.callbacks.get(), im.imms.get(), &im.gpu.poll_lag()});
    std::lock_guard fl(im.final_mu);
    im.final_stats = std::move(last);
  }
  // Workers are joined: registrations can be closed from here, before the
  // domains they belong to (owned by the workers).
  {
    std::unique_lock rl(im.reg_mu);
    // A PreparedTransfer may outlive the engine and hold a registration: its
    // NIC registrations close now, while their domains exist, not whenever
    // the last such handle goes.
    for (auto& [id, reg] : im.regs) {
      reg->retired.store(true, std::memory_order_release);
      reg->mrs.clear();
    }
    im.regs.clear();
  }
  im.send_pool.reg.reset();
  for (auto& p : im.recv_pools)
    if (p) p->reg.reset();
  im.workers.clear();
}

NetAddr TransferEngine::main_address() const {
  return impl_->workers.at(0)->addresses().at(0);
}

std::vector<NetAddr> TransferEngine::addresses(size_t group) const {
  if (group >= impl_->workers.size())
    throw Error(Code::kOutOfRange, fmt::format("group {} of {}", group, impl_->workers.size()));
  return impl_->workers[group]->addresses();
}

size_t TransferEngine::num_groups() const {
  return impl_->workers.size();
}
size_t TransferEngine::nics_per_group() const {
  return impl_->workers.at(0)->nics();
}
std::string TransferEngine::provider() const {
  return impl_->shared.config.provider;
}
uint64_t TransferEngine::incarnation() const {
  return impl_->shared.incarnation;
}

std::vector<int> TransferEngine::worker_state_numa_nodes() const {
  std::vector<int> nodes;
  for (auto& w : impl_->workers) nodes.push_back(w->state_numa_node());
  return nodes;
}

// ------------------------------------------------------------------ memory

std::pair<MrHandle, MrDesc> TransferEngine::reg_mr(void* ptr, size_t len, Device device) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (ptr == nullptr) throw Error(Code::kInvalidArgument, "reg_mr: null pointer");
  if (len == 0) throw Error(Code::kInvalidArgument, "reg_mr: zero length");
  if (reinterpret_cast<uintptr_t>(ptr) + len < reinterpret_cast<uintptr_t>(ptr))
    throw Error(Code::kInvalidArgument, "reg_mr: pointer + length overflows");
  auto& w = im.worker_for(device);
  auto reg = std::make_shared<core::Registration>();
  reg->id = im.next_reg_id.fetch_add(1);
  reg->ptr = static_cast<uint8_t*>(ptr);
  reg->len = len;
  reg->device = device;
  reg->group = w.index();
  // A peer must never be able to crash this process by writing into pages
  // it cannot write: such memory is registered without remote write, and
  // its descriptor says so, so senders refuse before posting.
  const bool writable = !device.is_host() || engine::host_range_writable(ptr, len);
  core::Worker* wp = &w;
  im.call(w, [wp, reg, writable] {
    Status e;
    wp->register_wt(*reg, writable, &e);
    return e;
  });

  MrDesc desc;
  desc.ptr = reinterpret_cast<uint64_t>(ptr);
  desc.len = len;
  desc.device = device;
  desc.writable = writable;
  for (size_t k = 0; k < w.nics(); ++k)
    desc.nics.push_back({w.addresses()[k], reg->mrs[k]->rkey, reg->mrs[k]->remote_base});
  {
    std::unique_lock lk(im.reg_mu);
    im.regs.emplace(reg->id, reg);
  }
  return {MrHandle{ptr, reg->id}, std::move(desc)};
}

void TransferEngine::unreg_mr(MrHandle handle) {
  auto& im = *impl_;
  auto entered = im.enter();
  RegRef reg;
  {
    std::unique_lock lk(im.reg_mu);
    auto it = im.regs.find(handle.id);
    if (it == im.regs.end() || it->second->ptr != handle.ptr)
      throw Error(Code::kNotFound,
                  fmt::format("unreg_mr: memory region {} (id {}) is not registered", handle.ptr,
                              handle.id));
    reg = std::move(it->second);
    im.regs.erase(it);
  }
  reg->retired.store(true, std::memory_order_release);
  auto& w = *im.workers.at(reg->group);
  // The reference moves into the call: unless a transfer in flight still
  // reads from the region, the NICs deregister it before unreg_mr returns, so
  // peers holding its descriptor are refused from then on and the caller may
  // free the memory.
  core::Worker* wp = &w;
  im.call(w, [wp, reg = std::move(reg)]() mutable {
    wp->retire_wt(std::move(reg));
    return Status();
  });
}

// -------------------------------------------------------------- two-sided

TransferId TransferEngine::submit_send(const NetAddr& addr, std::span<const uint8_t> msg,
                                       OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (addr.empty()) throw Error(Code::kInvalidArgument, "submit_send: empty address");
  if (msg.size() > im.send_pool.buf_len)
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_send: {} bytes exceed the send buffer size {} "
                            "(EngineConfig::send_buffer_size)",
                            msg.size(), im.send_pool.buf_len));
  const Clock::time_point dl = im.deadline();
  uint32_t buf = 0;
  Status st = im.send_free.acquire(dl, im.shared.config.queue_full == QueueFull::kBlock, &buf);
  if (!st.is_ok()) throw Error(st);
  if (!msg.empty()) std::memcpy(im.send_pool.buffer(buf), msg.data(), msg.size());
  try {
    return im.submit(*im.workers[0], std::move(on_done), core::SendReq{addr, buf, msg.size()}, dl);
  } catch (...) {
    im.send_free.release(buf);
    throw;
  }
}

void TransferEngine::submit_recvs(size_t len, size_t count, RecvCallback on_recv) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (len == 0 || count == 0)
    throw Error(Code::kInvalidArgument, "submit_recvs: len and count must be positive");
  if (count > (1u << 24) || len > (1ull << 32))
    throw Error(Code::kInvalidArgument, "submit_recvs: too many or too large buffers");
  if (!on_recv) throw Error(Code::kInvalidArgument, "submit_recvs: empty callback");
  std::lock_guard lk(im.recv_mu);
  if (im.num_recv_pools >= kMaxRecvPools)
    throw Error(Code::kResourceExhausted, "submit_recvs: too many receive pools");
  auto pool = std::make_unique<core::RecvPool>();
  pool->buf_len = len;
  pool->count = count;
  pool->mem.reset(new (core::BufferPool::kAlign) uint8_t[len * count]);
  pool->on_recv = std::move(on_recv);
  auto reg = std::make_shared<core::Registration>();
  reg->ptr = pool->mem.get();
  reg->len = len * count;
  auto& w = *im.workers[0];
  core::Worker* wp = &w;
  im.call(w, [wp, reg] {
    Status e;
    wp->register_wt(*reg, false, &e);
    return e;
  });
  pool->reg = reg;
  uint32_t index = im.num_recv_pools++;
  im.recv_pools[index] = std::move(pool);
  for (uint32_t i = 0; i < count; ++i) {
    Command c;
    c.req = core::RecvPostReq{index, i};
    w.submit(std::move(c));
  }
}

namespace {

// Validated requests, shared by submit_* and prepare_*: throw before anything
// is queued, and say which worker owns the source region.
core::SingleReq single_req(TransferEngine::Impl& im, uint64_t len, std::optional<uint32_t> imm,
                           MrHandle src, uint64_t src_offset, const MrDesc& dst,
                           uint64_t dst_offset, WriteRoute route, const char* what, size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  im.check_desc(dst, w.nics(), what);
  im.check_writable(dst, what);
  if (!fits(src_offset, len, reg->len))
    throw Error(Code::kOutOfRange,
                fmt::format("{}: source [{}, +{}) is outside the region of {} bytes", what,
                            src_offset, len, reg->len));
  if (!fits(dst_offset, len, dst.len))
    throw Error(Code::kOutOfRange, fmt::format("{}: destination [{}, +{}) is outside the remote "
                                               "region of {} bytes",
                                               what, dst_offset, len, dst.len));
  if (route.kind == WriteRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: pinned NIC {} of {}", what, route.nic, w.nics()));
  if (route.max_shards > w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: {} shards over {} NICs", what, route.max_shards, w.nics()));
  *owner = reg->group;
  return core::SingleReq{std::move(reg), src_offset, len,  core::DstRef::of(dst),
                         dst_offset,     imm,        route};
}

core::PagedReq paged_req(TransferEngine::Impl& im, uint64_t page_len, std::optional<uint32_t> imm,
                         MrHandle src, Pages src_pages, const MrDesc& dst, Pages dst_pages,
                         const char* what, size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  im.check_desc(dst, w.nics(), what);
  im.check_writable(dst, what);
  if (src_pages.indices.size() != dst_pages.indices.size())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: {} source pages but {} destination pages", what,
                            src_pages.indices.size(), dst_pages.indices.size()));
  if (src_pages.indices.size() > UINT32_MAX)
    throw Error(Code::kInvalidArgument, fmt::format("{}: more than 2^32 pages", what));
  // One pass for the largest index bounds every page.
  auto check = [&](const Pages& p, uint64_t limit, const char* side) {
    if (p.indices.empty()) return;
    uint32_t max = *std::max_element(p.indices.begin(), p.indices.end());
    uint64_t end = 0;
    bool overflow = __builtin_mul_overflow(uint64_t(max), p.stride, &end) ||
                    __builtin_add_overflow(end, p.offset, &end) ||
                    __builtin_add_overflow(end, page_len, &end);
    if (overflow || end > limit)
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: {} page {} (stride {}, offset {}, length {}) "
                              "ends past the region of {} bytes",
                              what, side, max, p.stride, p.offset, page_len, limit));
  };
  check(src_pages, reg->len, "source");
  check(dst_pages, dst.len, "destination");
  *owner = reg->group;
  return core::PagedReq{std::move(reg),        page_len, std::move(src_pages), std::move(dst_pages),
                        core::DstRef::of(dst), imm};
}

core::ScatterReq scatter_req(TransferEngine::Impl& im, std::optional<PeerGroupHandle> group,
                             std::optional<uint32_t> imm, MrHandle src,
                             std::vector<ScatterDst> dsts, GroupRoute route, const char* what,
                             size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  if (route.kind == GroupRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: pinned NIC {} of {}", what, route.nic, w.nics()));
  if (dsts.size() > UINT32_MAX)
    throw Error(Code::kInvalidArgument, fmt::format("{}: too many targets", what));
  for (size_t i = 0; i < dsts.size(); ++i) {
    const auto& t = dsts[i];
    im.check_desc(t.dst, w.nics(), what);
    im.check_writable(t.dst, what);
    if (!fits(t.src_offset, t.len, reg->len))
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: target {} source [{}, +{}) outside the region of {} "
                              "bytes",
                              what, i, t.src_offset, t.len, reg->len));
    if (!fits(t.dst_offset, t.len, t.dst.len))
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: target {} destination [{}, +{}) outside the remote "
                              "region of {} bytes",
                              what, i, t.dst_offset, t.len, t.dst.len));
  }
  *owner = reg->group;
  return core::ScatterReq{std::move(reg), std::move(dsts), group, imm, route};
}

}  // namespace

// -------------------------------------------------------------- one-sided

TransferId TransferEngine::submit_single_write(uint64_t len, std::optional<uint32_t> imm,
                                               MrHandle src, uint64_t src_offset, const MrDesc& dst,
                                               uint64_t dst_offset, OnDone on_done,
                                               WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req =
      single_req(im, len, imm, src, src_offset, dst, dst_offset, route, "submit_single_write", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_single_write(uint64_t len, MrHandle src,
                                                      uint64_t src_offset, const MrDesc& dst,
                                                      uint64_t dst_offset, WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = std::make_shared<PreparedTransfer::State>();
  st->req = single_req(im, len, std::nullopt, src, src_offset, dst, dst_offset, route,
                       "prepare_single_write", &st->group);
  st->engine = &im;
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit_paged_writes(uint64_t page_len, std::optional<uint32_t> imm,
                                               MrHandle src, Pages src_pages, const MrDesc& dst,
                                               Pages dst_pages, OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req = paged_req(im, page_len, imm, src, std::move(src_pages), dst, std::move(dst_pages),
                       "submit_paged_writes", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_paged_writes(uint64_t page_len, MrHandle src,
                                                      Pages src_pages, const MrDesc& dst,
                                                      Pages dst_pages) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = std::make_shared<PreparedTransfer::State>();
  st->req = paged_req(im, page_len, std::nullopt, src, std::move(src_pages), dst,
                      std::move(dst_pages), "prepare_paged_writes", &st->group);
  st->engine = &im;
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit_imm(uint32_t imm, const MrDesc& dst, OnDone on_done,
                                      WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto& w = *im.workers[0];
  im.check_desc(dst, w.nics(), "submit_imm");
  im.check_writable(dst, "submit_imm");
  if (route.kind == WriteRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_imm: pinned NIC {} of {}", route.nic, w.nics()));
  // An immediate is one zero-byte write: never split.
  if (route.kind == WriteRoute::Kind::kSplit) route = WriteRoute::pinned(0);
  return im.submit(w, std::move(on_done),
                   core::SingleReq{im.send_pool.reg, 0, 0, core::DstRef::of(dst), 0, imm, route});
}

MappedRegion TransferEngine::map_remote(const MrDesc& dst, uint64_t offset, uint64_t len,
                                        Device near) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (len == 0) throw Error(Code::kInvalidArgument, "map_remote: zero length");
  if (offset > dst.len || len > dst.len - offset)
    throw Error(Code::kOutOfRange, fmt::format("map_remote: [{}, +{}) outside a region of {} bytes",
                                               offset, len, dst.len));
  if (!dst.writable)
    throw Error(Code::kFailedPrecondition, "map_remote: the region is not writable by peers");
  auto& w = im.worker_for(near);
  core::Worker* wp = &w;
  auto out = std::make_shared<core::MappedRemote>();
  im.call(w, [wp, dst, offset, len, out] {
    Status e;
    *out = wp->map_remote_wt(dst, offset, len, &e);
    return e;
  });
  return MappedRegion(out->ptr, len, std::move(out->keep));
}

// ------------------------------------------------------------ peer groups

PeerGroupHandle TransferEngine::add_peer_group(const std::vector<std::vector<NetAddr>>& peers) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (peers.empty()) throw Error(Code::kInvalidArgument, "add_peer_group: no peers");
  size_t nics = im.workers[0]->nics();
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i].size() != nics)
      throw Error(Code::kFailedPrecondition,
                  fmt::format("add_peer_group: peer {} has {} addresses, this group has {} NICs", i,
                              peers[i].size(), nics));
  std::optional<PeerGroupHandle> handle;
  for (auto& owned : im.workers) {
    core::Worker* wp = owned.get();
    auto h = std::make_shared<PeerGroupHandle>(0);
    im.call(*wp, [wp, peers, h] {
      Status e;
      *h = wp->add_peer_group_wt(peers, &e);
      return e;
    });
    if (handle && *handle != *h)
      throw Error(Code::kInternal, "add_peer_group: workers disagree on the handle");
    handle = *h;
  }
  return *handle;
}

PeerGroupHandle TransferEngine::add_peer_group(const std::vector<MrDesc>& peers) {
  std::vector<std::vector<NetAddr>> addrs;
  addrs.reserve(peers.size());
  for (const auto& d : peers) {
    std::vector<NetAddr> a;
    for (const auto& n : d.nics) a.push_back(n.addr);
    addrs.push_back(std::move(a));
  }
  return add_peer_group(addrs);
}

TransferId TransferEngine::submit_scatter(std::optional<PeerGroupHandle> group, OnDone on_done,
                                          std::optional<uint32_t> imm, MrHandle src,
                                          std::vector<ScatterDst> dsts, GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req = scatter_req(im, group, imm, src, std::move(dsts), route, "submit_scatter", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_scatter(std::optional<PeerGroupHandle> group, MrHandle src,
                                                 std::vector<ScatterDst> dsts, GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = std::make_shared<PreparedTransfer::State>();
  st->req = scatter_req(im, group, std::nullopt, src, std::move(dsts), route, "prepare_scatter",
                        &st->group);
  st->engine = &im;
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit(const PreparedTransfer& prepared, std::optional<uint32_t> imm,
                                  OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (!prepared.valid()) throw Error(Code::kInvalidArgument, "submit: empty PreparedTransfer");
  const auto& st = prepared.s_;
  if (st->engine != &im)
    throw Error(Code::kInvalidArgument,
                "submit: the PreparedTransfer was prepared by another TransferEngine");
  // Caught here for the caller's sake; the worker checks again (unreg_mr may
  // race this submit).
  const bool retired = std::visit(
      [](const auto& r) { return r.src->retired.load(std::memory_order_acquire); }, st->req);
  if (retired)
    throw Error(Code::kFailedPrecondition,
                "submit: the prepared transfer's source region was unregistered (unreg_mr)");
  return im.submit(*im.workers[st->group], std::move(on_done), core::PreparedReq{st, imm});
}

TransferId TransferEngine::submit_barrier(std::optional<PeerGroupHandle> group, OnDone on_done,
                                          uint32_t imm, std::vector<MrDesc> dsts,
                                          GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto& w = *im.workers[0];
  if (route.kind == GroupRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_barrier: pinned NIC {} of {}", route.nic, w.nics()));
  for (const auto& d : dsts) {
    im.check_desc(d, w.nics(), "submit_barrier");
    im.check_writable(d, "submit_barrier");
  }
  return im.submit(w, std::move(on_done), core::BarrierReq{std::move(dsts), group, imm, route});
}

// -------------------------------------------------------------- immediates

void TransferEngine::expect_imm_count(uint32_t imm, uint32_t count, ImmCountCallback cb) {
  expect_imm_count(imm, count, std::move(cb), CallbackOn::kCallbackThread);
}

void TransferEngine::expect_imm_count(uint32_t imm, uint32_t count, ImmCountCallback cb,
                                      CallbackOn on) {
  if (count == 0) throw Error(Code::kInvalidArgument, "expect_imm_count: count must be positive");
  if (!cb) throw Error(Code::kInvalidArgument, "expect_imm_count: empty callback");
  auto entered = impl_->enter();
  impl_->imms->expect(imm, count, std::move(cb), on);
}

ImmCounter TransferEngine::imm_counter(uint32_t imm) {
  auto entered = impl_->enter();
  return impl_->imms->counter(imm);
}

void TransferEngine::remove_imm_count(uint32_t imm) {
  if (!impl_->imms->remove(imm))
    throw Error(Code::kNotFound, fmt::format("remove_imm_count: immediate {} is not counted", imm));
}

void TransferEngine::on_imm(ImmCallback cb) {
  if (!cb) throw Error(Code::kInvalidArgument, "on_imm: empty callback");
  auto entered = impl_->enter();
  impl_->imms->add_plain_callback(std::move(cb));
}

uint64_t* TransferEngine::alloc_uvm_watcher(WatcherCallback cb, WatchOn on) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (on == WatchOn::kWatcherThread)
    return im.gpu.alloc_watcher(im.shared.config.watcher_cpu, std::move(cb));
  core::Worker* w = im.workers[0].get();
  return im.gpu.alloc_worker_watcher(std::move(cb), [&](std::shared_ptr<core::TurnHook> hook) {
    im.call(*w, [w, hook] {
      w->add_turn_hook_wt(hook);
      return Status();
    });
  });
}

EngineStats TransferEngine::stats() const {
  auto& im = *impl_;
  if (im.stopped.load(std::memory_order_seq_cst)) {
    // The last figures stay readable (a final report after stop); while stop()
    // is still on its way there are none yet.
    std::lock_guard fl(im.final_mu);
    if (im.final_stats) return *im.final_stats;
    throw Error(Code::kFailedPrecondition, "the transfer engine is stopping");
  }
  auto entered = im.enter();
  return im.obs.stats({&im.workers, im.callbacks.get(), im.imms.get(), &im.gpu.poll_lag()});
}

std::string TransferEngine::metrics_address() const {
  return impl_->obs.metrics_address();
}
bool TransferEngine::tracing() const {
  return impl_->obs.tracing() && !impl_->stopped.load();
}
int64_t TransferEngine::trace_clock_ns() {
  return core::now_ns();
}

void TransferEngine::trace_span(std::string_view name, int64_t start_ns, int64_t end_ns,
                                std::string_view track) {
  auto& im = *impl_;
  // Like enter(), but a span after stop is dropped rather than an error.
  im.api_calls.fetch_add(1, std::memory_order_seq_cst);
  if (!im.stopped.load(std::memory_order_seq_cst)) im.obs.span(name, start_ns, end_ns, track);
  im.api_calls.fetch_sub(1, std::memory_order_seq_cst);
}
void TransferEngine::trace_instant(std::string_view name, int64_t at_ns, std::string_view track) {
  trace_span(name, at_ns, at_ns, track);
}

uint32_t* TransferEngine::imm_counter_gpu(uint32_t imm, uint32_t count) {
  auto entered = impl_->enter();
  return impl_->gpu.imm_counter(*impl_->imms, imm, count);
}

}  // namespace ferry

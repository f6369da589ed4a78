// TransferEngine (include/ferry/engine.h): construction and provider choice,
// stop, identity, memory registration and mapping, immediates, observability.
// The submissions are in engine_submit.cpp, the shared state in engine_impl.h.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>

#include "core/recv_queue_state.h"
#include "engine/engine_impl.h"

namespace ferry {

namespace {

uint64_t random_incarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t(rd()) << 32) ^ rd();
  return v;
}

}  // namespace

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
  if (config.send_buffer_count >= (1u << 24))
    throw Error(Code::kInvalidArgument, "EngineConfig: send_buffer_count must be below 2^24");

  im.shared.config = config;
  im.shared.incarnation = random_incarnation();
  im.imms = std::make_unique<core::ImmTable>(nullptr);
  im.imms->set_wait_sample_every(config.latency_sample_every);
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
      // A GPU group that names no NICs gets those closest to its GPU, not
      // the provider's first ones (every GPU on NIC 0).
      GroupConfig group = config.groups[g];
      if (auto near = engine::default_nics(group, provider, config.nics_per_group); !near.empty()) {
        core::log().info("group {} ({}): NICs {} from the topology", g, group.device.to_string(),
                         fmt::join(near, ", "));
        group.nic_names = std::move(near);
      }
      auto w =
          std::make_unique<core::Worker>(&im.shared, g, group, engine::default_affinity(group));
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
  sp.allocate(config.send_buffer_size, config.send_buffer_count);
  auto reg = std::make_shared<core::Registration>();
  reg->ptr = sp.mem.get();
  reg->len = sp.buf_len * sp.count;
  // Waiters on counters poll for idle workers (core/progress_help.h).
  if (std::all_of(im.workers.begin(), im.workers.end(), [](auto& w) { return w->can_help(); })) {
    using Workers = decltype(im.workers);
    if (im.workers.size() == 1) {
      im.help = std::make_shared<core::ProgressHelp>(
          [](void* w) { return static_cast<core::Worker*>(w)->help_progress(); },
          [](void* w) { static_cast<core::Worker*>(w)->help_leaves(); }, im.workers[0].get());
    } else {
      im.help = std::make_shared<core::ProgressHelp>(
          [](void* ws) {
            bool any = false;
            for (auto& w : *static_cast<Workers*>(ws)) any |= w->help_progress();
            return any;
          },
          [](void* ws) {
            for (auto& w : *static_cast<Workers*>(ws)) w->help_leaves();
          },
          &im.workers);
    }
    im.imms->set_progress_help(im.help);
    im.callbacks->set_progress_help(
        im.help.get(), core::resolve_idle_spin(config.spin_before_block, config.spin_yield).spin);
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
  im.send_free.reset(uint32_t(sp.count));
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
  while (im.api_calls.any()) std::this_thread::yield();
  im.gpu.stop();                  // watcher callbacks may submit: stop them while the workers run
  if (im.help) im.help->close();  // no waiter polls a worker from here on
  // Takers on empty receive queues return kCancelled; released messages give
  // nothing back to the workers from here on.
  for (auto& p : im.recv_pools)
    if (p && p->queue) p->queue->close();
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

MappedRegion TransferEngine::map_remote(const MrDesc& dst, uint64_t offset, uint64_t len,
                                        Device near) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (len == 0) throw Error(Code::kInvalidArgument, "map_remote: zero length");
  if (!fits(offset, len, dst.len))
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
  const core::CallsInProgress::Counted counted(im.api_calls);
  if (!im.stopped.load(std::memory_order_seq_cst)) im.obs.span(name, start_ns, end_ns, track);
}
void TransferEngine::trace_instant(std::string_view name, int64_t at_ns, std::string_view track) {
  trace_span(name, at_ns, at_ns, track);
}

uint32_t* TransferEngine::imm_counter_gpu(uint32_t imm, uint32_t count) {
  auto entered = impl_->enter();
  return impl_->gpu.imm_counter(*impl_->imms, imm, count);
}

}  // namespace ferry

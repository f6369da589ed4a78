#include "moe/proxy.h"

#include <algorithm>
#include <atomic>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry::moe {
namespace {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

template <typename T>
T load_acquire(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_acquire);
}

template <typename T>
void store_release(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
}

constexpr size_t kStatsKept = 4096;

}  // namespace

size_t plan_words(const Geometry& g) {
  return size_t{g.world} * g.local_experts() + 2 * size_t{g.world} + 2 * size_t{g.local_experts()};
}

void write_plan(const ReceivePlan& p, const Geometry& g, uint32_t* words) {
  uint32_t* w = words;
  w = std::copy(p.cnt.begin(), p.cnt.end(), w);
  w = std::copy(p.src_base.begin(), p.src_base.end(), w);
  w = std::copy(p.combine_send_offset.begin(), p.combine_send_offset.end(), w);
  w = std::copy(p.expert_offset.begin(), p.expert_offset.end(), w);
  w = std::copy(p.expert_total.begin(), p.expert_total.end(), w);
  (void)g;
}

Proxy::Proxy(TransferEngine& engine, ProxyConfig cfg, ProxyWords words, ProxyBuffers bufs,
             std::vector<ProxyPeer> peers)
    : engine_(engine), cfg_(cfg), words_(words), bufs_(bufs), peers_(std::move(peers)) {
  const Geometry& g = cfg_.geometry;
  if (peers_.size() != g.world)
    throw Error(Code::kInvalidArgument, "moe proxy: " + std::to_string(peers_.size()) +
                                            " peers for a world of " + std::to_string(g.world));
  std::vector<MrDesc> others, remotes;
  for (uint32_t r = 0; r < g.world; ++r) {
    if (r == g.rank) continue;
    others_.push_back(r);
    others.push_back(peers_[r].routes);
    if (!g.same_node(r, g.rank)) {
      remotes_.push_back(r);
      remotes.push_back(peers_[r].recv);
    }
  }
  if (!others.empty()) others_group_ = engine_.add_peer_group(others);
  if (!remotes.empty()) remotes_group_ = engine_.add_peer_group(remotes);
  route_imms_ = engine_.imm_counter(imm_of(cfg_.instance, ImmKind::kRoute));
  barrier_imms_ = engine_.imm_counter(imm_of(cfg_.instance, ImmKind::kBarrier));
  routes_copy_.resize(size_t{g.world} * g.num_experts);
  tracing_ = engine_.tracing();
  track_ = "moe rank " + std::to_string(g.rank);
  if (cfg_.instance != 0) track_ += " instance " + std::to_string(cfg_.instance);
  stats_.signal_to_first_post.reserve(kStatsKept);
  stats_.routes_to_second_post.reserve(kStatsKept);
  thread_ = std::thread([this] { run(); });
}

Proxy::~Proxy() {
  stop();
}

void Proxy::notify() {
  std::lock_guard lk(mu_);
  cv_.notify_one();
}

void Proxy::stop() {
  {
    std::lock_guard lk(mu_);
    stop_.store(true, std::memory_order_release);
    cv_.notify_one();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

Status Proxy::status() const {
  std::lock_guard lk(mu_);
  return status_;
}

ProxyStats Proxy::stats() const {
  std::lock_guard lk(mu_);
  ProxyStats s = stats_;
  s.epochs = epochs_done();
  return s;
}

void Proxy::fail(Status s) {
  {
    std::lock_guard lk(mu_);
    if (status_.is_ok()) status_ = s;
  }
  // The kernels poll this word in every wait: they give up instead of spinning.
  store_release(words_.error, static_cast<uint32_t>(s.code()));
}

template <typename Ready>
Status Proxy::wait(Ready&& ready, bool bounded, const char* what) {
  const auto start = Clock::now();
  const auto deadline = start + cfg_.deadline;
  std::unique_lock lk(mu_, std::defer_lock);
  for (;;) {
    if (ready()) return {};
    if (tx_->failed.load(std::memory_order_acquire)) {
      std::lock_guard g(tx_->mu);
      return tx_->status;
    }
    if (stop_.load(std::memory_order_acquire)) return {Code::kCancelled, "moe proxy stopped"};
    const auto now = Clock::now();
    if (bounded && now >= deadline)
      return {Code::kDeadlineExceeded, std::string("moe proxy: ") + what + " not done within " +
                                           std::to_string(cfg_.deadline.count()) + " ms"};
    if (now - start < cfg_.spin) {
      cpu_relax();
      continue;
    }
    // Watcher callbacks notify; network progress has no notifier, hence the
    // short timed sleep (it bounds the latency once the spin is over).
    lk.lock();
    cv_.wait_for(lk, std::chrono::microseconds(50));
    lk.unlock();
  }
}

Status Proxy::wait_progress(uint64_t value, bool bounded, const char* what) {
  return wait([&] { return load_acquire(words_.progress) >= value; }, bounded, what);
}

Status Proxy::wait_imms(ImmCounter& c, int64_t n, const char* what) {
  if (n == 0) return {};
  return wait([&] { return c.try_consume(n); }, true, what);
}

Status Proxy::wait_transfers(const char* what) {
  Status s = wait(
      [&] {
        return tx_->done.load(std::memory_order_acquire) == issued_.load(std::memory_order_relaxed);
      },
      true, what);
  if (!s.is_ok()) return s;
  std::lock_guard lk(tx_->mu);
  return tx_->status;
}

OnDone Proxy::on_done() {
  issued_.fetch_add(1, std::memory_order_relaxed);
  return OnDone([tx = tx_](const Status& s) {
    if (!s.is_ok()) {
      std::lock_guard lk(tx->mu);
      if (tx->status.is_ok()) tx->status = s;
      tx->failed.store(true, std::memory_order_release);
    }
    tx->done.fetch_add(1, std::memory_order_acq_rel);
  });
}

void Proxy::span(const char* name, Clock::time_point from, Clock::time_point to) {
  if (!tracing_) return;
  auto ns = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  engine_.trace_span(name, ns(from), ns(to), track_);
}

void Proxy::post_scatter(ImmKind kind, std::optional<PeerGroupHandle> group, MrHandle src,
                         std::vector<ScatterDst> dsts) {
  if (dsts.empty()) return;
  OnDone d = on_done();
  try {
    engine_.submit_scatter(group, std::move(d), imm_of(cfg_.instance, kind), src, std::move(dsts),
                           GroupRoute::shard_peers());
  } catch (...) {
    tx_->done.fetch_add(1, std::memory_order_acq_rel);  // never posted: its OnDone will not run
    throw;
  }
}

Status Proxy::step(uint32_t e) {
  const Geometry& g = cfg_.geometry;
  const uint32_t N = g.world, E = g.num_experts, me = g.rank, P = g.max_private_tokens;
  const uint64_t D = bufs_.dispatch_stride, C = bufs_.combine_stride;
  const uint64_t base = 4ull * e;

  // Unbounded: the iteration starts when the model calls dispatch.
  if (Status s = wait_progress(base - 3, false, "routes row"); !s.is_ok()) return s;
  const auto t_signal = Clock::now();
  const uint32_t* row = bufs_.routes_ptr + size_t{me} * E;
  {
    std::vector<ScatterDst> dsts;
    dsts.reserve(others_.size());
    for (uint32_t r : others_)
      dsts.push_back({E * 4ull, me * E * 4ull, peers_[r].routes, me * E * 4ull});
    post_scatter(ImmKind::kRoute, others_group_, bufs_.routes, std::move(dsts));
  }
  const auto t_first = Clock::now();

  // Own row, as the kernels wrote it (ordered by the progress word's acquire).
  std::copy(row, row + E, routes_copy_.begin() + size_t{me} * E);
  if (Status s = wait_progress(base - 2, true, "dispatch send buffer"); !s.is_ok()) return s;
  {
    Routes own(g, routes_copy_);  // only row `me` is read here
    std::vector<ScatterDst> dsts;
    for (uint32_t d : remotes_) {
      const uint32_t b = own.base(me, d);
      dsts.push_back({uint64_t{own.private_rows(me, d)} * D, uint64_t{b} * D, peers_[d].recv,
                      uint64_t{me} * P * D});
    }
    post_scatter(ImmKind::kDispatch, remotes_group_, bufs_.send, std::move(dsts));
  }

  if (Status s = wait_imms(route_imms_, static_cast<int64_t>(N) - 1, "routes from every rank");
      !s.is_ok())
    return s;
  const auto t_routes = Clock::now();
  for (uint32_t r : others_)
    for (uint32_t x = 0; x < E; ++x)
      routes_copy_[size_t{r} * E + x] = load_acquire(bufs_.routes_ptr + size_t{r} * E + x);
  Routes routes(g, routes_copy_);
  for (uint32_t d = 0; d < N; ++d)
    if (!routes.fits(d))
      return {Code::kInvalidArgument,
              "moe: rank " + std::to_string(d) + " would receive " +
                  std::to_string(routes.received(d)) + " rows, more than its buffers hold " +
                  "(a token naming one expert twice, or more than max_num_tokens tokens)"};
  ReceivePlan plan = ReceivePlan::make(routes);
  write_plan(plan, g, words_.plan);
  store_release(words_.plan_epoch, e);
  {
    std::vector<ScatterDst> dsts;
    for (uint32_t d : remotes_) {
      const uint64_t n = routes.overflow_rows(me, d);
      const uint64_t src = n ? (uint64_t{routes.base(me, d)} + P) * D : 0;
      const uint64_t dst = n ? routes.overflow_offset(me, d) * D : 0;
      dsts.push_back({n * D, src, peers_[d].recv, dst});
    }
    post_scatter(ImmKind::kDispatch, remotes_group_, bufs_.send, std::move(dsts));
  }
  const auto t_second = Clock::now();
  {
    std::lock_guard lk(mu_);
    auto ns = [](auto d) {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    };
    if (stats_.signal_to_first_post.size() == kStatsKept) {
      stats_.signal_to_first_post.clear();
      stats_.routes_to_second_post.clear();
    }
    stats_.signal_to_first_post.push_back(ns(t_first - t_signal));
    stats_.routes_to_second_post.push_back(ns(t_second - t_routes));
  }

  span("moe dispatch", t_signal, t_second);
  span("moe routes exchange", t_first, t_routes);

  if (Status s = wait_progress(base - 1, true, "combine send buffer"); !s.is_ok()) return s;
  const auto t_combine = Clock::now();
  {
    std::vector<ScatterDst> dsts;
    for (uint32_t s : remotes_) {
      const uint64_t n = routes.rows(s, me);
      dsts.push_back({n * C, n ? uint64_t{plan.combine_send_offset[s]} * C : 0,
                      peers_[s].combine_recv, n ? uint64_t{plan.src_base[s]} * C : 0});
    }
    // The combine targets are the peers' combine buffers: no peer group (the
    // group's descriptors are the dispatch buffers').
    post_scatter(ImmKind::kCombine, std::nullopt, bufs_.combine_send, std::move(dsts));
  }

  if (Status s = wait_progress(base, true, "combine receive"); !s.is_ok()) return s;
  const auto t_combined = Clock::now();
  span("moe combine", t_combine, t_combined);
  if (Status s = wait_transfers("this iteration's transfers"); !s.is_ok()) return s;
  if (!others_.empty()) {
    std::vector<MrDesc> dsts;
    for (uint32_t r : others_) dsts.push_back(peers_[r].routes);
    OnDone d = on_done();
    try {
      engine_.submit_barrier(others_group_, std::move(d), imm_of(cfg_.instance, ImmKind::kBarrier),
                             std::move(dsts));
    } catch (...) {
      tx_->done.fetch_add(1, std::memory_order_acq_rel);
      throw;
    }
    if (Status s = wait_imms(barrier_imms_, static_cast<int64_t>(N) - 1, "barrier"); !s.is_ok())
      return s;
    if (Status s = wait_transfers("barrier"); !s.is_ok()) return s;
  }
  store_release(words_.tx_ready, e);
  span("moe release", t_combined, Clock::now());
  return {};
}

void Proxy::run() {
  for (uint32_t e = 1; !stop_.load(std::memory_order_acquire); ++e) {
    Status s;
    try {
      s = step(e);
    } catch (const Error& err) {
      s = err.status();
    } catch (const std::exception& ex) {
      s = {Code::kInternal, std::string("moe proxy: ") + ex.what()};
    }
    if (!s.is_ok()) {
      if (s.code() != Code::kCancelled || !stop_.load()) fail(s);
      return;
    }
    epochs_.store(e, std::memory_order_release);
  }
}

}  // namespace ferry::moe

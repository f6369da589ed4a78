#include "engine/stats.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include <unistd.h>

#include "core/callback_thread.h"
#include "core/imm_table.h"
#include "core/log.h"
#include "core/wake.h"
#include "core/worker.h"
#include "engine/metrics_exporter.h"
#include "engine/trace.h"

namespace ferry {

double LatencyHistogram::quantile_upper(double q) const {
  if (count == 0) return 0;
  const double want = q * double(count);
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (double(seen) >= want && seen > 0) return upper_s[i];
  }
  return upper_s.empty() ? 0 : upper_s.back();
}

void LatencyHistogram::merge(const LatencyHistogram& o) {
  if (counts.empty()) {
    *this = o;
    return;
  }
  for (size_t i = 0; i < counts.size() && i < o.counts.size(); ++i) counts[i] += o.counts[i];
  count += o.count;
  sum_s += o.sum_s;
}

namespace {

template <typename F>
uint64_t sum_of(const std::vector<NicStats>& v, F f) {
  uint64_t s = 0;
  for (const auto& x : v) s += f(x);
  return s;
}

}  // namespace

uint64_t EngineStats::transfers_ok() const {
  uint64_t s = 0;
  for (const auto& w : workers) s += w.transfers_ok;
  return s;
}
uint64_t EngineStats::transfers_failed() const {
  uint64_t s = 0;
  for (const auto& w : workers)
    for (const auto& [code, n] : w.transfers_failed) s += n;
  return s;
}
uint64_t EngineStats::transfers_failed(const std::string& code) const {
  uint64_t s = 0;
  for (const auto& w : workers)
    if (auto it = w.transfers_failed.find(code); it != w.transfers_failed.end()) s += it->second;
  return s;
}
uint64_t EngineStats::bytes_posted() const {
  return sum_of(nics, [](const NicStats& n) { return n.bytes_posted; });
}
uint64_t EngineStats::bytes_completed() const {
  return sum_of(nics, [](const NicStats& n) { return n.bytes_completed; });
}
uint64_t EngineStats::writes_posted() const {
  return sum_of(nics, [](const NicStats& n) { return n.writes_posted; });
}
uint64_t EngineStats::writes_completed() const {
  return sum_of(nics, [](const NicStats& n) { return n.writes_completed; });
}
uint64_t EngineStats::imms_received() const {
  return sum_of(nics, [](const NicStats& n) { return n.imms_received; });
}
uint64_t EngineStats::backpressure() const {
  return sum_of(nics, [](const NicStats& n) { return n.backpressure; });
}

namespace engine {

namespace {

WakeStats wake_stats() {
  const auto& c = core::wake_counters();
  WakeStats w;
  w.blocks = c.blocks.load(std::memory_order_relaxed);
  w.woken_by_submission = c.by_submission.load(std::memory_order_relaxed);
  w.woken_by_completion = c.by_completion.load(std::memory_order_relaxed);
  w.woken_by_timer = c.by_timer.load(std::memory_order_relaxed);
  w.naps = c.naps.load(std::memory_order_relaxed);
  w.notifies = c.notifies.load();
  w.inline_posts = c.inline_posts.load();
  w.inline_replies = c.inline_replies.load();
  w.helped_polls = c.helped_polls.load();
  w.callback_blocks = c.callback_blocks.load(std::memory_order_relaxed);
  w.reply_windows = c.reply_windows.load();
  w.reply_hits = c.reply_hits.load();
  w.asides = c.asides.load();
  w.asleep = c.asleep.load(std::memory_order_relaxed);
  return w;
}

LatencyHistogram histogram_of(const core::StatHistogram& h) {
  LatencyHistogram out;
  using H = core::StatHistogram;
  for (int i = 0; i < H::kBuckets; ++i) {
    out.upper_s.push_back(i + 1 == H::kBuckets ? std::numeric_limits<double>::infinity()
                                               : double(H::upper_ns(i)) * 1e-9);
    out.counts.push_back(h.bucket(i));
    out.count += out.counts.back();
  }
  out.sum_s = double(h.sum_ns()) * 1e-9;
  return out;
}

}  // namespace

EngineStats snapshot(const StatsSources& src) {
  EngineStats s;
  s.enabled = core::kStatsEnabled;
  std::vector<ImmValueStats> imms;
  for (const auto& wp : *src.workers) {
    const core::Worker& w = *wp;
    const core::WorkerCounters& c = w.counters();
    WorkerStats ws;
    ws.group = w.index();
    ws.in_flight = w.in_flight();
    ws.queued = w.queued();
    for (size_t code = 0; code < core::kCodeCount; ++code) {
      const uint64_t n = c.outcomes[code].get();
      if (code == 0)
        ws.transfers_ok = n;
      else if (n != 0)
        ws.transfers_failed[std::string(code_name(Code(code)))] = n;
    }
    ws.transfer_latency = histogram_of(c.transfer_latency);
    ws.queue_delay = histogram_of(c.queue_delay);
    ws.registrations = c.registrations.get();
    ws.registered_bytes = c.registered_bytes.get();
    ws.registration_time = histogram_of(c.registration_time);
    s.workers.push_back(std::move(ws));

    const size_t first_nic = s.nics.size();
    for (size_t k = 0; k < w.nics(); ++k) {
      const core::NicCounters& n = c.nic[k];
      NicStats ns;
      ns.group = w.index();
      ns.nic = k;
      ns.name = w.nic_infos()[k].name;
      ns.provider = w.nic_infos()[k].provider;
      ns.writes_completed = n.writes_completed.get();
      ns.completion_errors = n.completion_errors.get();
      ns.bytes_completed = n.bytes_completed.get();
      ns.imms_received = n.imms_received.get();
      ns.imm_errors = n.imm_errors.get();
      ns.recvs = n.recvs.get();
      ns.outstanding = n.outstanding.get();
      ns.pending = n.pending.get();
      s.nics.push_back(std::move(ns));
    }
    for (size_t i = 0; i < c.peer_count(); ++i) {
      const core::PeerCounters& p = c.peer_at(i);
      PeerStats ps;
      ps.group = w.index();
      ps.nic = p.nic;
      ps.nic_name = p.nic < w.nics() ? w.nic_infos()[p.nic].name : std::string();
      ps.peer = p.name;
      ps.writes_posted = p.writes_posted.get();
      ps.bytes_posted = p.bytes_posted.get();
      ps.sends_posted = p.sends_posted.get();
      ps.backpressure = p.backpressure.get();
      ps.post_errors = p.post_errors.get();
      ps.transfers_ok = p.transfers_ok.get();
      ps.transfers_failed = p.transfers_failed.get();
      ps.bytes_ok = p.bytes_ok.get();
      if (first_nic + p.nic < s.nics.size()) {
        NicStats& ns = s.nics[first_nic + p.nic];
        ns.writes_posted += ps.writes_posted;
        ns.bytes_posted += ps.bytes_posted;
        ns.sends_posted += ps.sends_posted;
        ns.backpressure += ps.backpressure;
        ns.post_errors += ps.post_errors;
      }
      s.peers.push_back(std::move(ps));
    }
    for (size_t i = 0; i < core::ImmValueCounts::kSlots; ++i)
      if (const uint64_t key = c.imms.key(i); key != 0)
        imms.push_back(ImmValueStats{uint32_t(key - 1), c.imms.count(i)});
    s.imms_other += c.imms.other();
    if (const core::TraceRing* ring = w.trace_ring()) s.trace_events_dropped += ring->dropped();
  }
  // Workers count the same value separately: merge, then keep the busiest.
  std::sort(imms.begin(), imms.end(),
            [](const ImmValueStats& a, const ImmValueStats& b) { return a.imm < b.imm; });
  std::vector<ImmValueStats> merged;
  for (const auto& v : imms)
    if (!merged.empty() && merged.back().imm == v.imm)
      merged.back().count += v.count;
    else
      merged.push_back(v);
  std::sort(merged.begin(), merged.end(), [](const ImmValueStats& a, const ImmValueStats& b) {
    return a.count != b.count ? a.count > b.count : a.imm < b.imm;
  });
  for (size_t i = src.top_imms; i < merged.size(); ++i) s.imms_other += merged[i].count;
  if (merged.size() > src.top_imms) merged.resize(src.top_imms);
  s.top_imms = std::move(merged);

  if (src.imms) {
    s.counter_wait = histogram_of(src.imms->counter_waits());
    s.dropped_plain_imms = src.imms->dropped_plain_events();
  }
  if (src.callbacks) {
    s.callback_delay = histogram_of(src.callbacks->queue_delay());
    s.callback_queue_depth = src.callbacks->queue_depth();
    s.callback_failures = src.callbacks->callback_failures();
  }
  static const core::StatHistogram kNone;
  s.watcher_poll_lag = histogram_of(src.watcher_poll_lag ? *src.watcher_poll_lag : kNone);
  s.trace_events_dropped += src.trace_events_dropped;
  s.wake = wake_stats();
  return s;
}

Observability::Observability() = default;
Observability::~Observability() = default;

void Observability::from_environment(EngineConfig& config) {
  if (config.metrics_address.empty())
    if (const char* env = std::getenv("FERRY_METRICS"); env && *env) config.metrics_address = env;
  if (config.trace_file.empty())
    if (const char* env = std::getenv("FERRY_TRACE"); env && *env) config.trace_file = env;
  // "%p" becomes the process id: one FERRY_TRACE for every process of a job,
  // each writing its own file.
  for (size_t at = config.trace_file.find("%p"); at != std::string::npos;
       at = config.trace_file.find("%p", at)) {
    const std::string pid = std::to_string(::getpid());
    config.trace_file.replace(at, 2, pid);
    at += pid.size();
  }
}

void Observability::start_trace(const EngineConfig& config) {
  if (config.trace_file.empty()) return;
  if (!core::kStatsEnabled) {
    core::log().warn("trace file '{}' ignored: this build has no statistics (FERRY_STATS=OFF)",
                     config.trace_file);
    return;
  }
  trace_ = std::make_unique<Trace>(config.trace_file, config.trace_events);
}

void Observability::start_metrics(const EngineConfig& config, std::function<EngineStats()> stats) {
  if (config.metrics_address.empty()) return;
  metrics_ = std::make_unique<MetricsExporter>(
      config.metrics_address, [stats = std::move(stats)] { return prometheus_text(stats()); });
}

EngineStats Observability::stats(StatsSources sources) const {
  if (trace_) sources.trace_events_dropped += trace_->dropped();
  return snapshot(sources);
}

std::string Observability::metrics_address() const {
  return metrics_ ? metrics_->address() : std::string();
}

void Observability::span(std::string_view name, int64_t start_ns, int64_t end_ns,
                         std::string_view track) {
  if (trace_) trace_->span(name, start_ns, end_ns, track);
}

void Observability::stop_metrics() {
  if (metrics_) metrics_->stop();
}

void Observability::write_trace(const std::vector<std::unique_ptr<core::Worker>>& workers) {
  if (!trace_) return;
  std::vector<TraceSource> sources;
  for (const auto& w : workers) {
    TraceSource t;
    t.group = w->index();
    for (const auto& i : w->nic_infos()) t.nic_names.push_back(i.name);
    t.ring = w->trace_ring();
    sources.push_back(std::move(t));
  }
  Status st = trace_->write(sources);
  if (st.is_ok())
    core::log().info("trace written to {}", trace_->path());
  else
    core::log().error("trace: {}", st.message());
  trace_.reset();  // written once
}

}  // namespace engine
}  // namespace ferry

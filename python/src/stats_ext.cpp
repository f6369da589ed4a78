// Python side of the engine's observability (docs/OBSERVABILITY.md):
// TransferEngine.stats() as a dict of plain values, the trace clock and
// trace spans, the metrics address. Registered by ferry_ext.cpp, which hands
// over how to reach the C++ engine behind its Engine object.
#include "stats_ext.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cmath>

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

nb::dict histogram(const LatencyHistogram& h) {
  nb::dict d;
  d["count"] = h.count;
  d["sum_s"] = h.sum_s;
  nb::list buckets;
  for (size_t i = 0; i < h.counts.size(); ++i)
    if (h.counts[i] != 0)
      buckets.append(
          nb::make_tuple(std::isinf(h.upper_s[i]) ? INFINITY : h.upper_s[i], h.counts[i]));
  d["buckets"] = buckets;  // (upper bound in seconds, count), empty buckets left out
  d["p50_s"] = h.quantile_upper(0.5);
  d["p99_s"] = h.quantile_upper(0.99);
  return d;
}

nb::dict codes(const std::map<std::string, uint64_t>& m) {
  nb::dict d;
  for (const auto& [k, v] : m) d[k.c_str()] = v;
  return d;
}

nb::dict to_dict(const EngineStats& s) {
  nb::dict d;
  d["enabled"] = s.enabled;
  nb::dict transfers;
  transfers["ok"] = s.transfers_ok();
  std::map<std::string, uint64_t> failed;
  for (const auto& w : s.workers)
    for (const auto& [k, v] : w.transfers_failed) failed[k] += v;
  transfers["failed"] = codes(failed);
  d["transfers"] = transfers;
  d["bytes_posted"] = s.bytes_posted();
  d["bytes_completed"] = s.bytes_completed();
  d["writes_posted"] = s.writes_posted();
  d["writes_completed"] = s.writes_completed();
  d["imms_received"] = s.imms_received();
  d["backpressure"] = s.backpressure();

  nb::list workers;
  for (const auto& w : s.workers) {
    nb::dict x;
    x["group"] = w.group;
    x["in_flight"] = w.in_flight;
    x["queued"] = w.queued;
    x["transfers_ok"] = w.transfers_ok;
    x["transfers_failed"] = codes(w.transfers_failed);
    x["transfer_latency"] = histogram(w.transfer_latency);
    x["queue_delay"] = histogram(w.queue_delay);
    x["registrations"] = w.registrations;
    x["registered_bytes"] = w.registered_bytes;
    x["registration_time"] = histogram(w.registration_time);
    workers.append(x);
  }
  d["workers"] = workers;

  nb::list nics;
  for (const auto& n : s.nics) {
    nb::dict x;
    x["group"] = n.group;
    x["nic"] = n.nic;
    x["name"] = n.name;
    x["provider"] = n.provider;
    x["writes_posted"] = n.writes_posted;
    x["bytes_posted"] = n.bytes_posted;
    x["sends_posted"] = n.sends_posted;
    x["writes_completed"] = n.writes_completed;
    x["completion_errors"] = n.completion_errors;
    x["bytes_completed"] = n.bytes_completed;
    x["backpressure"] = n.backpressure;
    x["post_errors"] = n.post_errors;
    x["imms_received"] = n.imms_received;
    x["imm_errors"] = n.imm_errors;
    x["recvs"] = n.recvs;
    x["outstanding"] = n.outstanding;
    x["pending"] = n.pending;
    nics.append(x);
  }
  d["nics"] = nics;

  nb::list peers;
  for (const auto& p : s.peers) {
    nb::dict x;
    x["group"] = p.group;
    x["nic"] = p.nic;
    x["nic_name"] = p.nic_name;
    x["peer"] = p.peer;
    x["writes_posted"] = p.writes_posted;
    x["bytes_posted"] = p.bytes_posted;
    x["sends_posted"] = p.sends_posted;
    x["backpressure"] = p.backpressure;
    x["post_errors"] = p.post_errors;
    x["transfers_ok"] = p.transfers_ok;
    x["transfers_failed"] = p.transfers_failed;
    x["bytes_ok"] = p.bytes_ok;
    peers.append(x);
  }
  d["peers"] = peers;

  nb::list top;
  for (const auto& v : s.top_imms) top.append(nb::make_tuple(v.imm, v.count));
  d["top_imms"] = top;
  d["imms_other"] = s.imms_other;
  d["counter_wait"] = histogram(s.counter_wait);
  d["callback_delay"] = histogram(s.callback_delay);
  d["watcher_poll_lag"] = histogram(s.watcher_poll_lag);
  d["callback_queue_depth"] = s.callback_queue_depth;
  d["callback_failures"] = s.callback_failures;
  d["dropped_plain_imms"] = s.dropped_plain_imms;
  d["trace_events_dropped"] = s.trace_events_dropped;
  const WakeStats& k = s.wake;
  nb::dict wake;
  for (const WakeCount& c : kWakeCounts) wake[c.name] = k.*c.field;
  wake["asleep"] = k.asleep;
  d["wake"] = wake;
  return d;
}

}  // namespace

void register_stats(nb::module_& m, EngineOf engine_of) {
  m.def(
      "_stats", [engine_of](nb::handle e) { return to_dict(engine_of(e).stats()); }, "engine"_a,
      "The engine's statistics as a dict (docs/OBSERVABILITY.md).");
  m.def(
      "_metrics_address", [engine_of](nb::handle e) { return engine_of(e).metrics_address(); },
      "engine"_a);
  m.def(
      "_tracing", [engine_of](nb::handle e) { return engine_of(e).tracing(); }, "engine"_a);
  m.def(
      "_trace_span",
      [engine_of](nb::handle e, std::string_view name, int64_t start_ns, int64_t end_ns,
                  std::string_view track) {
        engine_of(e).trace_span(name, start_ns, end_ns, track);
      },
      "engine"_a, "name"_a, "start_ns"_a, "end_ns"_a, "track"_a);
  m.def("trace_clock_ns", &TransferEngine::trace_clock_ns,
        "The trace clock: CLOCK_MONOTONIC nanoseconds (time.monotonic_ns()).");
}

}  // namespace ferry::py

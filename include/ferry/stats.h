// A snapshot of an engine's statistics (TransferEngine::stats()). Counters
// are totals since the engine started; gauges are values now. The list, with
// the Prometheus names the exporter gives them, is in docs/OBSERVABILITY.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ferry {

// A latency distribution: counts[i] values fell at or below upper_s[i]
// seconds (and above upper_s[i - 1]); the last bucket is unbounded.
struct LatencyHistogram {
  std::vector<double> upper_s;
  std::vector<uint64_t> counts;
  uint64_t count = 0;
  double sum_s = 0;
  // Upper bound of the bucket holding quantile q (0 when empty).
  double quantile_upper(double q) const;
  void merge(const LatencyHistogram& o);
};

// Writes to one peer through one NIC.
struct PeerStats {
  size_t group = 0, nic = 0;
  std::string nic_name;
  std::string peer;  // NetAddr::brief() of the peer's address on that NIC
  uint64_t writes_posted = 0, bytes_posted = 0, sends_posted = 0;
  uint64_t backpressure = 0;  // posts refused for now (-FI_EAGAIN, queue full)
  uint64_t post_errors = 0;
  // Point-to-point transfers (single, paged, send, imm) by outcome; bytes_ok:
  // bytes of those that ended OK.
  uint64_t transfers_ok = 0, transfers_failed = 0, bytes_ok = 0;
};

struct NicStats {
  size_t group = 0, nic = 0;
  std::string name, provider;
  uint64_t writes_posted = 0, bytes_posted = 0, sends_posted = 0;
  uint64_t writes_completed = 0, completion_errors = 0;
  uint64_t bytes_completed = 0;  // bytes of transfers that ended OK, on this NIC
  uint64_t backpressure = 0, post_errors = 0;
  uint64_t imms_received = 0, imm_errors = 0, recvs = 0;
  uint64_t outstanding = 0;  // gauge: writes posted, not completed
  uint64_t pending = 0;      // gauge: transfer shards waiting to post
};

struct WorkerStats {
  size_t group = 0;
  uint64_t in_flight = 0;  // gauge: admitted requests not finished
  uint64_t queued = 0;     // gauge: commands waiting for the worker (approximate)
  uint64_t transfers_ok = 0;
  std::map<std::string, uint64_t> transfers_failed;  // by code name ("DEADLINE_EXCEEDED", ...)
  LatencyHistogram transfer_latency;                 // submit -> its OnDone is signalled
  LatencyHistogram queue_delay;                      // submit -> end of the turn that took it
  uint64_t registrations = 0, registered_bytes = 0;
  LatencyHistogram registration_time;
};

struct ImmValueStats {
  uint32_t imm = 0;
  uint64_t count = 0;
};

// How idle workers slept and were woken, and how often other threads did a
// worker's work for it (docs/ARCHITECTURE.md, "Polling modes"). Totals
// over every engine of the process since it started, not per engine: take
// differences between two snapshots.
struct WakeStats {
  uint64_t blocks = 0;               // a worker blocked in poll(2) on its eventfd and CQs
  uint64_t woken_by_submission = 0;  // ...the block ended by a submitter's eventfd write
  uint64_t woken_by_completion = 0;  // ...by a CQ's wait object
  uint64_t woken_by_timer = 0;       // ...by its timeout (deadlines, housekeeping)
  uint64_t naps = 0;                 // short timed sleeps (no wait object, or helpers drove)
  uint64_t notifies = 0;             // eventfd writes (submitters, helpers that stop)
  uint64_t inline_posts = 0;         // submissions posted by their own thread, the worker idle
  uint64_t inline_replies = 0;       // answers posted from the callback that made them
  uint64_t helped_polls = 0;         // a waiter's poll of an idle worker's NICs found work
  uint64_t callback_blocks = 0;      // the callback thread blocked waiting for an event
  uint64_t reply_windows = 0;        // a busy worker watched for an answer to arrivals
  uint64_t reply_hits = 0;           // ...and a submission came within the window
  uint64_t asides = 0;               // a busy worker stepped aside for spinning waiters
  int64_t asleep = 0;                // gauge: workers blocked or napping now
};

// The counts of WakeStats (all but the gauge), for readers that list them:
// the field's name (Python's stats()["wake"] keys) and the singular event
// label of the metric ferry_wake_events_total.
struct WakeCount {
  const char* name;
  const char* event;
  uint64_t WakeStats::*field;
};
inline constexpr WakeCount kWakeCounts[] = {
    {"blocks", "block", &WakeStats::blocks},
    {"woken_by_submission", "woken_by_submission", &WakeStats::woken_by_submission},
    {"woken_by_completion", "woken_by_completion", &WakeStats::woken_by_completion},
    {"woken_by_timer", "woken_by_timer", &WakeStats::woken_by_timer},
    {"naps", "nap", &WakeStats::naps},
    {"notifies", "notify", &WakeStats::notifies},
    {"inline_posts", "inline_post", &WakeStats::inline_posts},
    {"inline_replies", "inline_reply", &WakeStats::inline_replies},
    {"helped_polls", "helped_poll", &WakeStats::helped_polls},
    {"callback_blocks", "callback_block", &WakeStats::callback_blocks},
    {"reply_windows", "reply_window", &WakeStats::reply_windows},
    {"reply_hits", "reply_hit", &WakeStats::reply_hits},
    {"asides", "aside", &WakeStats::asides},
};

struct EngineStats {
  bool enabled = false;  // false in a build with FERRY_STATS=OFF: everything is zero
  std::vector<WorkerStats> workers;
  std::vector<NicStats> nics;
  std::vector<PeerStats> peers;
  // Immediates received by value, busiest first (at most top_imms_limit);
  // imms_other counts the rest.
  std::vector<ImmValueStats> top_imms;
  uint64_t imms_other = 0;
  LatencyHistogram counter_wait;      // ImmCounter::wait, call to the arrival that satisfied it
  LatencyHistogram callback_delay;    // queued for the callback thread -> it runs
  LatencyHistogram watcher_poll_lag;  // between two reads of the watched words
  uint64_t callback_queue_depth = 0;  // gauge
  uint64_t callback_failures = 0;     // user callbacks that threw
  uint64_t dropped_plain_imms = 0;    // on_imm events dropped at the queue bound
  uint64_t trace_events_dropped = 0;  // overwritten in the trace ring before the flush
  WakeStats wake;                     // process-wide, kept in every build (not FERRY_STATS)

  // Sums over workers and NICs.
  uint64_t transfers_ok() const;
  uint64_t transfers_failed() const;
  uint64_t transfers_failed(const std::string& code) const;
  uint64_t bytes_posted() const;
  uint64_t bytes_completed() const;
  uint64_t writes_posted() const;
  uint64_t writes_completed() const;
  uint64_t imms_received() const;
  uint64_t backpressure() const;
};

}  // namespace ferry

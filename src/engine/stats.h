// The engine's side of its statistics: a snapshot of the counters the
// workers, the callback thread, the immediate table and the watcher keep
// (core/stats.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/stats.h"
#include "ferry/engine.h"
#include "ferry/stats.h"

namespace ferry::core {
class Worker;
class CallbackThread;
class ImmTable;
}  // namespace ferry::core

namespace ferry::engine {

struct StatsSources {
  const std::vector<std::unique_ptr<core::Worker>>* workers = nullptr;
  const core::CallbackThread* callbacks = nullptr;
  const core::ImmTable* imms = nullptr;
  const core::StatHistogram* watcher_poll_lag = nullptr;  // null: no watcher thread yet
  uint64_t trace_events_dropped = 0;
  size_t top_imms = 16;
};

EngineStats snapshot(const StatsSources& sources);

class MetricsExporter;
class Trace;

// What TransferEngine::Impl holds for statistics, metrics and the timeline,
// so that the engine only calls in at start, at stop and from its accessors.
class Observability {
 public:
  Observability();
  ~Observability();
  // EngineConfig::metrics_address / trace_file from FERRY_METRICS /
  // FERRY_TRACE where the config leaves them empty.
  static void from_environment(EngineConfig& config);
  // Before the workers start (they keep their rings when trace_file is set).
  void start_trace(const EngineConfig& config);
  // Once the engine is up; throws Error when the address is unusable.
  void start_metrics(const EngineConfig& config, std::function<EngineStats()> stats);
  EngineStats stats(StatsSources sources) const;
  std::string metrics_address() const;
  bool tracing() const { return trace_ != nullptr; }
  void span(std::string_view name, int64_t start_ns, int64_t end_ns, std::string_view track);
  // First thing at stop: no scrape may reach into a stopping engine.
  void stop_metrics();
  // Once the workers have stopped and before they are destroyed; logs failures.
  void write_trace(const std::vector<std::unique_ptr<core::Worker>>& workers);

 private:
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<MetricsExporter> metrics_;
};

}  // namespace ferry::engine

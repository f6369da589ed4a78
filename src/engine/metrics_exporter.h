// Prometheus text exposition over HTTP (EngineConfig::metrics_address,
// FERRY_METRICS=host:port): GET /metrics answers the engine's statistics in
// the text format 0.0.4. One thread, one connection at a time, every read and
// write bounded by a timeout: a slow or hostile client delays the next scrape,
// never the engine. Why not prometheus-cpp: docs/OBSERVABILITY.md.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/unique_fd.h"
#include "ferry/stats.h"
#include "ferry/status.h"

namespace ferry::engine {

// Prometheus text format: counters *_total, gauges, histograms in seconds.
std::string prometheus_text(const EngineStats& s);

class MetricsExporter {
 public:
  // Listens on "host:port" ("0.0.0.0:9464", "127.0.0.1:0" = a free port);
  // throws Error(kInvalidArgument / kUnavailable) naming the address.
  MetricsExporter(const std::string& address, std::function<std::string()> body);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The address bound, with the port the kernel chose.
  const std::string& address() const { return bound_; }
  uint64_t scrapes() const { return scrapes_.load(); }
  void stop();

 private:
  void run();
  void serve(int fd);

  std::function<std::string()> body_;
  std::string bound_;
  core::UniqueFd listen_fd_;
  core::UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> scrapes_{0};
  std::thread thread_;
};

}  // namespace ferry::engine

// The timeline (EngineConfig::trace_file, FERRY_TRACE=file.json): each
// worker keeps its transfers, immediates and errors in a ring of its own
// (core/stats.h); users add spans here from any thread. At stop() the engine
// writes everything as Chrome trace-event JSON, one track per worker and NIC
// (and lanes under it where transfers overlap), one per user track.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/stats.h"
#include "ferry/status.h"

namespace ferry::engine {

// A worker's ring and the names of its NICs, for the writer.
struct TraceSource {
  size_t group = 0;
  std::vector<std::string> nic_names;
  const core::TraceRing* ring = nullptr;
};

class Trace {
 public:
  Trace(std::string path, size_t capacity);
  const std::string& path() const { return path_; }
  // Any thread; bounded (the oldest span goes first).
  void span(std::string_view name, int64_t start_ns, int64_t end_ns, std::string_view track);
  uint64_t dropped() const;
  // Writes the file (replacing it). Call once the workers have stopped.
  Status write(const std::vector<TraceSource>& workers) const;

 private:
  struct UserSpan {
    std::string name, track;
    int64_t start_ns = 0, end_ns = 0;
  };
  std::string path_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<UserSpan> spans_;  // a ring once full
  uint64_t next_ = 0;
};

}  // namespace ferry::engine

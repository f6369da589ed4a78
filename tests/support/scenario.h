// One sender exercising every one-sided operation against several receivers
// (each a region server): sharded single writes, pinned and round-robin
// writes, paged writes, scatter in every routing mode, barrier. Every byte and
// every immediate count is checked. Returns the failures, empty when all held.
#pragma once

#include <string>
#include <vector>

#include "ferry/engine.h"
#include "support/process.h"

namespace ferry::test {

struct ScenarioStats {
  uint64_t bytes = 0;  // payload bytes written
};

std::string run_scenario(const std::vector<Channel*>& receivers, const EngineConfig& cfg,
                         uint64_t region, ScenarioStats* stats = nullptr);

}  // namespace ferry::test

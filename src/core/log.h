#pragma once
#include <spdlog/spdlog.h>

#include <vector>

namespace ferry::core {
// The library's logger ("ferry"); level from FERRY_LOG (trace..off), default info.
spdlog::logger& log();
// Pin the calling thread to one CPU; returns false (and logs) on failure.
bool pin_current_thread(int cpu, const char* who);
bool pin_current_thread(const std::vector<int>& cpus, const char* who);
// Names the calling thread (top, perf, /proc/<pid>/task/<tid>/comm); at most
// 15 characters are kept.
void name_current_thread(const char* name);
}  // namespace ferry::core

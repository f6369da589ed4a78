#include "core/log.h"

#include <pthread.h>
#include <sched.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::core {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("ferry");
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [ferry] [%^%l%$] [pid %P] %v");
    const char* lvl = std::getenv("FERRY_LOG");
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
    return l;
  }();
  return *logger;
}

bool pin_current_thread(int cpu, const char* who) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    log().warn("{}: cannot pin to CPU {}: {}", who, cpu, std::strerror(rc));
    return false;
  }
  return true;
}

bool pin_current_thread(const std::vector<int>& cpus, const char* who) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    log().warn("{}: cannot restrict to {} CPUs: {}", who, cpus.size(), std::strerror(rc));
    return false;
  }
  return true;
}

void name_current_thread(const char* name) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%s", name);
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace ferry::core

#include "options.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace ferry_bench {

using namespace std::chrono_literals;

void pin_self(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
    std::fprintf(stderr, "ferry-bench: cannot pin to CPU %d\n", cpu);
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

ferry::EngineConfig engine_config(const Options& o, bool server, const Point& p) {
  const std::vector<int>& cpu = server ? o.server_cpu : o.cpu;
  ferry::EngineConfig c;
  c.provider = o.provider;
  if (!o.nvlink()) c.groups[0].nic_names = o.nic_names;  // nvlink: the GPU's own endpoint
  if (!o.gpu.empty()) {
    c.groups[0].device = ferry::Device::cuda(o.gpu_of(server));
    c.groups[0].insist = true;  // lo / shm are no NICs of the GPU's topology
  }
  c.groups[0].worker_cpu = cpu[0];
  c.callback_cpu = cpu[1];
  c.poll_mode = o.poll_mode();
  c.default_deadline = 60s;
  // One trace per point and side (a later repeat of the point overwrites it).
  if (!o.trace_dir.empty())
    c.trace_file = fmt::format("{}/{}-{}-{}.json", o.trace_dir, kind_name(p.kind), p.size_label(),
                               server ? "server" : "client");
  return c;
}

uint64_t ferry_imms_per_req(const Point& p, size_t nics) {
  if (!p.imm) return 0;
  switch (p.kind) {
    case Kind::kSingle:
      return ferry::ImmPlan::single_write(p.size, {}, nics);
    case Kind::kPaged:
      return ferry::ImmPlan::paged_writes(p.count);
    case Kind::kScatter:
      return p.count * ferry::ImmPlan::scatter_target(p.size, {}, nics);
    case Kind::kBarrier:
      return p.count * ferry::ImmPlan::barrier_target();
    default:
      return 0;
  }
}

size_t effective_window(const Options& o, const Layout& l) {
  if (l.bytes_per_req == 0) return size_t(o.window);
  uint64_t cap = (o.max_inflight_mib << 20) / l.bytes_per_req;
  return size_t(std::clamp<uint64_t>(cap, 1, uint64_t(o.window)));
}

}  // namespace ferry_bench

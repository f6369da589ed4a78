// ferry-idle: CPU an idle adaptive engine costs (docs/PERFORMANCE.md, "Idle
// CPU"). Two engines in this process on one provider exchange one immediate
// (so connections are up), then sit idle; the process' utime + stime from
// /proc/self/stat over the idle interval is what the workers and callback
// threads spent waiting for work.
//
//   ferry-idle [--provider tcp;ofi_rxm|shm|fake] [--seconds S]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"

namespace {

double process_cpu_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  // Fields after the command name (which may hold spaces) start past ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

int measure(const std::string& provider, double seconds) {
  ferry::EngineConfig c;
  c.provider = provider;
  c.groups[0].nic_names = {provider == "tcp;ofi_rxm" ? "lo" : provider};
  ferry::TransferEngine a(c), b(c);
  std::vector<uint8_t> buf(4096);
  auto [h, desc] = b.reg_mr(buf.data(), buf.size());
  auto counter = b.imm_counter(1);
  a.submit_imm(1, desc, ferry::OnDone::none());
  if (!counter.wait(1, std::chrono::seconds(10)).is_ok()) {
    std::fprintf(stderr, "ferry-idle: the immediate did not arrive\n");
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past every spin window
  const double c0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = process_cpu_seconds() - c0;
  std::printf("ferry-idle provider=%s: two idle adaptive engines, %.1f s: %.1f ms CPU per second\n",
              provider.c_str(), wall, 1000.0 * cpu / wall);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string provider = "tcp;ofi_rxm";
  double seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--provider") provider = argv[i + 1];
    if (a == "--seconds") seconds = std::atof(argv[i + 1]);
  }
  // A provider that is not there (a misspelt name) is an error message, not an abort.
  try {
    return measure(provider, seconds);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-idle: %s\n", e.what());
    return 1;
  }
}

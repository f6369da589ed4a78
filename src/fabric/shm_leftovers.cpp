#include "fabric/shm_leftovers.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/log.h"

namespace ferry::fabric {

size_t remove_stale_shm_regions(const std::string& dir, pid_t pid, std::time_t started) {
  const std::string prefix = std::to_string(pid) + ":";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_mtime >= started) continue;  // may be ours
    if (::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

namespace {

// Wall-clock start of this process, seconds, from /proc (boot time + start
// ticks); 0 when unknown (then nothing is removed).
std::time_t process_start() {
  std::ifstream stat_file("/proc/self/stat");
  std::string line;
  if (!std::getline(stat_file, line)) return 0;
  // Field 2 (comm) may hold spaces: fields are counted after its ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) start_ticks = std::stoull(field);
  std::ifstream proc_stat("/proc/stat");
  unsigned long long btime = 0;
  for (std::string key; proc_stat >> key;)
    if (key == "btime") {
      proc_stat >> btime;
      break;
    }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (btime == 0 || hz <= 0) return 0;
  return std::time_t(btime + start_ticks / (unsigned long long)hz);
}

}  // namespace

void remove_own_stale_shm_regions() {
  static std::atomic<pid_t> done_for{0};
  const pid_t pid = ::getpid();
  if (done_for.exchange(pid) == pid) return;
  const std::time_t started = process_start();
  // One second of slack: btime and the start are rounded to whole seconds.
  if (started <= 1) return;
  if (size_t n = remove_stale_shm_regions("/dev/shm", pid, started - 1))
    core::log().info("shm: removed {} region(s) of an earlier process with pid {}", n, pid);
}

}  // namespace ferry::fabric

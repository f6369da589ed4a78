// CPU time of one thread of this process, from /proc (tests and benchmarks).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>

namespace ferry::test {

// utime + stime of thread `tid`, in seconds; -1 if unreadable.
inline double thread_cpu_seconds(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');  // the name may hold spaces; fields follow ')'
  if (close == std::string::npos) return -1;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the name start at 3 (state); utime and stime are 14 and 15.
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// Thread id of the first thread of this process named `name`; 0 if none.
inline pid_t find_thread(const std::string& name) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  pid_t found = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == name) {
      found = pid_t(std::stol(e->d_name));
      break;
    }
  }
  closedir(d);
  return found;
}

}  // namespace ferry::test

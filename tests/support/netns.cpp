#include "support/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ferry::test {

bool enter_netns(const std::string& name) {
  std::string path = "/var/run/netns/" + name;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  return ok;
}

uint64_t tx_bytes(const std::string& iface) {
  std::ifstream f("/proc/self/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != iface) continue;
    std::istringstream in(line.substr(colon + 1));
    uint64_t v[9] = {};
    for (auto& x : v) in >> x;
    return v[8];  // 8 receive fields, then transmit bytes
  }
  return 0;
}

static std::string script() {
  // Tests run from build/tests; the script lives in the source tree.
  return std::string(FERRY_SOURCE_DIR) + "/scripts/netns.sh";
}

bool netns_up(int hosts) {
  if (::geteuid() != 0) return false;
  std::string cmd = "bash " + script() + " up " + std::to_string(hosts) + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

void netns_down() {
  std::string cmd = "bash " + script() + " down >/dev/null 2>&1";
  [[maybe_unused]] int rc = std::system(cmd.c_str());
}

}  // namespace ferry::test

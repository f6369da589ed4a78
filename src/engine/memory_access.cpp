#include "engine/memory_access.h"

#include <cinttypes>
#include <cstdint>
#include <cstdio>

namespace ferry::engine {

bool host_range_writable(const void* ptr, size_t len) {
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return true;
  uintptr_t want = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t end = want + len;
  char line[4352];  // a mapping line: addresses, flags and a path of up to PATH_MAX
  bool ok = true;
  // Mappings are listed in address order: walk them until the range is
  // covered by writable ones, or a gap or a read-only one is found.
  while (std::fgets(line, sizeof(line), f)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3) continue;
    if (hi <= want) continue;
    if (lo > want) break;  // a gap: not host memory we know of; the NIC decides
    // Readable but not writable: read-only memory. No access at all (a
    // reservation, as CUDA makes for its unified address space) is not
    // memory the CPU could write or read; the NIC decides.
    if (perms[0] == 'r' && perms[1] != 'w') {
      ok = false;
      break;
    }
    if (perms[1] != 'w') break;
    want = hi;
    if (want >= end) break;
  }
  std::fclose(f);
  return ok;
}

}  // namespace ferry::engine

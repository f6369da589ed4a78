// Whether this process may write a range of its own host memory, from the
// kernel's view of its mappings.
#pragma once

#include <cstddef>

namespace ferry::engine {

// False only when [ptr, ptr + len) is mapped and some page of it is not
// writable (/proc/self/maps). A range that is not mapped as host memory at all
// (a GPU pointer named as host, a bogus address) counts as writable here: the
// NIC's registration judges it and refuses it with its own error. Registration
// is rare and slow anyway, so reading the map is affordable; a map that cannot
// be read counts as writable too.
bool host_range_writable(const void* ptr, size_t len);

}  // namespace ferry::engine

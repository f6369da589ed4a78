// Network namespaces as simulated hosts (see scripts/netns.sh).
#pragma once

#include <cstdint>
#include <string>

namespace ferry::test {

// Moves the calling (single-threaded) process into namespace `name`.
bool enter_netns(const std::string& name);
// Bytes sent by interface `iface` of the current namespace (/proc/net/dev).
uint64_t tx_bytes(const std::string& iface);
// Creates hosts ferry-h0..h<n-1> with two rails each; false if not permitted.
bool netns_up(int hosts);
void netns_down();

}  // namespace ferry::test

// libfabric Domain peers: which addresses are refused before the provider
// sees them, and the address vector (add_peer / remove_peer). What is watched
// of a peer's liveness is in shm_peers.cpp and socket_peers.cpp.
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include "core/log.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

namespace {

// Length of the "scheme://" prefix when `a` is a NUL-terminated printable
// URI-style name (shm: "fi_shm://<pid>:..."), else 0.
size_t uri_scheme_len(std::span<const uint8_t> a) {
  const auto nul = std::find(a.begin(), a.end(), uint8_t{0});
  if (nul == a.end()) return 0;
  const std::string_view s(reinterpret_cast<const char*>(a.data()),
                           static_cast<size_t>(nul - a.begin()));
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) return 0;
  const size_t pos = s.find("://");
  return pos == std::string_view::npos || pos == 0 ? 0 : pos + 3;
}

}  // namespace

// Providers do not all validate what fi_av_insert gets (shm takes any string
// as a peer name and fails only on first use), so an address that cannot be
// of our format is refused up front. nullptr when it may be ours.
const char* FabricDomain::foreign_address(std::span<const uint8_t> raw) const {
  const size_t scheme = uri_scheme_len(address_);
  if (scheme != 0) {
    if (uri_scheme_len(raw) != scheme || std::memcmp(raw.data(), address_.data(), scheme) != 0) {
      return "name scheme differs";
    }
    return nullptr;
  }
  // Binary addresses (sockaddr, EFA GID+QPN) have one size per fabric.
  return raw.size() != address_.size() ? "length differs" : nullptr;
}

// The shm provider of libfabric 1.17 maps a peer's region on first use and
// crashes the process when that region is gone. A peer whose region does not
// exist (it exited) is therefore refused before it reaches the provider.
const char* FabricDomain::missing_shm_peer(std::span<const uint8_t> raw) const {
  static constexpr std::string_view kScheme = "fi_shm://";
  const size_t len = strnlen(reinterpret_cast<const char*>(raw.data()), raw.size());
  std::string_view name(reinterpret_cast<const char*>(raw.data()), len);
  if (info_.provider != "shm" || !name.starts_with(kScheme)) return nullptr;
  std::string region(name.substr(kScheme.size()));
  std::string path = "/dev/shm/" + region;
  if (::access(path.c_str(), F_OK) != 0) return "its shared-memory region is gone (peer exited)";
  // Regions are named "<pid>:..."; a killed peer leaves its region behind.
  char* end = nullptr;
  long pid = std::strtol(region.c_str(), &end, 10);
  if (end != region.c_str() && *end == ':' && pid > 0 && ::kill(pid_t(pid), 0) != 0 &&
      errno == ESRCH)
    return "its process no longer exists (peer exited)";
  return nullptr;
}

core::PeerId FabricDomain::add_peer(std::span<const uint8_t> raw, Status* error) {
  const std::string& nic = res_->nic_name;
  if (raw.empty() || raw.size() > NetAddr::kMaxRawSize) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_av_insert: bad address length {}", nic,
                                        raw.size())));
    return 0;
  }
  if (const char* why = foreign_address(raw); why != nullptr) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_av_insert: not a {} address of "
                                        "this NIC's format ({}; {} bytes, ours {})",
                                        nic, info_.provider, why, raw.size(), address_.size())));
    return 0;
  }
  if (const char* gone = missing_shm_peer(raw); gone != nullptr) {
    set_error(
        error,
        Status(
            Code::kUnavailable,
            fmt::format("fabric NIC '{}': peer {}: {}", nic,
                        std::string(reinterpret_cast<const char*>(raw.data()),
                                    strnlen(reinterpret_cast<const char*>(raw.data()), raw.size())),
                        gone)));
    return 0;
  }
  std::string key(reinterpret_cast<const char*>(raw.data()), raw.size());
  if (auto it = peers_.find(key); it != peers_.end()) {
    set_error(error, Status::ok());
    return it->second;
  }
  // fi_av_insert takes no length: the provider reads as many bytes as its
  // address format says. Zero padding keeps a short or foreign address from
  // making it read past our buffer.
  std::vector<uint8_t> buf(std::max(raw.size(), peer_addr_len_), 0);
  std::memcpy(buf.data(), raw.data(), raw.size());
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int ret = fi_av_insert(res_->av.get(), buf.data(), 1, &addr, 0, nullptr);
  if (ret != 1 || addr == FI_ADDR_NOTAVAIL) {
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("fabric NIC '{}': fi_av_insert failed: {} ({})", nic,
                                        ret < 0 ? fi_strerror(-ret) : "address rejected", ret)));
    return 0;
  }
  peers_.emplace(std::move(key), addr);
  if (socket_probe_) track_socket_peer(addr, raw);
  if (shm_) {
    track_shm_peer(
        addr, std::string_view(reinterpret_cast<const char*>(raw.data()),
                               strnlen(reinterpret_cast<const char*>(raw.data()), raw.size())));
  }
  set_error(error, Status::ok());
  return addr;
}

void FabricDomain::remove_peer(core::PeerId peer) {
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->second != peer) continue;
    fi_addr_t addr = peer;
    const int ret = fi_av_remove(res_->av.get(), &addr, 1, 0);
    if (ret != 0) {
      core::log().warn("fabric NIC '{}': fi_av_remove failed: {} ({})", res_->nic_name,
                       fi_strerror(-ret), ret);
    }
    peers_.erase(it);
    if (auto tp = socket_peers_.find(peer); tp != socket_peers_.end()) {
      forget_socket_peer(*tp->second);
      socket_peers_.erase(tp);
    }
    if (auto sp = shm_peers_.find(peer); sp != shm_peers_.end()) {
      removed_shm_peers_.push_back(std::move(sp->second));
      shm_peers_.erase(sp);
      last_shm_addr_ = FI_ADDR_NOTAVAIL;
      last_shm_peer_ = nullptr;
    }
    return;
  }
}

}  // namespace ferry::fabric

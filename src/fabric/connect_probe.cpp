#include "fabric/connect_probe.h"

#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace ferry::fabric {

bool ConnectProbe::is_inet(std::span<const uint8_t> addr) noexcept {
  sa_family_t family = 0;
  if (addr.size() < sizeof(family)) return false;
  std::memcpy(&family, addr.data(), sizeof(family));
  if (family == AF_INET) return addr.size() >= sizeof(sockaddr_in);
  if (family == AF_INET6) return addr.size() >= sizeof(sockaddr_in6);
  return false;
}

ConnectProbe::Answer ConnectProbe::start(std::span<const uint8_t> addr,
                                         std::chrono::steady_clock::time_point now) noexcept {
  fd_.reset();
  if (!is_inet(addr)) return Answer::kUnknown;
  sockaddr_storage ss{};
  sa_family_t family = 0;
  std::memcpy(&family, addr.data(), sizeof(family));
  const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&ss, addr.data(), len);
  core::UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Answer::kUnknown;
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) == 0)
    return Answer::kReachable;
  const int err = errno;
  if (err == EINPROGRESS) {
    fd_ = std::move(fd);
    started_ = now;
    return Answer::kPending;
  }
  return err == ECONNREFUSED ? Answer::kRefused : Answer::kUnknown;
}

ConnectProbe::Answer ConnectProbe::poll(std::chrono::steady_clock::time_point now,
                                        std::chrono::milliseconds timeout) noexcept {
  if (!fd_.valid()) return Answer::kIdle;
  pollfd p{fd_.get(), POLLOUT, 0};
  if (::poll(&p, 1, 0) == 0) {
    if (now - started_ < timeout) return Answer::kPending;
    fd_.reset();
    return Answer::kUnknown;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  fd_.reset();
  if (err == 0) return Answer::kReachable;
  return err == ECONNREFUSED ? Answer::kRefused : Answer::kUnknown;
}

}  // namespace ferry::fabric

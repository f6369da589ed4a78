#include "fabric/connect_probe.h"

#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::fabric {

bool ConnectProbe::is_inet(std::span<const uint8_t> addr) noexcept {
  sa_family_t family = 0;
  if (addr.size() < sizeof(family)) return false;
  std::memcpy(&family, addr.data(), sizeof(family));
  if (family == AF_INET) return addr.size() >= sizeof(sockaddr_in);
  if (family == AF_INET6) return addr.size() >= sizeof(sockaddr_in6);
  return false;
}

void ConnectProbe::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

ConnectProbe::Answer ConnectProbe::start(std::span<const uint8_t> addr,
                                         std::chrono::steady_clock::time_point now) noexcept {
  close();
  if (!is_inet(addr)) return Answer::kUnknown;
  sockaddr_storage ss{};
  sa_family_t family = 0;
  std::memcpy(&family, addr.data(), sizeof(family));
  const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&ss, addr.data(), len);
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Answer::kUnknown;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&ss), len) == 0) {
    ::close(fd);
    return Answer::kReachable;
  }
  const int err = errno;
  if (err == EINPROGRESS) {
    fd_ = fd;
    started_ = now;
    return Answer::kPending;
  }
  ::close(fd);
  return err == ECONNREFUSED ? Answer::kRefused : Answer::kUnknown;
}

ConnectProbe::Answer ConnectProbe::poll(std::chrono::steady_clock::time_point now,
                                        std::chrono::milliseconds timeout) noexcept {
  if (fd_ < 0) return Answer::kIdle;
  pollfd p{fd_, POLLOUT, 0};
  if (::poll(&p, 1, 0) == 0) {
    if (now - started_ < timeout) return Answer::kPending;
    close();
    return Answer::kUnknown;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  close();
  if (err == 0) return Answer::kReachable;
  return err == ECONNREFUSED ? Answer::kRefused : Answer::kUnknown;
}

}  // namespace ferry::fabric

// Whether anything still listens at a peer's TCP address, asked with one
// non-blocking connect(2).
//
// libfabric 1.17's tcp;ofi_rxm re-connects to a peer whose connection broke
// and, when the connect is refused, retries every few seconds for ever: a
// write queued for a peer that has exited never completes and never fails.
// A refused connect to the address the peer listens on is the plain answer
// that its process is gone (the kernel refuses on its behalf); the Domain asks
// it only for a peer whose writes have stopped completing.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <span>

#include "core/unique_fd.h"

namespace ferry::fabric {

class ConnectProbe {
 public:
  enum class Answer : uint8_t {
    kIdle,       // nothing asked yet, or the last answer was taken
    kPending,    // the connect is in progress
    kRefused,    // ECONNREFUSED: nothing listens at that address
    kReachable,  // the connect completed: something listens
    kUnknown,    // any other outcome (no route, no socket, timed out)
  };

  ConnectProbe() = default;

  // The sockaddr_in or sockaddr_in6 in `addr`; false when it is neither.
  static bool is_inet(std::span<const uint8_t> addr) noexcept;

  // Starts a connect to `addr` (an is_inet() address); the answer may come at once.
  Answer start(std::span<const uint8_t> addr, std::chrono::steady_clock::time_point now) noexcept;
  // The answer so far, without blocking; kUnknown once `timeout` has passed
  // since start() with no answer.
  Answer poll(std::chrono::steady_clock::time_point now,
              std::chrono::milliseconds timeout) noexcept;
  bool pending() const noexcept { return fd_.valid(); }

 private:
  core::UniqueFd fd_;
  std::chrono::steady_clock::time_point started_{};
};

}  // namespace ferry::fabric

// Multi-process test support: fork a peer process (before the parent starts
// any engine, so no threads are duplicated) and talk to it over a socketpair.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::test {

// Length-prefixed messages over a stream socket; every receive has a deadline.
class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd) : fd_(fd) {}
  Channel(Channel&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Channel& operator=(Channel&& o) noexcept;
  ~Channel();

  bool send(const std::vector<uint8_t>& msg);
  bool send(const std::string& msg) { return send(std::vector<uint8_t>(msg.begin(), msg.end())); }
  std::optional<std::vector<uint8_t>> recv(
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  std::optional<std::string> recv_str(std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  bool read_exact(uint8_t* p, size_t n, std::chrono::steady_clock::time_point deadline);
  int fd_ = -1;
};

class Peer {
 public:
  // Runs fn(channel) in a child process; its return value is the exit code.
  // Call it before this process starts threads (an engine): see PeerSpawner.
  explicit Peer(std::function<int(Channel&)> fn);
  // Adopts a running child (PeerSpawner::spawn).
  Peer(pid_t pid, Channel ch) : pid_(pid), ch_(std::move(ch)) {}
  ~Peer();
  Channel& channel() { return ch_; }
  // Exit code of the child, or -1 when it did not exit before the deadline
  // (it is then killed), or 128+signal when it died of a signal.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(120));
  void kill();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  Channel ch_;
  bool reaped_ = false;
  int status_ = -1;
};

// Starts peers after this process has started threads. The child of a fork
// in a multi-threaded process may only call async-signal-safe functions until
// it execs (a lock another thread held at the fork stays locked in the child;
// ThreadSanitizer refuses to start threads there at all), yet a peer starts an
// engine. So the spawner process is forked while the caller is still
// single-threaded, and forks every peer on request: each peer is the child of a
// single-threaded process. The caller is made a child subreaper
// (PR_SET_CHILD_SUBREAPER) and the spawner forks each peer through a short-lived
// intermediate, so the peer is re-parented to the caller: Peer::wait and
// Peer::kill work on it as on a direct child. The channel travels over a Unix
// socket (SCM_RIGHTS).
class PeerSpawner {
 public:
  // Forks the spawner; every spawn() runs fn(channel) in a new peer.
  explicit PeerSpawner(std::function<int(Channel&)> fn);
  ~PeerSpawner();
  PeerSpawner(const PeerSpawner&) = delete;
  PeerSpawner& operator=(const PeerSpawner&) = delete;
  // A new peer, or nullptr when the spawner failed.
  std::unique_ptr<Peer> spawn();

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

// Deterministic byte pattern so both sides can check data without sending it.
uint8_t pattern_byte(uint64_t seed, uint64_t i);
void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed);
// Index of the first mismatching byte, or -1.
int64_t check_pattern(const uint8_t* p, uint64_t len, uint64_t seed);

// Polls pred until true or the deadline passes.
bool wait_until(const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace ferry::test

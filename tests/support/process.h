// Multi-process test support: fork a peer process (before the parent starts
// any engine, so no threads are duplicated) and talk to it over a socketpair.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
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
  explicit Peer(std::function<int(Channel&)> fn);
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

// Deterministic byte pattern so both sides can check data without sending it.
uint8_t pattern_byte(uint64_t seed, uint64_t i);
void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed);
// Index of the first mismatching byte, or -1.
int64_t check_pattern(const uint8_t* p, uint64_t len, uint64_t seed);

// Polls pred until true or the deadline passes.
bool wait_until(const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace ferry::test

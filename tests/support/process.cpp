#include "process.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

namespace ferry::test {

using Clock = std::chrono::steady_clock;

Channel& Channel::operator=(Channel&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

bool Channel::send(const std::vector<uint8_t>& msg) {
  uint64_t n = msg.size();
  std::vector<uint8_t> buf(reinterpret_cast<const uint8_t*>(&n),
                           reinterpret_cast<const uint8_t*>(&n) + sizeof(n));
  buf.insert(buf.end(), msg.begin(), msg.end());
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t w = ::send(fd_, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += w;
  }
  return true;
}

bool Channel::read_exact(uint8_t* p, size_t n, Clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t got = ::recv(fd_, p + off, n - off, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    off += got;
  }
  return true;
}

std::optional<std::vector<uint8_t>> Channel::recv(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  uint64_t n = 0;
  if (!read_exact(reinterpret_cast<uint8_t*>(&n), sizeof(n), deadline)) return std::nullopt;
  if (n > (1ull << 30)) return std::nullopt;
  std::vector<uint8_t> msg(n);
  if (n && !read_exact(msg.data(), n, deadline)) return std::nullopt;
  return msg;
}

std::optional<std::string> Channel::recv_str(std::chrono::milliseconds timeout) {
  auto m = recv(timeout);
  if (!m) return std::nullopt;
  return std::string(m->begin(), m->end());
}

Peer::Peer(std::function<int(Channel&)> fn) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    std::perror("socketpair");
    std::abort();
  }
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(sv[0]);
    Channel ch(sv[1]);
    int code = 1;
    try {
      code = fn(ch);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "peer process: uncaught exception: %s\n", e.what());
      code = 3;
    } catch (...) {
      code = 4;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(sv[1]);
  ch_ = Channel(sv[0]);
}

Peer::~Peer() {
  if (!reaped_ && pid_ > 0) {
    if (wait(std::chrono::seconds(10)) == -1) kill();
  }
}

void Peer::kill() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int st;
  ::waitpid(pid_, &st, 0);
  reaped_ = true;
  status_ = 128 + SIGKILL;
}

int Peer::wait(std::chrono::milliseconds timeout) {
  if (reaped_) return status_;
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return status_;
    }
    if (Clock::now() > deadline) {
      kill();
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

uint8_t pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + (i / 8) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return uint8_t(x >> (8 * (i % 8)));
}

void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed) {
  for (uint64_t i = 0; i < len; ++i) p[i] = pattern_byte(seed, i);
}

int64_t check_pattern(const uint8_t* p, uint64_t len, uint64_t seed) {
  for (uint64_t i = 0; i < len; ++i)
    if (p[i] != pattern_byte(seed, i)) return int64_t(i);
  return -1;
}

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  int spins = 0;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace ferry::test

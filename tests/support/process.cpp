#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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

namespace {

// The body of a peer process: never returns.
[[noreturn]] void run_peer(const std::function<int(Channel&)>& fn, int fd) {
  Channel ch(fd);
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

// A pid and, when fd >= 0, a file descriptor (SCM_RIGHTS) over a Unix socket.
bool send_pid_fd(int sock, int32_t pid, int fd) {
  iovec iov{&pid, sizeof(pid)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = buf;
    msg.msg_controllen = sizeof(buf);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t r;
  do r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  return r == ssize_t(sizeof(pid));
}

bool recv_pid_fd(int sock, int32_t* pid, int* fd) {
  iovec iov{pid, sizeof(*pid)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = buf;
  msg.msg_controllen = sizeof(buf);
  ssize_t r;
  do r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  *fd = -1;
  if (r != ssize_t(sizeof(*pid))) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  return true;
}

bool read_full(int fd, void* p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::read(fd, static_cast<char*>(p) + off, n - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += r;
  }
  return true;
}

// Exit status as Peer::wait reports it, -1 when the child is still running
// at the deadline.
int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || Clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The harness cannot go on without its channel to a child.
void socketpair_or_abort(int sv[2]) {
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    std::perror("socketpair");
    std::abort();
  }
}

}  // namespace

Peer::Peer(std::function<int(Channel&)> fn) {
  int sv[2];
  socketpair_or_abort(sv);
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(sv[0]);
    run_peer(fn, sv[1]);
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
  int st = wait_child(pid_, timeout);
  if (st < 0) {
    kill();
    return -1;
  }
  reaped_ = true;
  status_ = st;
  return status_;
}

PeerSpawner::PeerSpawner(std::function<int(Channel&)> fn) {
  // Peers forked below are re-parented to this process when their
  // intermediate parent exits.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    std::perror("prctl(PR_SET_CHILD_SUBREAPER)");
    std::abort();
  }
  int sv[2];
  socketpair_or_abort(sv);
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ != 0) {
    ::close(sv[1]);
    fd_ = sv[0];
    return;
  }
  // The spawner: one byte per request; end of file (the caller is done or
  // gone) ends it.
  ::close(sv[0]);
  const int ctl = sv[1];
  for (;;) {
    char op = 0;
    if (!read_full(ctl, &op, 1) || op != 's') ::_exit(0);
    int ch[2], pp[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch) != 0) ::_exit(1);
    if (::pipe2(pp, O_CLOEXEC) != 0) ::_exit(1);
    std::fflush(nullptr);
    pid_t mid = ::fork();
    if (mid == 0) {
      pid_t peer = ::fork();
      if (peer == 0) {
        ::close(ctl);
        ::close(ch[0]);
        ::close(pp[0]);
        ::close(pp[1]);
        run_peer(fn, ch[1]);
      }
      int32_t p = peer;
      [[maybe_unused]] auto w = ::write(pp[1], &p, sizeof(p));
      ::_exit(0);
    }
    ::close(pp[1]);
    ::close(ch[1]);
    int32_t peer = -1;
    if (mid > 0) {
      if (!read_full(pp[0], &peer, sizeof(peer))) peer = -1;
      int st;
      ::waitpid(mid, &st, 0);  // from here on the peer is the caller's child
    }
    ::close(pp[0]);
    bool sent = send_pid_fd(ctl, peer, peer > 0 ? ch[0] : -1);
    ::close(ch[0]);
    if (!sent) ::_exit(1);
  }
}

PeerSpawner::~PeerSpawner() {
  if (fd_ >= 0) ::close(fd_);
  if (pid_ > 0 && wait_child(pid_, std::chrono::seconds(10)) < 0) {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

std::unique_ptr<Peer> PeerSpawner::spawn() {
  if (pid_ <= 0 || fd_ < 0) return nullptr;
  const char op = 's';
  if (::send(fd_, &op, 1, MSG_NOSIGNAL) != 1) return nullptr;
  int32_t pid = -1;
  int fd = -1;
  if (!recv_pid_fd(fd_, &pid, &fd) || pid <= 0 || fd < 0) {
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  return std::make_unique<Peer>(pid_t(pid), Channel(fd));
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

// Control channel between the two ferry-bench processes: length-prefixed
// messages over a socketpair, with a tiny append-only encoder. The data path
// never touches it; it only sequences points, so simplicity beats speed.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ferry_bench {

enum class MsgType : uint32_t {
  kHello,       // raw endpoint addresses and region keys (both directions)
  kRawRun,      // server: serve a raw phase (mode, point) until kRawStop
  kRawStop,     // client: raw phase over (requests submitted)
  kFerryBegin,  // client: start an engine for a point (client descriptor)
  kFerryEnd,    // client: ferry phase over (requests submitted)
  kReply,       // server: answer to any of the above
  kQuit,
};

class Writer {
 public:
  template <typename T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& bytes(const std::vector<uint8_t>& b) {
    put<uint64_t>(b.size());
    buf_.insert(buf_.end(), b.begin(), b.end());
    return *this;
  }
  Writer& str(const std::string& s) { return bytes(std::vector<uint8_t>(s.begin(), s.end())); }
  const std::vector<uint8_t>& data() const { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  explicit Reader(std::vector<uint8_t> b) : buf_(std::move(b)) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, buf_.data() + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  std::vector<uint8_t> bytes() {
    auto n = get<uint64_t>();
    need(n);
    std::vector<uint8_t> b(buf_.begin() + off_, buf_.begin() + off_ + n);
    off_ += n;
    return b;
  }
  std::string str() {
    auto b = bytes();
    return std::string(b.begin(), b.end());
  }

 private:
  void need(size_t n) const {
    if (off_ + n > buf_.size()) throw std::runtime_error("control message truncated");
  }
  std::vector<uint8_t> buf_;
  size_t off_ = 0;
};

inline void write_full(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::write(fd, b, n);
    if (r <= 0) throw std::runtime_error("control channel closed (write)");
    b += r;
    n -= size_t(r);
  }
}

inline void read_full(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, b, n);
    if (r <= 0) throw std::runtime_error("control channel closed (peer exited?)");
    b += r;
    n -= size_t(r);
  }
}

inline void send_msg(int fd, MsgType t, const Writer& w = Writer()) {
  uint32_t type = uint32_t(t);
  uint64_t n = w.data().size();
  write_full(fd, &type, 4);
  write_full(fd, &n, 8);
  write_full(fd, w.data().data(), n);
}

inline std::pair<MsgType, Reader> recv_any(int fd) {
  uint32_t type;
  uint64_t n;
  read_full(fd, &type, 4);
  read_full(fd, &n, 8);
  if (n > (64u << 20)) throw std::runtime_error("control message too large");
  std::vector<uint8_t> b(n);
  read_full(fd, b.data(), n);
  return {MsgType(type), Reader(std::move(b))};
}

inline Reader recv_msg(int fd, MsgType expect) {
  auto [type, r] = recv_any(fd);
  if (type != expect)
    throw std::runtime_error("control channel: unexpected message " +
                             std::to_string(uint32_t(type)) + " (wanted " +
                             std::to_string(uint32_t(expect)) + ")");
  return std::move(r);
}

// True when a message is waiting (never blocks).
inline bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace ferry_bench

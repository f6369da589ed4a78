// Little-endian byte writer/reader for everything that crosses a process
// boundary. The reader never reads past its span: every decoder built on it
// reports truncation instead of trusting a peer's lengths.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::core {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<uint8_t>(uint64_t(v) >> (8 * i)));
  }
  void put_bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }

 private:
  std::vector<uint8_t>& out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> in, const char* what) : in_(in), what_(what) {}
  template <typename T>
  T get() {
    static_assert(std::is_integral_v<T>);
    need(sizeof(T));
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(in_[pos_ + i]) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::span<const uint8_t> get_bytes(size_t n) {
    need(n);
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t remaining() const { return in_.size() - pos_; }
  void expect_end() const {
    if (remaining() != 0)
      throw Error(Code::kInvalidArgument,
                  std::string(what_) + ": " + std::to_string(remaining()) + " trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (n > in_.size() - pos_)
      throw Error(Code::kInvalidArgument, std::string(what_) + ": truncated at byte " +
                                              std::to_string(pos_) + " of " +
                                              std::to_string(in_.size()));
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* what_;
};

std::string to_hex(std::span<const uint8_t> b);
std::vector<uint8_t> from_hex(std::string_view hex, const char* what);

}  // namespace ferry::core

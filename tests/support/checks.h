// Small helpers of the engine tests: the error code a call throws, and a
// registered buffer.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "ferry/ferry.h"

namespace ferry::test {

// The code of the ferry::Error f throws (kOk if none); every error names its cause.
template <typename F>
Code code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_FALSE(e.status().message().empty());
    return e.code();
  }
  return Code::kOk;
}

struct Region {
  std::vector<uint8_t> buf;
  MrHandle h;
  MrDesc d;
};

// `len` bytes registered on `e`: zeros, or byte i = seed + 7 i.
inline Region region(TransferEngine& e, size_t len, std::optional<uint8_t> seed = std::nullopt) {
  Region r;
  r.buf.resize(len);
  if (seed)
    for (size_t i = 0; i < len; ++i) r.buf[i] = uint8_t(*seed + i * 7);
  std::tie(r.h, r.d) = e.reg_mr(r.buf.data(), len);
  return r;
}

}  // namespace ferry::test

// Small helpers of the engine tests: the error code a call throws, a
// registered buffer, a spinning take from a counter, and writes from several
// threads at once checked byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "ferry/ferry.h"
#include "support/process.h"

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

// Takes one arrival by spinning on try_consume, which polls for the worker,
// never sleeping (a wait that sleeps hands the NICs back to the worker); false
// after 10 s without one.
inline bool take_one_spinning(ImmCounter& c) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!c.try_consume(1))
    if (std::chrono::steady_clock::now() > deadline) return false;
  return true;
}

// `threads` threads each submit `writes` single writes of `len` bytes with
// immediate `imm` from a to b, each with an OnDone counter: every write lands
// once with its bytes, is counted once by b and completes once without error.
inline void writes_from_threads(TransferEngine& a, TransferEngine& b, int threads, int writes,
                                size_t len, uint32_t imm, uint8_t seed) {
  auto src = region(a, size_t(threads) * len, seed);
  auto dst = region(b, size_t(threads) * writes * len);
  auto arrived = b.imm_counter(imm);
  std::atomic<uint64_t> done{0}, errors{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < threads; ++t)
    submitters.emplace_back([&, t] {
      for (int i = 0; i < writes; ++i)
        a.submit_single_write(len, imm, src.h, t * len, dst.d, (size_t(t) * writes + i) * len,
                              OnDone::counter(done, &errors));
    });
  for (auto& th : submitters) th.join();
  const uint64_t total = uint64_t(threads) * writes;
  ASSERT_TRUE(arrived.wait(int64_t(total), std::chrono::seconds(20)).is_ok());
  ASSERT_TRUE(wait_until([&] { return done.load() == total; }, std::chrono::seconds(20)))
      << done.load() << " completions";
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(arrived.value(), 0);
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < writes; ++i)
      ASSERT_EQ(std::memcmp(dst.buf.data() + (size_t(t) * writes + i) * len,
                            src.buf.data() + t * len, len),
                0)
          << "thread " << t << " write " << i;
}

}  // namespace ferry::test

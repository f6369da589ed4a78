#include <gtest/gtest.h>

#include <random>

#include "ferry/ferry.h"

namespace ferry {
namespace {

TEST(NetAddr, RoundTripsThroughBytesAndHex) {
  std::vector<uint8_t> raw = {1, 2, 3, 250, 0, 9};
  NetAddr a(Transport::kFabric, 0x1122334455667788ull, raw);
  EXPECT_EQ(NetAddr::from_bytes(a.bytes()), a);
  EXPECT_EQ(NetAddr::from_hex(a.to_hex()), a);
  EXPECT_EQ(a.incarnation(), 0x1122334455667788ull);
  EXPECT_EQ(std::vector<uint8_t>(a.raw().begin(), a.raw().end()), raw);
  EXPECT_EQ(a.transport(), Transport::kFabric);
  EXPECT_EQ(std::hash<NetAddr>{}(a), std::hash<NetAddr>{}(NetAddr::from_hex(a.to_hex())));
}

TEST(NetAddr, RejectsEveryTruncationAndUnknownTransport) {
  NetAddr a(Transport::kVerbs, 5, std::vector<uint8_t>(26, 7));
  auto b = a.bytes();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + n);
    EXPECT_THROW(NetAddr::from_bytes(cut), Error) << n;
  }
  std::vector<uint8_t> bad(b.begin(), b.end());
  bad[1] = 42;
  EXPECT_THROW(NetAddr::from_bytes(bad), Error);
  EXPECT_THROW(NetAddr(Transport::kFabric, 1, {}), Error);
}

TEST(MrDesc, RoundTripsAndRejectsCorruption) {
  MrDesc d;
  d.ptr = 0x7f0000001000;
  d.len = 1 << 30;
  d.device = Device::cuda(3);
  for (int i = 0; i < 4; ++i)
    d.nics.push_back({NetAddr(Transport::kFabric, 9, std::vector<uint8_t>(32, uint8_t(i))),
                      uint64_t(1000 + i), d.ptr});
  EXPECT_EQ(MrDesc::from_bytes(d.to_bytes()), d);
  EXPECT_EQ(MrDesc::from_hex(d.to_hex()), d);
  auto b = d.to_bytes();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + n);
    EXPECT_THROW(MrDesc::from_bytes(cut), Error) << n;
  }
  // Random corruption never crashes: it decodes or throws Error.
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    auto c = b;
    c[rng() % c.size()] = uint8_t(rng());
    try {
      MrDesc::from_bytes(c);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
    }
  }
}

TEST(Status, OkIsEmptyAndErrorsNameTheirCode) {
  Status ok;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.to_string(), "OK");
  Status e(Code::kOutOfRange, "past the end");
  EXPECT_EQ(e.to_string(), "OUT_OF_RANGE: past the end");
  Error err(e);
  EXPECT_EQ(err.code(), Code::kOutOfRange);
  EXPECT_STREQ(err.what(), "OUT_OF_RANGE: past the end");
}

}  // namespace
}  // namespace ferry

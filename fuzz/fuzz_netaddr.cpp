// Fuzzes NetAddr::from_bytes and NetAddr::from_hex, the decoders of the endpoint
// addresses that peers and users hand to an engine.
//
// Every input is fed to both decoders (as bytes, and as a hex string), and is
// also read as the fields of an address to encode. Properties:
//  - a rejection is ferry::Error(kInvalidArgument), never another exception or a crash;
//  - whatever decodes re-encodes to exactly the input bytes (the encoding is
//    canonical), and decode(encode(x)) == x through both bytes and hex;
//  - the accessors agree with the header fields; raw() is 1..kMaxRawSize bytes;
//  - from_hex(s) accepts exactly when s is valid hex of an address from_bytes accepts;
//  - every address the constructor accepts round-trips.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/types.h"
#include "fuzz_check.h"

using ferry::NetAddr;
using ferry::Transport;
using ferry::fuzz::decodes;

namespace {

// Reference hex decoder: nullopt unless non-empty, even length, all hex digits.
std::optional<std::vector<uint8_t>> ref_unhex(std::string_view s) {
  if (s.empty() || s.size() % 2) return std::nullopt;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < s.size(); i += 2) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int hi = nib(s[i]), lo = nib(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(uint8_t(hi << 4 | lo));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

void check_decoded(const NetAddr& a, std::span<const uint8_t> in) {
  // Canonical: the decoded address is the input, byte for byte.
  FUZZ_CHECK(std::equal(a.bytes().begin(), a.bytes().end(), in.begin(), in.end()));
  FUZZ_CHECK(!a.empty());
  FUZZ_CHECK(a.bytes().size() >= NetAddr::kHeaderSize);
  FUZZ_CHECK(uint8_t(a.transport()) == in[1]);
  FUZZ_CHECK(a.transport() == Transport::kFabric || a.transport() == Transport::kVerbs ||
             a.transport() == Transport::kNvlink || a.transport() == Transport::kFake);
  uint64_t inc = 0;
  for (int i = 0; i < 8; ++i) inc |= uint64_t(in[2 + i]) << (8 * i);
  FUZZ_CHECK(a.incarnation() == inc);
  FUZZ_CHECK(!a.raw().empty() && a.raw().size() <= NetAddr::kMaxRawSize);
  FUZZ_CHECK(a.raw().size() == size_t(in[10] | in[11] << 8));
  FUZZ_CHECK(a.raw().size() + NetAddr::kHeaderSize == in.size());
  FUZZ_CHECK(!a.brief().empty());
  // Round trips: bytes, hex, and the constructor from the parts.
  NetAddr b = NetAddr::from_bytes(a.bytes());
  FUZZ_CHECK(b == a && b.hash() == a.hash());
  std::string hex = a.to_hex();
  FUZZ_CHECK(hex.size() == 2 * in.size());
  FUZZ_CHECK(NetAddr::from_hex(hex) == a);
  FUZZ_CHECK(NetAddr(a.transport(), a.incarnation(), a.raw()) == a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);

  // 1. The input as address bytes.
  std::optional<NetAddr> a;
  if (decodes([&] { a = NetAddr::from_bytes(in); })) check_decoded(*a, in);

  // 2. The input as a hex string.
  std::string_view hex(reinterpret_cast<const char*>(data), size);
  std::optional<NetAddr> h;
  bool hex_ok = decodes([&] { h = NetAddr::from_hex(hex); });
  auto ref = ref_unhex(hex);
  if (!ref) {
    FUZZ_CHECK(!hex_ok);
  } else {
    std::optional<NetAddr> viab;
    bool bytes_ok = decodes([&] { viab = NetAddr::from_bytes(*ref); });
    FUZZ_CHECK(hex_ok == bytes_ok);
    if (hex_ok) {
      FUZZ_CHECK(*h == *viab);
      FUZZ_CHECK(h->to_hex() == lower(hex));
      check_decoded(*h, *ref);
    }
  }

  // 3. The input as the parts of an address: encode, decode, compare.
  FuzzedDataProvider fdp(data, size);
  auto t = fdp.ConsumeIntegral<uint8_t>();
  auto inc = fdp.ConsumeIntegral<uint64_t>();
  auto raw = fdp.ConsumeRemainingBytes<uint8_t>();
  bool valid_t = t >= uint8_t(Transport::kFabric) && t <= uint8_t(Transport::kFake);
  if (valid_t) {
    std::optional<NetAddr> c;
    bool ok = decodes([&] { c = NetAddr(Transport(t), inc, raw); });
    FUZZ_CHECK(ok == (!raw.empty() && raw.size() <= NetAddr::kMaxRawSize));
    if (ok) {
      FUZZ_CHECK(c->transport() == Transport(t) && c->incarnation() == inc);
      FUZZ_CHECK(std::equal(raw.begin(), raw.end(), c->raw().begin(), c->raw().end()));
      check_decoded(*c, c->bytes());
    }
  }
  return 0;
}

// Fuzzes MrDesc::from_bytes and MrDesc::from_hex, the decoders of the region
// descriptors that peers send (and that users pass back in from storage).
//
// Every input is fed to both decoders (as bytes, and as a hex string), and is
// also read as the fields of a descriptor to encode. Properties:
//  - a rejection is ferry::Error(kInvalidArgument), never another exception or a crash;
//  - whatever decodes re-encodes to exactly the input bytes, and
//    decode(encode(x)) == x through both bytes and hex;
//  - a decoded descriptor is inside the documented domain: 1..16 NICs, each with a
//    valid address; a known device kind; ordinal >= 0; ptr + len does not wrap;
//  - from_hex(s) accepts exactly when s is hex of bytes from_bytes accepts;
//  - a descriptor built from arbitrary fields decodes after encoding exactly when
//    it is inside that domain, and then equals the original.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/types.h"
#include "fuzz_check.h"

using ferry::Device;
using ferry::MrDesc;
using ferry::NetAddr;
using ferry::Transport;
using ferry::fuzz::decodes;

namespace {

constexpr size_t kMaxDescNics = 16;  // as documented by the decoder's error message

bool in_domain(const MrDesc& d) {
  if (d.nics.empty() || d.nics.size() > kMaxDescNics) return false;
  if (uint8_t(d.device.kind) > uint8_t(Device::Kind::kCuda) || d.device.ordinal < 0) return false;
  if (d.ptr + d.len < d.ptr) return false;
  for (const auto& n : d.nics)
    if (n.addr.empty()) return false;
  return true;
}

void check_decoded(const MrDesc& d, std::span<const uint8_t> in) {
  FUZZ_CHECK(in_domain(d));
  auto enc = d.to_bytes();
  FUZZ_CHECK(std::equal(enc.begin(), enc.end(), in.begin(), in.end()));
  FUZZ_CHECK(MrDesc::from_bytes(enc) == d);
  FUZZ_CHECK(MrDesc::from_hex(d.to_hex()) == d);
  for (const auto& n : d.nics) FUZZ_CHECK(NetAddr::from_bytes(n.addr.bytes()) == n.addr);
  FUZZ_CHECK(!d.device.to_string().empty());
}

std::optional<std::vector<uint8_t>> ref_unhex(std::string_view s) {
  if (s.empty() || s.size() % 2) return std::nullopt;
  std::vector<uint8_t> out;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); i += 2) {
    int hi = nib(s[i]), lo = nib(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(uint8_t(hi << 4 | lo));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);

  // 1. The input as descriptor bytes.
  std::optional<MrDesc> d;
  if (decodes([&] { d = MrDesc::from_bytes(in); })) check_decoded(*d, in);

  // 2. The input as a hex string.
  std::string_view hex(reinterpret_cast<const char*>(data), size);
  std::optional<MrDesc> h;
  bool hex_ok = decodes([&] { h = MrDesc::from_hex(hex); });
  auto ref = ref_unhex(hex);
  if (!ref) {
    FUZZ_CHECK(!hex_ok);
  } else {
    std::optional<MrDesc> viab;
    bool bytes_ok = decodes([&] { viab = MrDesc::from_bytes(*ref); });
    FUZZ_CHECK(hex_ok == bytes_ok);
    if (hex_ok) {
      FUZZ_CHECK(*h == *viab);
      check_decoded(*h, *ref);
    }
  }

  // 3. The input as the fields of a descriptor: encode, decode, compare.
  FuzzedDataProvider fdp(data, size);
  MrDesc x;
  x.ptr = fdp.ConsumeIntegral<uint64_t>();
  x.len = fdp.ConsumeIntegral<uint64_t>();
  x.device.kind = Device::Kind(fdp.ConsumeIntegralInRange<uint8_t>(0, 2));
  x.device.ordinal = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int32_t>(0, 15)
                                       : fdp.ConsumeIntegral<int32_t>();
  x.writable = fdp.ConsumeBool();
  size_t n = fdp.ConsumeIntegralInRange<size_t>(0, kMaxDescNics + 2);
  for (size_t i = 0; i < n && fdp.remaining_bytes() > 0; ++i) {
    MrDesc::Nic nic;
    auto t = Transport(fdp.ConsumeIntegralInRange<uint8_t>(1, 4));
    auto inc = fdp.ConsumeIntegral<uint64_t>();
    auto raw = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange<size_t>(1, 64));
    if (!raw.empty()) nic.addr = NetAddr(t, inc, raw);  // empty raw: leave the address empty
    nic.rkey = fdp.ConsumeIntegral<uint64_t>();
    nic.base = fdp.ConsumeIntegral<uint64_t>();
    x.nics.push_back(std::move(nic));
  }
  auto enc = x.to_bytes();
  std::optional<MrDesc> y;
  bool ok = decodes([&] { y = MrDesc::from_bytes(enc); });
  FUZZ_CHECK(ok == in_domain(x));
  if (ok) {
    FUZZ_CHECK(*y == x);
    check_decoded(*y, enc);
  }
  return 0;
}

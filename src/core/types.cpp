#include <fmt/format.h>

#include <cstring>

#include "core/wire.h"
#include "ferry/engine.h"
#include "ferry/types.h"

namespace ferry {
namespace core {

std::string to_hex(std::span<const uint8_t> b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (uint8_t x : b) {
    s.push_back(kDigits[x >> 4]);
    s.push_back(kDigits[x & 15]);
  }
  return s;
}

std::vector<uint8_t> from_hex(std::string_view hex, const char* what) {
  if (hex.empty() || hex.size() % 2 != 0)
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: hex string must be non-empty and of even length (got {})", what,
                            hex.size()));
  auto nibble = [&](char c, size_t pos) -> uint8_t {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(Code::kInvalidArgument, fmt::format("{}: bad hex digit at {}", what, pos));
  };
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = uint8_t(nibble(hex[2 * i], 2 * i) << 4 | nibble(hex[2 * i + 1], 2 * i + 1));
  return out;
}

}  // namespace core

std::string Device::to_string() const {
  return is_host() ? std::string("host") : fmt::format("cuda:{}", ordinal);
}

// ---------------------------------------------------------------- NetAddr

NetAddr::NetAddr(Transport t, uint64_t incarnation, std::span<const uint8_t> raw) {
  if (raw.empty() || raw.size() > kMaxRawSize)
    throw Error(
        Code::kInvalidArgument,
        fmt::format("NetAddr: raw address of {} bytes (1..{} allowed)", raw.size(), kMaxRawSize));
  std::vector<uint8_t> b;
  b.reserve(kHeaderSize + raw.size());
  core::ByteWriter w(b);
  w.put<uint8_t>(kVersion);
  w.put<uint8_t>(static_cast<uint8_t>(t));
  w.put<uint64_t>(incarnation);
  w.put<uint16_t>(static_cast<uint16_t>(raw.size()));
  w.put_bytes(raw);
  // FNV-1a, once: addresses are hashed on every peer lookup.
  uint64_t h = 1469598103934665603ull;
  for (uint8_t x : b) h = (h ^ x) * 1099511628211ull;
  hash_ = h;
  bytes_ = std::make_shared<const std::vector<uint8_t>>(std::move(b));
}

NetAddr NetAddr::from_bytes(std::span<const uint8_t> bytes) {
  core::ByteReader r(bytes, "NetAddr");
  auto version = r.get<uint8_t>();
  if (version != kVersion)
    throw Error(
        Code::kInvalidArgument,
        fmt::format("NetAddr: unsupported version {} (this build reads {})", version, kVersion));
  auto t = r.get<uint8_t>();
  if (t < uint8_t(Transport::kFabric) || t > uint8_t(Transport::kFake))
    throw Error(Code::kInvalidArgument, fmt::format("NetAddr: unknown transport {}", t));
  auto inc = r.get<uint64_t>();
  auto n = r.get<uint16_t>();
  auto raw = r.get_bytes(n);
  r.expect_end();
  return NetAddr(static_cast<Transport>(t), inc, raw);
}

NetAddr NetAddr::from_hex(std::string_view hex) {
  auto b = core::from_hex(hex, "NetAddr");
  return from_bytes(b);
}

std::string NetAddr::to_hex() const {
  return core::to_hex(bytes());
}

Transport NetAddr::transport() const {
  auto b = bytes();
  return b.size() > 1 ? static_cast<Transport>(b[1]) : Transport::kFabric;
}

uint64_t NetAddr::incarnation() const {
  auto b = bytes();
  if (b.size() < kHeaderSize) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(b[2 + i]) << (8 * i);
  return v;
}

std::span<const uint8_t> NetAddr::raw() const {
  auto b = bytes();
  if (b.size() < kHeaderSize) return {};
  return b.subspan(kHeaderSize);
}

std::string NetAddr::brief() const {
  if (empty()) return "<empty address>";
  static constexpr const char* kNames[] = {"?", "fabric", "verbs", "nvlink", "fake"};
  auto t = static_cast<unsigned>(transport());
  auto raw_hex = core::to_hex(raw().first(std::min<size_t>(raw().size(), 6)));
  return fmt::format("{}:{}…(inc {:08x})", t < 5 ? kNames[t] : "?", raw_hex,
                     uint32_t(incarnation()));
}

// ----------------------------------------------------------------- MrDesc

namespace {
constexpr size_t kMaxDescNics = 16;
}

std::vector<uint8_t> MrDesc::to_bytes() const {
  std::vector<uint8_t> out;
  core::ByteWriter w(out);
  w.put<uint8_t>(writable ? kVersion : kVersionFlags);
  w.put<uint64_t>(ptr);
  w.put<uint64_t>(len);
  w.put<uint8_t>(static_cast<uint8_t>(device.kind));
  w.put<int32_t>(device.ordinal);
  if (!writable) w.put<uint8_t>(kFlagReadOnly);
  w.put<uint8_t>(static_cast<uint8_t>(nics.size()));
  for (const auto& n : nics) {
    w.put<uint16_t>(static_cast<uint16_t>(n.addr.bytes().size()));
    w.put_bytes(n.addr.bytes());
    w.put<uint64_t>(n.rkey);
    w.put<uint64_t>(n.base);
  }
  return out;
}

MrDesc MrDesc::from_bytes(std::span<const uint8_t> bytes) {
  core::ByteReader r(bytes, "MrDesc");
  auto version = r.get<uint8_t>();
  if (version != kVersion && version != kVersionFlags)
    throw Error(Code::kInvalidArgument,
                fmt::format("MrDesc: unsupported version {} (this build reads {} and {})", version,
                            kVersion, kVersionFlags));
  MrDesc d;
  d.ptr = r.get<uint64_t>();
  d.len = r.get<uint64_t>();
  auto kind = r.get<uint8_t>();
  if (kind > uint8_t(Device::Kind::kCuda))
    throw Error(Code::kInvalidArgument, fmt::format("MrDesc: unknown device kind {}", kind));
  d.device.kind = static_cast<Device::Kind>(kind);
  d.device.ordinal = r.get<int32_t>();
  if (d.device.ordinal < 0) throw Error(Code::kInvalidArgument, "MrDesc: negative device ordinal");
  if (version == kVersionFlags) {
    auto flags = r.get<uint8_t>();
    // One encoding per descriptor: a writable region is written as version 1.
    if (flags != kFlagReadOnly)
      throw Error(Code::kInvalidArgument,
                  fmt::format("MrDesc: version 2 with flags {:#x} (only {:#x}, read-only, is "
                              "defined; writable regions are version 1)",
                              flags, kFlagReadOnly));
    d.writable = !(flags & kFlagReadOnly);
  }
  auto n = r.get<uint8_t>();
  if (n == 0 || n > kMaxDescNics)
    throw Error(Code::kInvalidArgument,
                fmt::format("MrDesc: {} NICs (1..{} allowed)", n, kMaxDescNics));
  if (d.ptr + d.len < d.ptr)
    throw Error(Code::kInvalidArgument, "MrDesc: ptr + len overflows 64 bits");
  d.nics.reserve(n);
  for (unsigned i = 0; i < n; ++i) {
    auto alen = r.get<uint16_t>();
    Nic nic;
    nic.addr = NetAddr::from_bytes(r.get_bytes(alen));
    nic.rkey = r.get<uint64_t>();
    nic.base = r.get<uint64_t>();
    d.nics.push_back(std::move(nic));
  }
  r.expect_end();
  return d;
}

std::string MrDesc::to_hex() const {
  return core::to_hex(to_bytes());
}

MrDesc MrDesc::from_hex(std::string_view hex) {
  auto b = core::from_hex(hex, "MrDesc");
  return from_bytes(b);
}

// ----------------------------------------------------------------- OnDone

void OnDone::signal_inline(const Status& s) const {
  if (auto* c = std::get_if<Counter>(&v_)) {
    if (!s.is_ok() && c->errors) c->errors->fetch_add(1, std::memory_order_release);
    if (c->done) c->done->fetch_add(1, std::memory_order_release);
  } else if (auto* f = std::get_if<Flag>(&v_)) {
    if (!s.is_ok() && f->failed) f->failed->store(true, std::memory_order_release);
    if (f->done) f->done->store(true, std::memory_order_release);
  }
}

void OnDone::invoke(const Status& s) const {
  if (auto* cb = std::get_if<Callback>(&v_)) {
    if (*cb) (*cb)(s);
  } else {
    signal_inline(s);
  }
}

}  // namespace ferry

// What one benchmark point writes where. Both processes compute the same
// Layout from the same options, so the server can verify a point from the
// number of requests alone, and ferry and the raw baseline write exactly the
// same bytes to the same places.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace ferry_bench {

// kImmInline: imm-cb with the callback run on the worker (CallbackOn::kWorker);
// kSendRecvInline: sendrecv with both sides' receive callbacks run there;
// kSendRecvQueue: sendrecv with both sides' application threads taking the
// messages from a RecvQueue (no callback).
enum class Kind : uint32_t {
  kSingle,
  kPaged,
  kScatter,
  kBarrier,
  kImm,
  kImmCb,
  kSendRecv,
  kImmInline,
  kSendRecvInline,
  kSendRecvQueue
};

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSingle:
      return "single";
    case Kind::kPaged:
      return "paged";
    case Kind::kScatter:
      return "scatter";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kImm:
      return "imm";
    case Kind::kImmCb:
      return "imm-cb";
    case Kind::kSendRecv:
      return "sendrecv";
    case Kind::kImmInline:
      return "imm-inl";
    case Kind::kSendRecvInline:
      return "sendrecv-inl";
    case Kind::kSendRecvQueue:
      return "sendrecv-q";
  }
  return "?";
}

// Bytes at the end of every region kept for send/recv buffers of the raw
// ping-pong, so the data area of a point never overlaps them.
inline constexpr uint64_t kMsgArea = 1 << 20;
inline constexpr uint64_t kRecvSlot = 64 << 10;  // raw receive buffer size (max message)
inline constexpr uint32_t kRawRecvs = 8;
inline constexpr uint64_t kRawSendOffset = kRawRecvs * kRecvSlot;
// Every write starts and ends on 8 bytes: the pattern is checked per word.
inline constexpr uint64_t kPageGap = 128;

struct Point {
  Kind kind = Kind::kSingle;
  uint64_t size = 0;   // write, page, per-target or message bytes
  uint32_t count = 1;  // pages per request; scatter / barrier targets
  bool imm = true;
  bool latency() const {
    return kind == Kind::kImm || kind == Kind::kImmCb || kind == Kind::kImmInline || sendrecv();
  }
  bool sendrecv() const {
    return kind == Kind::kSendRecv || kind == Kind::kSendRecvInline || kind == Kind::kSendRecvQueue;
  }
  std::string size_label() const {
    if (size >= (1 << 20) && size % (1 << 20) == 0) return fmt::format("{}M", size >> 20);
    if (size >= 1024 && size % 1024 == 0) return fmt::format("{}K", size >> 10);
    return fmt::format("{}", size);
  }
};

struct WriteSpec {
  uint64_t src = 0;  // offset in the client region
  uint64_t dst = 0;  // offset in the server region
  uint64_t len = 0;
  uint32_t target = 0;  // scatter / barrier: which server descriptor
};

// Slots are filled in reverse on the server (src slot s -> dst slot n-1-s), so
// a transfer that mixes up source and destination offsets fails verification.
struct Layout {
  Kind kind;
  uint64_t size, data;
  uint32_t count;
  uint64_t stride = 0, slots = 1, slice = 0;
  uint32_t writes_per_req = 1;
  uint64_t bytes_per_req = 0;

  Layout(const Point& p, uint64_t region)
      : kind(p.kind), size(p.size), data(region - kMsgArea), count(p.count) {
    switch (kind) {
      case Kind::kSingle:
        stride = size;
        slots = std::max<uint64_t>(1, data / size);
        bytes_per_req = size;
        break;
      case Kind::kPaged:
        stride = size + kPageGap;
        slots = data / stride;
        writes_per_req = count;
        bytes_per_req = size * count;
        break;
      case Kind::kScatter:
      case Kind::kBarrier:
        slice = (data / count) & ~uint64_t(4095);
        writes_per_req = count;
        bytes_per_req = kind == Kind::kScatter ? size * count : 0;
        break;
      default:
        writes_per_req = 1;
        bytes_per_req = size;
        break;
    }
  }

  WriteSpec write(uint64_t req, uint32_t k) const {
    switch (kind) {
      case Kind::kSingle: {
        uint64_t s = req % slots;
        return {s * size, (slots - 1 - s) * size, size, 0};
      }
      case Kind::kPaged: {
        uint64_t s = k % slots;
        return {s * stride, (slots - 1 - s) * stride, size, 0};
      }
      case Kind::kScatter:
        return {uint64_t(k) * size, uint64_t(k) * slice, size, k};
      case Kind::kBarrier:
        return {0, uint64_t(k) * slice, 0, k};
      default:
        return {};
    }
  }
  // Distinct writes a run of `reqs` requests made (later ones repeat them).
  uint64_t distinct_writes(uint64_t reqs) const {
    switch (kind) {
      case Kind::kSingle:
        return std::min(reqs, slots);
      case Kind::kPaged:
        return reqs ? std::min<uint64_t>(count, slots) : 0;
      case Kind::kScatter:
        return reqs ? count : 0;
      default:
        return 0;
    }
  }
  WriteSpec distinct(uint64_t i) const {
    return kind == Kind::kSingle ? write(i, 0) : write(0, uint32_t(i));
  }
};

// 64-bit word i of the source under `seed` (splitmix64).
inline uint64_t pattern_word(uint64_t i, uint64_t seed) {
  uint64_t z = i + seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline void fill_pattern(uint8_t* buf, uint64_t len, uint64_t seed) {
  auto* w = reinterpret_cast<uint64_t*>(buf);
  for (uint64_t i = 0; i < len / 8; ++i) w[i] = pattern_word(i, seed);
}

// Empty when every distinct write of the run landed (and, for paged writes,
// the gaps between pages stayed zero); else what differs first.
inline std::string check_writes(const Layout& l, const uint8_t* dst, uint64_t reqs, uint64_t seed) {
  const auto* d = reinterpret_cast<const uint64_t*>(dst);
  for (uint64_t i = 0, n = l.distinct_writes(reqs); i < n; ++i) {
    WriteSpec w = l.distinct(i);
    for (uint64_t j = 0; j < w.len / 8; ++j)
      if (d[w.dst / 8 + j] != pattern_word(w.src / 8 + j, seed))
        return fmt::format("write {} (src {} -> dst {}, {} bytes): byte {} differs", i, w.src,
                           w.dst, w.len, j * 8);
    if (l.kind == Kind::kPaged)
      for (uint64_t j = w.dst + w.len; j < w.dst + l.stride; ++j)
        if (dst[j] != 0) return fmt::format("page {}: gap byte {} was written", i, j - w.dst);
  }
  return {};
}

}  // namespace ferry_bench

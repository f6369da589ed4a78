// The soak's model (soak.cpp says the protocol): the regions' layout, the
// transfers of a round and how each is laid out in its receivers' areas. A
// round is a pure function of (seed, sender, round), so every process replays
// every sender's rounds to know what it must receive.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/ferry.h"

namespace ferry::soak {

constexpr int kProcs = 3;
constexpr size_t kNics = 2;
constexpr uint64_t kSrcLen = 4 << 20;
constexpr uint64_t kArea = 8 << 20;  // per (sender, round parity) in each receiver
constexpr uint64_t kDstLen = kProcs * 2 * kArea;
constexpr uint32_t kSeqBits = 22;  // per sender; imm = sender << 30 | seq
constexpr uint32_t kSeqSpace = 1u << kSeqBits;
constexpr uint8_t kPoison = 0xD7;
constexpr uint32_t kMsgMagic = 0x53595246;  // "FRYS"
constexpr uint64_t kRecvLen = 4096;

enum class Kind : uint8_t { kSingle, kPaged, kScatter, kBarrier, kImm, kSend, kCount };
inline const char* kind_name(Kind k) {
  static const char* names[] = {"single", "paged", "scatter", "barrier", "imm", "send"};
  return names[static_cast<int>(k)];
}

struct Seg {
  uint64_t dst = 0;  // offset in the sender's area of the receiver
  uint64_t src = 0;  // offset in the sender's source region
  uint64_t len = 0;
};
struct Target {
  int peer = 0;
  std::vector<Seg> segs;
  uint64_t imms = 0;  // immediates this target gets (if the transfer has one)
};
struct Xfer {
  Kind kind = Kind::kSingle;
  uint32_t seq = 0;
  uint32_t imm = 0;
  bool has_imm = true;
  WriteRoute wroute;
  GroupRoute groute;
  bool use_group = false;
  uint64_t page_len = 0, stride = 0, page_base = 0;
  std::vector<uint32_t> sidx, didx;
  uint64_t msg_len = 0;
  std::vector<Target> targets;
};

inline uint32_t imm_of(int sender, uint32_t seq) {
  return uint32_t(sender) << 30 | seq;
}
inline uint64_t area_off(int sender, uint64_t round) {
  return (uint64_t(sender) * 2 + round % 2) * kArea;
}
inline uint64_t src_seed(uint64_t seed, int p) {
  return seed * 1315423911ull + uint64_t(p) * 977 + 5;
}
inline uint64_t msg_src(uint32_t seq) {
  return (uint64_t(seq) * 7919) % (kSrcLen - kRecvLen);
}

// Round r of sender s; identical in every process.
std::vector<Xfer> gen_round(uint64_t seed, int s, uint64_t r, uint32_t count);

}  // namespace ferry::soak

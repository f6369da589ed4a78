// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): a handful of
// valid encodings made by ferry's own encoders, binary and hex. Run by hand when the
// encodings change:  build-fuzz/fuzz/fuzz_gen_corpus fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ferry/types.h"
#ifdef FERRY_FUZZ_VERBS
#include "verbs/verbs_handshake.h"
#endif

using namespace ferry;
namespace fs = std::filesystem;

namespace {

void put(const fs::path& dir, const std::string& name, const std::vector<uint8_t>& b) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), b.size());
}
void put(const fs::path& dir, const std::string& name, const std::string& s) {
  put(dir, name, std::vector<uint8_t>(s.begin(), s.end()));
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 37);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  fs::path root = argv[1];

  // Addresses shaped like the providers' raw names: sockaddr_in (tcp), an shm
  // name, a 32-byte EFA address, a verbs GID+QPN, and the largest allowed.
  std::vector<std::pair<std::string, NetAddr>> addrs = {
      {"tcp", NetAddr(Transport::kFabric, 0x1122334455667788ull, pattern(16, 1))},
      {"shm", NetAddr(Transport::kFabric, 7, pattern(24, 2))},
      {"efa", NetAddr(Transport::kFabric, 0xdeadbeefcafef00dull, pattern(32, 3))},
      {"verbs", NetAddr(Transport::kVerbs, 42, pattern(22, 4))},
      {"nvlink", NetAddr(Transport::kNvlink, 1, pattern(1, 5))},
      {"max", NetAddr(Transport::kFabric, UINT64_MAX, pattern(NetAddr::kMaxRawSize, 6))},
  };
  fs::path na = root / "fuzz_netaddr";
  for (auto& [name, a] : addrs) {
    std::vector<uint8_t> b(a.bytes().begin(), a.bytes().end());
    put(na, name + ".bin", b);
    if (name != "max") put(na, name + ".hex", a.to_hex());
  }

  fs::path md = root / "fuzz_mrdesc";
  for (size_t nics : {1u, 2u, 4u}) {
    MrDesc d;
    d.ptr = 0x7f0000000000ull + nics * 4096;
    d.len = (64ull << 20) * nics;
    for (size_t k = 0; k < nics; ++k)
      d.nics.push_back({addrs[k % 4].second, 0x100 + k, k == 0 ? 0 : d.ptr});
    put(md, "host-" + std::to_string(nics) + "nic.bin", d.to_bytes());
    put(md, "host-" + std::to_string(nics) + "nic.hex", d.to_hex());
    d.device = Device::cuda(int(nics) - 1);
    put(md, "cuda-" + std::to_string(nics) + "nic.bin", d.to_bytes());
  }
  {
    MrDesc d;  // 16 NICs, the most a descriptor may carry, offset mode
    d.len = UINT64_MAX;
    for (size_t k = 0; k < 16; ++k) d.nics.push_back({addrs[1].second, k, 0});
    put(md, "max-16nic.bin", d.to_bytes());
  }

  // The sharding target reads its input as a stream of choices: random streams.
  fs::path sh = root / "fuzz_sharding";
  std::mt19937 rng(5);
  for (int i = 0; i < 8; ++i) {
    std::vector<uint8_t> b(16 + 16 * i);
    for (auto& x : b) x = uint8_t(rng());
    put(sh, "random-" + std::to_string(i) + ".bin", b);
  }
#ifdef FERRY_FUZZ_VERBS
  // fuzz_verbs_handshake: first byte 0 = UD address, 1 = datagram, 2 = machine events.
  {
    using namespace ferry::verbs;
    fs::path vh = root / "fuzz_verbs_handshake";
    auto with = [](uint8_t sel, std::span<const uint8_t> b) {
      std::vector<uint8_t> v{sel};
      v.insert(v.end(), b.begin(), b.end());
      return v;
    };
    UdAddress ud;
    for (size_t i = 0; i < ud.gid.size(); ++i)
      ud.gid[i] = uint8_t(i == 0 ? 0xfe : i == 1 ? 0x80 : i);
    ud.lid = 3;
    ud.qpn = 0x1a2b;
    ud.qkey = 0x11111111;
    put(vh, "ud.bin", with(0, ud.to_bytes()));
    HandshakeMsg m;
    m.src_incarnation = 0x180000000000abcdull;
    m.src_epoch = 1;
    m.from = ud;
    m.rc = {0x100, 0x123456, 0x101, 0x654321, 5};
    std::vector<uint8_t> b(HandshakeMsg::kSize);
    auto enc = [&](const HandshakeMsg& x) {
      x.encode(std::span<uint8_t, HandshakeMsg::kSize>(b.data(), HandshakeMsg::kSize));
      return b;
    };
    put(vh, "msg-hello.bin", with(1, enc(m)));
    m.flags = HandshakeMsg::kFlagAck;
    m.dst_incarnation = 0x180000000000beefull;
    m.dst_epoch = 2;
    put(vh, "msg-ack.bin", with(1, enc(m)));
    m.flags |= HandshakeMsg::kFlagConnected;
    auto longer = enc(m);
    put(vh, "msg-connected.bin", with(1, longer));
    longer.insert(longer.end(), {1, 2, 3, 4, 5, 6, 7, 8});
    put(vh, "msg-trailing.bin", with(1, longer));
    std::mt19937 r(9);
    for (int i = 0; i < 4; ++i) {
      std::vector<uint8_t> e(64 + 64 * i);
      for (auto& x : e) x = uint8_t(r());
      put(vh, "machine-" + std::to_string(i) + ".bin", with(2, e));
    }
  }
#endif
  std::printf("corpus written under %s\n", root.c_str());
  return 0;
}

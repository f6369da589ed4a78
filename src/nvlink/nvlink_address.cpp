// Address codec and host identity: plain C++, in every build.
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "nvlink/nvlink_domain.h"

namespace ferry::nvlink {

namespace {
void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int i = 0; i < 4; ++i) v.push_back(uint8_t(x >> (8 * i)));
}
uint32_t get32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
}  // namespace

std::vector<uint8_t> RawAddress::encode() const {
  std::vector<uint8_t> v;
  v.reserve(kSize);
  put32(v, kMagic);
  put32(v, 1);  // layout version
  v.insert(v.end(), boot_id.begin(), boot_id.end());
  put32(v, pid);
  put32(v, uint32_t(device));
  std::array<uint8_t, kNameBytes> name{};
  std::memcpy(name.data(), shm_name.data(), std::min(shm_name.size(), kNameBytes - 1));
  v.insert(v.end(), name.begin(), name.end());
  return v;
}

std::optional<RawAddress> RawAddress::decode(std::span<const uint8_t> raw, std::string* why) {
  if (raw.size() != kSize) {
    *why = fmt::format("{} bytes, an NVLink address has {}", raw.size(), kSize);
    return std::nullopt;
  }
  const uint8_t* p = raw.data();
  if (get32(p) != kMagic || get32(p + 4) != 1) {
    *why = "bad magic or layout version";
    return std::nullopt;
  }
  RawAddress a;
  std::memcpy(a.boot_id.data(), p + 8, 16);
  a.pid = get32(p + 24);
  a.device = int32_t(get32(p + 28));
  const char* name = reinterpret_cast<const char*>(p + 32);
  a.shm_name.assign(name, strnlen(name, kNameBytes));
  if (a.shm_name.empty() || a.shm_name[0] != '/' || a.shm_name.size() == kNameBytes) {
    *why = "bad segment name";
    return std::nullopt;
  }
  return a;
}

bool local_boot_id(std::array<uint8_t, 16>* out) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  if (!(f >> s)) return false;
  size_t n = 0;
  int hi = -1;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) continue;  // dashes
    if (hi < 0) {
      hi = d;
    } else {
      if (n == out->size()) return false;
      (*out)[n++] = uint8_t(hi << 4 | d);
      hi = -1;
    }
  }
  return n == out->size();
}

}  // namespace ferry::nvlink

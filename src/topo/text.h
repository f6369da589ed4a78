// Parsing the text of sysfs files and cpulists, shared by the scan and the
// public parsers.
#pragma once

#include <cctype>
#include <charconv>
#include <optional>
#include <string_view>
#include <system_error>

namespace ferry::topo::text {

// A CPU id past this is a corrupt cpulist, not a machine: refuse it rather
// than allocate for it.
inline constexpr int kMaxCpuId = 1 << 16;

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename T>
std::optional<T> parse_number(std::string_view s, int base) {
  s = trim(s);
  if (base == 16 && s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  if (s.empty()) return std::nullopt;
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace ferry::topo::text

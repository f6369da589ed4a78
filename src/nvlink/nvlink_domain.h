// NVLink Domain (provider "nvlink"): peers on the same host, GPU to GPU over
// CUDA IPC mappings. Design and measurements: docs/NVLINK.md.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/domain.h"

namespace ferry::nvlink {

// Raw address bytes of an NVLink endpoint (inside a NetAddr of kNvlink).
struct RawAddress {
  static constexpr uint32_t kMagic = 0x4c564e46;  // "FNVL"
  static constexpr size_t kNameBytes = 64;
  static constexpr size_t kSize = 4 + 4 + 16 + 4 + 4 + kNameBytes;

  std::array<uint8_t, 16> boot_id{};  // /proc/sys/kernel/random/boot_id: the host (and boot)
  uint32_t pid = 0;
  int32_t device = 0;    // CUDA ordinal in the owner's process
  std::string shm_name;  // the owner's segment (mailbox + region table)

  std::vector<uint8_t> encode() const;
  // nullopt with *why set when the bytes are not an NVLink address.
  static std::optional<RawAddress> decode(std::span<const uint8_t> raw, std::string* why);
};

// This boot's id; false when /proc/sys/kernel/random/boot_id is unreadable.
bool local_boot_id(std::array<uint8_t, 16>* out);

// Opens one NVLink endpoint for options.device (must be a CUDA device).
// Builds without CUDA return nullptr with kUnimplemented.
std::unique_ptr<core::Domain> open_nvlink_domain(const core::DomainOptions& options, Status* error);

// This family for the engine's registry (nvlink_family.cpp).
const core::DomainFamily& nvlink_family();

}  // namespace ferry::nvlink

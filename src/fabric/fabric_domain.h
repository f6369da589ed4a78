// libfabric Domain: one fabric domain + RDM endpoint per NIC (efa, tcp;ofi_rxm, shm).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/domain.h"

namespace ferry::fabric {

struct FabricNicInfo {
  std::string provider;  // as reported: "efa", "tcp;ofi_rxm", "shm"
  std::string fabric;
  std::string domain;  // NIC name used in GroupConfig::nic_names
  uint64_t link_speed_bps = 0;
  std::string pci_address;  // "0000:16:00.0" when the provider reports it
  bool hmem = false;        // FI_HMEM supported
};

// Domains the provider offers with RDM endpoints, RMA, MSG and remote CQ data
// (the hints and filters open_fabric_domain uses). *note, when given, gets
// fi_getinfo's answer when it found nothing.
std::vector<FabricNicInfo> list_fabric_nics(const std::string& provider,
                                            std::string* note = nullptr);

// Opens one NIC. Never falls back to another provider: failure is returned.
std::unique_ptr<core::Domain> open_fabric_domain(const core::DomainOptions& options, Status* error);

// What the shm lock rescuer of a domain has done so far (zeros for a domain
// without one): the peer exits it saw, its wake-ups that no event asked for
// (while it looks every few ms for a lock a dead peer may hold), and the times
// it went idle again after looking.
struct ShmRescuerCounts {
  uint64_t exits_seen = 0;
  uint64_t timed_wakes = 0;
  uint64_t rests = 0;
};
ShmRescuerCounts shm_rescuer_counts(const core::Domain& domain);

// This family for the engine's registry (fabric_family.cpp).
const core::DomainFamily& fabric_family();

}  // namespace ferry::fabric

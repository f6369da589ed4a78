// The registry of NIC families: the one place that names every transport.
// Each transport folder declares its family ({name, serves, open}); adding a
// NIC family is a new folder plus one line in domain_families.cpp. The list is
// explicit rather than filled by static initialisers, which the linker drops
// from a static libferry.a when nothing else references their object file.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/domain.h"

namespace ferry::engine {

// In the order a provider string is matched (libfabric last: it serves any name).
std::span<const core::DomainFamily* const> domain_families();

// The family serving `provider`; never null (libfabric takes what others do not).
const core::DomainFamily& family_for(std::string_view provider);

// What the engine hands its workers: opens options.provider's family and, when
// options.fault_injection is set, wraps the NIC in the seeded fault injector.
core::DomainOpener domain_opener();

}  // namespace ferry::engine

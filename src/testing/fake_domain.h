// The one fake NIC (provider "fake"): engines of one process reach each other
// through it with real copies into registered memory, key and bounds checks,
// immediates and send/recv, and no network. Engine tests run every operation
// on it; the submit-path benchmark uses its discard mode.
//
// NIC names: any; a name starting with "discard" accepts every post and
// completes it at the next poll without touching memory or any peer (what a
// NIC driver costs the worker is then nothing, so the benchmark measures
// ferry's own submit path).
#pragma once

#include <memory>

#include "core/domain.h"

namespace ferry::testing {

std::unique_ptr<core::Domain> open_fake_domain(const core::DomainOptions& options, Status* error);

// This family for the engine's registry (fake_family.cpp).
const core::DomainFamily& fake_family();

}  // namespace ferry::testing

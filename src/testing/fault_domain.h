// A Domain that wraps any other and, driven by a seed, misbehaves the way real
// fabrics may: completions delayed and reordered, transient back-pressure,
// writes split into pieces, permanent errors. The ImmCounter design must stay
// exact under all of it.
#pragma once

#include <memory>
#include <string>

#include "core/domain.h"

namespace ferry::testing {

// `spec`: comma-separated key=value (see EngineConfig::fault_injection).
// Returns nullptr and sets *error on a malformed spec.
std::unique_ptr<core::Domain> wrap_with_faults(std::unique_ptr<core::Domain> inner,
                                               const std::string& spec, size_t nic_index,
                                               Status* error);

}  // namespace ferry::testing

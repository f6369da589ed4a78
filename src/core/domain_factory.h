#pragma once
#include <memory>

#include "core/domain.h"

namespace ferry::core {
// Opens the Domain family named by options.provider ("verbs" -> libibverbs,
// anything else -> libfabric provider of that name).
std::unique_ptr<Domain> open_domain(const DomainOptions& options, Status* error);
}  // namespace ferry::core

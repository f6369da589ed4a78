#pragma once

#include "ferry/moe.h"
#include "moe/routing.h"

namespace ferry::moe {

// The geometry a configuration implies (default private round filled in).
Geometry geometry_of(const AllToAllConfig& c, uint32_t* private_tokens);

}  // namespace ferry::moe

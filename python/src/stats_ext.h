// Registers the observability bindings (stats_ext.cpp) on the module.
#pragma once

#include <nanobind/nanobind.h>

#include <functional>

#include "ferry/ferry.h"

namespace ferry::py {

// The C++ engine behind a Python Engine object; throws ferry::Error
// (kFailedPrecondition) once it is stopped.
using EngineOf = std::function<TransferEngine&(nanobind::handle)>;

void register_stats(nanobind::module_& m, EngineOf engine_of);

}  // namespace ferry::py

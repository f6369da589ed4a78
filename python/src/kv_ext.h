// What the other binding files (kv_ext.cpp, map_ext.cpp) take from ferry_ext.cpp,
// which binds the wrapped engine and prepared-transfer types.
#pragma once

#include <nanobind/nanobind.h>

#include "ferry/engine.h"
#include "py_args.h"  // parse_device, device_str

namespace ferry::py {

struct EngineAccess {
  // The running C++ engine of a ferry._ferry.Engine (raises when stopped).
  TransferEngine& (*engine_of)(nanobind::handle engine);
  // The shape of a ferry.PreparedTransfer (raises for other types).
  PreparedTransfer (*prepared_of)(nanobind::handle prepared);
  // Takes the GIL back after PyEval_SaveThread, or parks the thread for good
  // when the interpreter is exiting (the exit gate of py_runtime.h).
  void (*retake_gil)(PyThreadState* ts);
};

void bind_kv(nanobind::module_& m, const EngineAccess& access);
// TransferEngine::map_remote as ferry._ferry.map_remote / MappedRegion (map_ext.cpp).
void bind_map_remote(nanobind::module_& m, const EngineAccess& access);

}  // namespace ferry::py

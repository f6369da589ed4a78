// What the other binding files (kv_ext.cpp, map_ext.cpp) take from ferry_ext.cpp,
// which owns the wrapped engine and prepared-transfer types.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <string_view>

#include "ferry/engine.h"

namespace ferry::py {

struct EngineAccess {
  // The running C++ engine of a ferry._ferry.Engine (raises when stopped).
  TransferEngine& (*engine_of)(nanobind::handle engine);
  // The shape of a ferry.PreparedTransfer (raises for other types).
  PreparedTransfer (*prepared_of)(nanobind::handle prepared);
  // Takes the GIL back after PyEval_SaveThread, or parks the thread for good
  // when the interpreter is exiting (ferry_ext.cpp's exit gate).
  void (*retake_gil)(PyThreadState* ts);
};

// Device names as every binding takes and gives them (ferry_ext.cpp): "cpu" (or
// "host"), "cuda" (device 0) or "cuda:N"; anything else throws kInvalidArgument.
Device parse_device(std::string_view s);
std::string device_str(const Device& d);

void bind_kv(nanobind::module_& m, const EngineAccess& access);
// TransferEngine::map_remote as ferry._ferry.map_remote / MappedRegion (map_ext.cpp).
void bind_map_remote(nanobind::module_& m, const EngineAccess& access);

}  // namespace ferry::py

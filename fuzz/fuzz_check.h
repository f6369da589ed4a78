// Shared helpers of the fuzz targets: a property check that aborts (libFuzzer
// then saves the input as a crash artifact) and a guard that turns any
// exception other than the documented ferry::Error into a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "ferry/status.h"

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace ferry::fuzz {

// Runs `decode`; returns true when it succeeded. A rejection must be a
// ferry::Error with code kInvalidArgument (the decoders' contract); anything
// else (another code, another exception type) aborts.
template <typename F>
bool decodes(F&& decode) {
  try {
    decode();
    return true;
  } catch (const ferry::Error& e) {
    if (e.code() != ferry::Code::kInvalidArgument) {
      std::fprintf(stderr, "decoder threw %s instead of INVALID_ARGUMENT: %s\n",
                   std::string(ferry::code_name(e.code())).c_str(), e.what());
      std::abort();
    }
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decoder threw a non-ferry exception: %s\n", e.what());
    std::abort();
  }
}

}  // namespace ferry::fuzz

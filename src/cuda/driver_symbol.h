// A CUDA driver entry point (libcuda.so.1 through dlsym, no CUDA headers),
// only where the process has loaded the driver already: looking one up never
// loads it, so a process that has not touched CUDA stays without it.
#pragma once

namespace ferry::cuda {

// nullptr when the driver is not loaded or has no such symbol.
void* loaded_driver_symbol(const char* name);

}  // namespace ferry::cuda

#include "cuda/driver_symbol.h"

#include <dlfcn.h>

namespace ferry::cuda {

void* loaded_driver_symbol(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* sym = dlsym(lib, name);
  dlclose(lib);  // still loaded by whoever loaded it first
  return sym;
}

}  // namespace ferry::cuda

// CUDA implementation of mapped_memory.h: pinned mapped host memory, and
// GDRCopy-mapped device memory loaded at run time (no build dependency).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "cuda/mapped_memory.h"
#include "ferry/status.h"

namespace ferry::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? Code::kUnavailable
                                                                           : Code::kInternal,
                fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}

// --- GDRCopy, resolved with dlsym so that ferry neither needs its headers nor
// its library. Declarations follow gdrapi.h (2.x ABI).
struct gdr;
using gdr_t = gdr*;
struct gdr_mh_t {
  unsigned long h;
};
struct GdrApi {
  gdr_t (*open)() = nullptr;
  int (*close)(gdr_t) = nullptr;
  int (*pin_buffer)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t*) = nullptr;
  int (*unpin_buffer)(gdr_t, gdr_mh_t) = nullptr;
  int (*map)(gdr_t, gdr_mh_t, void**, size_t) = nullptr;
  int (*unmap)(gdr_t, gdr_mh_t, void*, size_t) = nullptr;
  gdr_t handle = nullptr;
};

constexpr size_t kGpuPage = 64 << 10;  // GDRCopy pins whole 64 KiB GPU pages

// Loaded once per process and never unloaded: blocks may outlive any owner we
// could tie the library to, and gdr_close on exit would race their unmapping.
GdrApi* gdr_api() {
  static GdrApi* api = []() -> GdrApi* {
    const char* env = std::getenv("FERRY_GDRCOPY");
    if (env && std::strcmp(env, "0") == 0) return nullptr;
    if (access("/dev/gdrdrv", R_OK | W_OK) != 0) return nullptr;
    void* lib = dlopen("libgdrapi.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libgdrapi.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      core::log().info("/dev/gdrdrv exists but libgdrapi.so does not load: {}", dlerror());
      return nullptr;
    }
    auto* a = new GdrApi;
    a->open = reinterpret_cast<decltype(a->open)>(dlsym(lib, "gdr_open"));
    a->close = reinterpret_cast<decltype(a->close)>(dlsym(lib, "gdr_close"));
    a->pin_buffer = reinterpret_cast<decltype(a->pin_buffer)>(dlsym(lib, "gdr_pin_buffer"));
    a->unpin_buffer = reinterpret_cast<decltype(a->unpin_buffer)>(dlsym(lib, "gdr_unpin_buffer"));
    a->map = reinterpret_cast<decltype(a->map)>(dlsym(lib, "gdr_map"));
    a->unmap = reinterpret_cast<decltype(a->unmap)>(dlsym(lib, "gdr_unmap"));
    if (!a->open || !a->close || !a->pin_buffer || !a->unpin_buffer || !a->map || !a->unmap ||
        !(a->handle = a->open())) {
      core::log().info("libgdrapi.so loaded but unusable: falling back to mapped host memory");
      delete a;
      return nullptr;
    }
    return a;
  }();
  return api;
}

// Owns a cudaMalloc'd range pinned and mapped through GDRCopy.
struct GdrMapping {
  GdrApi* api;
  void* dev_raw = nullptr;
  uint64_t dev_aligned = 0;
  gdr_mh_t mh{};
  bool pinned = false;
  void* va = nullptr;
  size_t size = 0;
  ~GdrMapping() {
    if (va) api->unmap(api->handle, mh, va, size);
    if (pinned) api->unpin_buffer(api->handle, mh);
    if (dev_raw) cudaFree(dev_raw);  // errors at process exit (runtime unloading) are moot
  }
};

std::shared_ptr<MappedBlock> alloc_gdr(GdrApi* api, size_t bytes) {
  auto m = std::make_shared<GdrMapping>();
  m->api = api;
  m->size = (bytes + kGpuPage - 1) / kGpuPage * kGpuPage;
  check(cudaMalloc(&m->dev_raw, m->size + kGpuPage), "cudaMalloc (GDRCopy flags)");
  m->dev_aligned = (reinterpret_cast<uint64_t>(m->dev_raw) + kGpuPage - 1) & ~(kGpuPage - 1);
  check(cudaMemset(reinterpret_cast<void*>(m->dev_aligned), 0, m->size), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (api->pin_buffer(api->handle, m->dev_aligned, m->size, 0, 0, &m->mh) != 0)
    throw Error(Code::kUnavailable, "gdr_pin_buffer failed");
  m->pinned = true;
  if (api->map(api->handle, m->mh, &m->va, m->size) != 0)
    throw Error(Code::kUnavailable, "gdr_map failed");
  auto b = std::make_shared<MappedBlock>();
  b->host = static_cast<uint8_t*>(m->va);
  b->device = m->dev_aligned;
  b->bytes = m->size;
  b->kind = "gdrcopy";
  b->owner = m;
  return b;
}

}  // namespace

std::shared_ptr<MappedBlock> alloc_mapped_host(size_t bytes) {
  bytes = (bytes + kSlotBytes - 1) / kSlotBytes * kSlotBytes;
  void* p = nullptr;
  // Portable: usable from every device's context; Mapped: kernels address it.
  check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
        "cudaHostAlloc(Portable | Mapped)");
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  std::memset(p, 0, bytes);
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, p, 0), "cudaHostGetDevicePointer");
  auto b = std::make_shared<MappedBlock>();
  b->host = static_cast<uint8_t*>(p);
  b->device = reinterpret_cast<uint64_t>(dev);
  b->bytes = bytes;
  b->kind = "cudaHostAlloc";
  b->owner = std::move(owner);
  return b;
}

std::shared_ptr<MappedBlock> alloc_flag_memory(size_t bytes) {
  if (GdrApi* api = gdr_api()) {
    try {
      return alloc_gdr(api, bytes);
    } catch (const Error& e) {
      core::log().warn("GDRCopy flag memory failed ({}); using mapped host memory", e.what());
    }
  }
  return alloc_mapped_host(bytes);
}

bool cuda_built() {
  return true;
}

}  // namespace ferry::cuda

// Python bindings of TransferEngine::map_remote (ferry/engine.h): a peer's
// registered memory as an address of this process, handed to Python as an
// object with the CUDA (or NumPy) array interface, so torch.as_tensor,
// CuPy or NumPy views it without a copy. The object holds the mapping open.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "kv_ext.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

EngineAccess g_map_access{};

struct PyMapped {
  MappedRegion region;
  Device device;
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(region.data()); }
  nb::dict interface() const {
    nb::dict d;
    d["shape"] = nb::make_tuple(region.size());
    d["typestr"] = "|u1";
    d["data"] = nb::make_tuple(ptr(), false);
    d["version"] = 3;
    d["strides"] = nb::none();
    return d;
  }
};

}  // namespace

void bind_map_remote(nb::module_& m, const EngineAccess& access) {
  g_map_access = access;
  nb::class_<PyMapped>(m, "MappedRegion",
                       "A peer's registered memory mapped into this process "
                       "(TransferEngine.map_remote). Stores through it land in the peer's "
                       "region with no transfer or immediate: the writer says when they are "
                       "done. Exposes __cuda_array_interface__ (GPU memory) or "
                       "__array_interface__ (host memory) as bytes; holds the mapping open.")
      .def_prop_ro("ptr", &PyMapped::ptr, "Address in this process.")
      .def_prop_ro("nbytes", [](const PyMapped& p) { return p.region.size(); })
      .def_prop_ro("device", [](const PyMapped& p) { return device_str(p.device); })
      .def_prop_ro("__cuda_array_interface__",
                   [](const PyMapped& p) -> nb::object {
                     if (p.device.is_host())
                       throw nb::attribute_error("host memory: use __array_interface__");
                     return p.interface();
                   })
      .def_prop_ro("__array_interface__",
                   [](const PyMapped& p) -> nb::object {
                     if (!p.device.is_host())
                       throw nb::attribute_error("GPU memory: use __cuda_array_interface__");
                     return p.interface();
                   })
      .def("__repr__", [](const PyMapped& p) {
        return "MappedRegion(ptr=" + std::to_string(p.ptr()) +
               ", nbytes=" + std::to_string(p.region.size()) + ")";
      });
  m.def(
      "map_remote",
      [](nb::handle engine, const MrDesc& dst, uint64_t offset, uint64_t length,
         const std::string& device) {
        const Device near = parse_device(device);
        TransferEngine& e = g_map_access.engine_of(engine);
        PyThreadState* ts = PyEval_SaveThread();
        MappedRegion r;
        try {
          r = e.map_remote(dst, offset, length, near);
        } catch (...) {
          g_map_access.retake_gil(ts);
          throw;
        }
        g_map_access.retake_gil(ts);
        return PyMapped{std::move(r), near};
      },
      "engine"_a, "dst"_a, "offset"_a, "length"_a, "device"_a);
}

}  // namespace ferry::py

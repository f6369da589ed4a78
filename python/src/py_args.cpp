// Conversions of the public calls' arguments (py_args.h).
#include "py_args.h"

#include <nanobind/ndarray.h>

#include <cstring>

#include "py_runtime.h"

namespace ferry::py {

Device parse_device(std::string_view s) {
  if (s == "cpu" || s == "host") return Device::host();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    int n = 0;
    for (char c : s.substr(5)) {
      if (c < '0' || c > '9' || n > 100000) invalid("bad device '" + std::string(s) + "'");
      n = n * 10 + (c - '0');
    }
    return Device::cuda(n);
  }
  invalid("bad device '" + std::string(s) + "': expected \"cpu\" or \"cuda:N\"");
}

std::string device_str(const Device& d) {
  return d.is_host() ? "cpu" : "cuda:" + std::to_string(d.ordinal);
}

ByteView::ByteView(nb::handle obj, const char* what) {
  if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    invalid(std::string(what) + ": expected a C-contiguous bytes-like object, got " +
            nb::type_name(obj.type()).c_str());
  }
}

PyObject* g_type_error_class = nullptr;

std::string type_of(nb::handle v) {
  PyObject* name =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(v.ptr())), "__name__");
  if (name == nullptr || !PyUnicode_Check(name)) {
    Py_XDECREF(name);
    PyErr_Clear();
    return Py_TYPE(v.ptr())->tp_name;
  }
  std::string r = PyUnicode_AsUTF8(name);
  Py_DECREF(name);
  return r;
}

std::string py_str(nb::handle v) {
  nb::object s = nb::steal(PyObject_Str(v.ptr()));
  if (!s.is_valid()) {
    PyErr_Clear();
    return "?";
  }
  return nb::borrow<nb::str>(s).c_str();
}

void wrong_type(const std::string& name, const char* expected, nb::handle got) {
  throw ArgTypeError(name + " must be " + expected + ", got " + type_of(got));
}

long long int_value(nb::handle v, const std::string& name, int& overflow) {
  PyObject* o = v.ptr();
  overflow = 0;
  if (PyLong_CheckExact(o)) return PyLong_AsLongLongAndOverflow(o, &overflow);
  if (PyBool_Check(o) || !PyIndex_Check(o)) wrong_type(name, "an int", v);
  nb::object i = nb::steal(PyNumber_Index(o));
  if (!i.is_valid()) {
    PyErr_Clear();
    wrong_type(name, "an int", v);
  }
  return PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
}

uint64_t byte_arg(nb::handle v, const std::string& name) {
  int of = 0;
  const long long x = int_value(v, name, of);
  if (of == 0 && x >= 0) return uint64_t(x);
  if (of < 0 || (of == 0 && x < 0)) invalid(name + " must not be negative (got " + py_str(v) + ")");
  throw Error(Code::kOutOfRange, name + " " + py_str(v) +
                                     " is past the end of any registered region (offsets and "
                                     "lengths are below 2**63)");
}

int64_t int_arg(nb::handle v, const std::string& name, int64_t lo, int64_t hi, const char* range) {
  int of = 0;
  const long long x = int_value(v, name, of);
  if (of == 0 && x >= lo && x <= hi) return x;
  if (lo == 0 && (of < 0 || (of == 0 && x < 0)))
    invalid(name + " must not be negative (got " + py_str(v) + ")");
  invalid(name + " must be in " + range + " (got " + py_str(v) + ")");
}

uint64_t count_arg(nb::handle v, const std::string& name) {
  return uint64_t(int_arg(v, name, 0, INT64_MAX, "[0, 2**63)"));
}

uint32_t u32_arg(nb::handle v, const std::string& name) {
  return uint32_t(int_arg(v, name, 0, UINT32_MAX, "[0, 2**32)"));
}

std::optional<uint32_t> opt_u32_arg(nb::handle v, const std::string& name) {
  if (!v.is_valid() || v.is_none()) return std::nullopt;
  return u32_arg(v, name);
}

uint64_t addr_arg(nb::handle v, const std::string& name) {
  int of = 0;
  const long long x = int_value(v, name, of);
  if (of == 0 && x >= 0) return uint64_t(x);
  if (of > 0) {
    nb::object i = nb::steal(PyNumber_Index(v.ptr()));
    const unsigned long long u = i.is_valid() ? PyLong_AsUnsignedLongLong(i.ptr()) : 0;
    if (i.is_valid() && !PyErr_Occurred()) return uint64_t(u);
    PyErr_Clear();
  }
  invalid(name + " must be an address in [0, 2**64) (got " + py_str(v) + ")");
}

std::optional<double> timeout_arg(nb::handle v, const std::string& name) {
  if (!v.is_valid() || v.is_none()) return std::nullopt;
  PyObject* o = v.ptr();
  double t = 0;
  if (PyFloat_CheckExact(o)) {
    t = PyFloat_AS_DOUBLE(o);
  } else {
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyIndex_Check(o) || PyNumber_Check(o)))
      wrong_type(name, "a number of seconds or None", v);
    if (PyIndex_Check(o)) {
      int of = 0;
      const long long x = int_value(v, name, of);
      t = of > 0 ? 1e300 : of < 0 ? -1.0 : double(x);
    } else {
      t = PyFloat_AsDouble(o);
      if (t == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        wrong_type(name, "a number of seconds or None", v);
      }
    }
  }
  if (!(t >= 0))
    invalid(name + " must be a non-negative number of seconds or None (got " + py_str(v) + ")");
  if (t > 1e9) return std::nullopt;
  return t;
}

Clock::time_point deadline_after(std::optional<double> timeout) {
  if (!timeout) return Clock::time_point::max();
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
}

std::string str_arg(nb::handle v, const std::string& name, const char* expected) {
  if (!v.is_valid() || !PyUnicode_Check(v.ptr())) wrong_type(name, expected, v);
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
  if (p == nullptr) throw nb::python_error();
  return std::string(p, size_t(n));
}

nb::handle callable_arg(nb::handle v, const std::string& name, bool allow_none) {
  if (allow_none && (!v.is_valid() || v.is_none())) return nb::handle();
  if (!v.is_valid() || !PyCallable_Check(v.ptr()))
    wrong_type(name, allow_none ? "a callable or None" : "a callable", v);
  return v;
}

nb::handle list_item(nb::handle list, size_t k) {
  return PyList_GET_ITEM(list.ptr(), Py_ssize_t(k));
}

// ------------------------------------------------------------------ page indices

namespace {

std::string dtype_name(nb::dlpack::dtype t) {
  const char* kinds[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  std::string k = t.code < 7 ? kinds[t.code] : "?";
  return k + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

[[noreturn]] void bad_page_index(const char* side, size_t i, const std::string& v, bool negative) {
  const std::string msg = std::string(side) + " pages: index " + v + " at position " +
                          std::to_string(i) + " is outside [0, 2**32)";
  if (negative) invalid(msg);
  throw Error(Code::kOutOfRange, msg);
}

}  // namespace

std::vector<uint32_t> page_indices(nb::handle obj, const char* side) {
  std::vector<uint32_t> out;
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()) || PyRange_Check(obj.ptr())) {
    nb::sequence seq = nb::borrow<nb::sequence>(obj);
    out.reserve(nb::len(seq));
    for (nb::handle item : seq) {
      PyObject* o = item.ptr();
      if (PyBool_Check(o) || !PyIndex_Check(o))
        wrong_type(std::string(side) + " pages[" + std::to_string(out.size()) + "]", "an int",
                   item);
      int of = 0;
      const long long v = int_value(item, "page index", of);
      if (of != 0 || v < 0 || v > (long long)UINT32_MAX)
        bad_page_index(side, out.size(), py_str(item), of < 0 || (of == 0 && v < 0));
      out.push_back(uint32_t(v));
    }
    return out;
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, false))
    wrong_type(std::string(side) + " pages",
               "a 1-D int32, uint32, int64 or uint64 array (NumPy, torch, DLPack or buffer "
               "protocol) or a list of ints",
               obj);
  if (a.device_type() != nb::device::cpu::value)
    invalid(std::string(side) + " pages must be in host memory (got a device array)");
  if (a.ndim() != 1)
    invalid(std::string(side) + " pages must be a 1-D array (got " + std::to_string(a.ndim()) +
            " dimensions)");
  const size_t n = a.shape(0);
  if (n > 1 && a.stride(0) != 1)
    invalid(std::string(side) + " pages must be contiguous (got stride " +
            std::to_string(a.stride(0)) + " elements)");
  const auto t = a.dtype();
  const bool is_int = t.code == uint8_t(nb::dlpack::dtype_code::Int);
  const bool is_uint = t.code == uint8_t(nb::dlpack::dtype_code::UInt);
  if (t.lanes != 1 || !(is_int || is_uint) || (t.bits != 32 && t.bits != 64))
    invalid(std::string(side) + " pages: dtype must be int32, uint32, int64 or uint64 (got " +
            dtype_name(t) + ")");
  out.resize(n);
  if (n == 0) return out;
  if (t.bits == 32) {
    std::memcpy(out.data(), a.data(), n * 4);
    if (is_int) {
      uint32_t acc = 0;
      for (uint32_t v : out) acc |= v;
      if (acc & 0x80000000u) {
        for (size_t i = 0; i < n; ++i)
          if (out[i] & 0x80000000u) bad_page_index(side, i, std::to_string(int32_t(out[i])), true);
      }
    }
  } else {
    const auto* p = static_cast<const uint64_t*>(a.data());
    for (size_t i = 0; i < n; ++i) {
      if (p[i] > UINT32_MAX) {
        const bool negative = is_int && int64_t(p[i]) < 0;
        bad_page_index(side, i, is_int ? std::to_string(int64_t(p[i])) : std::to_string(p[i]),
                       negative);
      }
      out[i] = uint32_t(p[i]);
    }
  }
  return out;
}

}  // namespace ferry::py

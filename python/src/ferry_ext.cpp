// ferry._ferry: the nanobind layer of the Python package. It converts types and
// bridges threads (the GIL and the engine's callback thread); transfer logic
// stays in the C++ library, Python conveniences live in python/ferry/*.py.
//
// Threading rules kept here:
//  * every call into the engine runs with the GIL released;
//  * user callbacks run on the engine's callback thread, which takes the GIL
//    for each one (keeping one Python thread state for its whole life);
//  * Python objects captured by C++ callbacks are held by PyRef, whose
//    destructor takes the GIL when needed, so they can die on any thread;
//  * stop() releases the GIL while the callback thread drains;
//  * a call that released the GIL re-takes it through retake_gil() (never a
//    destructor), which parks daemon threads at interpreter exit instead
//    (see "the GIL: release, re-take");
//  * arguments arrive as Python objects and are converted here with errors
//    that name them (InvalidArgument, OutOfRange; a wrong type raises
//    InvalidArgumentType, both an InvalidArgument and a TypeError).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/ferry.h"
#include "kv_ext.h"
#include "stats_ext.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ interpreter state

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  return Py_IsInitialized() && !finalizing && nb::is_alive();
}

// ------------------------------------------------------------------ the GIL: release, re-take
//
// At interpreter exit CPython makes a daemon thread that tries to re-take the
// GIL leave through pthread_exit. Its forced unwind through a frame that cannot
// unwind (a destructor such as gil_scoped_release's is noexcept; nanobind's
// dispatcher swallows it with catch (...)) ends in std::terminate. So a call
// that released the GIL re-takes it in retake_gil(), never in a destructor, and
// at exit no daemon thread re-takes it at all (the engine's own threads are
// joined by stop() in the same hook, before finalisation):
//  * the package's atexit hook calls begin_exit() (ferry/_engine.py; before
//    the interpreter finalises, so every thread can still take the GIL);
//  * from then on a thread other than the exiting one that comes back from a
//    GIL-released call parks for good instead of re-taking the GIL (the
//    process is ending; it holds no lock of ours);
//  * begin_exit() lets go of the GIL until the threads already on their way
//    back to it have it, so none is left inside PyEval_RestoreThread when
//    finalisation starts;
//  * with no atexit hook run (embedding), a thread other than Python's main
//    thread that finds the interpreter finalising parks as well.
struct ExitGate {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> exiting{false};  // written under mu
  std::thread::id exit_thread;
  int retaking = 0;              // threads between the check below and holding the GIL
  unsigned long main_ident = 0;  // PyThread_get_thread_ident() of Python's main thread
};

ExitGate& exit_gate() {
  static ExitGate* g = new ExitGate;  // never destroyed: parked threads may still look at it
  return *g;
}

[[noreturn]] void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// Takes the GIL back after PyEval_SaveThread (or parks, see above).
void retake_gil(PyThreadState* ts) {
  ExitGate& g = exit_gate();
  {
    std::unique_lock lk(g.mu);
    if (g.exiting ? std::this_thread::get_id() != g.exit_thread
                  : !interpreter_alive() && PyThread_get_thread_ident() != g.main_ident) {
      lk.unlock();
      park_forever();
    }
    ++g.retaking;
  }
  PyEval_RestoreThread(ts);
  std::lock_guard lk(g.mu);
  if (--g.retaking == 0) g.cv.notify_all();
}

// Threads inside without_gil (at exit: the ones that will park, holding references).
std::atomic<int> g_released{0};
struct Released {
  Released() { g_released.fetch_add(1, std::memory_order_relaxed); }
  ~Released() { g_released.fetch_sub(1, std::memory_order_relaxed); }
  Released(const Released&) = delete;
  Released& operator=(const Released&) = delete;
};

// Runs f() with the GIL released; exceptions of f pass through (the GIL held again).
template <typename F>
auto without_gil(F&& f) -> std::invoke_result_t<F&> {
  using R = std::invoke_result_t<F&>;
  // Coming back, this thread will park (holding its arguments): no leak report.
  if (exit_gate().exiting.load(std::memory_order_relaxed)) nb::set_leak_warnings(false);
  Released released;
  PyThreadState* ts = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    try {
      f();
    } catch (...) {
      retake_gil(ts);
      throw;
    }
    retake_gil(ts);
  } else {
    std::optional<R> r;
    try {
      r.emplace(f());
    } catch (...) {
      retake_gil(ts);
      throw;
    }
    retake_gil(ts);
    return std::move(*r);
  }
}

// The atexit hook's half (GIL held, on the thread that will finalise).
void begin_exit() {
  ExitGate& g = exit_gate();
  {
    std::lock_guard lk(g.mu);
    if (g.exiting) return;
    g.exiting = true;
    g.exit_thread = std::this_thread::get_id();
  }
  PyThreadState* ts = PyEval_SaveThread();
  {
    std::unique_lock lk(g.mu);
    // Bounded: a thread that got the GIL gives it back within the switch interval.
    g.cv.wait_for(lk, std::chrono::seconds(5), [&] { return g.retaking == 0; });
  }
  PyEval_RestoreThread(ts);
  // Threads still inside a call will park holding their arguments: nanobind would
  // report those objects as leaked when the module goes.
  if (g_released.load() > 0) nb::set_leak_warnings(false);
}

// Threads inside ImmCounter.wait / TransferCounter.wait (tests wait for them).
std::atomic<int> g_blocked_waits{0};
struct BlockedWait {
  BlockedWait() { g_blocked_waits.fetch_add(1); }
  ~BlockedWait() { g_blocked_waits.fetch_sub(1); }
  BlockedWait(const BlockedWait&) = delete;
  BlockedWait& operator=(const BlockedWait&) = delete;
};

// Depth of ferry callbacks running on this thread (the engine's callback thread).
thread_local int t_callback_depth = 0;

// A callback thread keeps one Python thread state for its whole life (one
// extra PyGILState_Ensure), so later callbacks only swap the GIL instead of
// creating and deleting thread states. The pin is dropped when the thread
// exits (its engine stops), so a stopped engine leaves no thread state behind.
struct ThreadStatePin {
  bool held = false;
  ~ThreadStatePin() {
    if (!held || !interpreter_alive()) return;  // finalizing: the process is ending
    PyThreadState* ts = PyGILState_GetThisThreadState();
    if (ts == nullptr) return;
    // The thread has its state but not the GIL: take the GIL with that state,
    // then the last release deletes the state and lets the GIL go.
    PyEval_RestoreThread(ts);
    PyGILState_Release(PyGILState_UNLOCKED);
  }
};
thread_local ThreadStatePin t_pin;

// Takes the GIL on the callback thread (pinning its thread state, above).
class CallbackGil {
 public:
  CallbackGil() : ok_(interpreter_alive()) {
    if (!ok_) return;
    // Only threads Python does not know: a Python thread's state is Python's.
    const bool pin = !t_pin.held && PyGILState_GetThisThreadState() == nullptr;
    state_ = PyGILState_Ensure();
    if (pin) {
      PyGILState_Ensure();
      t_pin.held = true;
    }
  }
  ~CallbackGil() {
    if (ok_) PyGILState_Release(state_);
  }
  CallbackGil(const CallbackGil&) = delete;
  CallbackGil& operator=(const CallbackGil&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  bool ok_;
  PyGILState_STATE state_{};
};

// An owned reference that may be released on any thread.
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(nb::handle h) : p_(h.is_valid() && !h.is_none() ? h.inc_ref().ptr() : nullptr) {}
  PyRef(PyRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PyRef& operator=(PyRef&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }

  void reset() {
    PyObject* p = std::exchange(p_, nullptr);
    if (p == nullptr) return;
    if (PyGILState_Check()) {
      Py_DECREF(p);
    } else if (interpreter_alive()) {
      PyGILState_STATE s = PyGILState_Ensure();
      Py_DECREF(p);
      PyGILState_Release(s);
    }  // else: the interpreter is gone, leak it
  }
  nb::handle get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_ = nullptr;
};

// ------------------------------------------------------------------ errors

// Exception classes are defined in Python (ferry/_errors.py: multiple
// inheritance such as InvalidArgument(FerryError, ValueError)) and handed over
// at import. Deliberately leaked references: they live as long as the module.
PyObject* g_error_classes = nullptr;  // dict: code name -> class
PyObject* g_error_hook = nullptr;     // callable(where: str, exc: BaseException)

nb::object make_error(const Status& s) {
  std::string_view name = code_name(s.code());
  nb::str code(name.data(), name.size());
  PyObject* cls = g_error_classes ? PyDict_GetItem(g_error_classes, code.ptr()) : nullptr;
  if (cls == nullptr) cls = PyExc_RuntimeError;
  nb::object exc = nb::handle(cls)(nb::str(s.message().c_str()));
  exc.attr("code") = code;
  return exc;
}

[[noreturn]] void invalid(std::string msg) {
  throw Error(Code::kInvalidArgument, std::move(msg));
}

// Per-engine state that callbacks reach; outlives the engine object if a
// callback is still queued when it goes.
struct Shared {
  std::atomic<uint64_t> callback_errors{0};
  std::atomic<bool> stopped{false};  // set by stop(): counter waits end with Cancelled
};

// Reports the pending Python error of a failed user callback (GIL held).
void report_current(Shared& sh, const char* where) {
  nb::python_error err;  // fetches and clears the error indicator
  if (g_error_hook == nullptr) {
    err.discard_as_unraisable(where);
  } else {
    try {
      nb::handle hook(g_error_hook);
      hook(where, err.value());
    } catch (nb::python_error& e2) {
      e2.discard_as_unraisable(where);
    }
  }
  // Counted once reported: the hook runs Python code, which may hand the GIL
  // to a thread that reads the count, and that thread must then find the log
  // record too.
  sh.callback_errors.fetch_add(1, std::memory_order_release);
}

// Runs f (a user callback) on the callback thread with the GIL held; an
// exception is logged through the hook and counted, never propagated.
template <typename F>
void run_py(Shared& sh, const char* where, F&& f) {
  CallbackGil gil;
  if (!gil) return;
  ++t_callback_depth;
  try {
    f();
  } catch (nb::python_error& e) {
    e.restore();
    report_current(sh, where);
  } catch (const Error& e) {
    try {
      nb::object exc = make_error(e.status());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (nb::python_error& e2) {
      e2.restore();
    }
    report_current(sh, where);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    report_current(sh, where);
  }
  --t_callback_depth;
}

// A long-lived Python callback (receive, immediate); cleared by stop() so that
// a callback referring to its engine does not keep a cycle alive.
struct Slot {
  PyRef fn;
};

// ------------------------------------------------------------------ conversions

}  // namespace

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

namespace {

// A contiguous read-only view of a bytes-like object.
class ByteView {
 public:
  ByteView(nb::handle obj, const char* what) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      invalid(std::string(what) + ": expected a C-contiguous bytes-like object, got " +
              nb::type_name(obj.type()).c_str());
    }
  }
  ~ByteView() { PyBuffer_Release(&view_); }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;
  std::span<const uint8_t> span() const {
    return {static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// ---- arguments
//
// Public calls take their arguments as Python objects and convert them here, so
// that a bad one raises a ferry error naming it instead of nanobind's TypeError
// listing a private signature. Integers are Python ints or anything with
// __index__ (NumPy integers), never bool.

// An argument of the wrong type: ferry.InvalidArgumentType (an InvalidArgument
// that is also a TypeError).
class ArgTypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
PyObject* g_type_error_class = nullptr;  // ferry._errors.InvalidArgumentType (leaked, as above)

// The type's __name__ (as Python's own messages say it: "str", "ndarray", "MrDesc").
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

[[noreturn]] void wrong_type(const std::string& name, const char* expected, nb::handle got) {
  throw ArgTypeError(name + " must be " + expected + ", got " + type_of(got));
}

// The value of an integer argument; overflow is -1 / +1 when it does not fit a long long.
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

// An offset, length or stride in bytes: [0, 2**63). Negative: InvalidArgument;
// 2**63 or more: OutOfRange (no registered region reaches that far).
uint64_t byte_arg(nb::handle v, const std::string& name) {
  int of = 0;
  const long long x = int_value(v, name, of);
  if (of == 0 && x >= 0) return uint64_t(x);
  if (of < 0 || (of == 0 && x < 0)) invalid(name + " must not be negative (got " + py_str(v) + ")");
  throw Error(Code::kOutOfRange, name + " " + py_str(v) +
                                     " is past the end of any registered region (offsets and "
                                     "lengths are below 2**63)");
}

// Any other integer: [lo, hi], else InvalidArgument ("must not be negative" below 0).
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

// A memory address: [0, 2**64).
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

// Seconds to wait: None (no deadline) or a non-negative real number. More than
// 10**9 s (31 years; also +inf) is no deadline, which keeps the clock arithmetic
// from overflowing.
std::optional<double> timeout_arg(nb::handle v, const std::string& name = "timeout") {
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

// An instance of a bound class, else InvalidArgumentType naming the argument.
template <typename T>
T& obj_arg(nb::handle v, const std::string& name, const char* expected) {
  if (!v.is_valid() || !nb::isinstance<T>(v)) wrong_type(name, expected, v);
  return *nb::inst_ptr<T>(v);
}

std::string str_arg(nb::handle v, const std::string& name, const char* expected = "a str") {
  if (!v.is_valid() || !PyUnicode_Check(v.ptr())) wrong_type(name, expected, v);
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
  if (p == nullptr) throw nb::python_error();
  return std::string(p, size_t(n));
}

// A callable (or, with allow_none, None: returns an invalid handle).
nb::handle callable_arg(nb::handle v, const std::string& name, bool allow_none = false) {
  if (allow_none && (!v.is_valid() || v.is_none())) return nb::handle();
  if (!v.is_valid() || !PyCallable_Check(v.ptr()))
    wrong_type(name, allow_none ? "a callable or None" : "a callable", v);
  return v;
}

// Item k of a list (borrowed).
nb::handle list_item(nb::handle list, size_t k) {
  return PyList_GET_ITEM(list.ptr(), Py_ssize_t(k));
}

constexpr const char* kHandleType = "a ferry.MrHandle (from register())";
constexpr const char* kDescType = "a ferry.MrDesc (the peer's descriptor)";
constexpr const char* kPreparedType = "a ferry.PreparedTransfer (from prepare_*())";

std::string dtype_name(nb::dlpack::dtype t) {
  const char* kinds[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  std::string k = t.code < 7 ? kinds[t.code] : "?";
  return k + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// Page indices: a 1-D int32, uint32, int64 or uint64 array in host memory
// (NumPy, torch, anything exposing DLPack or the buffer protocol) converted with
// one copy; lists, tuples and ranges of ints are accepted too (slower). A
// negative index raises InvalidArgument, one of 2**32 or more OutOfRange (the
// engine's page indices are 32-bit), both naming the side and the position.
[[noreturn]] void bad_page_index(const char* side, size_t i, const std::string& v, bool negative) {
  const std::string msg = std::string(side) + " pages: index " + v + " at position " +
                          std::to_string(i) + " is outside [0, 2**32)";
  if (negative) invalid(msg);
  throw Error(Code::kOutOfRange, msg);
}

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

// ------------------------------------------------------------------ wrapped types

struct PyMrHandle {
  MrHandle h;
  uint64_t len = 0;
  Device device;
  bool writable = true;
  bool registered = true;
  nb::object owner;  // the registered Python object (None for register_memory)
  MrDesc desc;
};

// A PreparedTransfer (TransferEngine::prepare_*) and what repr shows of it.
// The shape holds the source region's registration: the engine empties it on
// stop (a registration must not outlive its NICs), and the source object stays
// alive as long as the shape may keep the region registered.
struct PyPreparedTransfer {
  struct Holder {
    PreparedTransfer p;
  };
  std::shared_ptr<Holder> h;
  const char* kind = "";  // "single_write", "paged_writes" or "scatter"
  uint64_t count = 0;     // bytes, pages or targets
  uint64_t src_id = 0;    // the source region's registration id
  nb::object src_owner;   // the registered source object (None for register_memory)
};

class PyImmCounter {
 public:
  PyImmCounter(ImmCounter c, uint32_t imm, std::shared_ptr<Shared> sh)
      : c_(std::move(c)), imm_(imm), sh_(std::move(sh)) {}
  int64_t value() const { return c_.value(); }
  bool try_consume(nb::handle n) { return c_.try_consume(int64_t(count_arg(n, "n"))); }
  // A loop of bounded waits with the GIL released: between slices it notices
  // Ctrl-C (signals) and its engine stopping (Cancelled, also when the C++
  // counter does not say so itself).
  void wait(nb::handle n_arg, nb::handle timeout_arg_, bool spin) {
    const auto n = int64_t(count_arg(n_arg, "n"));
    const auto mode = spin ? ImmCounter::WaitMode::kSpin : ImmCounter::WaitMode::kSleep;
    const auto timeout = timeout_arg(timeout_arg_);
    const auto deadline = deadline_after(timeout);
    BlockedWait blocked;
    for (;;) {
      if (sh_->stopped.load(std::memory_order_acquire)) {  // arrivals already there still count
        if (c_.try_consume(n)) return;
        throw Error(Code::kCancelled, "ImmCounter(" + std::to_string(imm_) + ").wait(" +
                                          std::to_string(n) + "): the engine stopped; only " +
                                          std::to_string(c_.value()) + " arrival(s)");
      }
      auto slice = std::min<Clock::duration>(deadline - Clock::now(), kSlice);
      if (slice < Clock::duration::zero()) slice = Clock::duration::zero();
      const Status st = without_gil([&] { return c_.wait(n, slice, mode); });
      if (st.is_ok()) return;
      if (st.code() != Code::kDeadlineExceeded) throw Error(st);   // kCancelled: Cancelled
      if (sh_->stopped.load(std::memory_order_acquire)) continue;  // Cancelled, above
      if (Clock::now() >= deadline) {
        throw Error(Code::kDeadlineExceeded, "ImmCounter(" + std::to_string(imm_) + ").wait(" +
                                                 std::to_string(n) + "): only " +
                                                 std::to_string(c_.value()) + " arrival(s) after " +
                                                 std::to_string(*timeout) + " s");
      }
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
  }
  uint32_t imm() const { return imm_; }

 private:
  static constexpr std::chrono::milliseconds kSlice{100};
  ImmCounter c_;
  uint32_t imm_;
  std::shared_ptr<Shared> sh_;
};

// Counts completions without any Python on the completion path (bulk use):
// the worker bumps the atomics itself.
class PyTransferCounter {
 public:
  struct State {
    std::atomic<uint64_t> done{0};
    std::atomic<uint64_t> errors{0};
  };
  PyTransferCounter() : s_(std::make_shared<State>()) {}
  uint64_t done() const { return s_->done.load(); }
  uint64_t errors() const { return s_->errors.load(); }
  void wait(nb::handle n_arg, nb::handle timeout_arg_) {
    const uint64_t n = count_arg(n_arg, "n");
    const auto timeout = timeout_arg(timeout_arg_);
    const auto deadline = deadline_after(timeout);
    BlockedWait blocked;
    auto last_signal_check = Clock::now();
    while (s_->done.load(std::memory_order_acquire) < n) {
      without_gil([&] {
        for (int i = 0; i < 200 && s_->done.load(std::memory_order_acquire) < n; ++i)
          std::this_thread::sleep_for(std::chrono::microseconds(i < 50 ? 0 : 50));
      });
      auto now = Clock::now();
      if (s_->done.load() >= n) break;
      if (now >= deadline)
        throw Error(Code::kDeadlineExceeded, "TransferCounter.wait(" + std::to_string(n) +
                                                 "): " + std::to_string(s_->done.load()) +
                                                 " done after " + std::to_string(*timeout) + " s");
      if (now - last_signal_check > std::chrono::milliseconds(50)) {
        last_signal_check = now;
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
      }
    }
  }
  const std::shared_ptr<State>& state() const { return s_; }

 private:
  std::shared_ptr<State> s_;
};

// ------------------------------------------------------------------ engine

struct GroupSpec {
  std::string device;
  std::vector<std::string> nics;
  int worker_cpu = -1;
};

class PyEngine {
 public:
  PyEngine(std::string provider, std::vector<GroupSpec> groups, size_t nics_per_group, bool busy,
           int callback_cpu, double default_timeout, size_t send_buffer_size,
           size_t send_buffer_count, int verbs_gid_index, size_t max_requests_in_flight,
           std::string queue_full, std::string metrics_address, std::string trace_file)
      : shared_(std::make_shared<Shared>()) {
    EngineConfig c;
    c.metrics_address = std::move(metrics_address);  // observability: stats_ext.cpp
    c.trace_file = std::move(trace_file);
    if (max_requests_in_flight == 0) invalid("max_requests_in_flight must be positive");
    c.max_requests_in_flight = max_requests_in_flight;
    if (queue_full == "block")
      c.queue_full = QueueFull::kBlock;
    else if (queue_full == "refuse")
      c.queue_full = QueueFull::kRefuse;
    else
      invalid("queue_full must be 'block' or 'refuse'");
    c.provider = std::move(provider);
    c.verbs_gid_index = verbs_gid_index;  // checked by the engine, as from C++
    c.groups.clear();
    for (auto& g : groups) {
      GroupConfig gc;
      gc.device = parse_device(g.device);
      gc.nic_names = std::move(g.nics);
      gc.worker_cpu = g.worker_cpu;
      c.groups.push_back(std::move(gc));
    }
    if (c.groups.empty()) c.groups.push_back(GroupConfig{});
    if (nics_per_group == 0) invalid("nics_per_group must be positive");
    c.nics_per_group = nics_per_group;
    c.poll_mode = busy ? PollMode::kBusy : PollMode::kAdaptive;
    c.callback_cpu = callback_cpu;
    if (!(default_timeout >= 0))
      invalid("default_timeout must be a non-negative number of seconds");
    c.default_deadline = std::chrono::milliseconds(int64_t(default_timeout * 1000.0 + 0.5));
    if (default_timeout > 0 && c.default_deadline.count() == 0)
      c.default_deadline = std::chrono::milliseconds(1);
    c.send_buffer_size = send_buffer_size;
    c.send_buffer_count = send_buffer_count;
    engine_ = without_gil([&] { return std::make_unique<TransferEngine>(std::move(c)); });
    for (size_t g = 0; g < engine_->num_groups(); ++g) addresses_.push_back(engine_->addresses(g));
    provider_ = engine_->provider();
    nics_ = engine_->nics_per_group();
    incarnation_ = engine_->incarnation();
  }

  // The C++ engine, for the bindings of other files (stats_ext.cpp).
  TransferEngine& native() {
    if (stopped_ || !engine_)
      throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
    return *engine_;
  }
  // The same, stopped or not, for what a stopped engine still answers
  // (statistics as stop() left them; trace spans, dropped after stop).
  TransferEngine& observed() {
    if (!engine_) throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
    return *engine_;
  }

  ~PyEngine() { shutdown(); }
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // --- identity (cached: still readable after stop())
  const NetAddr& main_address() const { return addresses_.at(0).at(0); }
  std::vector<NetAddr> addresses(nb::handle group_arg) const {
    const auto group = size_t(count_arg(group_arg, "group"));
    if (group >= addresses_.size())
      throw Error(Code::kOutOfRange,
                  "group " + std::to_string(group) + " of " + std::to_string(addresses_.size()));
    return addresses_[group];
  }
  size_t num_groups() const { return addresses_.size(); }
  size_t nics_per_group() const { return nics_; }
  const std::string& provider() const { return provider_; }
  uint64_t incarnation() const { return incarnation_; }
  uint64_t callback_errors() const { return shared_->callback_errors.load(); }
  bool stopped() const { return stopped_; }

  // --- memory
  nb::tuple register_memory(nb::handle ptr_arg, nb::handle len_arg, nb::handle device_arg,
                            nb::object owner, bool writable) {
    const uint64_t ptr = addr_arg(ptr_arg, "ptr");
    const uint64_t len = byte_arg(len_arg, "length");
    const Device d =
        parse_device(str_arg(device_arg, "device", "a device name (\"cpu\" or \"cuda:N\")"));
    check_running();
    auto r = without_gil([&] { return engine_->reg_mr(reinterpret_cast<void*>(ptr), len, d); });
    auto h = std::make_unique<PyMrHandle>();
    h->h = r.first;
    h->len = len;
    h->device = d;
    h->writable = writable;
    h->owner = owner;
    h->desc = r.second;
    owners_[r.first.id] = std::move(owner);  // alive until unregister or stop
    nb::object desc = nb::cast(std::move(r.second));
    return nb::make_tuple(nb::cast(h.release(), nb::rv_policy::take_ownership), desc);
  }

  void unregister(nb::handle handle) {
    PyMrHandle& h = obj_arg<PyMrHandle>(handle, "handle", kHandleType);
    check_running();
    without_gil([&] { engine_->unreg_mr(h.h); });
    h.registered = false;
    owners_.erase(h.h.id);
  }

  // --- two-sided
  uint64_t submit_send(nb::handle addr_obj, nb::handle data, nb::handle future, nb::handle on_done,
                       nb::handle counter) {
    const NetAddr& addr =
        obj_arg<NetAddr>(addr_obj, "addr", "a ferry.NetAddr (the peer's main_address)");
    check_running();
    ByteView bytes(data, "submit_send");
    OnDone done = completion(future, on_done, counter);
    return without_gil([&] { return engine_->submit_send(addr, bytes.span(), std::move(done)); });
  }

  void submit_recvs(nb::handle len_arg, nb::handle count_arg_, nb::handle cb_arg) {
    const uint64_t l = byte_arg(len_arg, "length"), n = count_arg(count_arg_, "count");
    nb::handle cb = callable_arg(cb_arg, "callback");
    check_running();
    auto slot = add_slot(cb);
    auto sh = shared_;
    RecvCallback f = [slot, sh](std::span<const uint8_t> msg) {
      run_py(*sh, "receive callback", [&] {
        if (!slot->fn) return;
        nb::object mv = nb::steal(
            PyMemoryView_FromMemory(reinterpret_cast<char*>(const_cast<uint8_t*>(msg.data())),
                                    Py_ssize_t(msg.size()), PyBUF_READ));
        if (!mv.is_valid()) throw nb::python_error();
        bool ok = true;
        try {
          slot->fn.get()(mv);
        } catch (nb::python_error&) {
          ok = false;
          release_view(mv, false);
          throw;
        }
        if (ok) release_view(mv, true);
      });
    };
    without_gil([&] { engine_->submit_recvs(l, n, std::move(f)); });
  }

  // --- one-sided
  uint64_t submit_write(nb::handle src_arg, nb::handle src_offset, nb::handle len,
                        nb::handle dst_arg, nb::handle dst_offset, nb::handle imm,
                        nb::handle route_arg, nb::handle future, nb::handle on_done,
                        nb::handle counter) {
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    const auto so = byte_arg(src_offset, "src_offset");
    const auto l = byte_arg(len, "length");
    const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
    const auto doff = byte_arg(dst_offset, "dst_offset");
    const auto i = opt_u32_arg(imm, "imm");
    const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
    check_running();
    check_handle(src);
    OnDone done = completion(future, on_done, counter);
    return without_gil([&] {
      return engine_->submit_single_write(l, i, src.h, so, dst, doff, std::move(done), route);
    });
  }

  uint64_t submit_paged_writes(nb::handle page_len, nb::handle src_arg, nb::handle src_pages,
                               nb::handle src_stride, nb::handle src_offset, nb::handle dst_arg,
                               nb::handle dst_pages, nb::handle dst_stride, nb::handle dst_offset,
                               nb::handle imm, nb::handle future, nb::handle on_done,
                               nb::handle counter) {
    const auto pl = byte_arg(page_len, "page_len");
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    const auto sstride = byte_arg(src_stride, "src_stride");
    const auto soff = byte_arg(src_offset, "src_offset");
    const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
    const auto dstride = byte_arg(dst_stride, "dst_stride");
    const auto doff = byte_arg(dst_offset, "dst_offset");
    const auto i = opt_u32_arg(imm, "imm");
    check_running();
    check_handle(src);
    Pages sp{page_indices(src_pages, "source"), sstride, soff};
    Pages dp{page_indices(dst_pages, "destination"), dstride, doff};
    OnDone done = completion(future, on_done, counter);
    return without_gil([&] {
      return engine_->submit_paged_writes(pl, i, src.h, std::move(sp), dst, std::move(dp),
                                          std::move(done));
    });
  }

  uint64_t submit_imm(nb::handle imm, nb::handle dst_arg, nb::handle route_arg, nb::handle future,
                      nb::handle on_done, nb::handle counter) {
    const auto i = u32_arg(imm, "imm");
    const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
    const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
    check_running();
    OnDone done = completion(future, on_done, counter);
    return without_gil([&] { return engine_->submit_imm(i, dst, std::move(done), route); });
  }

  // --- peer groups
  // peers: a list of MrDesc, or a list of lists of NetAddr (every NIC of each peer).
  uint32_t add_peer_group(nb::handle peers_arg) {
    if (!PyList_Check(peers_arg.ptr())) wrong_type("peers", "a list", peers_arg);
    nb::list peers = nb::borrow<nb::list>(peers_arg);
    const size_t n = nb::len(peers);
    if (n > 0 && nb::isinstance<MrDesc>(list_item(peers, 0))) {
      std::vector<MrDesc> descs;
      descs.reserve(n);
      for (size_t k = 0; k < n; ++k)
        descs.push_back(obj_arg<MrDesc>(list_item(peers, k), "peers[" + std::to_string(k) + "]",
                                        "a ferry.MrDesc like peers[0]"));
      check_running();
      return without_gil([&] { return engine_->add_peer_group(descs); });
    }
    std::vector<std::vector<NetAddr>> addrs(n);
    for (size_t k = 0; k < n; ++k) {
      nb::handle p = list_item(peers, k);
      const std::string name = "peers[" + std::to_string(k) + "]";
      if (!PyList_Check(p.ptr()) && !PyTuple_Check(p.ptr()))
        wrong_type(name, "a ferry.MrDesc or a list of the peer's ferry.NetAddr", p);
      nb::sequence seq = nb::borrow<nb::sequence>(p);
      size_t j = 0;
      for (nb::handle a : seq)
        addrs[k].push_back(
            obj_arg<NetAddr>(a, name + "[" + std::to_string(j++) + "]", "a ferry.NetAddr"));
    }
    check_running();
    return without_gil([&] { return engine_->add_peer_group(addrs); });
  }

  uint64_t submit_scatter(nb::handle src_arg, nb::handle dsts_arg, nb::handle imm, nb::handle group,
                          nb::handle route_arg, nb::handle future, nb::handle on_done,
                          nb::handle counter) {
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    std::vector<ScatterDst> dsts = scatter_dsts(dsts_arg);
    const auto i = opt_u32_arg(imm, "imm");
    const auto g = opt_u32_arg(group, "group");
    const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
    check_running();
    check_handle(src);
    OnDone done = completion(future, on_done, counter);
    return without_gil([&] {
      return engine_->submit_scatter(g, std::move(done), i, src.h, std::move(dsts), route);
    });
  }

  uint64_t submit_barrier(nb::handle imm, nb::handle dsts_arg, nb::handle group,
                          nb::handle route_arg, nb::handle future, nb::handle on_done,
                          nb::handle counter) {
    const auto i = u32_arg(imm, "imm");
    if (!PyList_Check(dsts_arg.ptr())) wrong_type("dsts", "a list of ferry.MrDesc", dsts_arg);
    nb::list dl = nb::borrow<nb::list>(dsts_arg);
    std::vector<MrDesc> dsts;
    dsts.reserve(nb::len(dl));
    for (size_t k = 0, n = nb::len(dl); k < n; ++k)
      dsts.push_back(
          obj_arg<MrDesc>(list_item(dl, k), "dsts[" + std::to_string(k) + "]", kDescType));
    const auto g = opt_u32_arg(group, "group");
    const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
    check_running();
    OnDone done = completion(future, on_done, counter);
    return without_gil(
        [&] { return engine_->submit_barrier(g, std::move(done), i, std::move(dsts), route); });
  }

  // --- prepared transfers: the arguments and checks of the submit_* of the same
  // name, less the immediate and the completion; submit() posts one.
  PyPreparedTransfer prepare_single_write(nb::handle src_arg, nb::handle src_offset, nb::handle len,
                                          nb::handle dst_arg, nb::handle dst_offset,
                                          nb::handle route_arg) {
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    const auto so = byte_arg(src_offset, "src_offset");
    const auto l = byte_arg(len, "length");
    const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
    const auto doff = byte_arg(dst_offset, "dst_offset");
    const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
    check_running();
    check_handle(src);
    PreparedTransfer p =
        without_gil([&] { return engine_->prepare_single_write(l, src.h, so, dst, doff, route); });
    return keep_prepared(std::move(p), "single_write", l, src);
  }

  PyPreparedTransfer prepare_paged_writes(nb::handle page_len, nb::handle src_arg,
                                          nb::handle src_pages, nb::handle src_stride,
                                          nb::handle src_offset, nb::handle dst_arg,
                                          nb::handle dst_pages, nb::handle dst_stride,
                                          nb::handle dst_offset) {
    const auto pl = byte_arg(page_len, "page_len");
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    const auto sstride = byte_arg(src_stride, "src_stride");
    const auto soff = byte_arg(src_offset, "src_offset");
    const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
    const auto dstride = byte_arg(dst_stride, "dst_stride");
    const auto doff = byte_arg(dst_offset, "dst_offset");
    check_running();
    check_handle(src);
    Pages sp{page_indices(src_pages, "source"), sstride, soff};
    Pages dp{page_indices(dst_pages, "destination"), dstride, doff};
    const uint64_t pages = sp.indices.size();
    PreparedTransfer p = without_gil([&] {
      return engine_->prepare_paged_writes(pl, src.h, std::move(sp), dst, std::move(dp));
    });
    return keep_prepared(std::move(p), "paged_writes", pages, src);
  }

  PyPreparedTransfer prepare_scatter(nb::handle src_arg, nb::handle dsts_arg, nb::handle group,
                                     nb::handle route_arg) {
    const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
    std::vector<ScatterDst> dsts = scatter_dsts(dsts_arg);
    const auto g = opt_u32_arg(group, "group");
    const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
    check_running();
    check_handle(src);
    const uint64_t targets = dsts.size();
    PreparedTransfer p =
        without_gil([&] { return engine_->prepare_scatter(g, src.h, std::move(dsts), route); });
    return keep_prepared(std::move(p), "scatter", targets, src);
  }

  // An unregistered source is the engine's to refuse (kFailedPrecondition).
  uint64_t submit(nb::handle prepared_arg, nb::handle imm, nb::handle future, nb::handle on_done,
                  nb::handle counter) {
    const PyPreparedTransfer& prepared =
        obj_arg<PyPreparedTransfer>(prepared_arg, "prepared", kPreparedType);
    const auto i = opt_u32_arg(imm, "imm");
    check_running();
    OnDone done = completion(future, on_done, counter);
    PreparedTransfer p = prepared.h->p;  // stop() may empty the holder meanwhile
    return without_gil([&] {
      auto dropped = std::move(p);  // released before the GIL is taken back
      return engine_->submit(dropped, i, std::move(done));
    });
  }

  // --- immediates
  void expect_imm_count(nb::handle imm, nb::handle count, nb::handle cb_arg) {
    const auto i = u32_arg(imm, "imm");
    const auto n = u32_arg(count, "count");
    nb::handle cb = callable_arg(cb_arg, "callback");
    check_running();
    auto slot = add_slot(cb);
    auto sh = shared_;
    without_gil([&] {
      engine_->expect_imm_count(i, n, [slot, sh] {
        run_py(*sh, "expect_imm_count callback", [&] {
          if (slot->fn) slot->fn.get()();
        });
      });
    });
  }

  void remove_imm_count(nb::handle imm) {
    const auto i = u32_arg(imm, "imm");
    check_running();
    engine_->remove_imm_count(i);
  }

  PyImmCounter imm_counter(nb::handle imm) {
    const auto i = u32_arg(imm, "imm");
    check_running();
    return PyImmCounter(engine_->imm_counter(i), i, shared_);
  }

  void on_imm(nb::handle cb_arg) {
    nb::handle cb = callable_arg(cb_arg, "callback");
    check_running();
    auto slot = add_slot(cb);
    auto sh = shared_;
    without_gil([&] {
      engine_->on_imm([slot, sh](uint32_t imm) {
        run_py(*sh, "on_imm callback", [&] {
          if (slot->fn) slot->fn.get()(imm);
        });
      });
    });
  }

  // --- GPU signalling (builds without CUDA raise Unimplemented)
  uintptr_t alloc_uvm_watcher(nb::handle cb_arg) {
    nb::handle cb = callable_arg(cb_arg, "callback");
    check_running();
    auto slot = add_slot(cb);
    auto sh = shared_;
    uint64_t* word = without_gil([&] {
      return engine_->alloc_uvm_watcher([slot, sh](uint64_t old_v, uint64_t new_v) {
        bool keep = false;  // an exception releases the watcher
        run_py(*sh, "uvm watcher callback", [&] {
          if (slot->fn) keep = nb::cast<bool>(slot->fn.get()(old_v, new_v));
        });
        return keep;
      });
    });
    return reinterpret_cast<uintptr_t>(word);
  }

  uintptr_t imm_counter_gpu(nb::handle imm, nb::handle count) {
    const auto i = u32_arg(imm, "imm");
    const auto n = u32_arg(count, "count");
    check_running();
    return reinterpret_cast<uintptr_t>(without_gil([&] { return engine_->imm_counter_gpu(i, n); }));
  }

  void stop() {
    if (t_callback_depth > 0)
      throw Error(Code::kFailedPrecondition,
                  "stop() cannot be called from a ferry callback: it waits for the callback "
                  "thread to drain");
    shutdown();
  }

 private:
  void check_running() const {
    if (stopped_) throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
  }

  PyPreparedTransfer keep_prepared(PreparedTransfer p, const char* kind, uint64_t count,
                                   const PyMrHandle& src) {
    auto h = std::make_shared<PyPreparedTransfer::Holder>(PyPreparedTransfer::Holder{std::move(p)});
    if (prepared_.size() >= 2 * prepared_live_ + 64) {  // amortised pruning of dropped shapes
      std::erase_if(prepared_, [](const auto& w) { return w.expired(); });
      prepared_live_ = prepared_.size();
    }
    prepared_.push_back(h);
    return PyPreparedTransfer{std::move(h), kind, count, src.h.id, src.owner};
  }

  static std::vector<ScatterDst> scatter_dsts(nb::handle dsts_arg) {
    if (!PyList_Check(dsts_arg.ptr())) wrong_type("dsts", "a list of ferry.ScatterDst", dsts_arg);
    nb::list dl = nb::borrow<nb::list>(dsts_arg);
    std::vector<ScatterDst> dsts;
    dsts.reserve(nb::len(dl));
    for (size_t k = 0, n = nb::len(dl); k < n; ++k)
      dsts.push_back(obj_arg<ScatterDst>(list_item(dl, k), "scatter target " + std::to_string(k),
                                         "a ferry.ScatterDst"));
    return dsts;
  }

  static void check_handle(const PyMrHandle& h) {
    if (!h.registered)
      throw Error(Code::kNotFound, "memory region " + std::to_string(h.h.id) +
                                       " was unregistered: register it again");
  }

  std::shared_ptr<Slot> add_slot(nb::handle fn) {
    auto s = std::make_shared<Slot>();
    s->fn = PyRef(fn);
    slots_.push_back(s);
    return s;
  }

  static void release_view(nb::handle mv, bool raise) {
    PyObject* r = PyObject_CallMethod(mv.ptr(), "release", nullptr);
    if (r != nullptr) {
      Py_DECREF(r);
      return;
    }
    PyErr_Clear();
    if (raise)
      throw Error(Code::kFailedPrecondition,
                  "a view of a received message outlived its callback (the buffer is reused "
                  "right after the callback): copy the message with bytes(m) instead");
  }

  // The OnDone for one submit: nothing, a C++ counter (no Python at all on
  // completion), or a callback that resolves the future and calls on_done
  // with None or the ferry exception, on the callback thread.
  OnDone completion(nb::handle future, nb::handle on_done, nb::handle counter_arg) {
    const bool has_future = future.is_valid() && !future.is_none();
    const bool has_cb = callable_arg(on_done, "on_done", true).is_valid();
    if (counter_arg.is_valid() && !counter_arg.is_none()) {
      PyTransferCounter& counter =
          obj_arg<PyTransferCounter>(counter_arg, "counter", "a ferry.TransferCounter or None");
      if (has_cb || has_future) invalid("counter= cannot be combined with on_done= or a Transfer");
      counters_.insert(counter.state());  // the worker writes the atomics: keep them alive
      return OnDone::counter(counter.state()->done, &counter.state()->errors);
    }
    if (!has_future && !has_cb) return OnDone::none();
    struct Completion {
      PyRef future, on_done;
      std::shared_ptr<Shared> sh;
    };
    auto c = std::make_shared<Completion>(Completion{PyRef(future), PyRef(on_done), shared_});
    return OnDone([c](const Status& s) {
      run_py(*c->sh, "transfer completion", [&] {
        PyRef fut = std::move(c->future), cb = std::move(c->on_done);
        nb::object err = s.is_ok() ? nb::none() : make_error(s);
        if (fut) {
          try {
            if (s.is_ok())
              fut.get().attr("set_result")(nb::none());
            else
              fut.get().attr("set_exception")(err);
          } catch (nb::python_error& e) {
            e.restore();
            report_current(*c->sh, "resolving a Transfer");
          }
        }
        if (cb) cb.get()(err);
      });
    });
  }

  void shutdown() {
    if (!engine_ || stopped_) return;
    stopped_ = true;
    shared_->stopped.store(true, std::memory_order_release);  // counter waits: Cancelled
    for (auto& s : slots_) s->fn.reset();
    slots_.clear();
    for (auto& w : prepared_)  // their registrations go before the NICs close
      if (auto h = w.lock()) h->p = PreparedTransfer{};
    prepared_.clear();
    if (t_callback_depth > 0) {
      // The last reference went away inside a callback: stopping here would
      // join the callback thread from itself. Stop on a helper thread, keeping
      // the registered objects alive until the NICs are closed.
      auto owners = std::make_shared<std::vector<PyRef>>();
      for (auto& [id, o] : owners_) owners->emplace_back(o);
      owners_.clear();
      std::thread([e = std::move(engine_), owners]() mutable {
        e->stop();
        e.reset();
        owners->clear();
      }).detach();
      return;
    }
    // The callback thread drains (taking the GIL) and joins.
    without_gil([&] { engine_->stop(); });
    owners_.clear();
  }

  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<Shared> shared_;
  std::vector<std::vector<NetAddr>> addresses_;
  std::string provider_;
  size_t nics_ = 0;
  uint64_t incarnation_ = 0;
  bool stopped_ = false;
  std::vector<std::shared_ptr<Slot>> slots_;
  std::unordered_map<uint64_t, nb::object> owners_;
  std::set<std::shared_ptr<PyTransferCounter::State>> counters_;
  std::vector<std::weak_ptr<PyPreparedTransfer::Holder>> prepared_;
  size_t prepared_live_ = 0;
};

// ------------------------------------------------------------------ buffers and providers

// (ptr, nbytes, device, readonly, c_contiguous) of an object exposing DLPack or
// the buffer protocol; raises InvalidArgument for anything else.
nb::tuple describe_buffer(nb::handle obj) {
  auto describe = [](const auto& a, bool readonly) {
    bool contig = true;
    int64_t expect = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != expect) contig = false;
      expect *= int64_t(a.shape(i));
    }
    if (a.size() == 0) contig = true;  // empty: reg_mr reports the zero length
    std::string dev;
    switch (a.device_type()) {
      case nb::device::cpu::value:
      case nb::device::cuda_host::value:
        dev = "cpu";
        break;
      case nb::device::cuda::value:
      case nb::device::cuda_managed::value:
        dev = "cuda:" + std::to_string(a.device_id());
        break;
      default:
        invalid("cannot register memory of DLPack device type " + std::to_string(a.device_type()));
    }
    return nb::make_tuple(uint64_t(reinterpret_cast<uintptr_t>(a.data())),
                          uint64_t(a.itemsize() * a.size()), dev, readonly, contig);
  };
  nb::ndarray<> rw;
  if (nb::try_cast(obj, rw, false)) return describe(rw, false);
  nb::ndarray<nb::ro> ro;
  if (nb::try_cast(obj, ro, false)) return describe(ro, true);
  if (nb::hasattr(obj, "__dlpack__")) {
    // Say why the producer refused (e.g. torch: a tensor that requires grad).
    try {
      obj.attr("__dlpack__")();
    } catch (nb::python_error& e) {
      invalid(std::string("cannot register this ") + nb::type_name(obj.type()).c_str() +
              ": its __dlpack__() failed: " + e.what());
    }
  }
  invalid(std::string("cannot register an object of type ") + nb::type_name(obj.type()).c_str() +
          ": it exposes neither DLPack (__dlpack__) nor the buffer protocol; use "
          "register_memory(ptr, length, device) for raw memory");
}

// What the engine would open for `prov` (ferry/info.h, the engine's own
// listing): (note when nothing was found or "", [(domain, fabric, provider, hmem)]).
nb::tuple probe_provider(const std::string& prov) {
  ferry::ProviderListing l;
  without_gil([&] { l = ferry::list_provider(prov); });
  std::vector<std::tuple<std::string, std::string, std::string, bool>> domains;
  for (const auto& n : l.nics) domains.emplace_back(n.name, n.fabric, n.provider, n.hmem);
  return nb::make_tuple(l.nics.empty() ? l.note : std::string(), nb::cast(domains));
}

nb::dict build_info() {
  nb::dict d;
  d["version"] = kVersion;
#ifdef FERRY_PY_CUDA
  d["cuda"] = true;
#else
  d["cuda"] = false;
#endif
  d["libfabric_headers"] =
      std::to_string(FI_MAJOR_VERSION) + "." + std::to_string(FI_MINOR_VERSION);
  uint32_t v = fi_version();
  d["libfabric_runtime"] = std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  d["nanobind"] = std::to_string(NB_VERSION_MAJOR) + "." + std::to_string(NB_VERSION_MINOR) + "." +
                  std::to_string(NB_VERSION_PATCH);
  d["compiler"] = __VERSION__;
  d["cxx_standard"] = long(__cplusplus);
#ifdef NDEBUG
  d["assertions"] = false;
#else
  d["assertions"] = true;
#endif
  return d;
}

template <typename T>
nb::bytes to_pybytes(const T& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

std::string write_route_repr(const WriteRoute& r) {
  switch (r.kind) {
    case WriteRoute::Kind::kSplit:
      return "WriteRoute.split(max_shards=" + std::to_string(r.max_shards) +
             ", min_piece=" + std::to_string(r.min_piece) + ")";
    case WriteRoute::Kind::kPinned:
      return "WriteRoute.pinned(" + std::to_string(r.nic) + ")";
    case WriteRoute::Kind::kRoundRobin:
      return "WriteRoute.round_robin()";
  }
  return "WriteRoute(?)";
}

std::string group_route_repr(const GroupRoute& r) {
  switch (r.kind) {
    case GroupRoute::Kind::kShardPeers:
      return "GroupRoute.shard_peers()";
    case GroupRoute::Kind::kShardBytes:
      return "GroupRoute.shard_bytes()";
    case GroupRoute::Kind::kPinned:
      return "GroupRoute.pinned(" + std::to_string(r.nic) + ")";
  }
  return "GroupRoute(?)";
}

uint8_t nic_index(nb::handle nic, const char* name) {
  return uint8_t(int_arg(nic, name, 0, 255, "[0, 255]"));
}

PreparedTransfer prepared_of(nb::handle p) {  // for kv_ext.cpp
  return obj_arg<PyPreparedTransfer>(p, "prepared", kPreparedType).h->p;
}

}  // namespace
void register_moe(nb::module_& m);  // moe_ext.cpp

}  // namespace ferry::py

using namespace ferry;
using namespace ferry::py;

NB_MODULE(_ferry, m) {
  m.doc() = "Low-level bindings of the ferry transfer engine (use the `ferry` package).";
  m.attr("__version__") = kVersion;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object exc = make_error(e.status());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const ArgTypeError& e) {
      PyObject* cls = g_type_error_class ? g_type_error_class : PyExc_TypeError;
      nb::object exc = nb::handle(cls)(nb::str(e.what()));
      if (g_type_error_class) exc.attr("code") = nb::str("INVALID_ARGUMENT");
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  exit_gate().main_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));

  // Drop the Python objects held in C++ globals before the interpreter tears
  // modules down (registered first: runs after ferry's own atexit handlers,
  // which call _begin_exit themselves; calling it again does nothing).
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    begin_exit();
    Py_CLEAR(g_error_hook);
    Py_CLEAR(g_error_classes);
    Py_CLEAR(g_type_error_class);
  }));

  m.def(
      "_set_error_classes",
      [](nb::dict classes) {
        Py_XDECREF(g_error_classes);
        g_error_classes = classes.inc_ref().ptr();
      },
      "classes"_a, "Installs the exception class of every status code name (ferry/_errors.py).");
  m.def(
      "_set_type_error_class",
      [](nb::handle cls) {
        Py_XDECREF(g_type_error_class);
        g_type_error_class = cls.inc_ref().ptr();
      },
      "cls"_a, "Installs the exception class of wrongly typed arguments (InvalidArgumentType).");
  m.def("_begin_exit", &begin_exit,
        "Called at interpreter exit (atexit): from now on threads coming back from a ferry call "
        "that released the GIL park instead of re-taking it.");
  m.def(
      "_blocked_waits", [] { return g_blocked_waits.load(); },
      "Threads inside ImmCounter.wait or TransferCounter.wait (for tests).");
  m.def(
      "_set_callback_error_hook",
      [](nb::callable hook) {
        Py_XDECREF(g_error_hook);
        g_error_hook = hook.inc_ref().ptr();
      },
      "hook"_a,
      "hook(where, exc) is called (GIL held) for every exception a user callback raises.");
  m.def(
      "make_error",
      [](const std::string& code, const std::string& message) {
        for (int c = 0; c <= int(Code::kAborted); ++c)
          if (code_name(Code(c)) == code) return make_error(Status(Code(c), message));
        invalid("unknown status code '" + code + "'");
      },
      "code"_a, "message"_a, "The ferry exception for a status code name such as 'NOT_FOUND'.");
  m.def(
      "in_callback", [] { return t_callback_depth > 0; },
      "True while running inside a ferry callback (on the engine's callback thread).");
  m.def("describe_buffer", &describe_buffer, "obj"_a,
        "(ptr, nbytes, device, readonly, c_contiguous) of an object exposing DLPack or the buffer "
        "protocol.");
  m.def("probe_provider", &probe_provider, "provider"_a,
        "What the engine would open for one provider (ferry/info.h): (note or '', [(domain, "
        "fabric, provider, hmem)]).");
  m.def("build_info", &build_info, "Version and build options of this extension.");
  m.def(
      "_thread_states",
      [] {
        size_t n = 0;
        for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
             t != nullptr; t = PyThreadState_Next(t))
          ++n;
        return n;
      },
      "Python thread states of this interpreter (tests: engines leave none behind).");

  // ---- addresses and descriptors
  nb::class_<NetAddr>(m, "NetAddr",
                      "The address of one NIC endpoint of one engine incarnation (opaque bytes).")
      .def(
          "__init__",
          [](NetAddr* self, nb::handle b) {
            new (self) NetAddr(NetAddr::from_bytes(ByteView(b, "NetAddr").span()));
          },
          "data"_a, "Same as NetAddr.from_bytes(data).")
      .def_static(
          "from_bytes",
          [](nb::handle b) {
            return NetAddr::from_bytes(ByteView(b, "NetAddr.from_bytes").span());
          },
          "data"_a, "Decodes bytes produced by bytes(); raises InvalidArgument when malformed.")
      .def_static(
          "from_hex", [](nb::handle t) { return NetAddr::from_hex(str_arg(t, "text")); },
          "text"_a.none(), nb::sig("def from_hex(text: str) -> NetAddr"), "Decodes hex() output.")
      .def(
          "bytes", [](const NetAddr& a) { return to_pybytes(a.bytes()); }, "The wire form.")
      .def("hex", &NetAddr::to_hex, "The wire form as lowercase hex.")
      .def_prop_ro(
          "transport",
          [](const NetAddr& a) {
            switch (a.transport()) {
              case Transport::kFabric:
                return "fabric";
              case Transport::kVerbs:
                return "verbs";
              case Transport::kNvlink:
                return "nvlink";
              case Transport::kFake:
                return "fake";
            }
            return "?";
          },
          "Transport family: 'fabric', 'verbs' or 'nvlink'.")
      .def_prop_ro("incarnation", &NetAddr::incarnation, "Random id of the owning engine's run.")
      .def_prop_ro(
          "raw", [](const NetAddr& a) { return to_pybytes(a.raw()); },
          "The provider's raw endpoint name.")
      .def(
          "__eq__", [](const NetAddr& a, const NetAddr& b) { return a == b; }, nb::is_operator())
      .def(
          "__ne__", [](const NetAddr& a, const NetAddr& b) { return !(a == b); }, nb::is_operator())
      .def("__hash__", [](const NetAddr& a) { return a.hash(); })
      .def("__repr__", [](const NetAddr& a) { return "NetAddr(" + a.brief() + ")"; })
      .def("__reduce__", [](nb::handle self) {
        const NetAddr& a = nb::cast<const NetAddr&>(self);
        return nb::make_tuple(self.type(), nb::make_tuple(to_pybytes(a.bytes())));
      });

  nb::class_<MrDesc>(m, "MrDesc",
                     "Serialisable descriptor of a registered region: what a peer needs to write "
                     "into it. Send it to peers with bytes()/hex() or pickle.")
      .def(
          "__init__",
          [](MrDesc* self, nb::handle b) {
            new (self) MrDesc(MrDesc::from_bytes(ByteView(b, "MrDesc").span()));
          },
          "data"_a, "Same as MrDesc.from_bytes(data).")
      .def_static(
          "from_bytes",
          [](nb::handle b) { return MrDesc::from_bytes(ByteView(b, "MrDesc.from_bytes").span()); },
          "data"_a, "Decodes bytes produced by bytes(); raises InvalidArgument when malformed.")
      .def_static(
          "from_hex", [](nb::handle t) { return MrDesc::from_hex(str_arg(t, "text")); },
          "text"_a.none(), nb::sig("def from_hex(text: str) -> MrDesc"), "Decodes hex() output.")
      .def(
          "bytes", [](const MrDesc& d) { return to_pybytes(d.to_bytes()); }, "The wire form.")
      .def("hex", &MrDesc::to_hex, "The wire form as lowercase hex.")
      .def_ro("ptr", &MrDesc::ptr, "The owner's virtual base address (informational).")
      .def_ro("length", &MrDesc::len, "Size of the region in bytes.")
      .def_prop_ro(
          "device", [](const MrDesc& d) { return device_str(d.device); }, "'cpu' or 'cuda:N'.")
      .def_ro("writable", &MrDesc::writable,
              "False for a region registered read-only: peers may not write into it (a write "
              "is refused on the sender with FailedPrecondition).")
      .def_prop_ro(
          "addresses",
          [](const MrDesc& d) {
            std::vector<NetAddr> v;
            for (const auto& n : d.nics) v.push_back(n.addr);
            return v;
          },
          "The owner's NIC addresses, in NIC order.")
      .def_prop_ro(
          "nics",
          [](const MrDesc& d) {
            std::vector<std::tuple<NetAddr, uint64_t, uint64_t>> v;
            for (const auto& n : d.nics) v.emplace_back(n.addr, n.rkey, n.base);
            return v;
          },
          "[(address, rkey, base)] per NIC of the owner's group.")
      .def(
          "__eq__", [](const MrDesc& a, const MrDesc& b) { return a == b; }, nb::is_operator())
      .def(
          "__ne__", [](const MrDesc& a, const MrDesc& b) { return !(a == b); }, nb::is_operator())
      .def("__hash__",
           [](const MrDesc& d) {
             auto b = d.to_bytes();
             return std::hash<std::string_view>{}(
                 std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
           })
      .def("__repr__",
           [](const MrDesc& d) {
             return "MrDesc(" + std::to_string(d.len) + " bytes on " + device_str(d.device) + ", " +
                    std::to_string(d.nics.size()) + " NIC(s), owner " +
                    (d.nics.empty() ? std::string("?") : d.nics[0].addr.brief()) + ")";
           })
      .def("__reduce__", [](nb::handle self) {
        const MrDesc& d = nb::cast<const MrDesc&>(self);
        return nb::make_tuple(self.type(), nb::make_tuple(to_pybytes(d.to_bytes())));
      });

  nb::class_<PyMrHandle>(m, "MrHandle",
                         "Local handle of a registered region. Holds a reference to the registered "
                         "object; pass it to unregister() when done.")
      .def_prop_ro(
          "ptr", [](const PyMrHandle& h) { return uint64_t(uintptr_t(h.h.ptr)); },
          "Base address of the region.")
      .def_prop_ro(
          "id", [](const PyMrHandle& h) { return h.h.id; }, "Registration id.")
      .def_ro("length", &PyMrHandle::len, "Size of the region in bytes.")
      .def_prop_ro(
          "device", [](const PyMrHandle& h) { return device_str(h.device); }, "'cpu' or 'cuda:N'.")
      .def_ro("writable", &PyMrHandle::writable,
              "False when registered with writable=False (a read-only source).")
      .def_ro("registered", &PyMrHandle::registered, "False after unregister().")
      .def_ro("obj", &PyMrHandle::owner, "The registered Python object (None for register_memory).")
      .def_ro("desc", &PyMrHandle::desc, "The region's descriptor (also returned by register).")
      .def("__repr__", [](const PyMrHandle& h) {
        return "MrHandle(id=" + std::to_string(h.h.id) + ", " + std::to_string(h.len) +
               " bytes on " + device_str(h.device) + (h.registered ? "" : ", unregistered") + ")";
      });

  // ---- routes
  nb::class_<WriteRoute>(m, "WriteRoute", "How a single write is placed on the group's NICs.")
      .def_static(
          "split",
          [](nb::handle max_shards, nb::handle min_piece) {
            return WriteRoute::split(nic_index(max_shards, "max_shards"),
                                     count_arg(min_piece, "min_piece"));
          },
          "max_shards"_a.none() = 0, "min_piece"_a.none() = 256 << 10,
          nb::sig("def split(max_shards: int = 0, min_piece: int = 262144) -> WriteRoute"),
          "Cut into up to max_shards pieces (0 = all NICs) of at least min_piece bytes.")
      .def_static(
          "pinned", [](nb::handle nic) { return WriteRoute::pinned(nic_index(nic, "nic")); },
          "nic"_a.none(), nb::sig("def pinned(nic: int) -> WriteRoute"),
          "The whole write on NIC `nic`.")
      .def_static("round_robin", &WriteRoute::round_robin,
                  "The whole write on the next NIC of a per-group rotation.")
      .def_prop_ro("kind",
                   [](const WriteRoute& r) {
                     return r.kind == WriteRoute::Kind::kSplit    ? "split"
                            : r.kind == WriteRoute::Kind::kPinned ? "pinned"
                                                                  : "round_robin";
                   })
      .def_ro("nic", &WriteRoute::nic)
      .def_ro("max_shards", &WriteRoute::max_shards)
      .def_ro("min_piece", &WriteRoute::min_piece)
      .def(
          "__eq__",
          [](const WriteRoute& a, const WriteRoute& b) {
            return a.kind == b.kind && a.nic == b.nic && a.max_shards == b.max_shards &&
                   a.min_piece == b.min_piece;
          },
          nb::is_operator())
      .def("__repr__", &write_route_repr);

  nb::class_<GroupRoute>(m, "GroupRoute", "How scatter and barrier spread targets over NICs.")
      .def_static("shard_peers", &GroupRoute::shard_peers,
                  "Targets divided into contiguous runs, one run per NIC.")
      .def_static("shard_bytes", &GroupRoute::shard_bytes,
                  "Every target's bytes divided over all NICs.")
      .def_static(
          "pinned", [](nb::handle nic) { return GroupRoute::pinned(nic_index(nic, "nic")); },
          "nic"_a.none(), nb::sig("def pinned(nic: int) -> GroupRoute"), "Everything on NIC `nic`.")
      .def_prop_ro("kind",
                   [](const GroupRoute& r) {
                     return r.kind == GroupRoute::Kind::kShardPeers   ? "shard_peers"
                            : r.kind == GroupRoute::Kind::kShardBytes ? "shard_bytes"
                                                                      : "pinned";
                   })
      .def_ro("nic", &GroupRoute::nic)
      .def(
          "__eq__",
          [](const GroupRoute& a, const GroupRoute& b) {
            return a.kind == b.kind && a.nic == b.nic;
          },
          nb::is_operator())
      .def("__repr__", &group_route_repr);

  nb::class_<ScatterDst>(m, "ScatterDst", "One target of submit_scatter.")
      .def(
          "__init__",
          [](ScatterDst* self, nb::handle length, nb::handle src_offset, nb::handle dst,
             nb::handle dst_offset) {
            const uint64_t l = byte_arg(length, "length"), so = byte_arg(src_offset, "src_offset");
            const MrDesc& d = obj_arg<MrDesc>(dst, "dst", kDescType);
            new (self) ScatterDst{l, so, d, byte_arg(dst_offset, "dst_offset")};
          },
          "length"_a.none(), "src_offset"_a.none(), "dst"_a.none(), "dst_offset"_a.none() = 0,
          nb::sig("def __init__(self, length: int, src_offset: int, dst: MrDesc, "
                  "dst_offset: int = 0) -> None"))
      .def_ro("length", &ScatterDst::len)
      .def_ro("src_offset", &ScatterDst::src_offset)
      .def_ro("dst", &ScatterDst::dst)
      .def_ro("dst_offset", &ScatterDst::dst_offset)
      .def("__repr__", [](const ScatterDst& s) {
        return "ScatterDst(length=" + std::to_string(s.len) +
               ", src_offset=" + std::to_string(s.src_offset) +
               ", dst_offset=" + std::to_string(s.dst_offset) + ")";
      });

  // ---- immediate plans
  nb::class_<ImmPlan>(
      m, "ImmPlan", "Number of immediates the receiver gets for a request, for both sides to use.")
      .def_static(
          "single_write",
          [](nb::handle len, nb::handle route, nb::handle nics) {
            return ImmPlan::single_write(byte_arg(len, "length"),
                                         obj_arg<WriteRoute>(route, "route", "a ferry.WriteRoute"),
                                         count_arg(nics, "nics"));
          },
          "length"_a.none(), "route"_a.none(), "nics"_a.none(),
          nb::sig("def single_write(length: int, route: WriteRoute, nics: int) -> int"),
          "Immediates for one submit_write of `length` bytes.")
      .def_static(
          "paged_writes", [](nb::handle pages) { return count_arg(pages, "pages"); },
          "pages"_a.none(), nb::sig("def paged_writes(pages: int) -> int"),
          "One immediate per page.")
      .def_static(
          "scatter_target",
          [](nb::handle len, nb::handle route, nb::handle nics) {
            return ImmPlan::scatter_target(
                byte_arg(len, "length"), obj_arg<GroupRoute>(route, "route", "a ferry.GroupRoute"),
                count_arg(nics, "nics"));
          },
          "length"_a.none(), "route"_a.none(), "nics"_a.none(),
          nb::sig("def scatter_target(length: int, route: GroupRoute, nics: int) -> int"),
          "Immediates one scatter target receives.")
      .def_static("barrier_target", &ImmPlan::barrier_target, "One per barrier target.")
      .def_static("imm", &ImmPlan::imm, "One per submit_imm.");

  // ---- counters
  nb::class_<PyImmCounter>(m, "ImmCounter",
                           "Counts arrivals of one immediate value; wait(n) consumes n arrivals.")
      .def_prop_ro("value", &PyImmCounter::value, "Arrivals not yet consumed.")
      .def_prop_ro("imm", &PyImmCounter::imm, "The immediate value counted.")
      .def("try_consume", &PyImmCounter::try_consume, "n"_a.none() = 1,
           nb::sig("def try_consume(self, n: int = 1) -> bool"),
           "Consume n arrivals if they are there; never blocks. Returns whether it consumed.")
      .def("wait", &PyImmCounter::wait, "n"_a.none() = 1, "timeout"_a.none() = nb::none(),
           nb::kw_only(), "spin"_a = false,
           nb::sig("def wait(self, n: int = 1, timeout: float | None = None, *, "
                   "spin: bool = False) -> None"),
           "Wait (GIL released) until n arrivals can be consumed, then consume them. Raises "
           "ferry.Timeout (consuming nothing) after `timeout` seconds; None waits forever. "
           "Raises ferry.Cancelled when the engine stops first (or remove_imm_count removes the "
           "counter). spin: poll without ever sleeping (a core busy for the whole wait; no "
           "wake-up, which takes tens to hundreds of microseconds on an idle host).")
      .def("__repr__", [](const PyImmCounter& c) {
        return "ImmCounter(imm=" + std::to_string(c.imm()) +
               ", value=" + std::to_string(c.value()) + ")";
      });

  nb::class_<PyTransferCounter>(m, "TransferCounter",
                                "Completion counter for bulk submits: pass counter= to a submit_* "
                                "call; completions are counted in C++ with no Python callback.")
      .def(nb::init<>())
      .def_prop_ro("done", &PyTransferCounter::done, "Transfers ended (success or failure).")
      .def_prop_ro("errors", &PyTransferCounter::errors, "Transfers that failed.")
      .def("wait", &PyTransferCounter::wait, "n"_a.none(), "timeout"_a.none() = nb::none(),
           nb::sig("def wait(self, n: int, timeout: float | None = None) -> None"),
           "Wait (GIL released) until `done` reaches n; raises ferry.Timeout after `timeout` s.")
      .def("__repr__", [](const PyTransferCounter& c) {
        return "TransferCounter(done=" + std::to_string(c.done()) +
               ", errors=" + std::to_string(c.errors()) + ")";
      });

  nb::class_<PyPreparedTransfer>(
      m, "PreparedTransfer",
      "A transfer shape validated once by a TransferEngine.prepare_* call; post it with "
      "TransferEngine.submit(prepared, imm) as many times as needed. Opaque.")
      .def_prop_ro(
          "kind", [](const PyPreparedTransfer& p) { return std::string(p.kind); },
          "'single_write', 'paged_writes' or 'scatter'.")
      .def("__repr__", [](const PyPreparedTransfer& p) {
        const std::string what = std::string(p.kind) == "single_write"   ? " bytes"
                                 : std::string(p.kind) == "paged_writes" ? " pages"
                                                                         : " targets";
        return "PreparedTransfer(" + std::string(p.kind) + ", " + std::to_string(p.count) + what +
               ", src=" + std::to_string(p.src_id) + ")";
      });

  // ---- engine
  nb::class_<GroupSpec>(m, "_GroupSpec")
      .def(nb::init<std::string, std::vector<std::string>, int>(), "device"_a, "nics"_a,
           "worker_cpu"_a);

  using E = PyEngine;
  const auto none = nb::none();
  nb::class_<E>(m, "Engine", "The C++ TransferEngine (use ferry.TransferEngine).")
      .def(nb::init<std::string, std::vector<GroupSpec>, size_t, bool, int, double, size_t, size_t,
                    int, size_t, std::string, std::string, std::string>(),
           "provider"_a, "groups"_a, "nics_per_group"_a, "busy"_a, "callback_cpu"_a,
           "default_timeout"_a, "send_buffer_size"_a, "send_buffer_count"_a,
           "verbs_gid_index"_a = -1, "max_requests_in_flight"_a = 65536, "queue_full"_a = "block",
           "metrics_address"_a = "", "trace_file"_a = "")
      .def_prop_ro("main_address", &E::main_address)
      .def("addresses", &E::addresses, "group"_a.none() = 0)
      .def_prop_ro("num_groups", &E::num_groups)
      .def_prop_ro("nics_per_group", &E::nics_per_group)
      .def_prop_ro("provider", &E::provider)
      .def_prop_ro("incarnation", &E::incarnation)
      .def_prop_ro("callback_errors", &E::callback_errors)
      .def_prop_ro("stopped", &E::stopped)
      .def("register_memory", &E::register_memory, "ptr"_a.none(), "length"_a.none(),
           "device"_a.none(), "owner"_a.none(), "writable"_a)
      .def("unregister", &E::unregister, "handle"_a.none())
      .def("submit_send", &E::submit_send, "addr"_a.none(), "data"_a.none(), "future"_a.none(),
           "on_done"_a.none(), "counter"_a.none())
      .def("submit_recvs", &E::submit_recvs, "length"_a.none(), "count"_a.none(),
           "callback"_a.none())
      .def("submit_write", &E::submit_write, "src"_a.none(), "src_offset"_a.none(),
           "length"_a.none(), "dst"_a.none(), "dst_offset"_a.none(), "imm"_a.none(),
           "route"_a.none(), "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("submit_paged_writes", &E::submit_paged_writes, "page_len"_a.none(), "src"_a.none(),
           "src_pages"_a.none(), "src_stride"_a.none(), "src_offset"_a.none(), "dst"_a.none(),
           "dst_pages"_a.none(), "dst_stride"_a.none(), "dst_offset"_a.none(), "imm"_a.none(),
           "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("submit_imm", &E::submit_imm, "imm"_a.none(), "dst"_a.none(), "route"_a.none(),
           "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("add_peer_group", &E::add_peer_group, "peers"_a.none())
      .def("submit_scatter", &E::submit_scatter, "src"_a.none(), "dsts"_a.none(), "imm"_a.none(),
           "group"_a.none(), "route"_a.none(), "future"_a.none(), "on_done"_a.none(),
           "counter"_a.none())
      .def("submit_barrier", &E::submit_barrier, "imm"_a.none(), "dsts"_a.none(), "group"_a.none(),
           "route"_a.none(), "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("prepare_single_write", &E::prepare_single_write, "src"_a.none(), "src_offset"_a.none(),
           "length"_a.none(), "dst"_a.none(), "dst_offset"_a.none(), "route"_a.none())
      .def("prepare_paged_writes", &E::prepare_paged_writes, "page_len"_a.none(), "src"_a.none(),
           "src_pages"_a.none(), "src_stride"_a.none(), "src_offset"_a.none(), "dst"_a.none(),
           "dst_pages"_a.none(), "dst_stride"_a.none(), "dst_offset"_a.none())
      .def("prepare_scatter", &E::prepare_scatter, "src"_a.none(), "dsts"_a.none(),
           "group"_a.none(), "route"_a.none())
      .def("submit", &E::submit, "prepared"_a.none(), "imm"_a.none(), "future"_a.none(),
           "on_done"_a.none(), "counter"_a.none())
      .def("expect_imm_count", &E::expect_imm_count, "imm"_a.none(), "count"_a.none(),
           "callback"_a.none())
      .def("remove_imm_count", &E::remove_imm_count, "imm"_a.none())
      .def("imm_counter", &E::imm_counter, "imm"_a.none())
      .def("on_imm", &E::on_imm, "callback"_a.none())
      .def("alloc_uvm_watcher", &E::alloc_uvm_watcher, "callback"_a.none())
      .def("imm_counter_gpu", &E::imm_counter_gpu, "imm"_a.none(), "count"_a.none())
      .def("stop", &E::stop);
  (void)none;
  register_stats(m, [](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).observed(); });
  register_moe(m);  // ferry._ferry._moe (moe_ext.cpp)
  bind_kv(m, EngineAccess{[](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).native(); },
                          &prepared_of, &retake_gil});  // ferry.kv (kv_ext.cpp)
  bind_map_remote(
      m, EngineAccess{[](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).native(); },
                      &prepared_of, &retake_gil});  // map_ext.cpp
}

// The bindings' runtime: the interpreter's state, the GIL around engine calls
// and on the engine's callback thread, references that may die on any thread,
// and the bridge from ferry errors to Python exceptions.
//
// Threading rules kept by the bindings:
//  * every call into the engine runs with the GIL released;
//  * user callbacks run on the engine's callback thread, which takes the GIL
//    for each one (keeping one Python thread state for its whole life);
//  * Python objects captured by C++ callbacks are held by PyRef, whose
//    destructor takes the GIL when needed, so they can die on any thread;
//  * stop() releases the GIL while the callback thread drains;
//  * a call that released the GIL re-takes it through retake_gil() (never a
//    destructor), which parks daemon threads at interpreter exit instead
//    (see "the GIL: release, re-take");
//  * arguments arrive as Python objects and are converted with errors that
//    name them (py_args.h).
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "ferry/ferry.h"

namespace nb = nanobind;

namespace ferry::py {

// ------------------------------------------------------------------ interpreter state

bool interpreter_alive();

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

ExitGate& exit_gate();

// Takes the GIL back after PyEval_SaveThread (or parks, see above).
void retake_gil(PyThreadState* ts);

// Threads inside without_gil (at exit: the ones that will park, holding references).
extern std::atomic<int> g_released;
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
void begin_exit();

// Threads inside ImmCounter.wait / TransferCounter.wait (tests wait for them).
extern std::atomic<int> g_blocked_waits;
struct BlockedWait {
  BlockedWait() { g_blocked_waits.fetch_add(1); }
  ~BlockedWait() { g_blocked_waits.fetch_sub(1); }
  BlockedWait(const BlockedWait&) = delete;
  BlockedWait& operator=(const BlockedWait&) = delete;
};

// Depth of ferry callbacks running on this thread (the engine's callback thread).
extern thread_local int t_callback_depth;

// Takes the GIL on the callback thread, pinning the thread's Python thread
// state for the thread's whole life (py_runtime.cpp says why).
class CallbackGil {
 public:
  CallbackGil();
  ~CallbackGil();
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
extern PyObject* g_error_classes;  // dict: code name -> class
extern PyObject* g_error_hook;     // callable(where: str, exc: BaseException)

nb::object make_error(const Status& s);

[[noreturn]] void invalid(std::string msg);

// Per-engine state that callbacks reach; outlives the engine object if a
// callback is still queued when it goes.
struct Shared {
  std::atomic<uint64_t> callback_errors{0};
  std::atomic<bool> stopped{false};  // set by stop(): counter waits end with Cancelled
};

// Reports the pending Python error of a failed user callback (GIL held).
void report_current(Shared& sh, const char* where);

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

}  // namespace ferry::py

// The bindings' runtime (py_runtime.h): the exit gate, the callback thread's
// GIL and the error bridge.
#include "py_runtime.h"

#include <chrono>
#include <string_view>

namespace ferry::py {

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
// (why a thread parks instead of re-taking the GIL: py_runtime.h)

ExitGate& exit_gate() {
  static ExitGate* g = new ExitGate;  // never destroyed: parked threads may still look at it
  return *g;
}

namespace {

[[noreturn]] void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

}  // namespace

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

std::atomic<int> g_released{0};

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

std::atomic<int> g_blocked_waits{0};

thread_local int t_callback_depth = 0;

// ------------------------------------------------------------------ the callback thread's GIL

namespace {

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

}  // namespace

CallbackGil::CallbackGil() : ok_(interpreter_alive()) {
  if (!ok_) return;
  // Only threads Python does not know: a Python thread's state is Python's.
  const bool pin = !t_pin.held && PyGILState_GetThisThreadState() == nullptr;
  state_ = PyGILState_Ensure();
  if (pin) {
    PyGILState_Ensure();
    t_pin.held = true;
  }
}

CallbackGil::~CallbackGil() {
  if (ok_) PyGILState_Release(state_);
}

// ------------------------------------------------------------------ errors

PyObject* g_error_classes = nullptr;
PyObject* g_error_hook = nullptr;

nb::object make_error(const Status& s) {
  std::string_view name = code_name(s.code());
  nb::str code(name.data(), name.size());
  PyObject* cls = g_error_classes ? PyDict_GetItem(g_error_classes, code.ptr()) : nullptr;
  if (cls == nullptr) cls = PyExc_RuntimeError;
  nb::object exc = nb::handle(cls)(nb::str(s.message().c_str()));
  exc.attr("code") = code;
  return exc;
}

void invalid(std::string msg) {
  throw Error(Code::kInvalidArgument, std::move(msg));
}

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

}  // namespace ferry::py

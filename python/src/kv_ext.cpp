// Python bindings of StepSubmits (ferry/step_submits.h): ferry._ferry.StepSubmits
// and StepJob, used by ferry.kv to post a request's layers with no Python per
// layer. No Python object is touched by the engine's threads: a finished job
// is queued here (its token and status) and taken by a Python thread with
// wait_finished(), which blocks with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "ferry/step_submits.h"
#include "kv_ext.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

EngineAccess g_access{};

// Runs f() with the GIL released, coming back through the exit gate (a daemon
// thread returning while the interpreter exits parks instead of unwinding).
template <typename F>
auto nogil(F&& f) -> std::invoke_result_t<F&> {
  PyThreadState* ts = PyEval_SaveThread();
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      f();
      g_access.retake_gil(ts);
    } else {
      auto r = f();
      g_access.retake_gil(ts);
      return r;
    }
  } catch (...) {
    g_access.retake_gil(ts);
    throw;
  }
}

struct FinishedQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::tuple<uint64_t, std::string, std::string>> q;  // token, code, message
};

std::chrono::nanoseconds seconds(double s) {
  if (!(s >= 0)) throw Error(Code::kInvalidArgument, "timeout must be a non-negative number");
  if (s > 1e9) s = 1e9;
  return std::chrono::nanoseconds(int64_t(s * 1e9));
}

class PyStepJob {
 public:
  explicit PyStepJob(StepJob j) : j_(std::move(j)) {}
  uint64_t cancel() {
    return nogil([&] { return j_.cancel(); });
  }
  void wait(double timeout) {
    const auto t = seconds(timeout);
    Status st = nogil([&] { return j_.wait(t); });
    if (!st.is_ok()) throw Error(st);
  }
  const StepJob& job() const { return j_; }

 private:
  StepJob j_;
};

class PySteps {
 public:
  PySteps(nb::handle engine, bool watcher, std::shared_ptr<FinishedQueue> q,
          const EngineAccess& access)
      : engine_obj_(nb::borrow(engine)),
        q_(q ? std::move(q) : std::make_shared<FinishedQueue>()),
        prepared_of_(access.prepared_of) {
    TransferEngine& e = access.engine_of(engine);
    s_ = nogil([&] { return watcher ? e.alloc_uvm_watcher_submits() : StepSubmits::host(e); });
  }
  ~PySteps() { close(); }

  PyStepJob add(uint64_t base, nb::list steps, std::optional<uint32_t> imm, uint64_t token) {
    std::vector<std::vector<StepTransfer>> out;
    out.reserve(nb::len(steps));
    for (nb::handle step : steps) {
      std::vector<StepTransfer> ts;
      for (nb::handle p : step) ts.push_back(StepTransfer{prepared_of_(p), imm});
      out.push_back(std::move(ts));
    }
    auto q = q_;
    StepSubmits::Finished fin = [q, token](const Status& st) {
      {
        std::lock_guard lk(q->mu);
        q->q.emplace_back(token, st.is_ok() ? "" : std::string(code_name(st.code())),
                          st.is_ok() ? "" : st.message());
      }
      q->cv.notify_all();
    };
    live();
    return PyStepJob(nogil([&] { return s_->add(base, std::move(out), std::move(fin)); }));
  }

  void advance(uint64_t value) {
    live();
    nogil([&] { s_->advance(value); });
  }

  // [(token, code, message)] of jobs that finished (code "" = success);
  // waits up to `timeout` for the first.
  std::vector<std::tuple<uint64_t, std::string, std::string>> wait_finished(double timeout) {
    const auto t = seconds(timeout);
    return nogil([&] {
      std::vector<std::tuple<uint64_t, std::string, std::string>> out;
      std::unique_lock lk(q_->mu);
      q_->cv.wait_for(lk, t, [&] { return !q_->q.empty(); });
      out.assign(q_->q.begin(), q_->q.end());
      q_->q.clear();
      return out;
    });
  }

  void close() {
    if (!s_) return;
    nogil([&] { s_->close(); });
  }
  uint64_t value() const { return s_ ? s_->value() : 0; }
  uintptr_t word() const { return s_ ? reinterpret_cast<uintptr_t>(s_->word()) : 0; }
  size_t live_jobs() const { return s_ ? s_->live_jobs() : 0; }
  const std::shared_ptr<FinishedQueue>& queue() const { return q_; }

 private:
  void live() const {
    if (!s_) throw Error(Code::kFailedPrecondition, "StepSubmits is closed");
  }
  nb::object engine_obj_;  // the engine outlives its StepSubmits
  std::shared_ptr<FinishedQueue> q_;
  PreparedTransfer (*prepared_of_)(nb::handle);
  std::shared_ptr<StepSubmits> s_;
};

}  // namespace

void bind_kv(nb::module_& m, const EngineAccess& access) {
  g_access = access;
  nb::class_<PyStepJob>(m, "StepJob", "One job of a StepSubmits (ferry/step_submits.h).")
      .def("cancel", &PyStepJob::cancel,
           "Post no more steps; returns the number posted (their writes may be in flight).")
      .def("wait", &PyStepJob::wait, "timeout"_a,
           "Wait until every posted transfer ended (Timeout otherwise).")
      .def_prop_ro("num_steps", [](const PyStepJob& j) { return j.job().num_steps(); })
      .def_prop_ro("steps_posted", [](const PyStepJob& j) { return j.job().steps_posted(); })
      .def_prop_ro("transfers_posted",
                   [](const PyStepJob& j) { return j.job().transfers_posted(); })
      .def_prop_ro("transfers_done", [](const PyStepJob& j) { return j.job().transfers_done(); })
      .def_prop_ro("transfers_failed",
                   [](const PyStepJob& j) { return j.job().transfers_failed(); })
      .def_prop_ro("finished", [](const PyStepJob& j) { return j.job().finished(); });

  nb::class_<PySteps>(m, "StepSubmits",
                      "Prepared transfers posted when a step counter passes their values "
                      "(ferry/step_submits.h). watcher=True: a UVM watcher word kernels bump.")
      .def(
          "__init__",
          [access](PySteps* self, nb::handle engine, bool watcher, const PySteps* share) {
            new (self) PySteps(engine, watcher, share ? share->queue() : nullptr, access);
          },
          "engine"_a, "watcher"_a = false, "share_queue"_a.none() = nb::none(),
          "share_queue: another StepSubmits whose wait_finished() also reports this one's jobs.")
      .def("add", &PySteps::add, "base"_a, "steps"_a, "imm"_a.none(), "token"_a,
           "Bind steps (lists of PreparedTransfer) to values base+1..; returns a StepJob.")
      .def("advance", &PySteps::advance, "value"_a, "The counter reached `value`: post.")
      .def("wait_finished", &PySteps::wait_finished, "timeout"_a,
           "[(token, code, message)] of finished jobs; code '' is success.")
      .def("close", &PySteps::close)
      .def_prop_ro("value", &PySteps::value)
      .def_prop_ro("word", &PySteps::word)
      .def_prop_ro("live_jobs", &PySteps::live_jobs);
}

}  // namespace ferry::py

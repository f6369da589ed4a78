// The engine's values as wrapped for Python: registered regions, prepared
// transfers, immediate and completion counters, and the group specification
// handed to the engine's constructor.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "py_args.h"
#include "py_runtime.h"

namespace ferry::py {

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
  void wait(nb::handle n_arg, nb::handle timeout_arg_, bool spin);
  uint32_t imm() const { return imm_; }

 private:
  static constexpr std::chrono::milliseconds kSlice{100};
  ImmCounter c_;
  uint32_t imm_;
  std::shared_ptr<Shared> sh_;
};

// Messages taken by polling (TransferEngine::recv_queue): each is copied into
// a bytes object and its buffer given back at once, so no Python object ever
// points into the engine's buffers.
class PyRecvQueue {
 public:
  PyRecvQueue(RecvQueue q, std::shared_ptr<Shared> sh) : q_(std::move(q)), sh_(std::move(sh)) {}
  nb::object try_get();
  // Sliced like PyImmCounter::wait: Ctrl-C and a stopped engine are noticed.
  nb::bytes get(nb::handle timeout_arg_, bool spin);
  size_t size() const { return q_.size_approx(); }
  size_t buffer_len() const { return q_.buffer_len(); }
  size_t buffer_count() const { return q_.buffer_count(); }

 private:
  static constexpr std::chrono::milliseconds kSlice{100};
  static nb::bytes copy_out(RecvMessage& m);
  RecvQueue q_;
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
  void wait(nb::handle n_arg, nb::handle timeout_arg_);
  const std::shared_ptr<State>& state() const { return s_; }

 private:
  std::shared_ptr<State> s_;
};

struct GroupSpec {
  std::string device;
  std::vector<std::string> nics;
  int worker_cpu = -1;
};

}  // namespace ferry::py

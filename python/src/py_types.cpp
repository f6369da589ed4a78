// The blocking waits of the wrapped counters (py_types.h).
#include "py_types.h"

#include <algorithm>
#include <thread>

namespace ferry::py {

void PyImmCounter::wait(nb::handle n_arg, nb::handle timeout_arg_, bool spin) {
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

nb::bytes PyRecvQueue::copy_out(RecvMessage& m) {
  nb::bytes b(reinterpret_cast<const char*>(m.data().data()), m.size());
  m.release();
  return b;
}

nb::object PyRecvQueue::try_get() {
  RecvMessage m = without_gil([&] { return q_.try_pop(); });
  if (!m.valid()) return nb::none();
  return copy_out(m);
}

nb::bytes PyRecvQueue::get(nb::handle timeout_arg_, bool spin) {
  const auto mode = spin ? ImmCounter::WaitMode::kSpin : ImmCounter::WaitMode::kSleep;
  const auto timeout = timeout_arg(timeout_arg_);
  const auto deadline = deadline_after(timeout);
  BlockedWait blocked;
  RecvMessage m;
  for (;;) {
    auto slice = std::min<Clock::duration>(deadline - Clock::now(), kSlice);
    if (slice < Clock::duration::zero()) slice = Clock::duration::zero();
    const Status st = without_gil([&] { return q_.pop(m, slice, mode); });
    if (st.is_ok()) return copy_out(m);
    if (st.code() != Code::kDeadlineExceeded) throw Error(st);  // kCancelled: Cancelled
    if (sh_->stopped.load(std::memory_order_acquire) && !(m = q_.try_pop()).valid())
      throw Error(Code::kCancelled, "RecvQueue.get: the engine stopped and no message is left");
    if (m.valid()) return copy_out(m);
    if (Clock::now() >= deadline)
      throw Error(Code::kDeadlineExceeded,
                  "RecvQueue.get: no message after " + std::to_string(*timeout) + " s");
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

void PyTransferCounter::wait(nb::handle n_arg, nb::handle timeout_arg_) {
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

}  // namespace ferry::py

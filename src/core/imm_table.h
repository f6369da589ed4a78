// Per-immediate bookkeeping shared by every worker of an engine. Workers call
// on_arrival() from their CQ polling; it never blocks and never allocates.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "ferry/engine.h"

namespace ferry {

struct ImmCounter::State {
  std::atomic<int64_t> value{0};
  std::atomic<int32_t> waiters{0};
  std::mutex mu;
  std::condition_variable cv;

  void add(int64_t n) {
    value.fetch_add(n, std::memory_order_seq_cst);
    // A waiter registers before re-checking value, so either it sees the new
    // value or we see it registered and wake it.
    if (waiters.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lk(mu);
      cv.notify_all();
    }
  }
};

}  // namespace ferry

namespace ferry::core {

class CallbackThread;

struct ExpectedCount {
  std::atomic<uint64_t> arrived{0};  // monotonic: fires at each multiple of `every`
  uint32_t every = 1;
  ImmCountCallback cb;
};

// GPU-visible count (TransferEngine::imm_counter_gpu): the worker itself stores
// the generation arrived / every into *flag at each multiple, no callback hop.
struct GpuFlagCount {
  std::atomic<uint64_t> arrived{0};
  uint32_t every = 1;
  uint32_t* flag = nullptr;    // host address of a word kernels poll
  std::shared_ptr<void> keep;  // owns the flag's slot while the entry lives
};

class ImmTable {
 public:
  explicit ImmTable(CallbackThread* callbacks) : callbacks_(callbacks) {}
  // The callback thread needs the table and the table the thread: set after both exist.
  void set_callbacks(CallbackThread* callbacks) { callbacks_ = callbacks; }

  // Replace any prior mapping of imm.
  void expect(uint32_t imm, uint32_t count, ImmCountCallback cb);
  ImmCounter counter(uint32_t imm);
  // Replace any prior mapping of imm with a GPU flag entry (see GpuFlagCount).
  void expect_gpu_flag(uint32_t imm, uint32_t count, uint32_t* flag, std::shared_ptr<void> keep);
  bool remove(uint32_t imm);
  void add_plain_callback(ImmCallback cb);

  // Worker side: `n` immediates with value imm arrived (their data is visible).
  void on_arrival(uint32_t imm, uint32_t n = 1);

  // Callback-thread side.
  void run_plain_callbacks(uint32_t imm);

 private:
  struct Entry {
    std::shared_ptr<ImmCounter::State> counter;
    std::shared_ptr<ExpectedCount> expected;
    std::shared_ptr<GpuFlagCount> gpu;
  };
  CallbackThread* callbacks_;
  std::shared_mutex mu_;
  std::unordered_map<uint32_t, Entry> map_;
  std::mutex plain_mu_;
  std::vector<ImmCallback> plain_;
};

}  // namespace ferry::core

// Prepared transfers bound to the values of a step counter: the per-layer
// path of layer-wise KV transfer with no host code per layer (docs/KV.md).
//
// A StepSubmits owns one 64-bit word. A kernel (also inside a captured CUDA
// graph, whose baked-in address must not change from request to request)
// bumps it at the end of each layer; the engine's watcher thread then posts
// the prepared transfers bound to the values the word passed. Jobs are bound
// to values with a base: step i (0-based) of a job is posted once the word
// reached base + i + 1, so jobs of one forward pass may share a base and later
// forward passes take later ones. The word only grows; coalesced changes
// (1 -> 3) post steps 2 and 3 in order.
//
// Host producers (CPU prefill, tests) call advance(value) instead: the same
// posting, on the calling thread, with no watcher.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/engine.h"

namespace ferry {

struct StepTransfer {
  PreparedTransfer prepared;
  std::optional<uint32_t> imm;
};

// One job's steps: posted by its StepSubmits, cancelled by its owner.
class StepJob {
 public:
  struct State;
  // After cancel() returns no step of this job is posted any more. Returns the
  // number of steps posted (their transfers may still be in flight: finished()
  // says when they all ended).
  uint64_t cancel();
  size_t num_steps() const;
  uint64_t steps_posted() const;
  uint64_t transfers_posted() const;
  uint64_t transfers_done() const;    // ended, success or not
  uint64_t transfers_failed() const;  // ended with an error
  // Every step posted (or the job cancelled), every posted transfer ended and
  // the job's on_finished returned.
  bool finished() const;
  // Waits up to `timeout` for finished(); kDeadlineExceeded if it is not.
  Status wait(std::chrono::nanoseconds timeout) const;

 private:
  friend class StepSubmits;
  explicit StepJob(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::shared_ptr<State> s_;
};

class StepSubmits {
 public:
  // on_finished(first error or OK) runs once, when the job finished (see
  // StepJob::finished): on the engine's callback thread, or on the thread of
  // the cancel()/advance() that finished it. It must not block.
  using Finished = std::function<void(const Status&)>;
  struct Impl;

  // A host-driven counter (advance() only; word() is null). The engine must
  // outlive it (as for alloc_uvm_watcher_submits).
  static std::shared_ptr<StepSubmits> host(TransferEngine& engine);
  explicit StepSubmits(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  ~StepSubmits();
  StepSubmits(const StepSubmits&) = delete;
  StepSubmits& operator=(const StepSubmits&) = delete;

  // Binds `steps` to the values base+1 .. base+steps.size(); steps whose value
  // the word already passed are posted at once. The transfers' source regions
  // and peers are those of their prepare_*: the job keeps them alive.
  StepJob add(uint64_t base, std::vector<std::vector<StepTransfer>> steps,
              Finished on_finished = {});
  // The counter reached `value` (host-driven counters; also usable with a
  // watcher word, e.g. to post from the host what the kernel will not).
  void advance(uint64_t value);
  // The highest value seen so far.
  uint64_t value() const;
  // Device-visible word for kernels (alloc_uvm_watcher_submits), else null.
  uint64_t* word() const;
  // Jobs not finished yet (observability, leak checks).
  size_t live_jobs() const;
  // Cancels every job; the watcher (if any) is released at the word's next
  // change. Idempotent; also run by the destructor.
  void close();

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry

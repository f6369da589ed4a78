// What a worker's own thread and a thread doing its work for a while (posting
// inline, helping a napping worker, running a callback under its loop lock)
// know of themselves; shared by the worker's translation units.
#pragma once

namespace ferry::core::worker_thread {

// The calling thread is a worker or does a worker's work: nothing it starts
// may wait for admission.
inline thread_local bool t_worker = false;
// The worker whose work this thread does: its own thread's, or the one whose
// loop lock this thread holds while it does that worker's work (AsWorker).
inline thread_local const void* t_doing_work_of = nullptr;

// Another thread doing the worker's work (post_inline, help_progress) counts as
// a worker meanwhile. The flags are cleared however that returns, or the thread
// would pass for a worker from then on.
struct AsWorker {
  explicit AsWorker(const void* worker) {
    t_worker = true;
    t_doing_work_of = worker;
  }
  ~AsWorker() {
    t_worker = false;
    t_doing_work_of = nullptr;
  }
  AsWorker(const AsWorker&) = delete;
  AsWorker& operator=(const AsWorker&) = delete;
};

}  // namespace ferry::core::worker_thread

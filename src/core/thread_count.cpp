#include "core/thread_count.h"

#include <mutex>
#include <stdexcept>

#include "core/thread_records.h"

namespace ferry::core {

namespace {

struct Registry {
  // Held by load() and by a thread folding its block into the totals, so that
  // a sum never counts a block twice or misses it.
  std::mutex mu;
  ThreadRecords<detail::ThreadCells, kMaxCountingThreads> blocks;
  std::array<std::atomic<uint64_t>, kMaxThreadCounts> retired{};
  std::atomic<size_t> next_id{0};
};

Registry& registry() {
  // Never destroyed: threads may exit, and fold their counts, after static
  // destructors ran.
  static Registry* r = new Registry();  // NOLINT: intentionally leaked
  return *r;
}

// Set at the thread's exit, or when no block was free: adds go to the totals.
thread_local bool t_no_block = false;

// Folds the thread's block into the totals when the thread exits, and clears
// it for the next thread that takes it.
struct Retirer {
  ~Retirer() {
    detail::ThreadCells* c = detail::t_cells;
    t_no_block = true;
    detail::t_cells = nullptr;
    if (c == nullptr) return;
    Registry& r = registry();
    {
      std::lock_guard lk(r.mu);
      for (size_t i = 0; i < kMaxThreadCounts; ++i)
        r.retired[i].fetch_add(c->v[i].exchange(0, std::memory_order_relaxed),
                               std::memory_order_relaxed);
    }
    r.blocks.give_back(c);
  }
};

}  // namespace

namespace detail {

ThreadCells* register_thread_cells() {
  if (t_no_block) return nullptr;
  static thread_local Retirer retirer;  // its destructor runs at this thread's exit
  (void)retirer;
  ThreadCells* c = registry().blocks.take();
  if (c == nullptr) t_no_block = true;
  t_cells = c;
  return c;
}

void add_retired(size_t id, uint64_t n) {
  registry().retired[id].fetch_add(n, std::memory_order_relaxed);
}

}  // namespace detail

ThreadCount::ThreadCount() : id_(registry().next_id.fetch_add(1)) {
  if (id_ >= kMaxThreadCounts) throw std::logic_error("more than kMaxThreadCounts ThreadCounts");
}

uint64_t ThreadCount::load() const {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  uint64_t sum = r.retired[id_].load(std::memory_order_relaxed);
  for (size_t i = 0, n = r.blocks.used(); i < n; ++i)
    sum += r.blocks[i].v[id_].load(std::memory_order_relaxed);
  return sum;
}

}  // namespace ferry::core

#include "core/thread_count.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace ferry::core {

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<detail::ThreadCells>> live;
  std::array<std::atomic<uint64_t>, kMaxThreadCounts> retired{};
  std::atomic<size_t> next_id{0};
};

Registry& registry() {
  // Never destroyed: threads may exit, and fold their counts, after static
  // destructors ran.
  static Registry* r = new Registry();  // NOLINT: intentionally leaked
  return *r;
}

thread_local bool t_retired = false;

// Folds the thread's block into the totals when the thread exits.
struct Retirer {
  ~Retirer() {
    detail::ThreadCells* c = detail::t_cells;
    t_retired = true;
    detail::t_cells = nullptr;
    if (c == nullptr) return;
    Registry& r = registry();
    std::lock_guard lk(r.mu);
    for (size_t i = 0; i < kMaxThreadCounts; ++i)
      r.retired[i].fetch_add(c->v[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    auto it =
        std::find_if(r.live.begin(), r.live.end(), [&](const auto& p) { return p.get() == c; });
    if (it != r.live.end()) r.live.erase(it);
  }
};

}  // namespace

namespace detail {

ThreadCells* register_thread_cells() {
  if (t_retired) return nullptr;
  static thread_local Retirer retirer;  // its destructor runs at this thread's exit
  (void)retirer;
  auto cells = std::make_unique<ThreadCells>();
  ThreadCells* c = cells.get();
  Registry& r = registry();
  {
    std::lock_guard lk(r.mu);
    r.live.push_back(std::move(cells));
  }
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
  for (const auto& c : r.live) sum += c->v[id_].load(std::memory_order_relaxed);
  return sum;
}

}  // namespace ferry::core

#include "core/addr_table.h"

namespace ferry::core {

namespace {
constexpr size_t kInitialCapacity = 64;
}  // namespace

namespace {
std::atomic<uint64_t> g_next_table_id{1};
}  // namespace

thread_local AddrTable::LastLookup AddrTable::t_last;

AddrTable::AddrTable() : id_(g_next_table_id.fetch_add(1, std::memory_order_relaxed)) {
  arrays_.push_back(make_array(kInitialCapacity));
  current_.store(arrays_.back().get(), std::memory_order_release);
}

std::unique_ptr<AddrTable::Array> AddrTable::make_array(size_t capacity) {
  auto a = std::make_unique<Array>();
  a->mask = capacity - 1;
  a->slots = std::make_unique<std::atomic<const NetAddr*>[]>(capacity);
  for (size_t i = 0; i < capacity; ++i) a->slots[i].store(nullptr, std::memory_order_relaxed);
  return a;
}

void AddrTable::place(Array& a, const NetAddr* e) {
  size_t i = e->hash() & a.mask;
  while (a.slots[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & a.mask;
  a.slots[i].store(e, std::memory_order_release);
}

const NetAddr* AddrTable::insert(const NetAddr& addr) {
  std::lock_guard lk(mu_);
  Array& cur = *arrays_.back();
  // Another thread may have added it since this caller's probe.
  for (size_t i = addr.hash() & cur.mask;; i = (i + 1) & cur.mask) {
    const NetAddr* e = cur.slots[i].load(std::memory_order_relaxed);
    if (e == nullptr) break;
    if (*e == addr) return e;
  }
  const NetAddr* added = &entries_.emplace_back(addr);
  if (2 * entries_.size() > cur.mask + 1) {
    // Filled completely before readers can see it.
    auto bigger = make_array(2 * (cur.mask + 1));
    for (const NetAddr& e : entries_) place(*bigger, &e);
    arrays_.push_back(std::move(bigger));
    current_.store(arrays_.back().get(), std::memory_order_release);
  } else {
    place(cur, added);
  }
  return added;
}

size_t AddrTable::size() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

}  // namespace ferry::core

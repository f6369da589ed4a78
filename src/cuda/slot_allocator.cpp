#include "cuda/slot_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "ferry/status.h"

namespace ferry::cuda {

SlotAllocator::SlotAllocator(uint32_t capacity) : capacity_(capacity), taken_(capacity, false) {
  free_.reserve(capacity);
  for (uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
  std::make_heap(free_.begin(), free_.end(), std::greater<>());
}

uint32_t SlotAllocator::acquire() {
  std::lock_guard lk(mu_);
  if (free_.empty())
    throw Error(Code::kResourceExhausted,
                fmt::format("all {} watcher/flag slots are in use", capacity_));
  std::pop_heap(free_.begin(), free_.end(), std::greater<>());
  uint32_t slot = free_.back();
  free_.pop_back();
  taken_[slot] = true;
  ++in_use_;
  return slot;
}

void SlotAllocator::release(uint32_t slot) {
  std::lock_guard lk(mu_);
  if (slot >= capacity_)
    throw Error(Code::kInvalidArgument,
                fmt::format("slot {} is outside the pool of {} slots", slot, capacity_));
  if (!taken_[slot])
    throw Error(Code::kFailedPrecondition,
                fmt::format("slot {} released twice (or never acquired)", slot));
  taken_[slot] = false;
  --in_use_;
  free_.push_back(slot);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
}

uint32_t SlotAllocator::in_use() const {
  std::lock_guard lk(mu_);
  return in_use_;
}

bool SlotAllocator::taken(uint32_t slot) const {
  std::lock_guard lk(mu_);
  return slot < capacity_ && taken_[slot];
}

}  // namespace ferry::cuda

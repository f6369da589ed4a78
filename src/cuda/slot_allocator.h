// Fixed-capacity allocator of slot indices [0, capacity). Knows nothing about
// memory or CUDA, so it is unit-tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace ferry::cuda {

class SlotAllocator {
 public:
  explicit SlotAllocator(uint32_t capacity);

  // Lowest free index first, so a few live slots stay on few pages.
  // Throws Error(kResourceExhausted) when every slot is taken.
  uint32_t acquire();
  // Throws Error(kInvalidArgument) for an index past capacity and
  // Error(kFailedPrecondition) for a slot that is not taken (double release).
  void release(uint32_t slot);

  uint32_t capacity() const { return capacity_; }
  uint32_t in_use() const;
  bool taken(uint32_t slot) const;

 private:
  const uint32_t capacity_;
  mutable std::mutex mu_;
  std::vector<bool> taken_;
  // Free indices kept as a max-heap on the negated value: pop gives the lowest.
  std::vector<uint32_t> free_;
  uint32_t in_use_ = 0;
};

}  // namespace ferry::cuda

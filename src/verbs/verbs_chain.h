// Chains of up to kMaxChain ibv_send_wr built from core::WriteDesc batches.
// Pure: fills verbs structs, never posts, so the chaining rules (one peer per
// chain, templated invariant fields, inline decisions, partial acceptance)
// are unit-tested without a NIC.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/domain.h"

namespace ferry::verbs {

// Benchmarks of the reference design showed no gain above 4 WRs per
// ibv_post_send: one doorbell per 4 writes already hides the MMIO cost.
inline constexpr size_t kMaxChain = 4;

// What a WriteDesc::local_desc points to for verbs registrations: the lkey,
// plus whether the CPU may read the bytes (inline sends memcpy them in the
// post call, which must never touch device memory).
struct LocalKey {
  uint32_t lkey = 0;
  bool host = true;
};

class WriteChain {
 public:
  // Links the slots and points every WR at its SGE once; those fields never
  // change afterwards (the "template").
  explicit WriteChain(uint32_t max_inline = 0) noexcept;
  WriteChain(const WriteChain&) = delete;
  WriteChain& operator=(const WriteChain&) = delete;

  void set_max_inline(uint32_t max_inline) noexcept { max_inline_ = max_inline; }
  uint32_t max_inline() const noexcept { return max_inline_; }

  // Builds a chain from the head of `writes`: at most min(kMaxChain,
  // wr_ids.size()) WRs, stopping before the first write to a different peer
  // (a chain goes to one QP). wr_ids[i] becomes the wr_id of writes[i].
  // Returns the number of WRs built (0 only if either span is empty).
  size_t build(std::span<const core::WriteDesc> writes, std::span<const uint64_t> wr_ids) noexcept;

  ibv_send_wr* head() noexcept { return &wr_[0]; }
  const ibv_send_wr& wr(size_t i) const noexcept { return wr_[i]; }
  const ibv_sge& sge(size_t i) const noexcept { return sge_[i]; }
  size_t size() const noexcept { return n_; }

  // After ibv_post_send failed with `bad_wr`: the WRs before it were accepted
  // and will complete; it and those after it were not. A bad_wr that is not
  // one of ours (a provider bug) yields 0, and the caller logs it.
  size_t accepted(const ibv_send_wr* bad_wr) const noexcept;

 private:
  std::array<ibv_send_wr, kMaxChain> wr_{};
  std::array<ibv_sge, kMaxChain> sge_{};
  uint32_t max_inline_ = 0;
  size_t n_ = 0;
};

// Fills one send WR (IBV_WR_SEND) for post_send, inline when it fits and the
// buffer is host memory.
void build_send(ibv_send_wr* wr, ibv_sge* sge, const void* buf, size_t len, const LocalKey* key,
                uint64_t wr_id, uint32_t max_inline) noexcept;

}  // namespace ferry::verbs

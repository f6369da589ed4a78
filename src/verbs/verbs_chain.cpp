#include "verbs/verbs_chain.h"

#include <arpa/inet.h>

#include <algorithm>

namespace ferry::verbs {

WriteChain::WriteChain(uint32_t max_inline) noexcept : max_inline_(max_inline) {
  for (size_t i = 0; i < kMaxChain; ++i) {
    wr_[i].sg_list = &sge_[i];
    wr_[i].next = i + 1 < kMaxChain ? &wr_[i + 1] : nullptr;
  }
}

size_t WriteChain::build(std::span<const core::WriteDesc> writes,
                         std::span<const uint64_t> wr_ids) noexcept {
  const size_t limit = std::min({kMaxChain, writes.size(), wr_ids.size()});
  // Re-link what the previous build cut short.
  if (n_ > 0 && n_ < kMaxChain) wr_[n_ - 1].next = &wr_[n_];
  n_ = 0;
  if (limit == 0) return 0;
  const core::PeerId peer = writes[0].peer;
  size_t n = 0;
  for (; n < limit && writes[n].peer == peer; ++n) {
    const core::WriteDesc& w = writes[n];
    ibv_send_wr& wr = wr_[n];
    ibv_sge& sge = sge_[n];
    const auto* key = static_cast<const LocalKey*>(w.local_desc);
    wr.wr_id = wr_ids[n];
    wr.opcode = w.has_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    // Every write is signaled: the engine counts one local completion per
    // write, and an unsignaled WR's error would surface on a later one.
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = w.has_imm ? htonl(w.imm) : 0;
    wr.wr.rdma.remote_addr = w.remote_addr;
    wr.wr.rdma.rkey = static_cast<uint32_t>(w.rkey);
    if (w.len == 0) {
      // Immediate-only write: no SGE, but the target still checks the rkey.
      wr.num_sge = 0;
      wr.sg_list = nullptr;
      continue;
    }
    wr.sg_list = &sge;
    wr.num_sge = 1;
    sge.addr = reinterpret_cast<uintptr_t>(w.src);
    sge.length = static_cast<uint32_t>(w.len);
    sge.lkey = key != nullptr ? key->lkey : 0;
    if (w.len <= max_inline_ && key != nullptr && key->host) wr.send_flags |= IBV_SEND_INLINE;
  }
  wr_[n - 1].next = nullptr;
  n_ = n;
  return n;
}

size_t WriteChain::accepted(const ibv_send_wr* bad_wr) const noexcept {
  for (size_t i = 0; i < n_; ++i) {
    if (&wr_[i] == bad_wr) return i;
  }
  return 0;
}

void build_send(ibv_send_wr* wr, ibv_sge* sge, const void* buf, size_t len, const LocalKey* key,
                uint64_t wr_id, uint32_t max_inline) noexcept {
  *wr = ibv_send_wr{};
  wr->wr_id = wr_id;
  wr->opcode = IBV_WR_SEND;
  wr->send_flags = IBV_SEND_SIGNALED;
  if (len == 0) return;
  sge->addr = reinterpret_cast<uintptr_t>(buf);
  sge->length = static_cast<uint32_t>(len);
  sge->lkey = key != nullptr ? key->lkey : 0;
  wr->sg_list = sge;
  wr->num_sge = 1;
  if (len <= max_inline && key != nullptr && key->host) wr->send_flags |= IBV_SEND_INLINE;
}

}  // namespace ferry::verbs

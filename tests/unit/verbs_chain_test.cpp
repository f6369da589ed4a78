// WR chains built from paged write batches, checked field by field.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <random>
#include <vector>

#include "verbs/verbs_chain.h"

namespace ferry::verbs {
namespace {

constexpr uint64_t kRemoteBase = 0x7f0000000000;
constexpr uint64_t kStride = 1 << 20;
constexpr uint32_t kRkey = 0xabcd1234;
constexpr uint32_t kImm = 0xfeedf00d;

// A paged request as the worker cuts it: one WriteDesc per page, invariant
// key, length, immediate and peer.
std::vector<core::WriteDesc> paged(size_t pages, uint64_t page_len, const LocalKey* key, char* src,
                                   core::PeerId peer = 3, bool imm = true) {
  std::vector<core::WriteDesc> w(pages);
  for (size_t i = 0; i < pages; ++i) {
    w[i].src = src + i * page_len;
    w[i].len = page_len;
    w[i].local_desc = const_cast<LocalKey*>(key);
    w[i].peer = peer;
    w[i].remote_addr = kRemoteBase + ((i * 7919) % pages) * kStride;  // scattered pages
    w[i].rkey = kRkey;
    w[i].imm = kImm;
    w[i].has_imm = imm;
    w[i].ctx = 0x1000 + i;
  }
  return w;
}

void expect_wr_matches(const WriteChain& c, size_t k, const core::WriteDesc& w, uint64_t wr_id,
                       uint32_t max_inline) {
  const ibv_send_wr& wr = c.wr(k);
  EXPECT_EQ(wr.wr_id, wr_id);
  EXPECT_EQ(wr.opcode, w.has_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE);
  EXPECT_EQ(wr.imm_data, w.has_imm ? htonl(w.imm) : 0u);
  EXPECT_EQ(wr.wr.rdma.remote_addr, w.remote_addr);
  EXPECT_EQ(wr.wr.rdma.rkey, w.rkey);
  EXPECT_TRUE(wr.send_flags & IBV_SEND_SIGNALED);
  const auto* key = static_cast<const LocalKey*>(w.local_desc);
  if (w.len == 0) {
    EXPECT_EQ(wr.num_sge, 0);
    EXPECT_EQ(wr.sg_list, nullptr);
    EXPECT_FALSE(wr.send_flags & IBV_SEND_INLINE);
    return;
  }
  ASSERT_EQ(wr.num_sge, 1);
  ASSERT_EQ(wr.sg_list, &c.sge(k));
  EXPECT_EQ(wr.sg_list->addr, reinterpret_cast<uintptr_t>(w.src));
  EXPECT_EQ(wr.sg_list->length, w.len);
  EXPECT_EQ(wr.sg_list->lkey, key->lkey);
  const bool inline_expected = w.len <= max_inline && key->host;
  EXPECT_EQ((wr.send_flags & IBV_SEND_INLINE) != 0, inline_expected);
}

// Drains a batch the way post_writes does, optionally with a NIC that takes
// only part of each chain; every page must be posted once, in order.
struct DrainStats {
  size_t chains = 0;
  size_t posted = 0;
};

DrainStats drain(WriteChain& chain, const std::vector<core::WriteDesc>& writes, std::mt19937* rng,
                 uint32_t max_inline) {
  DrainStats st;
  size_t i = 0;
  uint64_t next_id = 1;
  while (i < writes.size()) {
    uint64_t ids[kMaxChain];
    for (auto& id : ids) id = next_id++;
    const auto rest = std::span<const core::WriteDesc>(writes).subspan(i);
    const size_t n = chain.build(rest, ids);
    EXPECT_EQ(n, std::min(kMaxChain, rest.size()));
    EXPECT_EQ(chain.size(), n);
    ++st.chains;
    // Linkage: a NULL-terminated list of exactly n WRs.
    const ibv_send_wr* p = chain.head();
    for (size_t k = 0; k < n; ++k) {
      if (p == nullptr) {
        ADD_FAILURE() << "chain shorter than " << n;
        return st;
      }
      EXPECT_EQ(p, &chain.wr(k));
      expect_wr_matches(chain, k, writes[i + k], ids[k], max_inline);
      p = p->next;
    }
    EXPECT_EQ(p, nullptr);
    size_t accepted = n;
    if (rng != nullptr && (*rng)() % 3 == 0) {
      // ENOMEM part-way: bad_wr names the first WR not taken.
      const size_t k = (*rng)() % n;
      accepted = chain.accepted(&chain.wr(k));
      EXPECT_EQ(accepted, k);
    }
    st.posted += accepted;
    i += accepted;
  }
  return st;
}

TEST(VerbsChain, PagedRequestsFrom1To10000Pages) {
  static char src[1 << 16];
  LocalKey key{0x55aa, true};
  std::vector<size_t> sizes;
  for (size_t n = 1; n <= 64; ++n) sizes.push_back(n);
  for (size_t n : {100, 127, 128, 129, 1023, 1024, 1025, 4097, 9999, 10000}) sizes.push_back(n);
  for (size_t pages : sizes) {
    SCOPED_TRACE(testing::Message() << pages << " pages");
    WriteChain chain(0);
    const auto w = paged(pages, 4, &key, src);
    const DrainStats st = drain(chain, w, nullptr, 0);
    EXPECT_EQ(st.posted, pages);
    EXPECT_EQ(st.chains, (pages + kMaxChain - 1) / kMaxChain);
  }
}

TEST(VerbsChain, PartialAcceptanceResumesAtTheFirstRejectedWrite) {
  static char src[1 << 16];
  LocalKey key{7, true};
  std::mt19937 rng(4);
  for (size_t pages : {1, 3, 4, 5, 17, 1000, 10000}) {
    SCOPED_TRACE(testing::Message() << pages << " pages");
    WriteChain chain(16);
    const auto w = paged(pages, 4, &key, src);
    const DrainStats st = drain(chain, w, &rng, 16);
    EXPECT_EQ(st.posted, pages);
    EXPECT_GE(st.chains, (pages + kMaxChain - 1) / kMaxChain);
  }
}

TEST(VerbsChain, AcceptedForeignBadWrIsZero) {
  WriteChain chain;
  LocalKey key{1, true};
  static char src[64];
  const auto w = paged(4, 8, &key, src);
  const uint64_t ids[4] = {1, 2, 3, 4};
  ASSERT_EQ(chain.build(w, ids), 4u);
  ibv_send_wr other{};
  EXPECT_EQ(chain.accepted(&other), 0u);
  EXPECT_EQ(chain.accepted(nullptr), 0u);
  EXPECT_EQ(chain.accepted(&chain.wr(3)), 3u);
}

TEST(VerbsChain, StopsAtPeerChange) {
  LocalKey key{1, true};
  static char src[256];
  auto w = paged(8, 8, &key, src);
  w[2].peer = 4;  // scatter: the next target is another QP
  const uint64_t ids[4] = {1, 2, 3, 4};
  WriteChain chain;
  EXPECT_EQ(chain.build(w, ids), 2u);
  EXPECT_EQ(chain.wr(1).next, nullptr);
  EXPECT_EQ(chain.build(std::span(w).subspan(2), ids), 1u);
  EXPECT_EQ(chain.build(std::span(w).subspan(3), ids), 4u);
  EXPECT_EQ(chain.wr(3).next, nullptr);
  EXPECT_EQ(chain.wr(0).next, &chain.wr(1));
  EXPECT_EQ(chain.wr(2).next, &chain.wr(3));
}

TEST(VerbsChain, ChainNeverExceedsTheIdsGiven) {
  LocalKey key{1, true};
  static char src[256];
  const auto w = paged(8, 8, &key, src);
  const uint64_t ids[2] = {1, 2};
  WriteChain chain;
  EXPECT_EQ(chain.build(w, ids), 2u);
  EXPECT_EQ(chain.build({}, ids), 0u);
  EXPECT_EQ(chain.build(w, {}), 0u);
}

TEST(VerbsChain, ZeroLengthImmediateWritesHaveNoSgeButKeepTheKey) {
  LocalKey key{9, true};
  static char src[64];
  auto w = paged(4, 8, &key, src);
  w[1].len = 0;
  w[1].src = nullptr;
  w[1].local_desc = nullptr;  // barrier writes carry no source registration
  const uint64_t ids[4] = {1, 2, 3, 4};
  WriteChain chain(64);
  ASSERT_EQ(chain.build(w, ids), 4u);
  EXPECT_EQ(chain.wr(1).num_sge, 0);
  EXPECT_EQ(chain.wr(1).sg_list, nullptr);
  EXPECT_EQ(chain.wr(1).wr.rdma.rkey, kRkey);
  EXPECT_EQ(chain.wr(1).opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  // The slot gets its SGE back on the next build.
  w[1] = w[0];
  ASSERT_EQ(chain.build(w, ids), 4u);
  EXPECT_EQ(chain.wr(1).sg_list, &chain.sge(1));
  EXPECT_EQ(chain.wr(1).num_sge, 1);
}

TEST(VerbsChain, InlineOnlyForSmallHostBuffers) {
  static char src[4096];
  LocalKey host{1, true};
  LocalKey gpu{2, false};
  const uint64_t ids[4] = {1, 2, 3, 4};
  WriteChain chain(64);
  auto w = paged(4, 64, &host, src);
  ASSERT_EQ(chain.build(w, ids), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(chain.wr(k).send_flags & IBV_SEND_INLINE);
  w = paged(4, 65, &host, src);
  ASSERT_EQ(chain.build(w, ids), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_FALSE(chain.wr(k).send_flags & IBV_SEND_INLINE);
  // The CPU must never memcpy device memory into the WQE.
  w = paged(4, 8, &gpu, src);
  ASSERT_EQ(chain.build(w, ids), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_FALSE(chain.wr(k).send_flags & IBV_SEND_INLINE);
  chain.set_max_inline(0);
  w = paged(4, 8, &host, src);
  ASSERT_EQ(chain.build(w, ids), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_FALSE(chain.wr(k).send_flags & IBV_SEND_INLINE);
}

TEST(VerbsChain, WritesWithoutImmediate) {
  static char src[64];
  LocalKey key{1, true};
  const auto w = paged(3, 8, &key, src, 1, /*imm=*/false);
  const uint64_t ids[3] = {1, 2, 3};
  WriteChain chain;
  ASSERT_EQ(chain.build(w, ids), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(chain.wr(k).opcode, IBV_WR_RDMA_WRITE);
    EXPECT_EQ(chain.wr(k).imm_data, 0u);
  }
}

TEST(VerbsChain, BuildSend) {
  static char buf[128];
  LocalKey key{0x42, true};
  ibv_send_wr wr;
  ibv_sge sge;
  build_send(&wr, &sge, buf, 100, &key, 77, 64);
  EXPECT_EQ(wr.opcode, IBV_WR_SEND);
  EXPECT_EQ(wr.wr_id, 77u);
  EXPECT_EQ(wr.next, nullptr);
  EXPECT_EQ(wr.num_sge, 1);
  EXPECT_EQ(wr.sg_list, &sge);
  EXPECT_EQ(sge.length, 100u);
  EXPECT_EQ(sge.lkey, 0x42u);
  EXPECT_EQ(wr.send_flags, static_cast<unsigned>(IBV_SEND_SIGNALED));
  build_send(&wr, &sge, buf, 32, &key, 78, 64);
  EXPECT_EQ(wr.send_flags, static_cast<unsigned>(IBV_SEND_SIGNALED | IBV_SEND_INLINE));
  build_send(&wr, &sge, nullptr, 0, nullptr, 79, 64);
  EXPECT_EQ(wr.num_sge, 0);
  EXPECT_EQ(wr.sg_list, nullptr);
}

}  // namespace
}  // namespace ferry::verbs

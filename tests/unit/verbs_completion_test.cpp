// Completion accounting: attribution by wr_id tag (never by wc.opcode),
// immediate receive re-posting, and the CQ credit bound.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "core/log.h"
#include "verbs/verbs_completion.h"

namespace ferry::verbs {
namespace {

ibv_wc make_wc(uint64_t wr_id, ibv_wc_status status, int opcode) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = static_cast<ibv_wc_opcode>(opcode);
  wc.qp_num = 0x77;
  wc.vendor_err = 0x81;
  return wc;
}

TEST(VerbsCompletion, WrIdPacking) {
  const uint64_t id = make_wr_id(WrKind::kRmaRecv, 0x123456, 0xfedcba98);
  EXPECT_EQ(wr_kind(id), WrKind::kRmaRecv);
  EXPECT_EQ(wr_gen(id), 0x123456u);
  EXPECT_EQ(wr_index(id), 0xfedcba98u);
  EXPECT_EQ(wr_gen(make_wr_id(WrKind::kWrite, 0x1ffffff, 0)), 0xffffffu);
}

TEST(VerbsCompletion, OpTableExhaustionAndStaleTags) {
  OpTable t(3);
  const uint64_t a = t.acquire(WrKind::kWrite, 10, 0);
  const uint64_t b = t.acquire(WrKind::kSend, 11, 1);
  const uint64_t c = t.acquire(WrKind::kRecv, 12, 2);
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(c, 0u);
  EXPECT_EQ(t.acquire(WrKind::kWrite, 13, 0), 0u) << "full: back-pressure";
  EXPECT_EQ(t.in_use(), 3u);
  t.release(b);
  const uint64_t d = t.acquire(WrKind::kSend, 14, 1);
  EXPECT_EQ(wr_index(d), wr_index(b)) << "slot reused";
  EXPECT_EQ(t.lookup(b), nullptr) << "old generation is stale";
  ASSERT_NE(t.lookup(d), nullptr);
  EXPECT_EQ(t.lookup(d)->user_ctx, 14u);
  // A tag whose kind disagrees with the slot is not that slot's.
  EXPECT_EQ(t.lookup(make_wr_id(WrKind::kRecv, wr_gen(a), wr_index(a))), nullptr);
  EXPECT_EQ(t.lookup(make_wr_id(WrKind::kWrite, 1, 99)), nullptr);
  t.release(b);  // double release of a stale tag is harmless
  EXPECT_EQ(t.in_use(), 3u);
}

// The bug this guards against: dispatching error CQEs on wc.opcode, which
// verbs leaves undefined when status != SUCCESS.
TEST(VerbsCompletion, ErrorCompletionsAttributedByTagWhateverTheOpcode) {
  // The duplicate CQEs below are logged at warn; keep the output readable.
  core::log().set_level(spdlog::level::err);
  std::mt19937 rng(11);
  CompletionTracker tr("mlx5_test", 4096, 4096);
  struct Posted {
    uint64_t wr_id;
    WrKind kind;
    uint64_t ctx;
  };
  std::vector<Posted> posted;
  const WrKind kinds[] = {WrKind::kWrite, WrKind::kSend, WrKind::kRecv};
  for (uint64_t i = 0; i < 3000; ++i) {
    const WrKind k = kinds[rng() % 3];
    const uint64_t ctx = 0xc0de0000 + i;
    ASSERT_EQ(tr.credits().take(1), 1u);
    const uint64_t id = tr.ops().acquire(k, ctx, static_cast<uint32_t>(i % 17));
    ASSERT_NE(id, 0u);
    posted.push_back({id, k, ctx});
  }
  std::shuffle(posted.begin(), posted.end(), rng);
  const ibv_wc_status errors[] = {IBV_WC_RETRY_EXC_ERR,     IBV_WC_REM_ACCESS_ERR,
                                  IBV_WC_WR_FLUSH_ERR,      IBV_WC_LOC_PROT_ERR,
                                  IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_REM_OP_ERR};
  std::map<uint64_t, int> seen;
  for (const Posted& p : posted) {
    const bool fail = rng() % 2 == 0;
    // On errors the opcode is garbage: anything, including RECV for a write.
    const int opcode = fail ? static_cast<int>(rng() % 256)
                            : (p.kind == WrKind::kWrite  ? IBV_WC_RDMA_WRITE
                               : p.kind == WrKind::kSend ? IBV_WC_SEND
                                                         : IBV_WC_RECV);
    ibv_wc wc = make_wc(p.wr_id, fail ? errors[rng() % 6] : IBV_WC_SUCCESS, opcode);
    wc.byte_len = 1234;
    core::Completion c;
    const WcOutcome o = tr.on_wc(wc, &c);
    ASSERT_TRUE(o.emit);
    ASSERT_TRUE(o.slot_found);
    EXPECT_EQ(o.kind, p.kind);
    EXPECT_EQ(c.ctx, p.ctx);
    const auto want = p.kind == WrKind::kWrite  ? core::Completion::Kind::kWrite
                      : p.kind == WrKind::kSend ? core::Completion::Kind::kSend
                                                : core::Completion::Kind::kRecv;
    EXPECT_EQ(c.kind, want);
    EXPECT_EQ(c.status.is_ok(), !fail);
    if (fail) {
      EXPECT_NE(c.status.message().find("mlx5_test"), std::string::npos);
      EXPECT_NE(c.status.message().find(ibv_wc_status_str(wc.status)), std::string::npos)
          << c.status.message();
      EXPECT_NE(c.status.message().find(wr_kind_name(p.kind)), std::string::npos);
      EXPECT_EQ(c.status.code(),
                wc.status == IBV_WC_WR_FLUSH_ERR ? Code::kAborted : Code::kUnavailable);
      EXPECT_EQ(c.len, 0u);
    } else {
      EXPECT_EQ(c.len, p.kind == WrKind::kRecv ? 1234u : 0u);
    }
    ++seen[p.ctx];
    // The same CQE again (a provider bug, or our own double poll) is ignored.
    core::Completion again;
    EXPECT_FALSE(tr.on_wc(wc, &again).emit);
    tr.credits().take(1);  // that duplicate returned a credit it never held
  }
  EXPECT_EQ(seen.size(), posted.size());
  for (const auto& [ctx, n] : seen) EXPECT_EQ(n, 1) << ctx;
  EXPECT_EQ(tr.ops().in_use(), 0u);
  core::log().set_level(spdlog::level::info);
}

TEST(VerbsCompletion, WriteWithImmediateIsReportedAndItsReceiveReposted) {
  CompletionTracker tr("nic", 64, 64);
  tr.credits().take(1);
  ibv_wc wc =
      make_wc(make_wr_id(WrKind::kRmaRecv, 0, 17), IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM);
  wc.wc_flags = IBV_WC_WITH_IMM;
  wc.imm_data = htonl(0xdeadbeef);  // verbs delivers it in network order
  core::Completion c;
  const WcOutcome o = tr.on_wc(wc, &c);
  EXPECT_TRUE(o.emit);
  EXPECT_EQ(c.kind, core::Completion::Kind::kRemoteImm);
  EXPECT_EQ(c.imm, 0xdeadbeefu);
  EXPECT_TRUE(c.status.is_ok());
  EXPECT_TRUE(o.repost);
  EXPECT_EQ(o.index, 17u);
  EXPECT_EQ(tr.credits().used(), 0u) << "the consumed receive's credit came back";

  // A send on the rma QP: not an immediate, but the receive is still gone.
  tr.credits().take(1);
  wc = make_wc(make_wr_id(WrKind::kRmaRecv, 0, 3), IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_FALSE(tr.on_wc(wc, &c).emit);
  // Error on an immediate receive: reported, receive re-posted.
  tr.credits().take(1);
  wc = make_wc(make_wr_id(WrKind::kRmaRecv, 0, 4), IBV_WC_LOC_LEN_ERR, 0xee);
  WcOutcome e = tr.on_wc(wc, &c);
  EXPECT_TRUE(e.emit);
  EXPECT_TRUE(e.repost);
  EXPECT_EQ(c.kind, core::Completion::Kind::kRemoteImm);
  EXPECT_FALSE(c.status.is_ok());
  // Flushed (SRQ torn down): neither reported nor re-posted.
  tr.credits().take(1);
  wc = make_wc(make_wr_id(WrKind::kRmaRecv, 0, 5), IBV_WC_WR_FLUSH_ERR, 0xee);
  e = tr.on_wc(wc, &c);
  EXPECT_FALSE(e.emit);
  EXPECT_FALSE(e.repost);
}

TEST(VerbsCompletion, HandshakeReceivesAndSends) {
  CompletionTracker tr("nic", 64, 64);
  tr.credits().take(3);
  core::Completion c;
  ibv_wc wc = make_wc(make_wr_id(WrKind::kUdRecv, 0, 9), IBV_WC_SUCCESS, IBV_WC_RECV);
  WcOutcome o = tr.on_wc(wc, &c);
  EXPECT_FALSE(o.emit);
  EXPECT_TRUE(o.ud_payload);
  EXPECT_TRUE(o.repost);
  EXPECT_EQ(o.index, 9u);
  wc = make_wc(make_wr_id(WrKind::kUdRecv, 0, 9), IBV_WC_WR_FLUSH_ERR, 0);
  o = tr.on_wc(wc, &c);
  EXPECT_FALSE(o.ud_payload);
  EXPECT_FALSE(o.repost);
  wc = make_wc(make_wr_id(WrKind::kUdSend, 0, 70), IBV_WC_RETRY_EXC_ERR, 0);
  o = tr.on_wc(wc, &c);
  EXPECT_FALSE(o.emit);
  EXPECT_EQ(o.kind, WrKind::kUdSend);
  EXPECT_EQ(o.index, 70u);
  EXPECT_EQ(tr.credits().used(), 0u);
  // A wr_id that is none of ours.
  wc = make_wc(0xff00000000000001ull, IBV_WC_SUCCESS, 0);
  tr.credits().take(1);
  o = tr.on_wc(wc, &c);
  EXPECT_FALSE(o.emit);
  EXPECT_EQ(tr.credits().used(), 0u);
}

TEST(VerbsCompletion, CreditsBackPressure) {
  CqCredits c(10);
  EXPECT_EQ(c.take(4), 4u);
  EXPECT_EQ(c.take(10), 6u) << "partial grant";
  EXPECT_EQ(c.take(1), 0u);
  c.give(3);
  EXPECT_EQ(c.available(), 3u);
  c.give(100);  // over-return clamps instead of wrapping
  EXPECT_EQ(c.used(), 0u);
  EXPECT_EQ(c.available(), 10u);
}

// A model of the shared CQ: a fixed number of slots, overflow is fatal. The
// poster follows the domain's discipline (credit before post, give back what
// the NIC did not take); CQEs appear at random times and are polled in random
// amounts. The CQ never holds more than its size, and no WR is lost.
TEST(VerbsCompletion, CreditBoundKeepsTheSharedCqFromOverflowing) {
  constexpr size_t kCq = 256;
  std::mt19937 rng(3);
  CompletionTracker tr("nic", kCq, kCq);
  std::deque<uint64_t> in_nic;  // posted, CQE not generated yet
  std::deque<ibv_wc> cq;        // generated, not polled
  size_t max_cq = 0;
  size_t posted = 0;
  size_t completed = 0;
  size_t back_pressured = 0;
  // Internal receives, as at open: they hold credits all the time.
  for (uint32_t i = 0; i < 32; ++i) {
    ASSERT_EQ(tr.credits().take(1), 1u);
    in_nic.push_back(make_wr_id(WrKind::kRmaRecv, 0, i));
  }
  for (int step = 0; step < 200000; ++step) {
    // Bursts of posting and NIC progress between rare polls (a busy worker):
    // the CQ fills up to the credit bound.
    const unsigned r = rng() % 9;
    switch (r < 4 ? 0 : r < 8 ? 1 : 2) {
      case 0: {  // post a chain of up to 4
        const size_t want = 1 + rng() % 4;
        const size_t got = tr.credits().take(want);
        if (got < want) ++back_pressured;
        size_t ok = 0;
        for (; ok < got; ++ok) {
          const uint64_t id = tr.ops().acquire(WrKind::kWrite, posted + ok, 0);
          if (id == 0) break;
          in_nic.push_back(id);
        }
        // The NIC took only part of the chain (ENOMEM): return the rest.
        const size_t accepted = ok == 0 ? 0 : ok - rng() % (ok == 1 ? 1 : 2);
        for (size_t k = accepted; k < ok; ++k) {
          tr.ops().release(in_nic.back());
          in_nic.pop_back();
        }
        tr.credits().give(got - accepted);
        posted += accepted;
        break;
      }
      case 1: {  // the NIC completes some work: CQEs land in the CQ
        for (size_t k = rng() % 8; k > 0 && !in_nic.empty(); --k) {
          const size_t pick = rng() % in_nic.size();
          const bool fail = rng() % 10 == 0;
          ibv_wc wc = make_wc(in_nic[pick], fail ? IBV_WC_REM_ACCESS_ERR : IBV_WC_SUCCESS,
                              fail ? static_cast<int>(rng() % 256) : IBV_WC_RDMA_WRITE);
          if (wr_kind(in_nic[pick]) == WrKind::kRmaRecv && !fail) {
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
          }
          in_nic.erase(in_nic.begin() + static_cast<ptrdiff_t>(pick));
          cq.push_back(wc);
          ASSERT_LE(cq.size(), kCq) << "CQ overflow";
          max_cq = std::max(max_cq, cq.size());
        }
        break;
      }
      case 2: {  // poll up to 32
        for (size_t k = rng() % 33; k > 0 && !cq.empty(); --k) {
          core::Completion c;
          const WcOutcome o = tr.on_wc(cq.front(), &c);
          if (o.kind == WrKind::kWrite) ++completed;
          if (o.repost) {
            ASSERT_EQ(tr.credits().take(1), 1u) << "a re-post always finds its credit";
            in_nic.push_back(make_wr_id(WrKind::kRmaRecv, 0, o.index));
          }
          cq.pop_front();
        }
        break;
      }
    }
    ASSERT_EQ(tr.credits().used(), in_nic.size() + cq.size());
  }
  EXPECT_GT(back_pressured, 0u) << "the bound was reached";
  EXPECT_GT(max_cq, kCq / 2);
  const auto is_write = [](uint64_t id) { return wr_kind(id) == WrKind::kWrite; };
  const size_t writes_pending =
      static_cast<size_t>(std::count_if(in_nic.begin(), in_nic.end(), is_write)) +
      static_cast<size_t>(std::count_if(cq.begin(), cq.end(),
                                        [&](const ibv_wc& wc) { return is_write(wc.wr_id); }));
  EXPECT_EQ(posted, completed + writes_pending) << "no write lost or counted twice";
}

}  // namespace
}  // namespace ferry::verbs

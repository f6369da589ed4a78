// The fault injector against a scripted inner Domain and a manual clock:
// every behaviour is deterministic for a given seed.
#include "testing/fault_domain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace ferry::testing {
namespace {

using core::Completion;
using core::PostResult;
using core::WriteDesc;

// Engine-style contexts (core/worker.cpp): tag | generation | slot.
uint64_t ectx(uint32_t gen, uint32_t slot, uint64_t tag = 1) {
  return tag << 56 | uint64_t(gen) << 32 | slot;
}

// Not a NIC but a script: the test decides which post is accepted or fails and
// when each completion appears, which the fault injector's own behaviour is
// then checked against. Engine tests use the one fake NIC (testing/fake_domain.h).
class ScriptedNic : public core::Domain {
 public:
  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return {}; }
  std::unique_ptr<core::DomainMr> register_mr(void*, size_t, Device, bool, Status*) override {
    return std::make_unique<core::DomainMr>();
  }
  core::PeerId add_peer(std::span<const uint8_t>, Status*) override { return 7; }
  void remove_peer(core::PeerId) override {}

  PostResult post_writes(std::span<const WriteDesc> ws) override {
    PostResult r;
    for (const auto& w : ws) {
      if (accept == 0) break;
      if (fail_next) {
        fail_next = false;
        r.error = Status(Code::kUnavailable, "scripted post failure");
        break;
      }
      --accept;
      writes.push_back(w);
      ++r.posted;
    }
    return r;
  }
  PostResult post_send(core::PeerId, const void*, size_t, void*, uint64_t ctx) override {
    sends.push_back(ctx);
    return {1, {}};
  }
  PostResult post_recv(void*, size_t, void*, uint64_t ctx) override {
    recvs.push_back(ctx);
    return {1, {}};
  }
  size_t poll(std::span<Completion> out) override {
    size_t n = 0;
    while (n < out.size() && !cq.empty()) {
      out[n++] = cq.front();
      cq.pop_front();
    }
    return n;
  }
  int wait_fd() override { return 42; }
  bool can_block() override { return true; }

  // Completes the write posted as writes[i] (as a NIC would).
  void complete(size_t i, Status st = {}) {
    Completion c;
    c.kind = Completion::Kind::kWrite;
    c.ctx = writes[i].ctx;
    c.status = std::move(st);
    cq.push_back(c);
  }
  void complete_all() {
    for (; completed < writes.size(); ++completed) complete(completed);
  }
  void remote_imm(uint32_t imm) {
    Completion c;
    c.kind = Completion::Kind::kRemoteImm;
    c.imm = imm;
    cq.push_back(c);
  }

  core::DomainInfo info_{"scripted", "scripted", "scripted"};
  std::vector<WriteDesc> writes;
  std::vector<uint64_t> sends, recvs;
  std::deque<Completion> cq;
  size_t accept = SIZE_MAX;
  bool fail_next = false;
  size_t completed = 0;
};

struct Rig {
  explicit Rig(const std::string& spec, size_t nic_index = 0) {
    FaultSpec s;
    Status st = parse_fault_spec(spec, &s);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    auto f = std::make_unique<ScriptedNic>();
    nic = f.get();
    dom = std::make_unique<FaultDomain>(std::move(f), s, nic_index, [this] { return now_ns; });
  }
  // Polls until the wrapper has nothing due and the scripted CQ is empty.
  std::vector<Completion> poll_all() {
    std::vector<Completion> got;
    Completion buf[32];
    for (int idle = 0; idle < 2;) {
      size_t n = dom->poll(buf);
      got.insert(got.end(), buf, buf + n);
      idle = n == 0 && nic->cq.empty() ? idle + 1 : 0;
    }
    return got;
  }
  void advance_us(uint64_t us) { now_ns += us * 1000; }

  uint64_t now_ns = 1'000'000'000;
  ScriptedNic* nic = nullptr;
  std::unique_ptr<FaultDomain> dom;
};

WriteDesc write(uint64_t len, uint64_t ctx, std::optional<uint32_t> imm = 5) {
  static uint8_t src[1 << 16];
  WriteDesc w;
  w.src = src;
  w.len = len;
  w.peer = 7;
  w.remote_addr = 0x10000;
  w.rkey = 99;
  w.has_imm = imm.has_value();
  w.imm = imm.value_or(0);
  w.ctx = ctx;
  return w;
}

// ------------------------------------------------------------------ parser

TEST(FaultSpecParse, AcceptsEveryKey) {
  FaultSpec s;
  ASSERT_TRUE(parse_fault_spec("seed=7,reorder=0.2,delay_us=50,eagain=0.05,split=0.1,fail=0.001,"
                               "stale=0.01,stale_us=200",
                               &s)
                  .is_ok());
  EXPECT_EQ(s.seed, 7u);
  EXPECT_DOUBLE_EQ(s.reorder, 0.2);
  EXPECT_EQ(s.delay_us, 50u);
  EXPECT_DOUBLE_EQ(s.eagain, 0.05);
  EXPECT_DOUBLE_EQ(s.split, 0.1);
  EXPECT_DOUBLE_EQ(s.fail, 0.001);
  EXPECT_DOUBLE_EQ(s.stale, 0.01);
  EXPECT_EQ(s.stale_us, 200u);
  FaultSpec d;
  ASSERT_TRUE(parse_fault_spec("", &d).is_ok());
  EXPECT_EQ(d.delay_us, 0u);
  EXPECT_EQ(d.stale_us, 1000u);
  ASSERT_TRUE(parse_fault_spec("fail=1,reorder=0", &d).is_ok());
}

TEST(FaultSpecParse, RejectsNamingTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"seed=7,bogus=1", "'bogus'"}, {"reorder=1.5", "'reorder'"}, {"eagain=-0.1", "'eagain'"},
      {"split=abc", "'split'"},      {"fail=", "'fail'"},          {"delay_us=-5", "'delay_us'"},
      {"delay_us=5x", "'delay_us'"}, {"seed=0x10", "'seed'"},      {"stale_us=1.5", "'stale_us'"},
      {"stale=nan", "'stale'"},      {"reorder", "'reorder'"},     {"=3", "'=3'"},
      {"seed=1,seed=2", "'seed'"},   {"seed=1,", "'seed=1'"},      {"seed=1,,fail=0", "''"},
  };
  for (auto [spec, key] : cases) {
    FaultSpec s;
    Status st = parse_fault_spec(spec, &s);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << spec;
    EXPECT_NE(st.message().find(key), std::string::npos) << spec << ": " << st.message();
  }
}

TEST(FaultSpecParse, WrapRefusesMalformedSpec) {
  Status err;
  auto d = wrap_with_faults(std::make_unique<ScriptedNic>(), "delay=5", 0, &err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err.code(), Code::kInvalidArgument);
  EXPECT_NE(err.message().find("'delay'"), std::string::npos);
  Status ok;
  EXPECT_NE(wrap_with_faults(std::make_unique<ScriptedNic>(), "seed=3", 0, &ok), nullptr);
  EXPECT_TRUE(ok.is_ok());
}

// ------------------------------------------------------------- behaviours

TEST(FaultDomain, ZeroSpecForwardsEverythingInOrder) {
  Rig r("seed=1");
  WriteDesc ws[3] = {write(10, ectx(1, 0)), write(0, ectx(1, 1)), write(4096, ectx(1, 2), {})};
  auto p = r.dom->post_writes(ws);
  EXPECT_EQ(p.posted, 3u);
  ASSERT_EQ(r.nic->writes.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.nic->writes[i].ctx, ws[i].ctx);
    EXPECT_EQ(r.nic->writes[i].len, ws[i].len);
    EXPECT_EQ(r.nic->writes[i].has_imm, ws[i].has_imm);
  }
  r.nic->complete_all();
  r.nic->remote_imm(77);
  auto got = r.poll_all();
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i].ctx, ws[i].ctx);
  EXPECT_EQ(got[3].kind, Completion::Kind::kRemoteImm);
  EXPECT_EQ(got[3].imm, 77u);
  EXPECT_EQ(r.dom->wait_fd(), 42);
  EXPECT_TRUE(r.dom->can_block());
}

TEST(FaultDomain, DelayHoldsCompletionsAndBlocksWaiting) {
  Rig r("seed=2,delay_us=100");
  for (uint32_t i = 0; i < 50; ++i) r.nic->remote_imm(i);
  auto first = r.poll_all();  // only the ones that drew a zero delay
  EXPECT_LT(first.size(), 10u);
  EXPECT_GT(r.dom->held(), 0u);
  EXPECT_EQ(r.dom->wait_fd(), -1);  // the worker must keep polling
  EXPECT_FALSE(r.dom->can_block());
  r.advance_us(50);
  auto mid = r.poll_all();
  EXPECT_GT(mid.size(), 10u);
  r.advance_us(51);
  auto rest = r.poll_all();
  EXPECT_EQ(first.size() + mid.size() + rest.size(), 50u);
  EXPECT_EQ(r.dom->held(), 0u);
  EXPECT_EQ(r.dom->wait_fd(), 42);
  EXPECT_GT(r.dom->stats().delayed, 30u);
}

TEST(FaultDomain, ReorderShufflesButLosesAndInventsNothing) {
  auto run = [](uint64_t seed) {
    Rig r("reorder=0.5,delay_us=20,seed=" + std::to_string(seed));
    std::vector<uint32_t> order;
    for (uint32_t i = 0; i < 1000; ++i) {
      r.nic->remote_imm(i);
      if (i % 10 == 0) r.advance_us(3);
      for (auto& c : r.poll_all()) order.push_back(c.imm);
    }
    for (int k = 0; k < 200 && r.dom->held(); ++k) {
      r.advance_us(10);
      for (auto& c : r.poll_all()) order.push_back(c.imm);
    }
    return order;
  };
  auto a = run(9), b = run(9), c = run(10);
  EXPECT_EQ(a, b);  // deterministic per seed
  EXPECT_NE(a, c);
  ASSERT_EQ(a.size(), 1000u);
  EXPECT_FALSE(std::is_sorted(a.begin(), a.end()));
  std::sort(a.begin(), a.end());
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(a[i], i);  // each exactly once
}

TEST(FaultDomain, CoalesceMergesRunsButKeepsEveryCount) {
  Rig r("seed=4,coalesce=1");
  // 100 immediates of 3 values in runs, 50 writes of 2 transfers, one failure.
  std::map<uint32_t, uint64_t> want_imm;
  for (uint32_t i = 0; i < 100; ++i) {
    r.nic->remote_imm(i / 10 % 3);
    want_imm[i / 10 % 3]++;
  }
  for (uint32_t i = 0; i < 50; ++i) r.nic->writes.push_back(write(8, ectx(1, i < 30 ? 0 : 1)));
  for (size_t i = 0; i < 50; ++i)
    r.nic->complete(i, i == 40 ? Status(Code::kUnavailable, "x") : Status());
  std::map<uint32_t, uint64_t> got_imm;
  std::map<uint64_t, uint64_t> got_ok;
  size_t entries = 0, failed = 0;
  for (auto& c : r.poll_all()) {
    ++entries;
    ASSERT_GE(c.count, 1u);
    if (c.kind == Completion::Kind::kRemoteImm) got_imm[c.imm] += c.count;
    if (c.kind == Completion::Kind::kWrite && c.status.is_ok()) got_ok[c.ctx] += c.count;
    if (!c.status.is_ok()) {
      EXPECT_EQ(c.count, 1u);  // an error is never folded into a success
      ++failed;
    }
  }
  EXPECT_EQ(got_imm, want_imm);
  EXPECT_EQ(got_ok[ectx(1, 0)], 30u);
  EXPECT_EQ(got_ok[ectx(1, 1)], 19u);
  EXPECT_EQ(failed, 1u);
  EXPECT_LT(entries, 40u);  // runs were merged
  EXPECT_GT(r.dom->stats().coalesced, 100u);
}

TEST(FaultDomain, PagedSpecAsksForPageListsAndTheBaseSpellsThemOut) {
  Rig off("seed=1");
  EXPECT_FALSE(off.dom->info().native_paged);
  Rig r("seed=1,paged=1");
  EXPECT_TRUE(r.dom->info().native_paged);
  static uint8_t src[1 << 16];
  std::vector<uint32_t> si(100), di(100);
  for (uint32_t k = 0; k < 100; ++k) {
    si[k] = (k * 37) % 100;
    di[k] = 99 - k;
  }
  core::PagedDesc p;
  p.src = src;
  p.src_stride = 300;
  p.src_idx = si.data();
  p.remote_base = 0x100000;
  p.dst_stride = 512;
  p.dst_idx = di.data();
  p.count = 100;
  p.page_len = 256;
  p.peer = 7;
  p.rkey = 99;
  p.imm = 3;
  p.has_imm = true;
  p.ctx = ectx(1, 5);
  r.nic->accept = 70;  // back-pressure part-way: a prefix is posted, no error
  PostResult res = r.dom->post_paged(p);
  EXPECT_EQ(res.posted, 70u);
  EXPECT_TRUE(res.error.is_ok());
  ASSERT_EQ(r.nic->writes.size(), 70u);
  for (uint32_t k = 0; k < 70; ++k) {
    const WriteDesc& w = r.nic->writes[k];
    EXPECT_EQ(w.src, src + si[k] * 300u);
    EXPECT_EQ(w.remote_addr, 0x100000u + di[k] * 512u);
    EXPECT_EQ(w.len, 256u);
    EXPECT_TRUE(w.has_imm && w.imm == 3 && w.ctx == ectx(1, 5) && w.rkey == 99u);
  }
  FaultSpec bad;
  EXPECT_EQ(parse_fault_spec("paged=2", &bad).code(), Code::kInvalidArgument);
}

TEST(FaultDomain, NicIndexChangesTheStream) {
  auto run = [](size_t nic) {
    Rig r("reorder=1,seed=5", nic);
    for (uint32_t i = 0; i < 64; ++i) r.nic->remote_imm(i);
    EXPECT_TRUE(r.poll_all().empty());  // each held back by at least 1 us
    r.advance_us(1000);
    std::vector<uint32_t> order;
    for (auto& c : r.poll_all()) order.push_back(c.imm);
    return order;
  };
  EXPECT_NE(run(0), run(1));
}

TEST(FaultDomain, EagainAcceptsFewerWithOkStatus) {
  Rig r("seed=3,eagain=1");
  std::vector<WriteDesc> ws;
  for (uint32_t i = 0; i < 16; ++i) ws.push_back(write(8, ectx(1, i)));
  size_t zero = 0, total = 0;
  for (int k = 0; k < 100; ++k) {
    auto p = r.dom->post_writes(ws);
    EXPECT_TRUE(p.error.is_ok());
    EXPECT_LT(p.posted, ws.size());
    zero += p.posted == 0;
    total += p.posted;
  }
  EXPECT_GT(zero, 0u);
  EXPECT_EQ(r.nic->writes.size(), total);
  EXPECT_EQ(r.dom->post_send(7, nullptr, 0, nullptr, ectx(1, 1, 2)).posted, 0u);
  EXPECT_EQ(r.dom->post_recv(nullptr, 0, nullptr, 3).posted, 0u);
  EXPECT_TRUE(r.nic->sends.empty());
  EXPECT_TRUE(r.nic->recvs.empty());
  EXPECT_EQ(r.dom->stats().short_posts, 102u);
}

TEST(FaultDomain, SplitPostsPiecesThenTheImmediateThenOneCompletion) {
  Rig r("seed=4,split=1");
  WriteDesc w = write(1000, ectx(3, 9), 1234);
  w.remote_addr = 0x5000;
  ASSERT_EQ(r.dom->post_writes(std::span(&w, 1)).posted, 1u);
  const size_t pieces = r.nic->writes.size();
  ASSERT_GE(pieces, 2u);
  ASSERT_LE(pieces, 4u);
  uint64_t off = 0;
  for (auto& p : r.nic->writes) {
    EXPECT_FALSE(p.has_imm);  // no piece may announce data that is not all there
    EXPECT_GT(p.len, 0u);
    EXPECT_EQ(p.remote_addr, 0x5000 + off);
    EXPECT_EQ(static_cast<const uint8_t*>(p.src), static_cast<const uint8_t*>(w.src) + off);
    EXPECT_NE(p.ctx, w.ctx);
    off += p.len;
  }
  EXPECT_EQ(off, 1000u);
  // All pieces but one complete: still no immediate, nothing handed up.
  for (size_t i = 0; i + 1 < pieces; ++i) r.nic->complete(i);
  EXPECT_TRUE(r.poll_all().empty());
  EXPECT_EQ(r.nic->writes.size(), pieces);
  r.nic->complete(pieces - 1);
  EXPECT_TRUE(r.poll_all().empty());
  ASSERT_EQ(r.nic->writes.size(), pieces + 1);
  const WriteDesc& imm = r.nic->writes.back();
  EXPECT_EQ(imm.len, 0u);
  EXPECT_TRUE(imm.has_imm);
  EXPECT_EQ(imm.imm, 1234u);
  EXPECT_EQ(imm.remote_addr, 0x5000u);
  EXPECT_EQ(imm.rkey, 99u);
  r.nic->complete(pieces);
  auto got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, Completion::Kind::kWrite);
  EXPECT_EQ(got[0].ctx, w.ctx);
  EXPECT_TRUE(got[0].status.is_ok());
  EXPECT_EQ(r.dom->stats().split_writes, 1u);
}

TEST(FaultDomain, SplitWithoutImmediateAndTinyWrites) {
  Rig r("seed=5,split=1");
  WriteDesc ws[3] = {write(64, ectx(1, 1), {}), write(1, ectx(1, 2)), write(0, ectx(1, 3))};
  ASSERT_EQ(r.dom->post_writes(ws).posted, 3u);
  // 1- and 0-byte writes are never split; they pass through unchanged.
  size_t passthrough = std::count_if(r.nic->writes.begin(), r.nic->writes.end(), [&](auto& w) {
    return w.ctx == ws[1].ctx || w.ctx == ws[2].ctx;
  });
  EXPECT_EQ(passthrough, 2u);
  r.nic->complete_all();
  auto got = r.poll_all();
  EXPECT_EQ(r.nic->writes.size(), r.nic->completed);  // no trailing write without an imm
  std::map<uint64_t, int> seen;
  for (auto& c : got) seen[c.ctx]++;
  EXPECT_EQ(seen, (std::map<uint64_t, int>{{ws[0].ctx, 1}, {ws[1].ctx, 1}, {ws[2].ctx, 1}}));
}

TEST(FaultDomain, SplitPieceErrorFailsTheWriteWithoutImmediate) {
  Rig r("seed=6,split=1");
  WriteDesc w = write(300, ectx(2, 4));
  ASSERT_EQ(r.dom->post_writes(std::span(&w, 1)).posted, 1u);
  size_t pieces = r.nic->writes.size();
  r.nic->complete(0, Status(Code::kUnavailable, "wire cut"));
  for (size_t i = 1; i < pieces; ++i) r.nic->complete(i);
  auto got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ctx, w.ctx);
  EXPECT_EQ(got[0].status.message(), "wire cut");
  EXPECT_EQ(r.nic->writes.size(), pieces);  // the immediate was never sent
}

TEST(FaultDomain, SplitSurvivesInnerBackPressureAndPoolsBookkeeping) {
  Rig r("seed=7,split=1");
  r.nic->accept = 1;  // the NIC takes one write, then is full
  std::vector<WriteDesc> ws;
  for (uint32_t i = 0; i < 20; ++i) ws.push_back(write(100 + i, ectx(1, i)));
  ASSERT_EQ(r.dom->post_writes(ws).posted, 20u);  // queued in the wrapper
  EXPECT_EQ(r.nic->writes.size(), 1u);
  EXPECT_EQ(r.dom->wait_fd(), -1);  // pieces are waiting: keep polling
  std::map<uint64_t, int> seen;
  for (int k = 0; k < 1000 && seen.size() < 20; ++k) {
    r.nic->accept = 3;
    r.nic->complete_all();
    for (auto& c : r.poll_all()) seen[c.ctx]++;
  }
  ASSERT_EQ(seen.size(), 20u);
  for (auto& [ctx, n] : seen) EXPECT_EQ(n, 1) << ctx;
  size_t imms =
      std::count_if(r.nic->writes.begin(), r.nic->writes.end(), [](auto& w) { return w.has_imm; });
  EXPECT_EQ(imms, 20u);
  // Every immediate follows all of its pieces.
  std::map<uint64_t, size_t> last_piece;
  for (size_t i = 0; i < r.nic->writes.size(); ++i) {
    auto& w = r.nic->writes[i];
    if (!w.has_imm)
      last_piece[w.ctx] = i;
    else
      EXPECT_GT(i, last_piece.at(w.ctx));
  }
  // A second wave reuses the pooled records: same contexts come back.
  std::set<uint64_t> first_ctxs;
  for (auto& w : r.nic->writes) first_ctxs.insert(w.ctx & 0xFFFFFFFF);
  r.nic->writes.clear();
  r.nic->completed = 0;
  r.nic->accept = SIZE_MAX;
  ASSERT_EQ(r.dom->post_writes(ws).posted, 20u);
  for (auto& w : r.nic->writes) EXPECT_TRUE(first_ctxs.count(w.ctx & 0xFFFFFFFF));
}

TEST(FaultDomain, FailTurnsCompletionsAndPostsIntoErrors) {
  Rig r("seed=8,fail=1");
  std::vector<WriteDesc> ws;
  for (uint32_t i = 0; i < 8; ++i) ws.push_back(write(8, ectx(1, i)));
  auto p = r.dom->post_writes(ws);
  EXPECT_EQ(p.error.code(), Code::kUnavailable);
  EXPECT_NE(p.error.message().find("injected fault"), std::string::npos);
  EXPECT_LT(p.posted, ws.size());
  EXPECT_EQ(r.nic->writes.size(), p.posted);
  EXPECT_EQ(r.dom->post_send(7, nullptr, 0, nullptr, ectx(1, 1, 2)).error.code(),
            Code::kUnavailable);
  EXPECT_TRUE(r.nic->sends.empty());
  // Completions of local work fail; remote immediates and receives never do.
  Rig q("seed=8,fail=1");
  q.nic->writes.push_back(write(8, ectx(1, 1)));
  q.nic->complete(0);
  q.nic->remote_imm(3);
  Completion rc;
  rc.kind = Completion::Kind::kRecv;
  rc.ctx = 3ull << 56;
  q.nic->cq.push_back(rc);
  auto got = q.poll_all();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].status.code(), Code::kUnavailable);
  EXPECT_NE(got[0].status.message().find("injected fault"), std::string::npos);
  EXPECT_TRUE(got[1].status.is_ok());
  EXPECT_TRUE(got[2].status.is_ok());
}

TEST(FaultDomain, StaleDuplicateOnlyAfterTheSlotWasReused) {
  Rig r("seed=9,stale=1,stale_us=500");
  WriteDesc w = write(8, ectx(4, 2));
  r.dom->post_writes(std::span(&w, 1));
  r.nic->complete(0);
  auto got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ctx, w.ctx);
  EXPECT_EQ(r.dom->stale_pending(), 1u);
  r.advance_us(10'000);
  EXPECT_TRUE(r.poll_all().empty());  // the transfer may still be running
  EXPECT_EQ(r.dom->wait_fd(), 42);    // an ineligible duplicate does not keep the worker awake
  // Another slot's transfer does not end this one.
  WriteDesc other = write(8, ectx(1, 3));
  r.dom->post_writes(std::span(&other, 1));
  EXPECT_TRUE(r.poll_all().empty());
  // The slot is reused by a new generation: the old transfer has ended.
  WriteDesc next = write(8, ectx(5, 2));
  r.dom->post_writes(std::span(&next, 1));
  got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ctx, w.ctx);  // the stale copy, old generation
  EXPECT_EQ(r.dom->stats().stale_delivered, 1u);
  // Too young: a duplicate waits for stale_us even when the slot moved on.
  r.nic->complete(1);
  got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  WriteDesc again = write(8, ectx(2, 3));
  r.dom->post_writes(std::span(&again, 1));
  EXPECT_TRUE(r.poll_all().empty());
  r.advance_us(501);
  got = r.poll_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ctx, other.ctx);
}

TEST(FaultDomain, AllAtOnceKeepsEveryImmediateExactlyOnce) {
  Rig r("seed=11,delay_us=30,reorder=0.3,eagain=0.2,split=0.5,stale=0.1");
  std::map<uint32_t, int> imms_sent;
  std::map<uint64_t, int> done;
  uint32_t next = 0;
  // The NIC completes what was posted; what it put on the wire lands at the
  // peer as immediates.
  auto wire = [&] {
    for (size_t i = r.nic->completed; i < r.nic->writes.size(); ++i)
      if (r.nic->writes[i].has_imm) imms_sent[r.nic->writes[i].imm]++;
    r.nic->complete_all();
  };
  for (int round = 0; round < 200; ++round) {
    std::vector<WriteDesc> ws;
    for (int i = 0; i < 8; ++i, ++next) ws.push_back(write(1 + next % 5000, ectx(1, next), next));
    size_t off = 0;
    while (off < ws.size()) {
      off += r.dom->post_writes(std::span(ws).subspan(off)).posted;
      wire();
      for (auto& c : r.poll_all()) done[c.ctx]++;
    }
    r.advance_us(7);
  }
  for (int k = 0; k < 1000 && (r.dom->held() || done.size() < next); ++k) {
    r.advance_us(50);
    wire();
    for (auto& c : r.poll_all()) done[c.ctx]++;
  }
  ASSERT_EQ(done.size(), next);
  ASSERT_EQ(imms_sent.size(), next);
  for (auto& [imm, n] : imms_sent) ASSERT_EQ(n, 1) << imm;
  // Slots were never reused (every ctx distinct), so no stale copy is due.
  for (auto& [ctx, n] : done) ASSERT_EQ(n, 1) << ctx;
  EXPECT_GT(r.dom->stats().split_writes, 100u);
  EXPECT_GT(r.dom->stats().short_posts, 30u);
}

}  // namespace
}  // namespace ferry::testing

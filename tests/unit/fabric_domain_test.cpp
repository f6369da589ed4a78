// Two libfabric domains of one provider in one process, talking to each other.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/domain.h"
#include "fabric/fabric_domain.h"
#include "fabric/shm_leftovers.h"

namespace ferry::fabric {
namespace {

using core::Completion;
using core::Domain;
using core::DomainMr;
using core::PeerId;
using core::WriteDesc;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(10);

struct ProviderParam {
  std::string provider;
  std::string nic;
};

std::string param_name(const ::testing::TestParamInfo<ProviderParam>& info) {
  return info.param.provider == "shm" ? "shm" : "tcp_rxm_lo";
}

// A side of the conversation: its domain plus everything it has completed.
struct Side {
  std::unique_ptr<Domain> domain;
  std::vector<Completion> done;
};

class FabricDomainTest : public ::testing::TestWithParam<ProviderParam> {
 protected:
  void SetUp() override {
    for (Side* s : {&a_, &b_}) {
      core::DomainOptions opts;
      opts.provider = GetParam().provider;
      opts.nic_name = GetParam().nic;
      Status st;
      s->domain = open_fabric_domain(opts, &st);
      ASSERT_NE(s->domain, nullptr) << st.message();
      ASSERT_TRUE(st.is_ok()) << st.message();
      EXPECT_EQ(s->domain->info().provider, GetParam().provider);
      EXPECT_EQ(s->domain->info().name, GetParam().nic);
      EXPECT_EQ(s->domain->info().transport, Transport::kFabric);
      EXPECT_FALSE(s->domain->raw_address().empty());
    }
    Status st;
    b_on_a_ = a_.domain->add_peer(b_.domain->raw_address(), &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    a_on_b_ = b_.domain->add_peer(a_.domain->raw_address(), &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    // Idempotent: same bytes, same id.
    EXPECT_EQ(a_.domain->add_peer(b_.domain->raw_address(), &st), b_on_a_);
  }

  void TearDown() override {
    // MRs before domains is the engine's order; keep it here too.
    mrs_.clear();
  }

  DomainMr* reg(Side& s, void* ptr, size_t len, bool remote) {
    Status st;
    auto mr = s.domain->register_mr(ptr, len, Device::host(), remote, &st);
    EXPECT_NE(mr, nullptr) << st.message();
    if (!mr) return nullptr;
    mrs_.push_back(std::move(mr));
    return mrs_.back().get();
  }

  void poll_once() {
    Completion buf[32];
    for (Side* s : {&a_, &b_}) {
      const size_t n = s->domain->poll(buf);
      s->done.insert(s->done.end(), buf, buf + n);
    }
  }

  // Polls both sides (the provider may need either to progress) until `pred`
  // holds; false on deadline.
  bool poll_until(const std::function<bool()>& pred) {
    const auto deadline = Clock::now() + kDeadline;
    while (!pred()) {
      if (Clock::now() > deadline) return false;
      poll_once();
    }
    return true;
  }

  static const Completion* find(const Side& s, Completion::Kind kind,
                                const std::function<bool(const Completion&)>& match) {
    for (const auto& c : s.done) {
      if (c.kind == kind && match(c)) return &c;
    }
    return nullptr;
  }

  // Posts one write, retrying on back-pressure while polling.
  core::PostResult post_write(const WriteDesc& w) {
    const auto deadline = Clock::now() + kDeadline;
    for (;;) {
      core::PostResult r = a_.domain->post_writes({&w, 1});
      if (r.posted == 1 || !r.error.is_ok() || Clock::now() > deadline) return r;
      poll_once();
    }
  }

  // Writes a->b with an immediate and waits for both completions.
  void write_imm_and_wait(const WriteDesc& w) {
    core::PostResult r = post_write(w);
    ASSERT_TRUE(r.error.is_ok()) << r.error.message();
    ASSERT_EQ(r.posted, 1u);
    const Completion* local = nullptr;
    const Completion* remote = nullptr;
    ASSERT_TRUE(poll_until([&] {
      local =
          find(a_, Completion::Kind::kWrite, [&](const Completion& c) { return c.ctx == w.ctx; });
      remote = find(b_, Completion::Kind::kRemoteImm,
                    [&](const Completion& c) { return c.imm == w.imm; });
      return local != nullptr && remote != nullptr;
    })) << "timed out: local="
        << (local != nullptr) << " remote=" << (remote != nullptr);
    EXPECT_TRUE(local->status.is_ok()) << local->status.message();
    EXPECT_TRUE(remote->status.is_ok()) << remote->status.message();
  }

  Side a_, b_;
  PeerId b_on_a_ = 0, a_on_b_ = 0;
  std::vector<std::unique_ptr<DomainMr>> mrs_;
};

TEST_P(FabricDomainTest, WriteWithImmediate) {
  std::vector<uint8_t> src(4096), dst(8192, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(smr && dmr);

  constexpr uint64_t kOffset = 1000;
  WriteDesc w;
  w.src = src.data();
  w.len = src.size();
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base + kOffset;
  w.rkey = dmr->rkey;
  w.imm = 0xdeadbeef;
  w.has_imm = true;
  w.ctx = 42;
  write_imm_and_wait(w);
  EXPECT_EQ(std::memcmp(dst.data() + kOffset, src.data(), src.size()), 0);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + kOffset, [](uint8_t v) { return v == 0; }));
  EXPECT_TRUE(
      std::all_of(dst.begin() + kOffset + src.size(), dst.end(), [](uint8_t v) { return v == 0; }));
}

TEST_P(FabricDomainTest, ZeroLengthImmediateWrite) {
  std::vector<uint8_t> src(64, 1), dst(64, 0);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(smr && dmr);
  WriteDesc w;
  w.src = src.data();
  w.len = 0;
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey;
  w.imm = 7;
  w.has_imm = true;
  w.ctx = 1;
  write_imm_and_wait(w);
  // A second one exercises whichever iovec form the first settled on.
  w.imm = 8;
  w.ctx = 2;
  write_imm_and_wait(w);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
}

// shm hands an immediate to the peer inside the post: at_post writes arrive,
// every one of them, and leave no local completion behind.
TEST_P(FabricDomainTest, ImmediatesAtPostArriveWithoutLocalCompletions) {
  const bool at_post = a_.domain->info().imm_at_post;
  EXPECT_EQ(at_post, GetParam().provider == "shm");
  if (!at_post) GTEST_SKIP() << GetParam().provider << " keeps a completion per write";
  std::vector<uint8_t> dst(64, 0);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(dmr);
  constexpr uint32_t kCount = 3000;  // more than the provider's queue holds
  uint64_t sum = 0;
  for (uint32_t i = 0; i < kCount; ++i) {
    const uint32_t imm = 100 + i;
    sum += imm;
    const auto deadline = Clock::now() + kDeadline;
    core::PostResult r;
    for (;;) {
      r = a_.domain->post_imm_at_post(b_on_a_, imm, dmr->remote_base, dmr->rkey);
      if (r.posted == 1 || !r.error.is_ok() || Clock::now() > deadline) break;
      poll_once();
    }
    ASSERT_TRUE(r.error.is_ok()) << r.error.message();
    ASSERT_EQ(r.posted, 1u) << "immediate " << i;
  }
  uint64_t got = 0;
  size_t arrived = 0;
  ASSERT_TRUE(poll_until([&] {
    for (; arrived < b_.done.size(); ++arrived) {
      const Completion& c = b_.done[arrived];
      EXPECT_EQ(c.kind, Completion::Kind::kRemoteImm);
      EXPECT_TRUE(c.status.is_ok()) << c.status.message();
      got += uint64_t(c.imm) * c.count;
    }
    return got >= sum;
  }));
  EXPECT_EQ(got, sum);
  for (int i = 0; i < 100; ++i) poll_once();
  EXPECT_TRUE(a_.done.empty()) << a_.done.size() << " completions on the writing side";
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
}

TEST_P(FabricDomainTest, LargeWrite) {
  constexpr size_t kLen = 16 << 20;
  ASSERT_GE(a_.domain->info().max_msg_size, kLen);
  std::vector<uint8_t> src(kLen), dst(kLen, 0);
  for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>((i >> 12) ^ i);
  DomainMr* smr = reg(a_, src.data(), kLen, false);
  DomainMr* dmr = reg(b_, dst.data(), kLen, true);
  ASSERT_TRUE(smr && dmr);
  WriteDesc w;
  w.src = src.data();
  w.len = kLen;
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey;
  w.imm = 0x12345678;
  w.has_imm = true;
  w.ctx = 99;
  write_imm_and_wait(w);
  EXPECT_TRUE(src == dst);
}

TEST_P(FabricDomainTest, WriteWithoutImmediateCompletesLocallyOnly) {
  std::vector<uint8_t> src(512, 0x5a), dst(512, 0);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(smr && dmr);
  WriteDesc w;
  w.src = src.data();
  w.len = src.size();
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey;
  w.ctx = 5;
  ASSERT_EQ(post_write(w).posted, 1u);
  // An imm write behind it on the same path tells us the first one landed.
  WriteDesc fence = w;
  fence.len = 0;
  fence.has_imm = true;
  fence.imm = 77;
  fence.ctx = 6;
  write_imm_and_wait(fence);
  ASSERT_TRUE(poll_until([&] {
    return find(a_, Completion::Kind::kWrite, [](const Completion& c) { return c.ctx == 5; });
  }));
  EXPECT_TRUE(src == dst);
  for (const auto& c : b_.done) EXPECT_EQ(c.imm, 77u) << "only the fence carries an imm";
}

TEST_P(FabricDomainTest, SendRecv) {
  constexpr size_t kLen = 100 << 10;
  std::vector<uint8_t> msg(kLen), rbuf(kLen, 0);
  for (size_t i = 0; i < kLen; ++i) msg[i] = static_cast<uint8_t>(i % 251);
  DomainMr* smr = reg(a_, msg.data(), kLen, false);
  DomainMr* rmr = reg(b_, rbuf.data(), kLen, false);
  ASSERT_TRUE(smr && rmr);

  core::PostResult r = b_.domain->post_recv(rbuf.data(), kLen, rmr->local_desc, 1234);
  ASSERT_TRUE(r.error.is_ok()) << r.error.message();
  ASSERT_EQ(r.posted, 1u);
  const auto deadline = Clock::now() + kDeadline;
  do {
    r = a_.domain->post_send(b_on_a_, msg.data(), kLen, smr->local_desc, 4321);
    ASSERT_TRUE(r.error.is_ok()) << r.error.message();
    if (r.posted == 0) poll_once();
  } while (r.posted == 0 && Clock::now() < deadline);
  ASSERT_EQ(r.posted, 1u);

  const Completion* sent = nullptr;
  const Completion* recvd = nullptr;
  ASSERT_TRUE(poll_until([&] {
    sent = find(a_, Completion::Kind::kSend, [](const Completion& c) { return c.ctx == 4321; });
    recvd = find(b_, Completion::Kind::kRecv, [](const Completion& c) { return c.ctx == 1234; });
    return sent != nullptr && recvd != nullptr;
  }));
  EXPECT_TRUE(sent->status.is_ok()) << sent->status.message();
  ASSERT_TRUE(recvd->status.is_ok()) << recvd->status.message();
  EXPECT_EQ(recvd->len, kLen);
  EXPECT_TRUE(msg == rbuf);
}

// A send at post copies its payload out before it returns: the buffer is
// overwritten at once, yet each message arrives as it was, and the sending
// side sees no completion.
TEST_P(FabricDomainTest, SendsAtPostCopyTheirPayloadAndLeaveNoCompletion) {
  const uint64_t max = a_.domain->info().send_at_post_max;
  if (GetParam().provider != "shm") {
    EXPECT_EQ(max, 0u);
    GTEST_SKIP() << GetParam().provider << " keeps a completion per send";
  }
  ASSERT_GE(max, 1024u);
  constexpr int kMsgs = 8;
  const size_t len = max;
  std::vector<uint8_t> msg(len), rbuf(len * kMsgs, 0);
  DomainMr* rmr = reg(b_, rbuf.data(), rbuf.size(), false);
  ASSERT_TRUE(rmr);
  for (int i = 0; i < kMsgs; ++i) {
    core::PostResult r = b_.domain->post_recv(rbuf.data() + i * len, len, rmr->local_desc, i);
    ASSERT_EQ(r.posted, 1u) << r.error.message();
  }
  for (int i = 0; i < kMsgs; ++i) {
    std::fill(msg.begin(), msg.end(), uint8_t(i + 1));
    core::PostResult r;
    const auto deadline = Clock::now() + kDeadline;
    do {
      r = a_.domain->post_send_at_post(b_on_a_, msg.data(), len);
      ASSERT_TRUE(r.error.is_ok()) << r.error.message();
      if (r.posted == 0) poll_once();
    } while (r.posted == 0 && Clock::now() < deadline);
    ASSERT_EQ(r.posted, 1u);
    std::fill(msg.begin(), msg.end(), uint8_t(0xEE));
  }
  ASSERT_TRUE(poll_until([&] { return b_.done.size() >= size_t(kMsgs); }));
  std::vector<int> seen(kMsgs, 0);
  for (const Completion& c : b_.done) {
    ASSERT_EQ(c.kind, Completion::Kind::kRecv);
    ASSERT_TRUE(c.status.is_ok()) << c.status.message();
    ASSERT_EQ(c.len, len);
    const uint8_t* got = rbuf.data() + c.ctx * len;
    const uint8_t value = got[0];
    ASSERT_GE(value, 1);
    ASSERT_LE(value, kMsgs);
    ++seen[value - 1];
    EXPECT_TRUE(std::all_of(got, got + len, [&](uint8_t v) { return v == value; }));
  }
  EXPECT_EQ(seen, std::vector<int>(kMsgs, 1));
  for (int i = 0; i < 100; ++i) poll_once();
  EXPECT_TRUE(a_.done.empty()) << a_.done.size() << " completions on the sending side";
}

// tcp;ofi_rxm and shm (1.17) complete writes at transmit: the target finds
// the bad key, logs it and drops the write, and the initiator still sees
// success. EFA and FI_DELIVERY_COMPLETE paths report an error instead. Either
// way: no crash, nothing written, no immediate delivered.
TEST_P(FabricDomainTest, BadRemoteKeyFailsWithoutCrashing) {
  std::vector<uint8_t> src(256, 3), dst(256, 0);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(smr && dmr);
  WriteDesc w;
  w.src = src.data();
  w.len = src.size();
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey ^ 0x5a5a5a5aull;
  w.imm = 9;
  w.has_imm = true;
  w.ctx = 77;
  core::PostResult r = post_write(w);
  if (!r.error.is_ok()) {
    EXPECT_EQ(r.posted, 0u);
    EXPECT_NE(r.error.message().find(a_.domain->info().name), std::string::npos)
        << r.error.message();
    return;
  }
  ASSERT_EQ(r.posted, 1u);
  const Completion* local = nullptr;
  ASSERT_TRUE(poll_until([&] {
    local = find(a_, Completion::Kind::kWrite, [](const Completion& c) { return c.ctx == 77; });
    return local != nullptr;
  })) << "no completion for a write with a bad key";
  if (!local->status.is_ok()) {
    EXPECT_EQ(local->status.code(), Code::kUnavailable);
    EXPECT_NE(local->status.message().find(a_.domain->info().name), std::string::npos)
        << local->status.message();
    EXPECT_NE(local->status.message().find("write"), std::string::npos) << local->status.message();
  }
  // Give the target time to process (and reject) the write before checking.
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (Clock::now() < until) poll_once();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0; }));
  EXPECT_EQ(find(b_, Completion::Kind::kRemoteImm, [](const Completion&) { return true; }),
            nullptr);
}

// Remote CQ data must not eat a posted receive (FI_RX_CQ_DATA providers
// re-post it internally; tcp;ofi_rxm and shm do not consume one at all).
TEST_P(FabricDomainTest, ImmediateDoesNotConsumeReceive) {
  std::vector<uint8_t> src(128, 4), dst(128, 0), msg(300, 6), rbuf(1024, 0);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  DomainMr* mmr = reg(a_, msg.data(), msg.size(), false);
  DomainMr* rmr = reg(b_, rbuf.data(), rbuf.size(), false);
  ASSERT_TRUE(smr && dmr && mmr && rmr);
  ASSERT_EQ(b_.domain->post_recv(rbuf.data(), rbuf.size(), rmr->local_desc, 555).posted, 1u);

  WriteDesc w;
  w.src = src.data();
  w.len = src.size();
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey;
  w.imm = 0xabcd;
  w.has_imm = true;
  w.ctx = 11;
  write_imm_and_wait(w);
  EXPECT_EQ(find(b_, Completion::Kind::kRecv, [](const Completion&) { return true; }), nullptr);

  ASSERT_EQ(a_.domain->post_send(b_on_a_, msg.data(), msg.size(), mmr->local_desc, 12).posted, 1u);
  const Completion* recvd = nullptr;
  ASSERT_TRUE(poll_until([&] {
    recvd = find(b_, Completion::Kind::kRecv, [](const Completion& c) { return c.ctx == 555; });
    return recvd != nullptr;
  }));
  ASSERT_TRUE(recvd->status.is_ok()) << recvd->status.message();
  EXPECT_EQ(recvd->len, msg.size());
  EXPECT_EQ(std::memcmp(rbuf.data(), msg.data(), msg.size()), 0);
}

TEST_P(FabricDomainTest, AddPeerRejectsGarbage) {
  Status st;
  a_.domain->add_peer({}, &st);
  EXPECT_FALSE(st.is_ok());
  const uint8_t garbage[] = {0xff, 0xfe, 0xfd};
  a_.domain->add_peer(garbage, &st);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("fi_av_insert"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(a_.domain->info().name), std::string::npos) << st.message();
  // Right length, wrong content: ours or the provider's check must refuse it.
  std::vector<uint8_t> same_len(a_.domain->raw_address().size(), 0xff);
  a_.domain->add_peer(same_len, &st);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("fi_av_insert"), std::string::npos) << st.message();
}

TEST_P(FabricDomainTest, RegisterRejectsEmptyRegion) {
  Status st;
  EXPECT_EQ(a_.domain->register_mr(nullptr, 0, Device::host(), true, &st), nullptr);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
}

TEST_P(FabricDomainTest, MrMayOutliveItsDomain) {
  std::vector<uint8_t> buf(4096);
  Status st;
  auto mr = a_.domain->register_mr(buf.data(), buf.size(), Device::host(), true, &st);
  ASSERT_NE(mr, nullptr) << st.message();
  a_.domain.reset();
  mr.reset();  // closes the MR, then the domain it kept alive
}

TEST_P(FabricDomainTest, WaitFdAndTrywait) {
  const int fd = a_.domain->wait_fd();
  if (fd < 0) {
    EXPECT_FALSE(a_.domain->can_block());
    return;
  }
  poll_once();
  // Nothing outstanding: blocking must be allowed (a spurious "no" is also
  // legal, so only the call itself is checked).
  (void)a_.domain->can_block();
}

TEST_P(FabricDomainTest, RemovePeerThenReAdd) {
  a_.domain->remove_peer(b_on_a_);
  Status st;
  b_on_a_ = a_.domain->add_peer(b_.domain->raw_address(), &st);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<uint8_t> src(64, 9), dst(64, 0);
  DomainMr* smr = reg(a_, src.data(), src.size(), false);
  DomainMr* dmr = reg(b_, dst.data(), dst.size(), true);
  ASSERT_TRUE(smr && dmr);
  WriteDesc w;
  w.src = src.data();
  w.len = src.size();
  w.local_desc = smr->local_desc;
  w.peer = b_on_a_;
  w.remote_addr = dmr->remote_base;
  w.rkey = dmr->rkey;
  w.imm = 3;
  w.has_imm = true;
  w.ctx = 3;
  write_imm_and_wait(w);
  EXPECT_TRUE(src == dst);
}

INSTANTIATE_TEST_SUITE_P(Providers, FabricDomainTest,
                         ::testing::Values(ProviderParam{"tcp;ofi_rxm", "lo"},
                                           ProviderParam{"shm", "shm"}),
                         param_name);

TEST(FabricDiscovery, ListsLoopbackAndShm) {
  auto tcp = list_fabric_nics("tcp;ofi_rxm");
  EXPECT_TRUE(std::any_of(tcp.begin(), tcp.end(), [](const FabricNicInfo& n) {
    return n.domain == "lo" && n.provider == "tcp;ofi_rxm";
  }));
  for (size_t i = 0; i < tcp.size(); ++i) {
    for (size_t j = i + 1; j < tcp.size(); ++j) EXPECT_NE(tcp[i].domain, tcp[j].domain);
  }
  auto shm = list_fabric_nics("shm");
  ASSERT_EQ(shm.size(), 1u);
  EXPECT_EQ(shm[0].domain, "shm");
  EXPECT_TRUE(list_fabric_nics("no-such-provider").empty());
}

TEST(FabricDiscovery, NeverFallsBackToAnotherProvider) {
  core::DomainOptions opts;
  opts.provider = "no-such-provider";
  Status st;
  EXPECT_EQ(open_fabric_domain(opts, &st), nullptr);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("no-such-provider"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fi_getinfo"), std::string::npos) << st.message();

  opts.provider = "tcp;ofi_rxm";
  opts.nic_name = "no-such-nic0";
  EXPECT_EQ(open_fabric_domain(opts, &st), nullptr);
  EXPECT_NE(st.message().find("no-such-nic0"), std::string::npos) << st.message();
}

TEST(FabricDiscovery, NicIndexPicksDistinctDomains) {
  auto tcp = list_fabric_nics("tcp;ofi_rxm");
  for (size_t i = 0; i < tcp.size(); ++i) {
    core::DomainOptions opts;
    opts.provider = "tcp;ofi_rxm";
    opts.nic_index = i;
    Status st;
    auto d = open_fabric_domain(opts, &st);
    ASSERT_NE(d, nullptr) << st.message();
    EXPECT_EQ(d->info().name, tcp[i].domain);
  }
  core::DomainOptions opts;
  opts.provider = "tcp;ofi_rxm";
  opts.nic_index = tcp.size();
  Status st;
  EXPECT_EQ(open_fabric_domain(opts, &st), nullptr);
  EXPECT_FALSE(st.is_ok());
}

TEST(ShmLeftovers, OnlyEntriesOfThisPidOlderThanTheProcessAreRemoved) {
  char tmpl[] = "/tmp/ferry-shm-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto touch = [&](const std::string& name, std::time_t mtime) {
    const std::string path = dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), ts, 0), 0);
  };
  const std::time_t started = 1'700'000'000;
  touch("4242:0:0", started - 600);   // an earlier process with pid 4242: stale
  touch("4242:1:3", started - 1);     // stale too
  touch("4242:2:0", started + 5);     // made by this process: kept
  touch("42420:0:0", started - 600);  // another pid with the same digits: kept
  touch("777:0:0", started - 600);    // another pid: kept
  touch("4242", started - 600);       // not a region name: kept
  EXPECT_EQ(fabric::remove_stale_shm_regions(dir, 4242, started), 2u);
  auto exists = [&](const std::string& n) { return ::access((dir + "/" + n).c_str(), F_OK) == 0; };
  EXPECT_FALSE(exists("4242:0:0"));
  EXPECT_FALSE(exists("4242:1:3"));
  EXPECT_TRUE(exists("4242:2:0"));
  EXPECT_TRUE(exists("42420:0:0"));
  EXPECT_TRUE(exists("777:0:0"));
  EXPECT_TRUE(exists("4242"));
  EXPECT_EQ(fabric::remove_stale_shm_regions(dir + "/missing", 4242, started), 0u);
  for (const char* n : {"4242:2:0", "42420:0:0", "777:0:0", "4242"})
    ::unlink((dir + "/" + n).c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace ferry::fabric

// The verbs Domain through the engine's opener. Without an RDMA device (CI)
// only the "no device" contract runs; on a host with one (ConnectX, or
// soft-RoCE: `rdma link add rxe0 type rxe netdev eth0`) the loopback tests
// exercise the real handshake, writes with immediates and send/recv.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "core/domain.h"
#include "engine/domain_families.h"
#include "verbs/verbs_devinfo.h"

#include <infiniband/verbs.h>

namespace ferry::verbs {
namespace {

using namespace std::chrono_literals;

bool have_device() {
  return !list_verbs_nics().empty();
}

std::unique_ptr<core::Domain> open(Status* err) {
  core::DomainOptions o;
  o.provider = "verbs";
  return engine::domain_opener()(o, err);
}

TEST(VerbsDomain, NoDeviceIsUnavailable) {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l != nullptr) ibv_free_device_list(l);
  if (n > 0) GTEST_SKIP() << "this host has RDMA devices";
  Status err;
  auto d = open(&err);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(err.code(), Code::kUnavailable);
  EXPECT_NE(err.message().find("no RDMA device: ibv_get_device_list returned 0 devices"),
            std::string::npos)
      << err.message();
}

TEST(VerbsDomainHw, LoopbackWritesWithImmediatesAndSendRecv) {
  if (!have_device()) GTEST_SKIP() << "no RDMA device with an active port";
  Status err;
  auto a = open(&err);
  ASSERT_NE(a, nullptr) << err.message();
  auto b = open(&err);  // a second domain on the same NIC: a real peer
  ASSERT_NE(b, nullptr) << err.message();

  constexpr size_t kPages = 2000;
  constexpr size_t kPage = 4096;
  std::vector<uint8_t> src(kPages * kPage), dst(kPages * kPage, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  auto src_mr = a->register_mr(src.data(), src.size(), Device::host(), false, &err);
  ASSERT_NE(src_mr, nullptr) << err.message();
  auto dst_mr = b->register_mr(dst.data(), dst.size(), Device::host(), true, &err);
  ASSERT_NE(dst_mr, nullptr) << err.message();

  const core::PeerId peer = a->add_peer(b->raw_address(), &err);
  ASSERT_TRUE(err.is_ok()) << err.message();
  EXPECT_EQ(a->add_peer(b->raw_address(), &err), peer) << "idempotent";

  std::vector<core::WriteDesc> w(kPages);
  for (size_t i = 0; i < kPages; ++i) {
    w[i].src = src.data() + i * kPage;
    w[i].len = i % 100 == 0 ? 16 : kPage;  // some small enough to go inline
    w[i].local_desc = src_mr->local_desc;
    w[i].peer = peer;
    w[i].remote_addr = dst_mr->remote_base + i * kPage;
    w[i].rkey = dst_mr->rkey;
    w[i].imm = static_cast<uint32_t>(i);
    w[i].has_imm = true;
    w[i].ctx = i;
  }
  size_t next = 0, done = 0;
  std::vector<bool> imm_seen(kPages, false);
  size_t imms = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  core::Completion buf[64];
  while ((done < kPages || imms < kPages) && std::chrono::steady_clock::now() < deadline) {
    if (next < kPages) {
      const auto r =
          a->post_writes(std::span(w).subspan(next, std::min<size_t>(64, kPages - next)));
      ASSERT_TRUE(r.error.is_ok()) << r.error.message();
      next += r.posted;
    }
    for (size_t n = a->poll(buf), i = 0; i < n; ++i) {
      ASSERT_TRUE(buf[i].status.is_ok()) << buf[i].status.message();
      ASSERT_EQ(buf[i].kind, core::Completion::Kind::kWrite);
      ++done;
    }
    for (size_t n = b->poll(buf), i = 0; i < n; ++i) {
      ASSERT_TRUE(buf[i].status.is_ok()) << buf[i].status.message();
      ASSERT_EQ(buf[i].kind, core::Completion::Kind::kRemoteImm);
      ASSERT_LT(buf[i].imm, kPages);
      ASSERT_FALSE(imm_seen[buf[i].imm]);
      imm_seen[buf[i].imm] = true;
      ++imms;
    }
  }
  ASSERT_EQ(done, kPages);
  ASSERT_EQ(imms, kPages);
  for (size_t i = 0; i < kPages; ++i) {
    const size_t len = w[i].len;
    ASSERT_EQ(std::memcmp(dst.data() + i * kPage, src.data() + i * kPage, len), 0) << i;
  }

  // send / recv on the msg QP pair.
  std::vector<uint8_t> rbuf(256, 0);
  auto rmr = b->register_mr(rbuf.data(), rbuf.size(), Device::host(), false, &err);
  ASSERT_NE(rmr, nullptr);
  ASSERT_EQ(b->post_recv(rbuf.data(), rbuf.size(), rmr->local_desc, 42).posted, 1u);
  const char msg[] = "hello over RC";
  std::memcpy(src.data(), msg, sizeof(msg));  // send from registered memory
  bool sent = false, send_done = false, recv_done = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!(send_done && recv_done) && std::chrono::steady_clock::now() < until) {
    if (!sent) {
      const auto r = a->post_send(peer, src.data(), sizeof(msg), src_mr->local_desc, 7);
      ASSERT_TRUE(r.error.is_ok()) << r.error.message();
      sent = r.posted == 1;
    }
    for (size_t n = a->poll(buf), i = 0; i < n; ++i) {
      ASSERT_TRUE(buf[i].status.is_ok()) << buf[i].status.message();
      ASSERT_EQ(buf[i].kind, core::Completion::Kind::kSend);
      EXPECT_EQ(buf[i].ctx, 7u);
      send_done = true;
    }
    for (size_t n = b->poll(buf), i = 0; i < n; ++i) {
      ASSERT_TRUE(buf[i].status.is_ok()) << buf[i].status.message();
      ASSERT_EQ(buf[i].kind, core::Completion::Kind::kRecv);
      EXPECT_EQ(buf[i].ctx, 42u);
      EXPECT_EQ(buf[i].len, sizeof(msg));
      recv_done = true;
    }
  }
  ASSERT_TRUE(send_done && recv_done);
  EXPECT_EQ(std::memcmp(rbuf.data(), msg, sizeof(msg)), 0);
}

}  // namespace
}  // namespace ferry::verbs

// A tcp;ofi_rxm peer whose process has gone: libfabric 1.17 re-connects to it
// for ever, so the Domain asks the peer's address itself (ConnectProbe).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/domain.h"
#include "fabric/connect_probe.h"
#include "fabric/fabric_domain.h"
#include "support/fabric_target.h"
#include "support/process.h"

namespace ferry::fabric {
namespace {

using core::Completion;
using core::PeerId;
using core::WriteDesc;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using Answer = ConnectProbe::Answer;

std::span<const uint8_t> bytes(const sockaddr_in& in) {
  return {reinterpret_cast<const uint8_t*>(&in), sizeof(in)};
}

// A loopback socket bound to a free port, listening or not.
struct LoopbackSocket {
  explicit LoopbackSocket(bool listen) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        (listen && ::listen(fd, 4) != 0))
      addr.sin_port = 0;
  }
  ~LoopbackSocket() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  sockaddr_in addr{};
};

Answer settle(ConnectProbe& probe, Answer first) {
  Answer a = first;
  const auto until = Clock::now() + 5s;
  while (a == Answer::kPending && Clock::now() < until) a = probe.poll(Clock::now(), 5000ms);
  return a;
}

TEST(ConnectProbe, AListeningAddressIsReachable) {
  LoopbackSocket server(true);
  ASSERT_NE(server.addr.sin_port, 0);
  ConnectProbe probe;
  EXPECT_EQ(settle(probe, probe.start(bytes(server.addr), Clock::now())), Answer::kReachable);
  EXPECT_FALSE(probe.pending());
  EXPECT_EQ(probe.poll(Clock::now(), 1000ms), Answer::kIdle);
}

TEST(ConnectProbe, APortNobodyListensOnIsRefused) {
  // Bound but not listening: the kernel refuses connects to it.
  LoopbackSocket closed(false);
  ASSERT_NE(closed.addr.sin_port, 0);
  ConnectProbe probe;
  EXPECT_EQ(settle(probe, probe.start(bytes(closed.addr), Clock::now())), Answer::kRefused);
}

TEST(ConnectProbe, OnlyInetAddressesAreProbed) {
  const uint8_t name[] = "fi_shm://1234:0:0";
  EXPECT_FALSE(ConnectProbe::is_inet(name));
  sockaddr_in in{};
  in.sin_family = AF_INET;
  EXPECT_TRUE(ConnectProbe::is_inet(bytes(in)));
  EXPECT_FALSE(ConnectProbe::is_inet(bytes(in).first(4)));
  ConnectProbe probe;
  EXPECT_EQ(probe.start(name, Clock::now()), Answer::kUnknown);
}

std::unique_ptr<core::Domain> open_tcp() {
  return test::open_fabric_nic("tcp;ofi_rxm", "lo");
}

// The target: a tcp domain with a 1 MiB region, polled until it is killed.
int tcp_target(test::Channel& ch) {
  return test::serve_fabric_target(ch, "tcp;ofi_rxm", "lo", 1 << 20);
}

// After the kill, every posted write ends and posting is refused with
// kUnavailable naming the peer's address, within a few seconds (rxm alone:
// never; the engine's deadline was the only way out), and for good. The
// target is killed 5 times, once with nothing in flight to it.
TEST(FabricTcpPeerDeath, KilledTargetIsSeenWithinSeconds) {
  test::PeerSpawner spawner(tcp_target);
  std::vector<uint8_t> src(64 << 10, 7);
  auto a = open_tcp();
  ASSERT_NE(a, nullptr);
  Status st;
  auto smr = a->register_mr(src.data(), src.size(), Device::host(), false, &st);
  ASSERT_NE(smr, nullptr) << st.message();
  uint64_t next_ctx = 1;
  for (int rep = 0; rep < 5; ++rep) {
    SCOPED_TRACE("repeat " + std::to_string(rep));
    test::FabricTarget t = test::spawn_fabric_target(spawner);
    ASSERT_TRUE(t.ok()) << "cannot start a target";
    auto& proc = t.proc;
    const std::vector<uint8_t>& raw = t.raw;
    const uint64_t rkey = t.rkey, base = t.base;
    const PeerId peer = a->add_peer(raw, &st);
    ASSERT_TRUE(st.is_ok()) << st.message();
    const std::string where =
        "127.0.0.1:" +
        std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(raw.data())->sin_port));

    std::unordered_map<uint64_t, Status> outcome;
    size_t posted = 0;
    auto poll = [&] {
      Completion buf[32];
      const size_t n = a->poll(buf);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(outcome.count(buf[i].ctx), 0u) << "completed twice: " << buf[i].ctx;
        outcome[buf[i].ctx] = buf[i].status;
      }
    };
    auto post = [&](uint64_t len) {
      WriteDesc w;
      w.src = src.data();
      w.len = len;
      w.local_desc = smr->local_desc;
      w.peer = peer;
      w.remote_addr = base;
      w.rkey = rkey;
      w.ctx = next_ctx++;
      const core::PostResult r = a->post_writes({&w, 1});
      posted += r.posted;
      return r;
    };
    // Posts through back-pressure (rxm refuses posts while it connects).
    auto post_taken = [&](uint64_t len) {
      const auto until = Clock::now() + 10s;
      core::PostResult r;
      while ((r = post(len)).posted == 0 && r.error.is_ok() && Clock::now() < until) poll();
      return r.posted == 1;
    };
    // The target works.
    ASSERT_TRUE(post_taken(src.size()));
    const auto warm = Clock::now() + 10s;
    while (outcome.size() < posted && Clock::now() < warm) poll();
    ASSERT_EQ(outcome.size(), posted);
    ASSERT_TRUE(outcome.begin()->second.is_ok()) << outcome.begin()->second.message();

    // Some writes in flight at the kill, except in the first repeat.
    if (rep > 0)
      for (int i = 0; i < 16; ++i) ASSERT_TRUE(post_taken(src.size()));
    proc->kill();

    // Keep writing (through back-pressure) until a post is refused.
    const auto killed = Clock::now();
    core::PostResult r;
    while (Clock::now() - killed < 8s) {
      r = post(8);
      if (!r.error.is_ok()) break;
      poll();
    }
    const auto seen_after = Clock::now() - killed;
    ASSERT_FALSE(r.error.is_ok()) << "writes to a killed tcp peer are still taken after 8 s";
    EXPECT_LT(seen_after, 4s);
    EXPECT_EQ(r.error.code(), Code::kUnavailable);
    EXPECT_NE(r.error.message().find(where), std::string::npos) << r.error.message();
    EXPECT_NE(r.error.message().find("refuses connections"), std::string::npos)
        << r.error.message();
    // Everything posted has ended, ok (landed before the kill) or kUnavailable.
    const auto drain = Clock::now() + 2s;
    while (outcome.size() < posted && Clock::now() < drain) poll();
    EXPECT_EQ(outcome.size(), posted) << "writes to the dead target never ended";
    for (const auto& [ctx, s] : outcome)
      if (!s.is_ok()) EXPECT_EQ(s.code(), Code::kUnavailable) << s.message();
    // For good.
    for (int i = 0; i < 3; ++i) {
      r = post(8);
      EXPECT_EQ(r.posted, 0u);
      EXPECT_EQ(r.error.code(), Code::kUnavailable);
    }
    a->remove_peer(peer);
  }
}

}  // namespace
}  // namespace ferry::fabric

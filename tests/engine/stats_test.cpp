// Engine statistics (TransferEngine::stats(), the metrics endpoint, the
// trace file) against traffic whose size, count and outcome the test knows:
// over tcp;ofi_rxm and shm, with the fault injector for back-pressure and
// errors, and an expired deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/text_file.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::region;
using test::Region;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSendPool = (64 << 10) * 256;  // EngineConfig's send buffers, registered too

// Outcomes as the OnDone callbacks saw them, by code name.
struct Tally {
  std::mutex mu;
  std::map<std::string, uint64_t> codes;
  std::atomic<uint64_t> done{0};
  OnDone cb() {
    return OnDone::callback([this](const Status& s) {
      {
        std::lock_guard lk(mu);
        codes[s.is_ok() ? "OK" : std::string(code_name(s.code()))]++;
      }
      done.fetch_add(1);
    });
  }
  bool wait(uint64_t n) {
    return test::wait_until([&] { return done.load() >= n; }, 60s);
  }
};

const PeerStats* only_peer(const EngineStats& s) {
  return s.peers.size() == 1 ? &s.peers[0] : nullptr;
}

class StatsTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Every submission timed, so that latency counts equal transfer counts.
  EngineConfig config(const std::string& faults = "") {
    EngineConfig c = test::config_for(GetParam());
    c.fault_injection = faults;
    c.latency_sample_every = 1;
    return c;
  }
};

TEST_P(StatsTest, CountsMatchTheTrafficMoved) {
  TransferEngine e(config());
  constexpr uint32_t kPages = 64, kRounds = 5, kImms = 7;
  constexpr uint64_t kSingle = 300'000;
  Region src = region(e, kPage * kPages, 1), dst = region(e, kPage * kPages, 0);
  Region big = region(e, kSingle, 2), big_dst = region(e, kSingle, 0);
  Pages pages;
  for (uint32_t i = 0; i < kPages; ++i) pages.indices.push_back(i);
  pages.stride = kPage;
  ImmCounter paged = e.imm_counter(11), single = e.imm_counter(12), imms = e.imm_counter(13);
  Tally t;
  for (uint32_t r = 0; r < kRounds; ++r)
    e.submit_paged_writes(kPage, 11, src.h, pages, dst.d, pages, t.cb());
  e.submit_single_write(kSingle, 12, big.h, 0, big_dst.d, 0, t.cb());
  for (uint32_t i = 0; i < kImms; ++i) e.submit_imm(13, dst.d, t.cb());
  const uint64_t transfers = kRounds + 1 + kImms;
  ASSERT_TRUE(t.wait(transfers));
  ASSERT_TRUE(paged.wait(kPages * kRounds, 30s).is_ok());
  ASSERT_TRUE(imms.wait(kImms, 30s).is_ok());
  ASSERT_TRUE(single.wait(1, 30s).is_ok());  // one NIC, unsplit: one immediate
  EXPECT_EQ(t.codes["OK"], transfers);

  const EngineStats s = e.stats();
  ASSERT_TRUE(s.enabled);
  const uint64_t bytes = kPage * kPages * kRounds + kSingle;
  EXPECT_EQ(s.transfers_ok(), transfers);
  EXPECT_EQ(s.transfers_failed(), 0u);
  EXPECT_EQ(s.bytes_posted(), bytes);
  EXPECT_EQ(s.bytes_completed(), bytes);
  EXPECT_EQ(s.writes_completed(), s.writes_posted());
  EXPECT_GE(s.writes_posted(), uint64_t(kPages * kRounds + 1 + kImms));
  EXPECT_EQ(s.imms_received(), s.writes_posted());  // every write carried an immediate
  ASSERT_EQ(s.nics.size(), 1u);
  // Gauges follow the worker's loop: they settle once it has gone round.
  EXPECT_TRUE(test::wait_until(
      [&] {
        const EngineStats now = e.stats();
        return now.nics[0].outstanding == 0 && now.nics[0].pending == 0 &&
               now.workers[0].in_flight == 0;
      },
      10s));
  const PeerStats* p = only_peer(s);
  ASSERT_NE(p, nullptr) << s.peers.size() << " peers";
  EXPECT_EQ(p->bytes_ok, bytes);
  EXPECT_EQ(p->bytes_posted, bytes);
  EXPECT_EQ(p->transfers_ok, transfers);
  EXPECT_FALSE(p->peer.empty());
  // Busiest immediates first.
  ASSERT_GE(s.top_imms.size(), 3u);
  EXPECT_EQ(s.top_imms[0].imm, 11u);
  EXPECT_EQ(s.top_imms[0].count, kPages * kRounds);
  EXPECT_EQ(s.top_imms[1].imm, 13u);
  EXPECT_EQ(s.top_imms[1].count, kImms);
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].transfer_latency.count, transfers);
  EXPECT_EQ(s.workers[0].queue_delay.count, transfers);
  EXPECT_EQ(s.workers[0].registrations, 5u);  // four regions and the send pool
  EXPECT_EQ(s.workers[0].registered_bytes, 2 * kPage * kPages + 2 * kSingle + kSendPool);
  EXPECT_EQ(s.workers[0].registration_time.count, 5u);
  EXPECT_EQ(s.counter_wait.count, 3u);
  // The callbacks ran on the callback thread, so each waited in its queue.
  EXPECT_GE(s.callback_delay.count, transfers);
  EXPECT_GT(s.workers[0].transfer_latency.quantile_upper(0.5), 0.0);

  // After stop, the last figures stay readable.
  e.stop();
  const EngineStats last = e.stats();
  EXPECT_EQ(last.transfers_ok(), transfers);
  EXPECT_EQ(last.bytes_completed(), bytes);
  EXPECT_EQ(last.workers.size(), 1u);
  EXPECT_EQ(e.stats().imms_received(), last.imms_received());
}

TEST_P(StatsTest, BackPressureIsCountedAndTheBytesStayExact) {
  TransferEngine e(config("seed=3,eagain=0.5"));
  constexpr uint32_t kPages = 256;
  Region src = region(e, kPage * kPages, 1), dst = region(e, kPage * kPages, 0);
  Pages pages;
  for (uint32_t i = 0; i < kPages; ++i) pages.indices.push_back(i);
  pages.stride = kPage;
  ImmCounter c = e.imm_counter(5);
  Tally t;
  for (int r = 0; r < 4; ++r) e.submit_paged_writes(kPage, 5, src.h, pages, dst.d, pages, t.cb());
  ASSERT_TRUE(t.wait(4));
  ASSERT_TRUE(c.wait(4 * kPages, 30s).is_ok());
  const EngineStats s = e.stats();
  EXPECT_EQ(s.transfers_ok(), 4u);
  EXPECT_EQ(s.bytes_posted(), 4 * kPages * kPage);
  EXPECT_EQ(s.writes_posted(), 4 * kPages);
  EXPECT_GT(s.backpressure(), 0u);
  ASSERT_NE(only_peer(s), nullptr);
  EXPECT_EQ(only_peer(s)->backpressure, s.backpressure());
}

TEST_P(StatsTest, InjectedFailuresAreCountedByCode) {
  TransferEngine e(config("seed=11,fail=0.3"));
  Region src = region(e, kPage * 8, 1), dst = region(e, kPage * 8, 0);
  Tally t;
  constexpr int kTransfers = 40;
  for (int i = 0; i < kTransfers; ++i) e.submit_single_write(kPage, 9, src.h, 0, dst.d, 0, t.cb());
  ASSERT_TRUE(t.wait(kTransfers));
  const EngineStats s = e.stats();
  uint64_t failed = 0;
  for (auto& [code, n] : t.codes) {
    if (code == "OK") {
      EXPECT_EQ(s.transfers_ok(), n);
    } else {
      EXPECT_EQ(s.transfers_failed(code), n) << code;
      failed += n;
    }
  }
  EXPECT_GT(failed, 0u) << "fail=0.3 over 40 transfers failed none";
  EXPECT_EQ(s.transfers_failed(), failed);
  EXPECT_EQ(s.transfers_ok() + failed, uint64_t(kTransfers));
  ASSERT_EQ(s.nics.size(), 1u);
  EXPECT_GT(s.nics[0].completion_errors + s.nics[0].post_errors, 0u);
}

TEST_P(StatsTest, AnExpiredDeadlineIsCountedAsDeadlineExceeded) {
  // Completions held up to 2 s against a 20 ms deadline: nearly all expire.
  EngineConfig c = config("seed=5,delay_us=2000000");
  c.default_deadline = 20ms;
  TransferEngine e(c);
  Region dst = region(e, kPage, 0);
  Tally t;
  constexpr int kImms = 10;
  for (int i = 0; i < kImms; ++i) e.submit_imm(21, dst.d, t.cb());
  ASSERT_TRUE(t.wait(kImms));
  const EngineStats s = e.stats();
  EXPECT_GT(t.codes["DEADLINE_EXCEEDED"], 0u);
  EXPECT_EQ(s.transfers_failed("DEADLINE_EXCEEDED"), t.codes["DEADLINE_EXCEEDED"]);
  EXPECT_EQ(s.transfers_ok(), t.codes["OK"]);
  ASSERT_NE(only_peer(s), nullptr);
  EXPECT_EQ(only_peer(s)->transfers_failed, t.codes["DEADLINE_EXCEEDED"]);
}

// Immediates with no OnDone to a one-NIC group skip the slot (the worker posts
// them straight from the command): every one still ends in exactly one
// outcome, its admission is given back, and a failure is counted by code.
TEST_P(StatsTest, ImmediatesWithoutOnDoneEndInOneOutcomeEachAndLeaveNothingInFlight) {
  TransferEngine e(config("seed=13,fail=0.3,eagain=0.2"));
  Region dst = region(e, kPage, 0);
  constexpr uint64_t kImms = 200;
  for (uint64_t i = 0; i < kImms; ++i) e.submit_imm(23, dst.d, OnDone::none());
  EngineStats s;
  ASSERT_TRUE(test::wait_until(
      [&] {
        s = e.stats();
        return s.transfers_ok() + s.transfers_failed() >= kImms && s.workers[0].in_flight == 0;
      },
      60s))
      << s.transfers_ok() << " ok, " << s.transfers_failed() << " failed, "
      << s.workers[0].in_flight << " in flight";
  EXPECT_EQ(s.transfers_ok() + s.transfers_failed(), kImms);
  // The first injected failure marks the peer failed; later immediates to it
  // fail at once, before they reach the NIC (and its peer's counters).
  EXPECT_GT(s.transfers_failed(), 0u) << "fail=0.3 over 200 immediates failed none";
  EXPECT_EQ(s.writes_completed(), s.writes_posted());
  ASSERT_NE(only_peer(s), nullptr);
  EXPECT_EQ(only_peer(s)->transfers_ok, s.transfers_ok());
}

// Such an immediate past its deadline is reported once, as
// DEADLINE_EXCEEDED, and its late completion adds no second outcome.
TEST_P(StatsTest, AnImmediateWithoutOnDonePastItsDeadlineIsCountedOnce) {
  EngineConfig c = config("seed=5,delay_us=300000");
  c.default_deadline = 20ms;
  TransferEngine e(c);
  Region dst = region(e, kPage, 0);
  auto counter = e.imm_counter(24);
  constexpr uint64_t kImms = 10;
  for (uint64_t i = 0; i < kImms; ++i) e.submit_imm(24, dst.d, OnDone::none());
  EngineStats s;
  // Every write completed (after up to 0.3 s), so every outcome is in.
  ASSERT_TRUE(test::wait_until(
      [&] {
        s = e.stats();
        return s.writes_completed() >= kImms && s.workers[0].in_flight == 0;
      },
      60s));
  EXPECT_GT(s.transfers_failed("DEADLINE_EXCEEDED"), 0u);
  EXPECT_EQ(s.transfers_ok() + s.transfers_failed("DEADLINE_EXCEEDED"), kImms);
  EXPECT_EQ(s.transfers_failed(), s.transfers_failed("DEADLINE_EXCEEDED"));
  // The deadline is the sender's bookkeeping: the immediates themselves arrive.
  EXPECT_TRUE(counter.wait(int64_t(kImms), 30s).is_ok());
}

// Sends with no OnDone take the same short way: each message arrives once and
// intact, and each send buffer comes back at its completion (the pool holds
// an eighth of the messages sent, so the later sends need the earlier ones'
// buffers).
TEST_P(StatsTest, SendsWithoutOnDoneArriveOnceAndGiveTheirBuffersBack) {
  EngineConfig c = config("seed=17,eagain=0.2");
  c.send_buffer_count = 25;
  TransferEngine e(c);
  constexpr uint64_t kMsgs = 200, kLen = 48;
  std::vector<std::atomic<uint32_t>> seen(kMsgs);
  std::atomic<uint64_t> arrived{0}, bad{0};
  e.submit_recvs(kLen, 64, [&](std::span<const uint8_t> m) {
    uint64_t i = kMsgs;
    if (m.size() == kLen) std::memcpy(&i, m.data(), sizeof i);
    if (i < kMsgs && test::check_pattern(m.data() + 8, kLen - 8, i) < 0)
      seen[i].fetch_add(1);
    else
      bad.fetch_add(1);
    arrived.fetch_add(1);
  });
  const NetAddr me = e.main_address();
  for (uint64_t i = 0; i < kMsgs; ++i) {
    std::array<uint8_t, kLen> msg;
    std::memcpy(msg.data(), &i, sizeof i);
    test::fill_pattern(msg.data() + 8, kLen - 8, i);
    e.submit_send(me, msg, OnDone::none());
  }
  EngineStats s;
  ASSERT_TRUE(test::wait_until(
      [&] {
        s = e.stats();
        return arrived.load() >= kMsgs && s.transfers_ok() >= kMsgs && s.workers[0].in_flight == 0;
      },
      60s))
      << arrived.load() << " arrived, " << s.transfers_ok() << " ok";
  EXPECT_EQ(bad.load(), 0u);
  for (uint64_t i = 0; i < kMsgs; ++i) EXPECT_EQ(seen[i].load(), 1u) << "message " << i;
  EXPECT_EQ(s.transfers_ok(), kMsgs);
  EXPECT_EQ(s.transfers_failed(), 0u);
  EXPECT_EQ(s.bytes_posted(), kMsgs * kLen);
  EXPECT_EQ(s.bytes_completed(), kMsgs * kLen);
}

// --- metrics endpoint ------------------------------------------------------

// GET http://address/path over a plain socket; the body, or "" on failure.
std::string http_get(const std::string& address, const std::string& path, std::string* status) {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + address + "\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == ssize_t(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, size_t(n));
    }
  }
  ::close(fd);
  const auto eol = out.find("\r\n");
  if (status) *status = out.substr(0, eol);
  const auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The value of the sample whose line starts with `prefix` (name and labels).
double sample(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0 && line.size() > prefix.size() && line[prefix.size()] == ' ')
      return std::stod(line.substr(prefix.size() + 1));
  return -1;
}
double sum_of(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  double total = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0)
      total += std::stod(line.substr(line.rfind(' ') + 1));
  return total;
}

// By default one submission in latency_sample_every per thread is timed, the
// thread's first included; every transfer is still counted.
TEST_P(StatsTest, LatencyIsTimedForOneSubmissionInNPerThread) {
  EngineConfig c = config();
  c.latency_sample_every = 16;
  TransferEngine e(c);
  Region src = region(e, kPage, 1), dst = region(e, kPage, 0);
  ImmCounter writes = e.imm_counter(21), imms = e.imm_counter(22);
  constexpr uint32_t kWrites = 20, kImms = 20;  // 40 submissions: the 1st, 17th and 33rd timed
  Tally t;
  // A thread of its own: the sampling count is per thread.
  std::thread submitter([&] {
    for (uint32_t i = 0; i < kWrites; ++i)
      e.submit_single_write(kPage, 21, src.h, 0, dst.d, 0, t.cb());
    for (uint32_t i = 0; i < kImms; ++i) e.submit_imm(22, dst.d, OnDone::none());
  });
  submitter.join();
  ASSERT_TRUE(t.wait(kWrites));
  ASSERT_TRUE(writes.wait(kWrites, 30s).is_ok());
  ASSERT_TRUE(imms.wait(kImms, 30s).is_ok());
  EXPECT_TRUE(test::wait_until([&] { return e.stats().transfers_ok() == kWrites + kImms; }, 10s))
      << e.stats().transfers_ok();
  const EngineStats s = e.stats();
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].transfer_latency.count, 3u);
  EXPECT_EQ(s.workers[0].queue_delay.count, 3u);
  EXPECT_EQ(s.transfers_failed(), 0u);
}

TEST_P(StatsTest, TheMetricsEndpointServesWhatMovedWhileTrafficRuns) {
  EngineConfig c = config();
  c.metrics_address = "127.0.0.1:0";
  TransferEngine e(c);
  ASSERT_FALSE(e.metrics_address().empty());
  constexpr uint32_t kPages = 32;
  Region src = region(e, kPage * kPages, 1), dst = region(e, kPage * kPages, 0);
  Pages pages;
  for (uint32_t i = 0; i < kPages; ++i) pages.indices.push_back(i);
  pages.stride = kPage;
  ImmCounter cnt = e.imm_counter(3);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> submitted{0};
  Tally t;
  std::thread traffic([&] {
    while (!stop.load()) {
      e.submit_paged_writes(kPage, 3, src.h, pages, dst.d, pages, t.cb());
      const uint64_t n = submitted.fetch_add(1) + 1;
      if (!t.wait(n)) return;  // one at a time: ImmCounter waits stay simple
      if (!cnt.wait(kPages, 30s).is_ok()) return;
    }
  });
  double last = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(test::wait_until([&] { return submitted.load() > uint64_t(i) * 3; }, 30s));
    std::string status;
    const std::string body = http_get(e.metrics_address(), "/metrics", &status);
    EXPECT_NE(status.find("200"), std::string::npos) << status;
    const double now = sum_of(body, "ferry_bytes_written_total");
    EXPECT_GE(now, last);
    last = now;
  }
  stop = true;
  traffic.join();
  ASSERT_EQ(t.done.load(), submitted.load());
  const std::string body = http_get(e.metrics_address(), "/metrics", nullptr);
  const double moved = double(submitted.load() * kPages * kPage);
  EXPECT_EQ(sum_of(body, "ferry_bytes_written_total"), moved);
  EXPECT_EQ(sum_of(body, "ferry_writes_posted_total"), double(submitted.load() * kPages));
  EXPECT_EQ(sample(body, "ferry_transfers_total{group=\"0\",outcome=\"ok\"}"),
            double(submitted.load()));
  EXPECT_EQ(sample(body, "ferry_imm_value_received_total{imm=\"3\"}"),
            double(submitted.load() * kPages));
  EXPECT_EQ(sample(body, "ferry_transfer_latency_seconds_count{group=\"0\"}"),
            double(submitted.load()));
  EXPECT_EQ(sample(body, "ferry_transfer_latency_seconds_bucket{group=\"0\",le=\"+Inf\"}"),
            double(submitted.load()));
  std::string status;
  http_get(e.metrics_address(), "/nothing", &status);
  EXPECT_NE(status.find("404"), std::string::npos) << status;
  e.stop();
  EXPECT_TRUE(http_get(e.metrics_address(), "/metrics", nullptr).empty());
}

TEST(StatsConfig, AnUnusableMetricsAddressIsInvalidArgument) {
  EngineConfig c = test::config_for("shm");
  c.metrics_address = "no-port";
  EXPECT_EQ(test::code_of([&] { TransferEngine e(c); }), Code::kInvalidArgument);
}

// --- timeline ----------------------------------------------------------------

TEST_P(StatsTest, TheTraceFileHoldsTransfersImmediatesAndUserSpans) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ferry_trace_" + GetParam() + "_" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  {
    EngineConfig c = config();
    c.trace_file = path.string();
    TransferEngine e(c);
    ASSERT_TRUE(e.tracing());
    Region src = region(e, kPage * 4, 1), dst = region(e, kPage * 4, 0);
    Pages pages{{0, 1, 2, 3}, kPage, 0};
    Tally t;
    ImmCounter c8 = e.imm_counter(8);
    const int64_t t0 = TransferEngine::trace_clock_ns();
    for (int i = 0; i < 3; ++i) e.submit_paged_writes(kPage, 8, src.h, pages, dst.d, pages, t.cb());
    ASSERT_TRUE(t.wait(3));
    ASSERT_TRUE(c8.wait(12, 30s).is_ok());
    e.trace_span("layer 0 pushed", t0, TransferEngine::trace_clock_ns(), "kv");
    e.trace_instant("step end", TransferEngine::trace_clock_ns(), "kv");
  }  // written at stop
  const std::string j = test::read_text(path);
  ASSERT_FALSE(j.empty()) << path;
  auto count = [&](const std::string& needle) { return test::occurrences(j, needle); };
  EXPECT_EQ(j.rfind("{\"displayTimeUnit\"", 0), 0u);
  EXPECT_EQ(count("\"name\":\"paged_writes\""), 3u);
  EXPECT_EQ(count("\"cat\":\"imm\""), 12u) << "one instant per immediate completion";
  EXPECT_EQ(count("\"name\":\"layer 0 pushed\""), 1u);
  EXPECT_EQ(count("\"name\":\"step end\""), 1u);
  EXPECT_NE(j.find("\"name\":\"kv\""), std::string::npos) << "the user track is named";
  EXPECT_NE(j.find("\"status\":\"OK\""), std::string::npos);
  std::filesystem::remove(path);
}

TEST_P(StatsTest, PercentPInTheTraceFileBecomesTheProcessId) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto want = dir / ("ferry_pid_" + GetParam() + "_" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(want);
  {
    EngineConfig c = config();
    c.trace_file = (dir / ("ferry_pid_" + GetParam() + "_%p.json")).string();
    TransferEngine e(c);
    ASSERT_TRUE(e.tracing());
  }
  EXPECT_TRUE(std::filesystem::exists(want)) << want;
  std::filesystem::remove(want);
}

TEST_P(StatsTest, TheTraceRingIsBoundedAndSaysWhatItDropped) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ferry_ring_" + GetParam() + "_" + std::to_string(::getpid()) + ".json");
  {
    EngineConfig c = config();
    c.trace_file = path.string();
    c.trace_events = 8;
    TransferEngine e(c);
    Region dst = region(e, kPage, 0);
    Tally t;
    for (int i = 0; i < 20; ++i) e.submit_imm(30, dst.d, t.cb());
    ASSERT_TRUE(t.wait(20));
    // 20 transfers and 20 immediate arrivals into a ring of 8.
    EXPECT_TRUE(test::wait_until([&] { return e.stats().trace_events_dropped == 32; }, 10s))
        << e.stats().trace_events_dropped;
  }
  EXPECT_NE(test::read_text(path).find("trace ring dropped 32 older events"), std::string::npos);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Providers, StatsTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

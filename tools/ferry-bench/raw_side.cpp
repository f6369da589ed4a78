#include "raw_side.h"

#include <rdma/fi_errno.h>
#include <sched.h>
#include <time.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "channel.h"
#include "raw_relay.h"

namespace ferry_bench {

using namespace std::chrono_literals;

namespace {

// Receives stay posted for the process' lifetime; posted once, re-posted on use.
void post_raw_recvs(RawFabric& rf, uint8_t* msg_area, bool* posted) {
  if (*posted) return;
  for (uint32_t i = 0; i < kRawRecvs; ++i)
    if (int ret = rf.recv(0, msg_area + i * kRecvSlot, kRecvSlot, (uint64_t(1) << 32) | i))
      throw std::runtime_error(fmt::format("raw fi_recv failed: {}", fi_strerror(-ret)));
  *posted = true;
}

}  // namespace

RawMode raw_mode(const Point& p) {
  if (p.sendrecv()) return RawMode::kPingSend;
  if (p.latency()) return RawMode::kPingWrite;
  return RawMode::kSink;
}

Result RawClient::throughput(const Point& p, const Layout& l, const DriveConfig& dc,
                             uint64_t* next_req) {
  struct Req {
    uint64_t r = 0;
    uint32_t next = 0, left = 0;
    bool failed = false;
  };
  std::vector<Req> reqs(dc.window);
  std::deque<uint32_t> to_post;
  std::optional<uint32_t> imm;
  if (p.imm || p.kind == Kind::kBarrier) imm = kImmData;
  size_t rr = 0;
  std::vector<size_t> outstanding(rf_.nics(), 0);
  RawEvent ev[32];
  auto admit = [&](uint64_t r, uint32_t slot) {
    reqs[slot] = Req{r, 0, l.writes_per_req, false};
    to_post.push_back(slot);
  };
  auto progress = [&](auto&& done) -> size_t {
    // Post in request order until the provider pushes back, at most a
    // batch between two CQ reads (the engine's kPostsPerStep), so that
    // completions and the provider's progress are not starved by posting.
    size_t budget = kRawPostBatch;
    while (!to_post.empty()) {
      Req& q = reqs[to_post.front()];
      while (q.next < l.writes_per_req) {
        WriteSpec w = l.write(q.r, q.next);
        size_t nic = rr % rf_.nics();
        if (outstanding[nic] >= kRawMaxOutstanding || budget == 0) goto reap;
        int ret = rf_.write(nic, region_ + w.src, w.len, peer_.bases[nic] + w.dst, peer_.keys[nic],
                            imm, to_post.front());
        if (ret == -FI_EAGAIN) goto reap;
        if (ret != 0)
          throw std::runtime_error(fmt::format("raw write failed: {}", fi_strerror(-ret)));
        ++q.next;
        ++rr;
        ++outstanding[nic];
        --budget;
      }
      to_post.pop_front();
    }
  reap:
    size_t finished = 0;
    for (size_t k = 0; k < rf_.nics(); ++k) {
      size_t n = rf_.poll(k, ev, 32);
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind == RawEvent::Kind::kLocal || ev[i].kind == RawEvent::Kind::kError)
          outstanding[k] -= outstanding[k] > 0;
        // Completions of earlier ping-pong phases carry tagged contexts.
        if ((ev[i].kind != RawEvent::Kind::kLocal && ev[i].kind != RawEvent::Kind::kError) ||
            (ev[i].ctx >> 32) != 0)
          continue;
        Req& q = reqs[uint32_t(ev[i].ctx)];
        q.failed |= ev[i].kind == RawEvent::Kind::kError;
        if (--q.left == 0) {
          done(uint32_t(ev[i].ctx), !q.failed);
          ++finished;
        }
      }
    }
    return finished;
  };
  // Yield when nothing completed, as the ferry client thread does: with two
  // processes on two cores the receiver needs the CPU to drain the socket.
  return drive(dc, next_req, admit, progress, [] { sched_yield(); });
}

Result RawClient::pingpong_(const Point& p, const DriveConfig& dc) {
  RawEvent ev[32];
  const bool send = p.sendrecv();
  if (o_.raw_relay && !send) return relayed_pingpong(dc);
  if (send) post_raw_recvs(rf_, msg_, &recvs_posted_);
  InjectImmediates inject(rf_, o_.raw_inject && !send);
  uint8_t* sbuf = msg_ + kRawSendOffset;
  std::string bad;
  auto one = [&](uint64_t n) {
    int ret;
    if (send) {
      std::memcpy(sbuf, &n, 8);
      ret = rf_.send(0, sbuf, p.size, uint64_t(2) << 32);
    } else {
      ret = rf_.write(0, region_, 0, peer_.bases[0], peer_.keys[0], kImmPing, uint64_t(3) << 32);
    }
    for (auto t = Clock::now(); ret == -FI_EAGAIN && secs_since(t) < 10;) {
      rf_.poll(0, ev, 32);
      ret = send ? rf_.send(0, sbuf, p.size, uint64_t(2) << 32)
                 : rf_.write(0, region_, 0, peer_.bases[0], peer_.keys[0], kImmPing,
                             uint64_t(3) << 32);
    }
    if (ret != 0) return false;
    for (auto t = Clock::now(); secs_since(t) < 10;) {
      size_t got = rf_.poll(0, ev, 32);
      if (got == 0 && o_.spin_pause) __builtin_ia32_pause();
      for (size_t i = 0; i < got; ++i) {
        if (!send && ev[i].kind == RawEvent::Kind::kRemoteData) return true;
        if (send && ev[i].kind == RawEvent::Kind::kRecv) {
          uint32_t idx = uint32_t(ev[i].ctx);
          uint8_t* b = msg_ + idx * kRecvSlot;
          uint64_t echoed;
          std::memcpy(&echoed, b, 8);
          if (o_.verify && (echoed != n || ev[i].len != p.size))
            bad =
                fmt::format("echo {} of {} bytes, expected {} of {}", echoed, ev[i].len, n, p.size);
          rf_.recv(0, b, kRecvSlot, ev[i].ctx);
          return true;
        }
      }
    }
    return false;
  };
  Result r = pingpong(dc, one);
  if (o_.verify) r.verify = bad.empty() ? "ok" : bad;
  return r;
}

Result RawClient::relayed_pingpong(const DriveConfig& dc) {
  const bool yield = o_.poll_mode() == ferry::PollMode::kAdaptive;
  RawRelay relay(rf_, o_.cpu[0], yield, region_, peer_.bases[0], peer_.keys[0], kImmPing);
  uint64_t sent = 0;  // across the warm-up and the measured phase
  auto one = [&](uint64_t) {
    relay.request();
    ++sent;
    const auto t = Clock::now();
    for (uint32_t spins = 1;; ++spins) {
      if (relay.arrived() >= sent) return true;
      if ((spins & 4095) == 0 && (relay.failed() || secs_since(t) >= 10)) return false;
      if (yield) sched_yield();
    }
  };
  Result r = pingpong(dc, one);
  if (relay.failed()) std::fprintf(stderr, "client: %s\n", relay.error().c_str());
  return r;
}

namespace {

// serve_raw's ping-pong of immediates through a RawRelay: this thread answers
// each arrival, as the engine's counter responder does.
void serve_relayed(RawFabric& rf, Region& reg, const RawRegion& client, const Options& o, int fd) {
  uint64_t arrivals = 0;
  std::string error;
  {
    const bool yield = o.poll_mode() == ferry::PollMode::kAdaptive;
    RawRelay relay(rf, o.server_cpu[0], yield, reg.data(), client.bases[0], client.keys[0],
                   kImmPong);
    send_msg(fd, MsgType::kReply);  // ready
    uint64_t replied = 0;
    for (uint64_t spins = 1;; ++spins) {
      for (const uint64_t a = relay.arrived(); replied < a; ++replied) relay.request();
      // Rarely: a system call between two arrivals would be the floor's own delay.
      if ((spins & 16383) == 0 && readable(fd)) break;
      if (yield) sched_yield();
    }
    recv_msg(fd, MsgType::kRawStop);
    arrivals = relay.arrived();
    error = relay.error();
  }
  if (!error.empty()) std::fprintf(stderr, "server: %s\n", error.c_str());
  send_msg(fd, MsgType::kReply, Writer().put(arrivals).str(error));
}

}  // namespace

void serve_raw(RawFabric& rf, Region& reg, const RawRegion& client, const Options& o, int fd,
               const Point& p, RawMode mode, uint64_t seed, bool* recvs_posted) {
  if (mode == RawMode::kPingWrite && o.raw_relay) return serve_relayed(rf, reg, client, o, fd);
  const Layout l(p, o.region());
  uint8_t* region = reg.data();
  uint8_t* msg = region + o.region() - kMsgArea;  // host regions only: no ping-pong on GPUs
  if (mode == RawMode::kPingSend) post_raw_recvs(rf, msg, recvs_posted);
  InjectImmediates inject(rf, o.raw_inject && mode == RawMode::kPingWrite);
  if (o.verify && mode == RawMode::kSink) reg.zero(l.data);
  send_msg(fd, MsgType::kReply);  // ready

  RawEvent ev[32];
  uint64_t arrivals = 0, replies = 0;
  std::deque<std::pair<uint32_t, uint64_t>> sends;  // receive buffer, length
  const bool busy = o.poll_mode() == ferry::PollMode::kBusy;
  auto step = [&]() -> bool {
    bool did = false;
    for (size_t k = 0; k < rf.nics(); ++k) {
      size_t n = rf.poll(k, ev, 32);
      did |= n > 0;
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind == RawEvent::Kind::kRemoteData) {
          ++arrivals;
          if (mode == RawMode::kPingWrite) ++replies;
        } else if (ev[i].kind == RawEvent::Kind::kRecv) {
          sends.emplace_back(uint32_t(ev[i].ctx), ev[i].len);
        } else if (ev[i].kind == RawEvent::Kind::kError) {
          std::fprintf(stderr, "server: raw completion error %u\n", ev[i].data);
        }
      }
    }
    while (replies > 0 && rf.write(0, region, 0, client.bases[0], client.keys[0], kImmPong,
                                   uint64_t(3) << 32) == 0)
      --replies;
    while (!sends.empty()) {
      auto [idx, len] = sends.front();
      uint8_t* b = msg + idx * kRecvSlot;
      std::memcpy(msg + kRawSendOffset, b, len);
      if (rf.send(0, msg + kRawSendOffset, len, uint64_t(2) << 32) != 0) break;
      rf.recv(0, b, kRecvSlot, (uint64_t(1) << 32) | idx);
      sends.pop_front();
    }
    return did;
  };
  auto last_busy = Clock::now();
  for (uint64_t spins = 0;; ++spins) {
    if (step()) {
      last_busy = Clock::now();
      continue;
    }
    if (busy && o.spin_pause) __builtin_ia32_pause();
    if (!busy && Clock::now() - last_busy > 200us) {
      if (!rf.wait(2, fd)) {
        timespec ts{0, 20'000};
        nanosleep(&ts, nullptr);
      }
      if (readable(fd)) break;
    } else if (spins % end_check_every(o) == 0 && readable(fd)) {
      break;
    }
  }
  Reader stop = recv_msg(fd, MsgType::kRawStop);
  const uint64_t reqs = stop.get<uint64_t>(), expected = stop.get<uint64_t>();
  auto deadline = Clock::now() + kSettleTimeout;
  while (arrivals < expected && Clock::now() < deadline) step();
  std::string verify;
  if (arrivals != expected && mode == RawMode::kSink)
    verify = fmt::format("{} immediates arrived, {} expected", arrivals, expected);
  if (o.verify && mode == RawMode::kSink && verify.empty()) {
    // Writes without an immediate may still be in flight: re-check until they land.
    for (;;) {
      verify = reg.check(l, reqs, seed);
      if (verify.empty() || Clock::now() > deadline) break;
      for (int i = 0; i < 1000; ++i) step();
    }
    if (verify.empty()) verify = "ok";
  }
  send_msg(fd, MsgType::kReply, Writer().put(arrivals).str(verify));
}

void serve_copies(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed) {
  const Layout l(p, o.region());
  if (o.verify) reg.zero(l.data);
  send_msg(fd, MsgType::kReply);  // ready
  Reader stop = recv_msg(fd, MsgType::kRawStop);
  const uint64_t reqs = stop.get<uint64_t>();
  std::string verify;
  if (o.verify) {
    verify = reg.check(l, reqs, seed);
    if (verify.empty()) verify = "ok";
  }
  send_msg(fd, MsgType::kReply, Writer().put(uint64_t(0)).str(verify));
}

Result CopyClient::throughput(const Layout& l, const DriveConfig& dc, uint64_t* next_req) {
  PeerCopier copier(o_.gpu_of(false), peer_handle_, dc.window);
  std::vector<char> busy(dc.window, 0);
  auto admit = [&](uint64_t r, uint32_t slot) {
    copier.begin(slot, r);
    for (uint32_t k = 0; k < l.writes_per_req; ++k) {
      WriteSpec w = l.write(r, k);
      copier.copy(slot, w.dst, region_.data() + w.src, w.len);
    }
    copier.close(slot);
    busy[slot] = 1;
  };
  auto progress = [&](auto&& on_done) -> size_t {
    size_t n = 0;
    for (uint32_t s = 0; s < dc.window; ++s) {
      if (!busy[s] || !copier.done(s)) continue;
      busy[s] = 0;
      on_done(s, true);
      ++n;
    }
    return n;
  };
  return drive(dc, next_req, admit, progress, [] { std::this_thread::yield(); });
}

}  // namespace ferry_bench

#include "ferry_side.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "channel.h"

namespace ferry_bench {

using namespace std::chrono_literals;

namespace {

// Between polls of a counter or queue, as ImmCounter::wait spins
// (core/arrival_wait.h): with --poll busy every thread has its own core and
// spins exactly as the raw loops do, with no pause between polls unless
// --spin-pause asks it of both (a pause takes over a hundred cycles on some
// server cores, a delay between an arrival and its poll); otherwise the first
// kSpinPolls fruitless polls of a wait spin too (the raw loop never yields
// while it waits), and only a longer wait gives the core away. One Relax per
// wait.
class Relax {
 public:
  explicit Relax(const Options& o) : busy_(o.poll == "busy"), pause_(o.spin_pause) {}
  void operator()() {
    if (busy_) {
      if (pause_) __builtin_ia32_pause();
    } else if (++polls_ <= kSpinPolls) {
      __builtin_ia32_pause();
    } else {
      std::this_thread::yield();
    }
  }
  void reset() { polls_ = 0; }

 private:
  static constexpr uint32_t kSpinPolls = 200;
  bool busy_;
  bool pause_;
  uint32_t polls_ = 0;
};

// Wake-up counts of this process over one point's ferry run (--wake). They are
// process-wide, and each side is a process of its own.
class WakeReport {
 public:
  WakeReport(const Options& o, ferry::TransferEngine& e) : on_(o.wake) {
    if (on_) start_ = e.stats().wake;
  }
  void print(ferry::TransferEngine& e, const char* side, const Point& p) const {
    if (!on_) return;
    const ferry::WakeStats n = e.stats().wake;
    std::string counts;
    for (const ferry::WakeCount& c : ferry::kWakeCounts)
      counts += fmt::format(" {} {}", c.name, n.*c.field - start_.*c.field);
    fmt::print(stderr, "wake {} {} {}:{}\n", side, kind_name(p.kind), p.size_label(), counts);
  }

 private:
  bool on_;
  ferry::WakeStats start_;
};

ferry::CallbackOn callbacks_on(const Point& p) {
  return p.kind == Kind::kSendRecvInline ? ferry::CallbackOn::kWorker
                                         : ferry::CallbackOn::kCallbackThread;
}

}  // namespace

void serve_ferry(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed,
                 const ferry::MrDesc& client) {
  const Layout l(p, o.region());
  if (o.verify) reg.zero(l.data);
  auto e = std::make_unique<ferry::TransferEngine>(engine_config(o, true, p));
  const WakeReport wake(o, *e);
  std::vector<ferry::MrDesc> descs;
  if (p.kind == Kind::kScatter || p.kind == Kind::kBarrier) {
    for (uint32_t t = 0; t < p.count; ++t)
      descs.push_back(e->reg_mr(reg.data() + uint64_t(t) * l.slice, l.slice, reg.device()).second);
  } else {
    descs.push_back(e->reg_mr(reg.data(), o.region(), reg.device()).second);
  }
  auto data = e->imm_counter(kImmData);
  ferry::ImmCounter ping;
  if (p.kind == Kind::kImm) ping = e->imm_counter(kImmPing);
  if (p.kind == Kind::kImmCb || p.kind == Kind::kImmInline)
    e->expect_imm_count(
        kImmPingCb, 1, [&] { e->submit_imm(kImmPong, client, ferry::OnDone::none()); },
        p.kind == Kind::kImmInline ? ferry::CallbackOn::kWorker
                                   : ferry::CallbackOn::kCallbackThread);
  ferry::RecvQueue queue;
  if (p.kind == Kind::kSendRecvQueue) {
    queue = e->recv_queue(p.size, kFerryRecvs);
  } else if (p.sendrecv()) {
    ferry::NetAddr to = client.nics[0].addr;
    e->submit_recvs(
        p.size, kFerryRecvs,
        [&e, to](std::span<const uint8_t> m) { e->submit_send(to, m, ferry::OnDone::none()); },
        callbacks_on(p));
  }
  Writer w;
  w.put<uint64_t>(descs.size());
  for (auto& d : descs) w.bytes(d.to_bytes());
  send_msg(fd, MsgType::kReply, w);

  if (p.kind == Kind::kImm || p.kind == Kind::kSendRecvQueue) {
    // The application thread answers: it spins on the counter, or takes each
    // message from the queue and echoes it.
    const ferry::NetAddr to = client.nics[0].addr;
    Relax relax(o);
    for (uint64_t spins = 0;; ++spins) {
      if (p.kind == Kind::kImm ? ping.try_consume(1) : false) {
        e->submit_imm(kImmPong, client, ferry::OnDone::none());
        relax.reset();
        continue;
      }
      if (p.kind == Kind::kSendRecvQueue) {
        if (ferry::RecvMessage m = queue.try_pop(); m.valid()) {
          e->submit_send(to, m.data(), ferry::OnDone::none());
          relax.reset();
          continue;
        }
      }
      if (spins % end_check_every(o) == 0 && readable(fd)) break;
      relax();
    }
  }
  Reader end = recv_msg(fd, MsgType::kFerryEnd);
  const uint64_t reqs = end.get<uint64_t>(), expected = end.get<uint64_t>();
  std::string verify;
  int64_t arrived = 0;
  if (expected > 0) {
    auto st = data.wait(int64_t(expected), kSettleTimeout);
    arrived = st.is_ok() ? int64_t(expected) : data.value();
    if (!st.is_ok()) verify = fmt::format("{} immediates arrived, {} expected", arrived, expected);
  }
  arrived += data.value();  // any surplus
  if (o.verify && verify.empty() && !p.latency() && p.kind != Kind::kBarrier) {
    auto deadline = Clock::now() + kSettleTimeout;
    for (;;) {
      // Scatter targets are separate registrations carved from the region:
      // the layout's absolute offsets hold for them too.
      verify = reg.check(l, reqs, seed);
      if (verify.empty() || Clock::now() > deadline) break;
      std::this_thread::sleep_for(1ms);
    }
  }
  if (o.verify && verify.empty()) verify = "ok";
  wake.print(*e, "server", p);
  e->stop();
  e.reset();
  send_msg(fd, MsgType::kReply, Writer().put(uint64_t(arrived)).str(verify));
}

Result FerryClient::run(uint64_t index, const Point& p, const DriveConfig& dc, uint64_t seed) {
  const Layout l(p, o_.region());
  ferry::TransferEngine e(engine_config(o_, false, p));
  const WakeReport wake(o_, e);
  auto [h, mine] = e.reg_mr(region_.data(), o_.region(), region_.device());
  auto pong = e.imm_counter(kImmPong);
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> last_echo{~0ull}, last_len{0};
  ferry::RecvQueue queue;
  if (p.kind == Kind::kSendRecvQueue)
    queue = e.recv_queue(p.size, kFerryRecvs);
  else if (p.sendrecv())
    e.submit_recvs(
        p.size, kFerryRecvs,
        [&](std::span<const uint8_t> m) {
          uint64_t v = ~0ull;
          if (m.size() >= 8) std::memcpy(&v, m.data(), 8);
          last_echo.store(v);
          last_len.store(m.size());
          received.fetch_add(1, std::memory_order_release);
        },
        callbacks_on(p));
  send_msg(fd_, MsgType::kFerryBegin, Writer().put(index).put(seed).bytes(mine.to_bytes()));
  Reader rep = recv_msg(fd_, MsgType::kReply);
  std::vector<ferry::MrDesc> descs(rep.get<uint64_t>());
  for (auto& d : descs) d = ferry::MrDesc::from_bytes(rep.bytes());

  Result res;
  uint64_t next_req = 0;
  std::string bad;
  if (p.latency()) {
    const uint32_t ping = p.kind == Kind::kImm ? kImmPing : kImmPingCb;
    std::vector<uint8_t> msg(p.size);
    const ferry::NetAddr server = descs[0].nics[0].addr;
    uint64_t seen = 0;
    Relax relax(o_);
    auto one = [&](uint64_t n) {
      auto t = Clock::now();
      relax.reset();
      if (p.sendrecv()) {
        std::memcpy(msg.data(), &n, std::min<size_t>(8, msg.size()));
        e.submit_send(server, msg, ferry::OnDone::none());
        if (queue.valid()) {
          ferry::RecvMessage m;
          while (!(m = queue.try_pop()).valid()) {
            if (secs_since(t) > 10) return false;
            relax();
          }
          uint64_t v = ~0ull;
          if (m.size() >= 8) std::memcpy(&v, m.data().data(), 8);
          if (o_.verify && (v != n || m.size() != p.size))
            bad = fmt::format("echo {} of {} bytes, expected {} of {}", v, m.size(), n, p.size);
          return true;
        }
        while (received.load(std::memory_order_acquire) == seen) {
          if (secs_since(t) > 10) return false;
          relax();
        }
        ++seen;
        if (o_.verify && (last_echo.load() != n || last_len.load() != p.size))
          bad = fmt::format("echo {} of {} bytes, expected {} of {}", last_echo.load(),
                            last_len.load(), n, p.size);
        return true;
      }
      e.submit_imm(ping, descs[0], ferry::OnDone::none());
      while (!pong.try_consume(1)) {
        if (secs_since(t) > 10) return false;
        relax();
      }
      return true;
    };
    res = pingpong(dc, one);
    next_req = res.requests;
    if (o_.verify) res.verify = bad.empty() ? "ok" : bad;
  } else {
    res = throughput(e, h, descs, p, l, dc, &next_req);
  }
  send_msg(fd_, MsgType::kFerryEnd,
           Writer().put(next_req).put(next_req * ferry_imms_per_req(p, e.nics_per_group())));
  Reader end = recv_msg(fd_, MsgType::kReply);
  end.get<uint64_t>();
  std::string v = end.str();
  if (!p.latency()) res.verify = v;
  wake.print(e, "client", p);
  e.stop();
  return res;
}

Result FerryClient::throughput(ferry::TransferEngine& e, ferry::MrHandle h,
                               const std::vector<ferry::MrDesc>& descs, const Point& p,
                               const Layout& l, const DriveConfig& dc, uint64_t* next_req) {
  std::optional<uint32_t> imm;
  if (p.imm) imm = kImmData;
  std::optional<ferry::PeerGroupHandle> group;
  std::vector<ferry::ScatterDst> dsts;
  ferry::Pages src_pages, dst_pages;
  if (p.kind == Kind::kScatter || p.kind == Kind::kBarrier) {
    group = e.add_peer_group(descs);
    for (uint32_t t = 0; t < p.count; ++t) {
      WriteSpec w = l.write(0, t);
      dsts.push_back({w.len, w.src, descs[t], w.dst - uint64_t(t) * l.slice});
    }
  }
  if (p.kind == Kind::kPaged) {
    src_pages.stride = dst_pages.stride = l.stride;
    for (uint32_t k = 0; k < p.count; ++k) {
      WriteSpec w = l.write(0, k);
      src_pages.indices.push_back(uint32_t(w.src / l.stride));
      dst_pages.indices.push_back(uint32_t(w.dst / l.stride));
    }
  }
  std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[dc.window]);
  std::unique_ptr<std::atomic<bool>[]> failed(new std::atomic<bool>[dc.window]);
  std::vector<char> busy(dc.window, 0);
  for (size_t i = 0; i < dc.window; ++i) done[i] = failed[i] = false;
  auto admit = [&](uint64_t r, uint32_t slot) {
    done[slot].store(false, std::memory_order_relaxed);
    failed[slot].store(false, std::memory_order_relaxed);
    busy[slot] = 1;
    auto od = ferry::OnDone::flag(done[slot], &failed[slot]);
    switch (p.kind) {
      case Kind::kSingle: {
        WriteSpec w = l.write(r, 0);
        e.submit_single_write(w.len, imm, h, w.src, descs[0], w.dst, std::move(od));
        break;
      }
      case Kind::kPaged:
        e.submit_paged_writes(p.size, imm, h, src_pages, descs[0], dst_pages, std::move(od));
        break;
      case Kind::kScatter:
        e.submit_scatter(group, std::move(od), imm, h, dsts);
        break;
      case Kind::kBarrier:
        e.submit_barrier(group, std::move(od), kImmData, descs);
        break;
      default:
        break;
    }
  };
  auto progress = [&](auto&& on_done) -> size_t {
    size_t n = 0;
    for (uint32_t s = 0; s < dc.window; ++s) {
      if (!busy[s] || !done[s].load(std::memory_order_acquire)) continue;
      busy[s] = 0;
      on_done(s, !failed[s].load(std::memory_order_relaxed));
      ++n;
    }
    return n;
  };
  // Yield so the engine's worker gets the core when there are fewer cores
  // than busy threads (this machine: 2 cores, 2 processes).
  return drive(dc, next_req, admit, progress, [] { std::this_thread::yield(); });
}

}  // namespace ferry_bench

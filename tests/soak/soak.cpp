// ferry-soak: three processes, each one engine with two NICs and the fault
// injector on, each sending randomised transfers of every kind to the other
// two and checking every byte and every immediate the others send it.
//
// Protocol (docs/RELIABILITY.md, "Fault injection and soak"):
// - Process p fills a 4 MiB source region with pattern(p); every process can
//   compute every other's source, so no payload travels outside ferry.
// - Each destination region holds one area per (sender, round parity). Round r
//   of sender s is a pure function of (seed, s, r): every receiver replays it
//   to learn exactly which bytes of its area s wrote, from where, and how many
//   immediates each transfer owes it. Reservations in an area are disjoint and
//   separated by random gaps that must stay poisoned.
// - Every transfer carries a unique immediate (sender << 30 | sequence); the
//   receivers count arrivals per immediate with an on_imm callback, so a lost
//   or extra immediate is pinned to one transfer.
// - Rounds are lockstep through the hub (process 0): submit the round, wait
//   for every on_done (success or error, each within its deadline), exchange
//   the failed sequence numbers, then each receiver waits for the immediates
//   of the successful transfers, checks their bytes, checks the gaps, and
//   re-poisons the area. Failed transfers' bytes and immediates are "don't
//   care" (this round and, for bytes still landing, two rounds later when the
//   area is reused), but must not touch anything else.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "model.h"
#include "stats.h"
#include "support/engine_config.h"
#include "support/process.h"
#include "support/region_server.h"
#include "support/tsan.h"
#include "testing/fault_domain.h"

namespace ferry::soak {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Channel;

struct Options {
  uint64_t transfers = 0;
  double seconds = 0;
  std::string provider = "tcp";
  uint64_t seed = 1;
  std::string faults =
      "reorder=0.2,delay_us=50,eagain=0.05,coalesce=0.3,paged=1,split=0.1,fail=0.00002,"
      "stale=0.01";
  uint32_t round = 1000;
  uint64_t deadline_ms = 30000;
  double progress_s = 10;
};

// ---------------------------------------------------- hub (process 0) I/O

std::string pack_u64(const std::vector<uint64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8);
}
std::vector<uint64_t> unpack_u64(const std::string& s) {
  std::vector<uint64_t> v(s.size() / 8);
  std::memcpy(v.data(), s.data(), v.size() * 8);
  return v;
}

class Hub {
 public:
  Hub(int me, std::vector<Channel*> chans) : me_(me), chans_(std::move(chans)) {}
  // Every process contributes one blob and gets all of them, in process order.
  std::vector<std::string> allgather(const std::string& mine) {
    std::vector<std::string> all(kProcs);
    if (me_ == 0) {
      all[0] = mine;
      for (int p = 1; p < kProcs; ++p) all[p] = recv(*chans_[p - 1]);
      std::string packed;
      for (auto& b : all) packed += pack_u64({b.size()}) + b;
      for (auto* c : chans_) c->send(packed);
    } else {
      chans_[0]->send(mine);
      std::string packed = recv(*chans_[0]);
      size_t off = 0;
      for (auto& b : all) {
        uint64_t n;
        std::memcpy(&n, packed.data() + off, 8);
        b = packed.substr(off + 8, n);
        off += 8 + n;
      }
    }
    return all;
  }

 private:
  static std::string recv(Channel& c) {
    auto m = c.recv_str(std::chrono::minutes(5));
    if (!m) throw Error(Code::kDeadlineExceeded, "soak: a peer process did not answer in 5 min");
    return *m;
  }
  int me_;
  std::vector<Channel*> chans_;
};

// ------------------------------------------------------------------ node

class Node {
 public:
  Node(int me, const Options& o, Hub* hub) : me_(me), o_(o), hub_(hub) {}

  int run() {
    setup();
    const auto t0 = Clock::now();
    auto last_report = t0;
    uint64_t total = 0;
    for (uint64_t r = 0;; ++r) {
      // The hub decides when to stop, so every process runs the same rounds.
      std::string go = "1";
      double el = std::chrono::duration<double>(Clock::now() - t0).count();
      bool enough = (o_.transfers && total >= o_.transfers) ||
                    (o_.seconds > 0 && el >= o_.seconds) || (r + 1) * o_.round >= kSeqSpace ||
                    abort_;
      if (me_ == 0 && enough) go = "0";
      auto gos = hub_->allgather(go + (abort_ ? "!" : ""));
      if (gos[0][0] == '0') break;
      for (auto& g : gos) abort_ |= g.size() > 1;
      if (abort_) break;

      auto mine = gen_round(o_.seed, me_, r, o_.round);
      send_round(r, mine);
      // Failed sequence numbers of this round, from every sender.
      std::vector<uint64_t> failed_seqs;
      for (size_t i = 0; i < mine.size(); ++i)
        if (!round_->results[i].is_ok()) failed_seqs.push_back(mine[i].seq);
      failed_seqs.push_back(mine.size());  // last word: how many this sender made
      auto all = hub_->allgather(pack_u64(failed_seqs));
      bool any_failed = false;
      for (int s = 0; s < kProcs; ++s) {
        auto v = unpack_u64(all[s]);
        total += v.back();
        v.pop_back();
        any_failed |= !v.empty();
        if (s == me_) continue;
        for (uint64_t q : v) failed_flag_[s][q] = 1;
        verify_round(s, r);
      }
      stats_.rounds++;
      if (any_failed) {
        // An injected kUnavailable marks the peer failed for good (the engine
        // fails later transfers to it fast), as a real transport error would:
        // recover the way an application must, with new engines (new
        // incarnations) and fresh descriptors, all at once at a round boundary.
        hub_->allgather("");  // everybody verified: nobody writes any more
        engine_.reset();
        start_engine();
        stats_.restarts++;
      }
      if (me_ == 0 &&
          std::chrono::duration<double>(Clock::now() - last_report).count() >= o_.progress_s) {
        last_report = Clock::now();
        double t = std::chrono::duration<double>(last_report - t0).count();
        fmt::print(stderr,
                   "[soak] {:.0f} s: round {}, {} transfers ({:.0f}/s), node 0: {} failed, {} "
                   "corrupted B, {} lost / {} extra imms\n",
                   t, r + 1, total, total / t, stats_.failed, stats_.corrupted, stats_.lost_imms,
                   stats_.extra_imms);
      }
    }
    // Everything still landing (immediates of failed transfers, late
    // duplicates) gets a moment, then the last two rounds are re-checked.
    std::this_thread::sleep_for(1s);
    for (int s = 0; s < kProcs; ++s) {
      if (s == me_) continue;
      for (int h = 0; h < 2; ++h) late_check(s, h);
      for (uint32_t q = 0; q < kSeqSpace; ++q) {
        uint32_t v = imm_count_[s][q].load();
        if (v && !failed_flag_[s][q]) stats_.extra_imms += v;  // never owed
        uint32_t m = msg_count_[s][q].load();
        if (m && !failed_flag_[s][q]) stats_.dup_msgs += m;  // after late_check: extra
      }
    }
    stats_.extra_imms += unknown_imms_.load();
    stats_.bad_msgs += bad_msgs_.load();
    stats_.corrupted += bad_msg_bytes_.load();
    stats_.double_done += double_done_.load();
    elapsed_ = std::chrono::duration<double>(Clock::now() - t0).count();
    hub_->allgather("");  // nobody writes to anybody any more
    engine_.reset();      // fault domains publish their counts as they close
    stats_.faults = testing::process_fault_stats();
    auto all = hub_->allgather(pack_u64(stats_.pack()));
    if (me_ != 0) return 0;
    Stats sum;
    for (auto& b : all) sum.add(unpack_u64(b));
    return report(sum);
  }

 private:
  void setup() {
    for (int p = 0; p < kProcs; ++p) {
      srcs_[p].reset(new (test::Buffer::kAlign) uint8_t[kSrcLen]);
      test::fill_pattern(srcs_[p].get(), kSrcLen, src_seed(o_.seed, p));
      imm_count_[p].reset(new std::atomic<uint32_t>[kSeqSpace]());
      msg_count_[p].reset(new std::atomic<uint8_t>[kSeqSpace]());
      failed_flag_[p].assign(kSeqSpace, 0);
    }
    dst_.reset(new (test::Buffer::kAlign) uint8_t[kDstLen]);
    std::memset(dst_.get(), kPoison, kDstLen);
    start_engine();
  }

  void start_engine() {
    EngineConfig cfg = test::config_for(o_.provider, kNics);
    cfg.groups[0].insist = true;  // "lo" and "shm" are no NICs of the detected topology
    cfg.default_deadline = std::chrono::milliseconds(o_.deadline_ms);
    cfg.fault_injection = o_.faults;
    engine_ = std::make_unique<TransferEngine>(cfg);
    auto& e = *engine_;
    std::tie(src_h_, std::ignore) = e.reg_mr(srcs_[me_].get(), kSrcLen);
    MrDesc mine;
    std::tie(std::ignore, mine) = e.reg_mr(dst_.get(), kDstLen);
    e.on_imm([this](uint32_t imm) {
      uint32_t s = imm >> 30, seq = imm & (kSeqSpace - 1);
      if (s >= kProcs || int(s) == me_ || (imm & ((1u << 30) - 1)) >= kSeqSpace) {
        unknown_imms_++;
        return;
      }
      // Release: verify_round reads the bytes an immediate announces after
      // loading this count, so the count must carry the order of the data
      // (worker -> this callback thread -> verify_round).
      imm_count_[s][seq].fetch_add(1, std::memory_order_release);
    });
    e.submit_recvs(kRecvLen, 256, [this](std::span<const uint8_t> m) { on_msg(m); });

    auto d = mine.to_bytes();
    const NetAddr main = e.main_address();
    auto a = main.bytes();
    std::string blob =
        pack_u64({d.size()}) + std::string(d.begin(), d.end()) + std::string(a.begin(), a.end());
    auto all = hub_->allgather(blob);
    for (int p = 0; p < kProcs; ++p) {
      uint64_t n;
      std::memcpy(&n, all[p].data(), 8);
      auto b = reinterpret_cast<const uint8_t*>(all[p].data());
      descs_[p] = MrDesc::from_bytes(std::span(b + 8, n));
      addrs_[p] = NetAddr::from_bytes(std::span(b + 8 + n, all[p].size() - 8 - n));
    }
    std::vector<MrDesc> peers;
    for (int p = 0; p < kProcs; ++p)
      if (p != me_) peers.push_back(descs_[p]);
    group_ = e.add_peer_group(peers);
    hub_->allgather("");  // every receiver is ready before anybody writes
  }

  void on_msg(std::span<const uint8_t> m) {
    // Runs on the callback thread of the current engine only.
    uint32_t hdr[4];
    if (m.size() < 16) {
      bad_msgs_++;
      return;
    }
    std::memcpy(hdr, m.data(), 16);
    uint32_t s = hdr[1], seq = hdr[2];
    if (hdr[0] != kMsgMagic || s >= kProcs || int(s) == me_ || seq >= kSeqSpace ||
        hdr[3] != m.size()) {
      bad_msgs_++;
      return;
    }
    const uint8_t* want = srcs_[s].get() + msg_src(seq);
    uint64_t bad = 0;
    for (size_t i = 16; i < m.size(); ++i) bad += m[i] != want[i - 16];
    bad_msg_bytes_ += bad;
    msg_count_[s][seq].fetch_add(1, std::memory_order_relaxed);
  }

  void send_round(uint64_t r, const std::vector<Xfer>& xs) {
    auto& e = *engine_;
    const size_t n = xs.size();
    round_ = std::make_shared<RoundState>(n);
    RoundState& rs = *round_;
    for (size_t i = 0; i < n; ++i) {
      const Xfer& x = xs[i];
      stats_.transfers++;
      stats_.by_kind[int(x.kind)]++;
      OnDone od = [this, i, st_ = round_](const Status& st) {
        if (st_->dones[i].fetch_add(1) > 0) {
          double_done_++;
          return;
        }
        st_->results[i] = st;
        st_->done.fetch_add(1, std::memory_order_release);
      };
      std::optional<uint32_t> imm = x.has_imm ? std::optional(x.imm) : std::nullopt;
      const uint64_t base = area_off(me_, r);
      try {
        switch (x.kind) {
          case Kind::kSingle: {
            const Target& t = x.targets[0];
            const Seg& g = t.segs[0];
            e.submit_single_write(g.len, imm, src_h_, g.src, descs_[t.peer], base + g.dst,
                                  std::move(od), x.wroute);
            break;
          }
          case Kind::kPaged:
            e.submit_paged_writes(x.page_len, imm, src_h_, Pages{x.sidx, x.stride, 0},
                                  descs_[x.targets[0].peer],
                                  Pages{x.didx, x.stride, base + x.page_base}, std::move(od));
            break;
          case Kind::kScatter: {
            std::vector<ScatterDst> dsts;
            for (const Target& t : x.targets)
              dsts.push_back({t.segs[0].len, t.segs[0].src, descs_[t.peer], base + t.segs[0].dst});
            e.submit_scatter(x.use_group ? std::optional(group_) : std::nullopt, std::move(od), imm,
                             src_h_, std::move(dsts), x.groute);
            break;
          }
          case Kind::kBarrier: {
            std::vector<MrDesc> dsts;
            for (const Target& t : x.targets) dsts.push_back(descs_[t.peer]);
            e.submit_barrier(x.use_group ? std::optional(group_) : std::nullopt, std::move(od),
                             x.imm, std::move(dsts), x.groute);
            break;
          }
          case Kind::kImm:
            e.submit_imm(x.imm, descs_[x.targets[0].peer], std::move(od), x.wroute);
            break;
          case Kind::kSend: {
            std::vector<uint8_t> msg(x.msg_len);
            uint32_t hdr[4] = {kMsgMagic, uint32_t(me_), x.seq, uint32_t(x.msg_len)};
            std::memcpy(msg.data(), hdr, 16);
            std::memcpy(msg.data() + 16, srcs_[me_].get() + msg_src(x.seq), x.msg_len - 16);
            e.submit_send(addrs_[x.targets[0].peer], msg, std::move(od));
            break;
          }
          case Kind::kCount:
            break;
        }
      } catch (const Error& err) {
        // A request the engine refuses is a soak bug, not an injected fault.
        fmt::print(stderr, "[soak] node {}: {} seq {} refused: {}\n", me_, kind_name(x.kind), x.seq,
                   err.what());
        rs.results[i] = err.status();
        rs.dones[i] = 1;
        rs.done++;
        stats_.unexplained++;
      }
    }
    // Every transfer ends (success or error) by its deadline; a grace period
    // covers the callback thread and the deadline scan.
    auto limit = Clock::now() + std::chrono::milliseconds(o_.deadline_ms) + 15s;
    while (rs.done.load(std::memory_order_acquire) < n && Clock::now() < limit)
      std::this_thread::sleep_for(100us);
    for (size_t i = 0; i < n; ++i) {
      const Xfer& x = xs[i];
      if (rs.dones[i].load() == 0) {
        stats_.hangs++;
        abort_ = true;  // its bytes may still land: the areas are no longer trustworthy
        fmt::print(stderr, "[soak] node {}: HANG {} seq {} never completed\n", me_,
                   kind_name(x.kind), x.seq);
        rs.results[i] = Status(Code::kDeadlineExceeded, "soak: never completed");
        continue;
      }
      const Status& st = rs.results[i];
      if (st.is_ok()) {
        stats_.ok++;
        for (auto& t : x.targets)
          for (auto& g : t.segs) stats_.bytes += g.len;
        stats_.bytes += x.msg_len;
        continue;
      }
      stats_.failed++;
      if (st.code() == Code::kDeadlineExceeded) {
        stats_.deadline++;
        stats_.hangs++;
      } else if (st.message().find("injected fault") == std::string::npos) {
        stats_.unexplained++;
      } else if (st.message().find("failed earlier") != std::string::npos) {
        stats_.fail_fast++;  // its peer was marked failed by an injected fault before
      }
      if (st.message().find("injected fault") == std::string::npos)
        fmt::print(stderr, "[soak] node {}: {} seq {} failed: {}\n", me_, kind_name(x.kind), x.seq,
                   st.to_string());
    }
    // A transfer whose on_done ran twice shows up here (before its slot's reuse).
    if (double_done_.load())
      fmt::print(stderr, "[soak] node {}: {} on_done ran twice\n", me_, double_done_.load());
  }

  // Immediates of round r-2 (same area half) are final now: anything beyond
  // what a successful transfer owed is extra.
  void late_check(int s, int half) {
    for (const Xfer& x : kept_[s][half]) {
      uint64_t want = owed(x);
      if (failed_flag_[s][x.seq]) continue;
      uint32_t v = imm_count_[s][x.seq].exchange(0);
      if (v > want) {
        stats_.extra_imms += v - want;
        fmt::print(stderr, "[soak] node {}: {} extra immediates of {} seq {} from {}\n", me_,
                   v - want, kind_name(x.kind), x.seq, s);
      }
      if (x.kind == Kind::kSend && x.targets[0].peer == me_) {
        uint8_t m = msg_count_[s][x.seq].exchange(0);
        if (m > 1) stats_.dup_msgs += m - 1;
      }
    }
    kept_[s][half].clear();
  }

  uint64_t owed(const Xfer& x) const {
    if (!x.has_imm) return 0;
    uint64_t n = 0;
    for (auto& t : x.targets)
      if (t.peer == me_) n += t.imms;
    return n;
  }

  void verify_round(int s, uint64_t r) {
    const int half = r % 2;
    late_check(s, half);
    auto xs = gen_round(o_.seed, s, r, o_.round);
    uint8_t* area = dst_.get() + area_off(s, r);
    const uint8_t* src = srcs_[s].get();

    // 1. Immediates owed by the successful transfers: exact, bounded wait.
    auto limit = Clock::now() + 20s;
    for (const Xfer& x : xs) {
      if (failed_flag_[s][x.seq]) continue;
      uint64_t want = owed(x);
      stats_.imms += want;
      while (imm_count_[s][x.seq].load() < want && Clock::now() < limit)
        std::this_thread::sleep_for(50us);
      uint32_t got = imm_count_[s][x.seq].load();
      if (got < want) {
        stats_.lost_imms += want - got;
        fmt::print(stderr, "[soak] node {}: {} of {} immediates of {} seq {} from {} never came\n",
                   me_, want - got, want, kind_name(x.kind), x.seq, s);
      } else if (got > want) {
        stats_.extra_imms += got - want;
        imm_count_[s][x.seq] -= got - want;  // counted once
        fmt::print(stderr, "[soak] node {}: {} extra immediates of {} seq {} from {}\n", me_,
                   got - want, kind_name(x.kind), x.seq, s);
      }
      if (x.kind == Kind::kSend && x.targets[0].peer == me_) {
        stats_.msgs++;
        while (msg_count_[s][x.seq].load() == 0 && Clock::now() < limit)
          std::this_thread::sleep_for(50us);
        if (msg_count_[s][x.seq].load() == 0) {
          stats_.lost_msgs++;
          fmt::print(stderr, "[soak] node {}: message seq {} from {} never came\n", me_, x.seq, s);
        }
      }
    }

    // 2. Bytes. Data announced by immediates must be there now; bytes of
    // writes without one may still be landing (bounded retry).
    uint64_t extent = 0;
    std::vector<uint8_t>& mask = mask_;
    for (const Xfer& x : xs)
      for (auto& t : x.targets)
        if (t.peer == me_)
          for (auto& g : t.segs) extent = std::max(extent, g.dst + g.len);
    for (auto& [b, e] : dont_care_[s][half]) extent = std::max(extent, e);
    mask.assign(extent, 0);  // 0 = must still be poison
    for (auto& [b, e] : dont_care_[s][half]) std::fill(mask.begin() + b, mask.begin() + e, 2);
    std::vector<std::pair<uint64_t, uint64_t>> now_dont_care;
    auto seg_bad = [&](const Seg& g) {
      // The sender's writes of round r + 2 land here again after the hub's
      // round barrier (another process); bytes of failed transfers may land
      // at any time: under TSan a NIC memory access (support/tsan.h).
      test::NicMemoryAccess scope;
      if (std::memcmp(area + g.dst, src + g.src, g.len) == 0) return uint64_t(0);
      uint64_t bad = 0;
      for (uint64_t i = 0; i < g.len; ++i) bad += area[g.dst + i] != src[g.src + i];
      return bad;
    };
    std::vector<const Seg*> later;
    for (const Xfer& x : xs) {
      bool failed_x = failed_flag_[s][x.seq];
      for (auto& t : x.targets) {
        if (t.peer != me_) continue;
        for (auto& g : t.segs) {
          if (failed_x) {
            std::fill(mask.begin() + g.dst, mask.begin() + g.dst + g.len, 2);
            now_dont_care.emplace_back(g.dst, g.dst + g.len);
            continue;
          }
          std::fill(mask.begin() + g.dst, mask.begin() + g.dst + g.len, 1);
          if (!x.has_imm) {
            later.push_back(&g);
            continue;
          }
          uint64_t bad = seg_bad(g);
          stats_.verified_bytes += g.len;
          if (bad) {
            stats_.corrupted += bad;
            fmt::print(stderr,
                       "[soak] node {}: {} bad bytes in {} seq {} from {} (area offset {}, {} B) "
                       "after its immediates arrived\n",
                       me_, bad, kind_name(x.kind), x.seq, s, g.dst, g.len);
          }
        }
      }
    }
    auto until = Clock::now() + 5s;
    for (const Seg* g : later) {
      uint64_t bad;
      while ((bad = seg_bad(*g)) && Clock::now() < until) std::this_thread::sleep_for(1ms);
      stats_.verified_bytes += g->len;
      if (bad) {
        stats_.corrupted += bad;
        fmt::print(stderr, "[soak] node {}: {} bad bytes at area offset {} from {} (no imm)\n", me_,
                   bad, g->dst, s);
      }
    }
    // 3. Nothing outside the reservations: gaps stay poisoned.
    uint64_t stray = 0;
    {
      test::NicMemoryAccess scope;  // as in seg_bad
      for (uint64_t i = 0; i < extent; ++i) stray += mask[i] == 0 && area[i] != kPoison;
    }
    if (stray) {
      stats_.corrupted += stray;
      fmt::print(stderr, "[soak] node {}: {} stray bytes in gaps of the area of {} (round {})\n",
                 me_, stray, s, r);
    }
    // 4. Ready for round r+2. Bytes of failed transfers may still land then.
    {
      test::NicMemoryAccess scope;  // as in seg_bad
      std::memset(area, kPoison, extent);
    }
    dont_care_[s][half] = std::move(now_dont_care);
    kept_[s][half] = std::move(xs);
  }

  int report(const Stats& t) {
    uint64_t injected = t.faults.failed_completions + t.faults.failed_posts;
    bool pass = t.corrupted == 0 && t.lost_imms == 0 && t.extra_imms == 0 && t.hangs == 0 &&
                t.unexplained == 0 && t.double_done == 0 && t.lost_msgs == 0 && t.dup_msgs == 0 &&
                t.bad_msgs == 0 && (injected == 0) == (t.failed == 0) &&
                t.failed - t.fail_fast <= injected && !abort_;
    std::string kinds;
    for (int k = 0; k < int(Kind::kCount); ++k)
      kinds += fmt::format("{}{} {}", k ? ", " : "", kind_name(Kind(k)), t.by_kind[k]);
    fmt::print(
        "ferry-soak: provider {}, {} processes x {} NICs, faults '{}', seed {}\n"
        "  elapsed          {:.1f} s ({} rounds)\n"
        "  transfers        {} ({:.0f}/s): {}\n"
        "  succeeded        {}\n"
        "  bytes            {} written, {} verified at receivers\n"
        "  immediates       {} owed and checked exactly; {} messages checked\n"
        "  corrupted bytes  {}\n"
        "  lost / extra imm {} / {}\n"
        "  lost / dup / bad messages {} / {} / {}\n"
        "  failures         {} reported: {} by an injected fault, {} fail-fast to a peer an "
        "injected "
        "fault marked failed, {} unexplained; {} injected ({} completions, {} posts); {} engine "
        "restarts\n"
        "  hangs            {} ({} past deadline), double completions {}\n"
        "  injector         {} completions seen, {} delayed, {} held back, {} short posts, {} "
        "split writes ({} pieces), {} stale duplicates delivered, {} completions coalesced\n"
        "RESULT: {}\n",
        o_.provider, kProcs, kNics, o_.faults, o_.seed, elapsed_, t.rounds / kProcs, t.transfers,
        t.transfers / elapsed_, kinds, t.ok, t.bytes, t.verified_bytes, t.imms, t.msgs, t.corrupted,
        t.lost_imms, t.extra_imms, t.lost_msgs, t.dup_msgs, t.bad_msgs, t.failed,
        t.failed - t.fail_fast - t.unexplained - t.deadline, t.fail_fast, t.unexplained, injected,
        t.faults.failed_completions, t.faults.failed_posts, t.restarts / kProcs, t.hangs,
        t.deadline, t.double_done, t.faults.completions, t.faults.delayed, t.faults.held_back,
        t.faults.short_posts, t.faults.split_writes, t.faults.split_pieces,
        t.faults.stale_delivered, t.faults.coalesced, pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
  }

  int me_;
  Options o_;
  Hub* hub_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<uint8_t[], test::Buffer::AlignedDelete> srcs_[kProcs];
  std::unique_ptr<uint8_t[], test::Buffer::AlignedDelete> dst_;
  MrHandle src_h_;
  MrDesc descs_[kProcs];
  NetAddr addrs_[kProcs];
  PeerGroupHandle group_ = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> imm_count_[kProcs];
  std::unique_ptr<std::atomic<uint8_t>[]> msg_count_[kProcs];
  std::vector<uint8_t> failed_flag_[kProcs];
  std::vector<Xfer> kept_[kProcs][2];
  std::vector<std::pair<uint64_t, uint64_t>> dont_care_[kProcs][2];
  std::vector<uint8_t> mask_;
  // Per round, shared with its callbacks: a late (duplicate) on_done touches
  // only its own round's state.
  struct RoundState {
    explicit RoundState(size_t n) : results(n), dones(new std::atomic<uint32_t>[n]()) {}
    std::vector<Status> results;
    std::unique_ptr<std::atomic<uint32_t>[]> dones;
    std::atomic<uint64_t> done{0};
  };
  std::shared_ptr<RoundState> round_;
  std::atomic<uint64_t> unknown_imms_{0}, bad_msgs_{0}, bad_msg_bytes_{0}, double_done_{0};
  Stats stats_;
  bool abort_ = false;
  double elapsed_ = 0;
};

std::string process_faults(const std::string& spec, uint64_t seed, int p) {
  if (spec.empty() || spec == "none") return "";
  testing::FaultSpec f;
  Status st = testing::parse_fault_spec(spec, &f);
  if (!st.is_ok()) throw Error(st);
  // Every process (and, through seed ^ nic_index, every NIC) misbehaves differently.
  uint64_t s = (spec.find("seed=") != std::string::npos ? f.seed : seed) * 1000003 + p * 7919;
  return fmt::format(
      "seed={},delay_us={},reorder={},eagain={},coalesce={},paged={},split={},fail={},"
      "stale={},stale_us={}",
      s, f.delay_us, f.reorder, f.eagain, f.coalesce, int(f.paged), f.split, f.fail, f.stale,
      f.stale_us);
}

}  // namespace
}  // namespace ferry::soak

int main(int argc, char** argv) {
  using namespace ferry::soak;
  Options o;
  CLI::App app{"ferry-soak: 3 processes x 2 NICs, randomised transfers under fault injection"};
  app.add_option("--transfers", o.transfers, "stop after this many transfers (all processes)");
  app.add_option("--seconds", o.seconds, "stop after this many seconds");
  app.add_option("--provider", o.provider, "tcp (tcp;ofi_rxm on lo) or shm")
      ->check(CLI::IsMember({"tcp", "shm"}));
  app.add_option("--seed", o.seed, "seed of the transfer mix and of the injector");
  app.add_option("--faults", o.faults, "injector spec (src/testing/fault_domain.h), or 'none'");
  app.add_option("--round", o.round, "transfers per process per round (all in flight)")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--deadline-ms", o.deadline_ms, "per-transfer deadline");
  app.add_option("--progress", o.progress_s, "seconds between progress lines (stderr)");
  CLI11_PARSE(app, argc, argv);
  if (!o.transfers && o.seconds <= 0) o.transfers = 100000;

  std::vector<std::string> specs;
  try {
    for (int p = 0; p < kProcs; ++p) specs.push_back(process_faults(o.faults, o.seed, p));
  } catch (const ferry::Error& e) {
    fmt::print(stderr, "ferry-soak: --faults: {}\n", e.what());
    return 2;
  }
  // Children are forked before any engine exists (no threads to duplicate).
  std::vector<std::unique_ptr<ferry::test::Peer>> peers;
  for (int p = 1; p < kProcs; ++p)
    peers.push_back(std::make_unique<ferry::test::Peer>([&, p](ferry::test::Channel& ch) {
      Options mine = o;
      mine.faults = specs[p];
      Hub hub(p, {&ch});
      return Node(p, mine, &hub).run();
    }));
  int rc;
  try {
    Options mine = o;
    mine.faults = specs[0];
    Hub hub(0, {&peers[0]->channel(), &peers[1]->channel()});
    rc = Node(0, mine, &hub).run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry-soak: {}\n", e.what());
    rc = 3;
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    int c = peers[i]->wait(std::chrono::seconds(60));
    if (c != 0) {
      fmt::print(stderr, "ferry-soak: process {} exited with {}\n", i + 1, c);
      rc = rc ? rc : 4;
    }
  }
  return rc;
}

#include "support/scenario.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>

#include "support/region_server.h"

namespace ferry::test {

using namespace std::chrono_literals;

namespace {

struct Checker {
  std::string failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures += what + "\n";
  }
  void expect_eq(const std::string& got, const std::string& want, const std::string& what) {
    if (got != want) failures += fmt::format("{}: got '{}', want '{}'\n", what, got, want);
  }
};

// Waits for a transfer signalled through a flag; false on failure or timeout.
struct Done {
  std::atomic<bool> done{false}, failed{false};
  OnDone on_done() { return OnDone::flag(done, &failed); }
  bool wait() {
    return wait_until([&] { return done.load(); }, 60s) && !failed.load();
  }
};

}  // namespace

std::string run_scenario(const std::vector<Channel*>& rx, const EngineConfig& cfg, uint64_t region,
                         ScenarioStats* stats) {
  Checker ck;
  const size_t peers = rx.size();
  std::vector<MrDesc> descs;
  for (auto* ch : rx) {
    auto b = ch->recv(60s);
    if (!b) return "a receiver did not publish its descriptor\n";
    descs.push_back(MrDesc::from_bytes(*b));
  }
  Buffer src(region);  // outlives the engine, which may still read it on an early return
  TransferEngine e(cfg);
  const uint32_t nics = e.nics_per_group();
  auto [h, mine] = e.reg_mr(src.get(), region);
  for (auto* ch : rx)
    for (int imm = 100; imm <= 106; ++imm)
      ck.expect_eq(ask(*ch, fmt::format("counter {}", imm)), "ok", "counter");
  std::mt19937_64 rng(11);
  uint64_t seed = 1;
  uint64_t bulk_bytes = 0;

  // (a) split single writes of several sizes, to every peer.
  for (uint64_t len : {uint64_t(100), uint64_t(300) << 10, uint64_t(3) << 20, region}) {
    for (size_t p = 0; p < peers; ++p) {
      uint64_t off = len == region ? 0 : rng() % (region - len);
      fill_pattern(src.get() + off, len, seed);
      Done d;
      e.submit_single_write(len, 100, h, off, descs[p], off, d.on_done(), WriteRoute::split());
      ck.expect(d.wait(), fmt::format("split write of {} to peer {}", len, p));
      uint64_t imms = ImmPlan::single_write(len, WriteRoute::split(), nics);
      ck.expect_eq(ask(*rx[p], fmt::format("count 100 {}", imms)), "ok 0",
                   fmt::format("imms of split write {}", len));
      ck.expect_eq(ask(*rx[p], check_cmd(off, len, seed)), "ok",
                   fmt::format("bytes of split write {}", len));
      bulk_bytes += len;
      ++seed;
    }
  }
  // (b) pinned to each NIC, and round robin: one immediate each.
  for (uint32_t k = 0; k <= nics; ++k) {
    WriteRoute route = k < nics ? WriteRoute::pinned(k) : WriteRoute::round_robin();
    uint64_t len = 64 << 10, off = (k * len) % (region - len);
    fill_pattern(src.get() + off, len, seed);
    Done d;
    e.submit_single_write(len, 101, h, off, descs[0], off, d.on_done(), route);
    ck.expect(d.wait(), fmt::format("pinned/rr write {}", k));
    ck.expect_eq(ask(*rx[0], "count 101 1"), "ok 0", "imm of pinned write");
    ck.expect_eq(ask(*rx[0], check_cmd(off, len, seed)), "ok", "bytes of pinned write");
    ++seed;
  }
  // (c) paged writes: random distinct destination pages, one imm per page.
  {
    const uint64_t page = 16 << 10, stride = page + 128;
    const uint32_t slots = region / stride, n = std::min<uint32_t>(slots, 200);
    std::vector<uint32_t> sidx(slots), didx(slots);
    std::iota(sidx.begin(), sidx.end(), 0);
    std::iota(didx.begin(), didx.end(), 0);
    std::shuffle(sidx.begin(), sidx.end(), rng);
    std::shuffle(didx.begin(), didx.end(), rng);
    sidx.resize(n);
    didx.resize(n);
    for (uint32_t i = 0; i < n; ++i) fill_pattern(src.get() + sidx[i] * stride, page, seed + i);
    for (size_t p = 0; p < peers; ++p) {
      Done d;
      e.submit_paged_writes(page, 102, h, Pages{sidx, stride, 0}, descs[p], Pages{didx, stride, 0},
                            d.on_done());
      ck.expect(d.wait(), "paged writes");
      ck.expect_eq(ask(*rx[p], fmt::format("count 102 {}", n)), "ok 0", "imms of paged writes");
      for (uint32_t i = 0; i < n; ++i)
        ck.expect_eq(ask(*rx[p], check_cmd(didx[i] * stride, page, seed + i)), "ok", "paged bytes");
      bulk_bytes += uint64_t(n) * page;
    }
    // An empty page list completes at once and delivers nothing.
    Done d;
    e.submit_paged_writes(page, 102, h, Pages{}, descs[0], Pages{}, d.on_done());
    ck.expect(d.wait(), "empty paged request completes");
    seed += n;
  }
  // (d) scatter to the peer group: each route, with and without the handle.
  auto group = e.add_peer_group(descs);
  ck.expect(e.add_peer_group(descs) == group, "add_peer_group is idempotent");
  const uint64_t part = std::min<uint64_t>(region / peers, 1 << 20);
  struct Mode {
    GroupRoute route;
    uint32_t imm;
    bool use_group;
  };
  for (Mode m :
       {Mode{GroupRoute::shard_peers(), 103, true}, Mode{GroupRoute::shard_bytes(), 104, true},
        Mode{GroupRoute::pinned(nics - 1), 105, false},
        Mode{GroupRoute::shard_bytes(), 104, false}}) {
    std::vector<ScatterDst> dsts;
    for (size_t p = 0; p < peers; ++p) {
      uint64_t len = part - p * 4096;  // targets of different lengths
      fill_pattern(src.get() + p * part, len, seed + p);
      dsts.push_back(ScatterDst{len, p * part, descs[p], region - len});
    }
    Done d;
    e.submit_scatter(m.use_group ? std::optional(group) : std::nullopt, d.on_done(), m.imm, h, dsts,
                     m.route);
    ck.expect(d.wait(), "scatter");
    for (size_t p = 0; p < peers; ++p) {
      uint64_t imms = ImmPlan::scatter_target(dsts[p].len, m.route, nics);
      ck.expect_eq(ask(*rx[p], fmt::format("count {} {}", m.imm, imms)), "ok 0", "scatter imms");
      ck.expect_eq(ask(*rx[p], check_cmd(dsts[p].dst_offset, dsts[p].len, seed + p)), "ok",
                   "scatter bytes");
      bulk_bytes += dsts[p].len;
    }
    seed += peers;
  }
  // (e) barrier: one immediate per peer.
  {
    Done d;
    e.submit_barrier(group, d.on_done(), 106, descs);
    ck.expect(d.wait(), "barrier");
    for (auto* ch : rx) ck.expect_eq(ask(*ch, "count 106 1"), "ok 0", "barrier imm");
    Done empty;
    e.submit_barrier(std::nullopt, empty.on_done(), 106, {});
    ck.expect(empty.wait(), "empty barrier completes");
  }
  if (stats) stats->bytes = bulk_bytes;
  for (auto* ch : rx) ask(*ch, "quit");
  return ck.failures;
}

}  // namespace ferry::test

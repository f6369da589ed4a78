// A Domain that wraps any other and, driven by a seed, misbehaves the way real
// fabrics may: completions delayed and reordered, transient back-pressure,
// writes split into pieces, permanent errors, late duplicates of completions.
// The ImmCounter design must stay exact under all of it.
//
// Spec (EngineConfig::fault_injection, env FERRY_FAULT_INJECTION): comma-
// separated key=value, every key optional, each at most once. Probabilities
// are decimals in [0, 1]; durations are unsigned integers.
//
//   seed=N       PRNG seed (u64, default 0). Each NIC draws from its own
//                std::mt19937_64 seeded with seed ^ nic_index, so a run is
//                reproducible per NIC for the same sequence of calls.
//   delay_us=N   every completion polled from the inner domain (local write,
//                send, receive, remote immediate) is held for a uniform
//                0..N microseconds before it is handed up (default 0).
//   reorder=P    with probability P a completion is held back further, by
//                1..max(1, 4*delay_us) microseconds, and every batch of
//                completions that are due is handed up in shuffled order
//                (default 0: due completions leave in the order they came).
//   eagain=P     with probability P a post_writes/post_send/post_recv call
//                accepts fewer requests than asked (possibly none) and returns
//                OK: -FI_EAGAIN back-pressure (default 0).
//   coalesce=P   with probability P a completion handed up merges into the one
//                before it in the same poll when both are successful local
//                writes of one ctx or remote immediates of one value: one
//                entry with a count, as batching domains (NVLink) report runs.
//   paged=1      report DomainInfo::native_paged, so the worker hands paged
//                writes over as page lists (post_paged) and the base class
//                spells them out into post_writes, as a batching domain would
//                take them (default 0).
//   split=P      with probability P a write of more than 1 byte is posted as
//                2-4 pieces without immediate; once every piece completed
//                locally a zero-byte write carries the immediate (if any), and
//                only after that one completion with the caller's ctx goes up.
//                Relies on the inner transport delivering one connection's
//                writes in order (tcp;ofi_rxm, shm) for data-before-immediate.
//   fail=P       with probability P a local completion (write, send) is turned
//                into an error (kUnavailable "injected fault"), and with
//                probability P a post_writes/post_send call fails part-way with
//                that error (default 0). Receive posts and receive / remote
//                immediate completions are never failed: the transport would
//                fail the initiator's operation instead, and the engine could
//                not tell a lost message from a failed one.
//   stale=P      with probability P a copy of a local completion (write, send)
//                that was handed up is handed up again later, once it is at
//                least stale_us old AND the engine reused its transfer slot
//                for a new transfer (so the original transfer has ended). The
//                engine must ignore it by its slot generation (default 0).
//   stale_us=N   minimum age of a stale duplicate in microseconds (default 1000).
//
// A ctx handed to post_* is opaque, except for `stale`: it reads the worker's
// layout tag(8) | generation(24) | slot(32) (core/ctx.h) to know when a
// slot was reused. Contexts of the wrapper's own writes carry tag 0xFE.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/domain.h"

namespace ferry::testing {

struct FaultSpec {
  uint64_t seed = 0;
  uint64_t delay_us = 0;
  double reorder = 0;
  double eagain = 0;
  double coalesce = 0;
  bool paged = false;
  double split = 0;
  double fail = 0;
  double stale = 0;
  uint64_t stale_us = 1000;
};

// Parses `spec` (see above). kInvalidArgument names the offending key.
Status parse_fault_spec(std::string_view spec, FaultSpec* out);

// Counters of what was injected, per domain; process_fault_stats() sums the
// domains of this process destroyed so far (a soak stops its engine, then
// compares them with what its transfers reported).
struct FaultStats {
  uint64_t completions = 0;         // completions polled from the inner domain
  uint64_t delayed = 0;             // held for a nonzero time
  uint64_t held_back = 0;           // reorder: held back further
  uint64_t short_posts = 0;         // eagain: calls that accepted fewer than asked
  uint64_t split_writes = 0;        // writes split into pieces
  uint64_t split_pieces = 0;        // pieces posted for them
  uint64_t failed_completions = 0;  // completions turned into errors
  uint64_t failed_posts = 0;        // post calls failed
  uint64_t stale_delivered = 0;     // stale duplicates handed up
  uint64_t stale_dropped = 0;       // duplicates dropped (never eligible, queue full)
  uint64_t coalesced = 0;           // completions merged into their neighbour (coalesce)
};
FaultStats process_fault_stats();

class FaultDomain : public core::Domain {
 public:
  using NowFn = std::function<uint64_t()>;  // monotonic nanoseconds

  FaultDomain(std::unique_ptr<core::Domain> inner, const FaultSpec& spec, size_t nic_index,
              NowFn now = {});
  ~FaultDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return inner_->raw_address(); }
  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override {
    return inner_->register_mr(ptr, len, device, remote, error);
  }
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override {
    return inner_->add_peer(raw, error);
  }
  void remove_peer(core::PeerId peer) override { inner_->remove_peer(peer); }
  core::MappedRemote map_remote(core::PeerId peer, uint64_t rkey, uint64_t remote_addr, size_t len,
                                Status* error) override {
    return inner_->map_remote(peer, rkey, remote_addr, len, error);
  }

  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;
  int wait_fd() override;
  bool can_block() override;

  const FaultStats& stats() const { return stats_; }
  // Completions polled from the inner domain but not yet handed up, plus
  // pieces and trailing immediates not yet accepted by the inner domain.
  size_t held() const { return held_.size() + backlog_.size(); }
  size_t stale_pending() const { return stale_.size(); }

 private:
  // Bookkeeping of one split write, pooled by index.
  struct SplitRec {
    uint32_t gen = 0;
    bool active = false;
    bool has_imm = false;
    bool imm_posted = false;
    uint32_t unposted = 0;     // in backlog_
    uint32_t outstanding = 0;  // posted to the inner domain, not completed
    uint64_t ctx = 0;          // the caller's
    core::WriteDesc imm_write;
    Status error;
  };
  struct Held {
    core::Completion c;
    uint64_t release_ns = 0;
  };
  struct Stale {
    core::Completion c;
    uint64_t not_before_ns = 0;
  };

  uint64_t now() const;
  double uniform01() { return double(rng_() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return p > 0 && uniform01() < p; }
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }

  void note_post(uint64_t ctx);
  bool slot_reused(uint64_t ctx) const;
  uint32_t alloc_rec();
  void queue_split(const core::WriteDesc& w);
  void flush_backlog();
  void on_own_completion(const core::Completion& c);
  void maybe_complete_rec(uint32_t idx);
  void intake(core::Completion c);
  size_t release(std::span<core::Completion> out);
  bool stale_ready(const Stale& s, uint64_t now) const;
  bool can_block_now() const;

  std::unique_ptr<core::Domain> inner_;
  core::DomainInfo info_;
  FaultSpec spec_;
  size_t nic_;
  NowFn now_;
  std::mt19937_64 rng_;
  FaultStats stats_;

  std::vector<Held> held_;
  std::vector<core::Completion> ready_;   // scratch of release()
  std::vector<core::WriteDesc> backlog_;  // FIFO: front at backlog_head_
  size_t backlog_head_ = 0;
  std::vector<SplitRec> recs_;
  std::vector<uint32_t> free_recs_;
  std::vector<Stale> stale_;
  std::vector<uint32_t> slot_gen_;  // last generation posted per engine slot
};

// `spec`: see above. Returns nullptr and sets *error on a malformed spec.
std::unique_ptr<core::Domain> wrap_with_faults(std::unique_ptr<core::Domain> inner,
                                               const std::string& spec, size_t nic_index,
                                               Status* error);

}  // namespace ferry::testing

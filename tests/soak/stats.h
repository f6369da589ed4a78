// Totals of one soak process, summed by the hub over all three (packed as a
// vector of counters to travel over the hub's channel).
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"
#include "testing/fault_domain.h"

namespace ferry::soak {

struct Stats {
  uint64_t rounds = 0, transfers = 0, ok = 0, failed = 0, unexplained = 0, deadline = 0, hangs = 0,
           double_done = 0, bytes = 0, verified_bytes = 0, corrupted = 0, lost_imms = 0,
           extra_imms = 0, imms = 0, lost_msgs = 0, dup_msgs = 0, bad_msgs = 0, msgs = 0,
           restarts = 0, fail_fast = 0;
  uint64_t by_kind[int(Kind::kCount)] = {};
  testing::FaultStats faults;

  std::vector<uint64_t> pack() const {
    std::vector<uint64_t> v = {rounds,    transfers, ok,          failed,   unexplained,
                               deadline,  hangs,     double_done, bytes,    verified_bytes,
                               corrupted, lost_imms, extra_imms,  imms,     lost_msgs,
                               dup_msgs,  bad_msgs,  msgs,        restarts, fail_fast};
    v.insert(v.end(), by_kind, by_kind + int(Kind::kCount));
    const auto& f = faults;
    v.insert(v.end(), {f.completions, f.delayed, f.held_back, f.short_posts, f.split_writes,
                       f.split_pieces, f.failed_completions, f.failed_posts, f.stale_delivered,
                       f.stale_dropped, f.coalesced});
    return v;
  }
  void add(const std::vector<uint64_t>& v) {
    uint64_t* fields[] = {&rounds,    &transfers, &ok,          &failed,   &unexplained,
                          &deadline,  &hangs,     &double_done, &bytes,    &verified_bytes,
                          &corrupted, &lost_imms, &extra_imms,  &imms,     &lost_msgs,
                          &dup_msgs,  &bad_msgs,  &msgs,        &restarts, &fail_fast};
    size_t i = 0;
    for (auto* f : fields) *f += v[i++];
    for (int k = 0; k < int(Kind::kCount); ++k) by_kind[k] += v[i++];
    auto& f = faults;
    for (auto* p : {&f.completions, &f.delayed, &f.held_back, &f.short_posts, &f.split_writes,
                    &f.split_pieces, &f.failed_completions, &f.failed_posts, &f.stale_delivered,
                    &f.stale_dropped, &f.coalesced})
      *p += v[i++];
  }
};

}  // namespace ferry::soak

// The receive plan as the kernels read it (proxy.h write_plan): one header for
// the CUDA kernels and for the host-side stand-in the proxy tests use, so both
// locate a received row by the same arithmetic. ReceivePlan::for_each_row in
// routing.h is the model it is tested against.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FERRY_MOE_HD __host__ __device__ __forceinline__
#else
#define FERRY_MOE_HD inline
#endif

namespace ferry::moe {

enum RowFrom : uint32_t { kFromOwnSend = 0, kFromPeerSend = 1, kFromRecv = 2 };

struct PlanView {
  uint32_t N, L, me, S, P;
  const uint32_t* cnt;       // [N*L], source-major
  const uint32_t* src_base;  // [N]
  const uint32_t* cso;       // [N] combine send offset
  const uint32_t* eoff;      // [L] padded output offset
  const uint32_t* etot;      // [L]

  FERRY_MOE_HD static PlanView of(const uint32_t* w, uint32_t N, uint32_t L, uint32_t me,
                                  uint32_t S, uint32_t P) {
    PlanView v{
        N, L, me, S, P, w, w + N * L, w + N * L + N, w + N * L + 2 * N, w + N * L + 2 * N + L};
    return v;
  }
  FERRY_MOE_HD bool same_node(uint32_t a, uint32_t b) const { return a / S == b / S; }
};

// Derived tables, sequential (E <= 512 entries): item_pre[L*N + 1] exclusive
// prefix of rows in (expert, source) order; stream_pre[N*L] rows a source
// sends this rank for earlier experts; ovf[N] first shared-region row.
FERRY_MOE_HD void derive(const PlanView& v, uint32_t* item_pre, uint32_t* stream_pre,
                         uint32_t* ovf) {
  uint32_t acc = 0;
  for (uint32_t l = 0; l < v.L; ++l)
    for (uint32_t s = 0; s < v.N; ++s) {
      item_pre[l * v.N + s] = acc;
      acc += v.cnt[s * v.L + l];
    }
  item_pre[v.L * v.N] = acc;
  uint32_t off = v.N * v.P;
  for (uint32_t s = 0; s < v.N; ++s) {
    uint32_t run = 0;
    for (uint32_t l = 0; l < v.L; ++l) {
      stream_pre[s * v.L + l] = run;
      run += v.cnt[s * v.L + l];
    }
    ovf[s] = off;
    if (!v.same_node(s, v.me) && run > v.P) off += run - v.P;
  }
}

struct RowLoc {
  uint32_t out_row;
  uint32_t src;
  uint32_t from;         // RowFrom
  uint32_t read_row;     // row in the buffer `from` names
  uint32_t combine_row;  // row of src's combine receive buffer
  uint32_t send_row;     // row of this rank's combine send buffer
};

FERRY_MOE_HD RowLoc locate(const PlanView& v, const uint32_t* item_pre, const uint32_t* stream_pre,
                           const uint32_t* ovf, uint32_t i) {
  // Largest idx with item_pre[idx] <= i (empty (expert, source) cells share
  // a prefix value; upper bound skips them).
  uint32_t lo = 0, hi = v.L * v.N;  // item_pre[hi] = total > i
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (item_pre[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  const uint32_t l = lo / v.N, s = lo % v.N, j = i - item_pre[lo];
  RowLoc r;
  r.out_row = v.eoff[l] + (item_pre[lo] - item_pre[l * v.N]) + j;
  r.src = s;
  const uint32_t q = stream_pre[s * v.L + l] + j;
  r.combine_row = v.src_base[s] + q;
  r.send_row = v.cso[s] + q;
  if (s == v.me) {
    r.from = kFromOwnSend;
    r.read_row = r.combine_row;
  } else if (q < v.P) {
    r.from = kFromRecv;
    r.read_row = s * v.P + q;
  } else if (v.same_node(s, v.me)) {
    r.from = kFromPeerSend;
    r.read_row = r.combine_row;
  } else {
    r.from = kFromRecv;
    r.read_row = ovf[s] + (q - v.P);
  }
  return r;
}

}  // namespace ferry::moe

// MoE all-to-all geometry and layout (docs/MOE.md): plain C++ shared by the
// host proxy, the kernels' launch code and the tests. Everything here is a
// pure function of the configuration and the per-expert counts every rank
// publishes, so sender and receiver compute the same offsets without talking.
//
// Terms: N ranks, E experts block-partitioned (rank r owns experts
// [r*L, (r+1)*L), L = E/N), K experts per token, T tokens per rank at most,
// P = max_private_tokens, S ranks per NVLink node (node = rank / S).
//
// Sender layout (send buffer of rank s): every (token, k) pair of s in
// expert order, so the pairs for destination d are one contiguous run
// starting at base(s, d) = sum of s's counts for experts < d*L.
//
// Receiver layout (dispatch receive buffer of rank d, in token rows):
//   [0, N*P)            private rows, P per source: the first P rows s sends
//                       to d land at s*P (speculative round, no routes needed)
//   [N*P, N*P + N*T*min(K, L))   one shared overflow region: the rest of
//                       each remote-node source's rows, packed in source order
// Same-node sources push their first P rows into the private rows over NVLink
// and the receiver pulls the rest from the source's send buffer; rank d's own
// rows are read from its own send buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::moe {

struct Geometry {
  uint32_t world = 1;
  uint32_t rank = 0;
  uint32_t node_size = 1;  // ranks that share NVLink (world % node_size == 0)
  uint32_t num_experts = 1;
  uint32_t experts_per_token = 1;
  uint32_t max_tokens = 1;
  uint32_t expert_padding = 1;
  uint32_t max_private_tokens = 0;

  // Validates (kInvalidArgument naming the field) and returns the geometry.
  static Geometry make(uint32_t world, uint32_t rank, uint32_t node_size, uint32_t num_experts,
                       uint32_t experts_per_token, uint32_t max_tokens, uint32_t expert_padding,
                       uint32_t max_private_tokens);

  uint32_t local_experts() const { return num_experts / world; }
  uint32_t node_of(uint32_t r) const { return r / node_size; }
  bool same_node(uint32_t a, uint32_t b) const { return node_of(a) == node_of(b); }
  uint32_t local_index(uint32_t r) const { return r % node_size; }
  uint32_t remote_ranks() const { return world - node_size; }
  // Rows a rank can receive: private rows plus the shared region.
  uint64_t recv_rows() const;
  uint64_t shared_rows() const;  // N*T*min(K, L): rows a rank can get at most
  // Rows of the expert-major padded output (what out_expert_x must hold).
  uint64_t max_out_rows() const;
  // Rows of the combine receive buffer: one per (token, k) pair.
  uint64_t combine_rows() const { return uint64_t{max_tokens} * experts_per_token; }
};

// The default speculative round: 1.2x the even share of a destination's
// experts, at least one token (what a uniform router sends each rank).
uint32_t default_max_private_tokens(uint32_t world, uint32_t num_experts,
                                    uint32_t experts_per_token, uint32_t max_tokens);

// Bytes of one dispatched row: payload, then fp32 block scales, each 16-aligned.
uint64_t dispatch_stride(uint64_t hidden, uint64_t in_elem_size, uint64_t hidden_scale);
uint64_t combine_stride(uint64_t hidden, uint64_t out_elem_size);

// Immediates an AllToAll uses (docs/MOE.md "Immediates"): the top nibble is
// 0xF, the instance takes 24 bits, the kind 4. Users keep to imm < 0xF0000000.
enum class ImmKind : uint32_t { kRoute = 0, kDispatch = 1, kCombine = 2, kBarrier = 3 };
inline constexpr uint32_t kImmBase = 0xF0000000u;
inline constexpr uint32_t kMaxInstance = (1u << 24) - 1;
uint32_t imm_of(uint32_t instance, ImmKind kind);

// What every rank's published counts imply. `counts` is the N x E matrix of
// per-expert (token, k) counts, row s published by rank s.
class Routes {
 public:
  Routes(const Geometry& g, std::span<const uint32_t> counts);

  const Geometry& geometry() const { return g_; }
  uint32_t count(uint32_t src, uint32_t expert) const {
    return c_[size_t{src} * g_.num_experts + expert];
  }
  // Rows src sends to dst, and where they start in src's send layout.
  uint32_t rows(uint32_t src, uint32_t dst) const;
  uint32_t base(uint32_t src, uint32_t dst) const;
  uint32_t private_rows(uint32_t src, uint32_t dst) const;
  // Rows of src -> dst that go into dst's shared region (remote nodes only).
  uint32_t overflow_rows(uint32_t src, uint32_t dst) const;
  // Row in dst's receive buffer where src's overflow starts.
  uint64_t overflow_offset(uint32_t src, uint32_t dst) const;
  // Rows dst receives in all; false if they exceed its buffers (a token that
  // names one expert twice, or counts that do not match max_tokens).
  uint64_t received(uint32_t dst) const;
  bool fits(uint32_t dst) const;

 private:
  Geometry g_;
  std::span<const uint32_t> c_;
};

// Where one received row comes from.
enum class Source : uint8_t {
  kOwnSend,   // this rank's own send buffer
  kPeerSend,  // a same-node peer's send buffer (NVLink pull)
  kRecv,      // this rank's receive buffer (private rows or shared region)
};

// The receiver's view for rank g.rank: everything the kernels need, in the
// compact form the proxy hands them (ReceivePlan::words).
struct ReceivePlan {
  // Per source, per local expert: rows (N x L).
  std::vector<uint32_t> cnt;
  // Per source: where the rows for this rank start in the source's layout.
  std::vector<uint32_t> src_base;
  // Per local expert: total rows and first padded output row.
  std::vector<uint32_t> expert_total;
  std::vector<uint32_t> expert_offset;
  // Per source: first row of its block in this rank's combine send buffer.
  std::vector<uint32_t> combine_send_offset;
  uint64_t out_rows = 0;  // padded rows used

  static ReceivePlan make(const Routes& routes);

  // One received row: output row, where to read it, and where it goes back.
  struct Row {
    uint32_t out_row;
    uint32_t src;
    uint32_t stream_index;  // index among the rows src sends to this rank
    Source from;
    uint64_t read_row;     // row in the buffer `from` names
    uint64_t combine_row;  // row of src's combine receive buffer it returns to
  };
  // Visits rows in output order (expert, then source, then stream order).
  // The kernels compute the same thing per row in parallel; this is the model.
  template <typename F>
  void for_each_row(const Routes& routes, F&& f) const;
};

// Immediates each rank receives per iteration.
struct ExpectedImms {
  uint32_t route;     // one routes row from every other rank
  uint32_t dispatch;  // private + overflow write from every remote-node rank
  uint32_t combine;   // one write from every remote-node rank
  uint32_t barrier;
};
ExpectedImms expected_imms(const Geometry& g);

// ---------------------------------------------------------------------------

template <typename F>
void ReceivePlan::for_each_row(const Routes& routes, F&& f) const {
  const Geometry& g = routes.geometry();
  const uint32_t L = g.local_experts(), N = g.world, me = g.rank;
  for (uint32_t l = 0; l < L; ++l) {
    uint32_t out = expert_offset[l];
    for (uint32_t s = 0; s < N; ++s) {
      uint32_t before = 0;  // rows s sends to me for experts < l
      for (uint32_t k = 0; k < l; ++k) before += cnt[size_t{s} * L + k];
      for (uint32_t j = 0; j < cnt[size_t{s} * L + l]; ++j) {
        Row r{};
        r.out_row = out++;
        r.src = s;
        r.stream_index = before + j;
        const uint32_t q = r.stream_index;
        r.combine_row = uint64_t{src_base[s]} + q;
        if (s == me) {
          r.from = Source::kOwnSend;
          r.read_row = r.combine_row;
        } else if (q < g.max_private_tokens) {
          r.from = Source::kRecv;
          r.read_row = uint64_t{s} * g.max_private_tokens + q;
        } else if (g.same_node(s, me)) {
          r.from = Source::kPeerSend;
          r.read_row = r.combine_row;
        } else {
          r.from = Source::kRecv;
          r.read_row = routes.overflow_offset(s, me) + (q - g.max_private_tokens);
        }
        f(r);
      }
    }
  }
}

}  // namespace ferry::moe

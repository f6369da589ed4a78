#include "moe/routing.h"

#include <algorithm>
#include <string>

#include "ferry/status.h"

namespace ferry::moe {
namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(Code::kInvalidArgument, "moe: " + what);
}

uint64_t round_up(uint64_t v, uint64_t m) {
  return (v + m - 1) / m * m;
}

}  // namespace

Geometry Geometry::make(uint32_t world, uint32_t rank, uint32_t node_size, uint32_t num_experts,
                        uint32_t experts_per_token, uint32_t max_tokens, uint32_t expert_padding,
                        uint32_t max_private_tokens) {
  if (world == 0 || world > 512) bad("world size must be 1..512, got " + std::to_string(world));
  if (rank >= world)
    bad("rank " + std::to_string(rank) + " outside world " + std::to_string(world));
  if (node_size == 0 || world % node_size != 0)
    bad("node size " + std::to_string(node_size) + " must divide world " + std::to_string(world));
  if (node_size > 8) bad("node size must be at most 8, got " + std::to_string(node_size));
  if (num_experts == 0 || num_experts > 512 || num_experts % world != 0)
    bad("num_experts must be 1..512 and a multiple of the world size, got " +
        std::to_string(num_experts));
  if (experts_per_token == 0 || experts_per_token > 8)
    bad("experts_per_token must be 1..8, got " + std::to_string(experts_per_token));
  if (max_tokens == 0 || max_tokens > 4096)
    bad("max_num_tokens must be 1..4096, got " + std::to_string(max_tokens));
  if (expert_padding == 0 || expert_padding > 1024)
    bad("expert_padding must be 1..1024, got " + std::to_string(expert_padding));
  if (max_private_tokens > max_tokens * experts_per_token)
    bad("max_private_tokens " + std::to_string(max_private_tokens) + " exceeds max_num_tokens * k");
  Geometry g{world,      rank,           node_size,         num_experts, experts_per_token,
             max_tokens, expert_padding, max_private_tokens};
  return g;
}

uint64_t Geometry::shared_rows() const {
  // A token sends each destination at most min(K, L) rows (distinct experts).
  return uint64_t{world} * max_tokens * std::min(experts_per_token, local_experts());
}

uint64_t Geometry::recv_rows() const {
  return uint64_t{world} * max_private_tokens + shared_rows();
}

uint64_t Geometry::max_out_rows() const {
  // Sum over experts of round_up(total_l, pad) is a multiple of pad and at
  // most sum(total_l + pad - 1); each total_l is at most N*T.
  const uint64_t pad = expert_padding, L = local_experts();
  const uint64_t a = (shared_rows() + L * (pad - 1)) / pad * pad;
  const uint64_t b = L * round_up(uint64_t{world} * max_tokens, pad);
  return std::max<uint64_t>(std::min(a, b), 1);
}

uint32_t default_max_private_tokens(uint32_t world, uint32_t num_experts,
                                    uint32_t experts_per_token, uint32_t max_tokens) {
  const uint64_t even = (uint64_t{max_tokens} * experts_per_token + world - 1) / world;
  const uint64_t p = std::max<uint64_t>(1, (even * 6 + 4) / 5);
  (void)num_experts;
  return static_cast<uint32_t>(std::min<uint64_t>(p, uint64_t{max_tokens} * experts_per_token));
}

uint64_t dispatch_stride(uint64_t hidden, uint64_t in_elem_size, uint64_t hidden_scale) {
  return round_up(hidden * in_elem_size, 16) + round_up(hidden_scale * 4, 16);
}

uint64_t combine_stride(uint64_t hidden, uint64_t out_elem_size) {
  return round_up(hidden * out_elem_size, 16);
}

uint32_t imm_of(uint32_t instance, ImmKind kind) {
  if (instance > kMaxInstance) bad("instance " + std::to_string(instance) + " above 2^24-1");
  return kImmBase | (instance << 4) | static_cast<uint32_t>(kind);
}

Routes::Routes(const Geometry& g, std::span<const uint32_t> counts) : g_(g), c_(counts) {
  if (counts.size() != size_t{g.world} * g.num_experts)
    bad("routes matrix has " + std::to_string(counts.size()) + " entries, expected N*E");
}

uint32_t Routes::rows(uint32_t src, uint32_t dst) const {
  const uint32_t L = g_.local_experts();
  uint32_t n = 0;
  for (uint32_t e = dst * L; e < (dst + 1) * L; ++e) n += count(src, e);
  return n;
}

uint32_t Routes::base(uint32_t src, uint32_t dst) const {
  uint32_t n = 0;
  for (uint32_t e = 0; e < dst * g_.local_experts(); ++e) n += count(src, e);
  return n;
}

uint32_t Routes::private_rows(uint32_t src, uint32_t dst) const {
  return std::min(rows(src, dst), g_.max_private_tokens);
}

uint32_t Routes::overflow_rows(uint32_t src, uint32_t dst) const {
  if (g_.same_node(src, dst)) return 0;
  return rows(src, dst) - private_rows(src, dst);
}

uint64_t Routes::overflow_offset(uint32_t src, uint32_t dst) const {
  uint64_t off = uint64_t{g_.world} * g_.max_private_tokens;
  for (uint32_t s = 0; s < src; ++s) off += overflow_rows(s, dst);
  return off;
}

uint64_t Routes::received(uint32_t dst) const {
  uint64_t n = 0;
  for (uint32_t s = 0; s < g_.world; ++s) n += rows(s, dst);
  return n;
}

bool Routes::fits(uint32_t dst) const {
  // Every source's rows must fit its send layout, and the receiver's shared
  // region and padded output must hold what arrives.
  for (uint32_t s = 0; s < g_.world; ++s) {
    uint64_t sent = 0;
    for (uint32_t e = 0; e < g_.num_experts; ++e) sent += count(s, e);
    if (sent > g_.combine_rows()) return false;
  }
  if (received(dst) > g_.shared_rows()) return false;
  if (overflow_offset(g_.world, dst) > g_.recv_rows()) return false;
  uint64_t out = 0;
  const uint32_t L = g_.local_experts();
  for (uint32_t l = 0; l < L; ++l) {
    uint64_t t = 0;
    for (uint32_t s = 0; s < g_.world; ++s) t += count(s, dst * L + l);
    out += round_up(t, g_.expert_padding);
  }
  return out <= g_.max_out_rows();
}

ReceivePlan ReceivePlan::make(const Routes& routes) {
  const Geometry& g = routes.geometry();
  const uint32_t N = g.world, L = g.local_experts(), me = g.rank;
  ReceivePlan p;
  p.cnt.resize(size_t{N} * L);
  p.src_base.resize(N);
  p.expert_total.assign(L, 0);
  p.expert_offset.resize(L);
  p.combine_send_offset.resize(N);
  uint32_t send_off = 0;
  for (uint32_t s = 0; s < N; ++s) {
    p.src_base[s] = routes.base(s, me);
    p.combine_send_offset[s] = send_off;
    for (uint32_t l = 0; l < L; ++l) {
      const uint32_t c = routes.count(s, me * L + l);
      p.cnt[size_t{s} * L + l] = c;
      p.expert_total[l] += c;
      send_off += c;
    }
  }
  uint64_t off = 0;
  for (uint32_t l = 0; l < L; ++l) {
    p.expert_offset[l] = static_cast<uint32_t>(off);
    off += round_up(p.expert_total[l], g.expert_padding);
  }
  p.out_rows = off;
  return p;
}

ExpectedImms expected_imms(const Geometry& g) {
  return {g.world - 1, 2 * g.remote_ranks(), g.remote_ranks(), g.world - 1};
}

}  // namespace ferry::moe

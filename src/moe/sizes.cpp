// Sizes of an AllToAll's buffers: plain arithmetic, in every build.
#include "moe/sizes.h"

#include <string>

namespace ferry::moe {
namespace {
uint64_t align(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
}  // namespace

size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1;
}

Geometry geometry_of(const AllToAllConfig& c, uint32_t* private_tokens) {
  const uint32_t P = c.max_private_tokens
                         ? c.max_private_tokens
                         : default_max_private_tokens(c.world_size, c.num_experts,
                                                      c.experts_per_token, c.max_num_tokens);
  if (private_tokens) *private_tokens = P;
  return Geometry::make(c.world_size, c.rank, c.node_size, c.num_experts, c.experts_per_token,
                        c.max_num_tokens, c.expert_padding, P);
}

BufferSizes buffer_size_hint(const AllToAllConfig& c) {
  if (c.hidden == 0 || c.hidden > 8192)
    throw Error(Code::kInvalidArgument,
                "moe: hidden must be 1..8192, got " + std::to_string(c.hidden));
  if (c.out_dtype == DType::kF8E4M3)
    throw Error(Code::kInvalidArgument, "moe: out_dtype must be f32 or bf16");
  uint32_t P = 0;
  const Geometry g = geometry_of(c, &P);
  BufferSizes s{};
  s.out_rows = g.max_out_rows();
  s.dispatch_stride = dispatch_stride(c.hidden, dtype_size(c.in_dtype), c.hidden_scale);
  s.combine_stride = combine_stride(c.hidden, dtype_size(c.out_dtype));
  s.recv_rows = g.recv_rows();
  s.max_private_tokens = P;
  s.bytes = align(4096, 4096) + align(g.combine_rows() * s.dispatch_stride, 4096) +
            align(g.recv_rows() * s.dispatch_stride, 4096) +
            align(g.shared_rows() * s.combine_stride, 4096) +
            align(g.combine_rows() * s.combine_stride, 4096);
  return s;
}

}  // namespace ferry::moe

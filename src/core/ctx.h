// Completion contexts the worker gives every post: tag(8) | generation(24) |
// slot(32). The generation makes a late completion of a recycled slot
// harmless. Wrappers that post on their own (the fault injector) use a tag
// of their own in the same layout.
#pragma once

#include <cstdint>

namespace ferry::core {

// kTagFast: an immediate or send posted without a slot (worker_fast_posts.cpp);
// its "slot" is a position in the worker's table of such posts.
enum : uint64_t { kTagWrite = 1, kTagSend = 2, kTagRecv = 3, kTagFast = 4 };

inline uint64_t make_ctx(uint64_t tag, uint32_t gen, uint32_t idx) {
  return tag << 56 | uint64_t(gen & 0xFFFFFF) << 32 | idx;
}
inline uint64_t ctx_tag(uint64_t ctx) {
  return ctx >> 56;
}
inline uint32_t ctx_gen(uint64_t ctx) {
  return uint32_t(ctx >> 32) & 0xFFFFFF;
}
inline uint32_t ctx_idx(uint64_t ctx) {
  return uint32_t(ctx);
}

}  // namespace ferry::core

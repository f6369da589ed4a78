// Prepared transfers: a single, paged or scatter request validated once on
// the submitting side and shared by every submit. Each submit resolves its
// peers again (one cached lookup per NIC, so a peer that restarted or failed
// is noticed) and then runs the base kind's operation; nothing is copied or
// allocated per page.
#include <fmt/format.h>

#include "core/ops.h"

namespace ferry::core::ops {

namespace {

const RegRef& source_of(const PreparedBase& b) {
  return std::visit([](const auto& r) -> const RegRef& { return r.src; }, b);
}

}  // namespace

Status prepare(Slot& s, PreparedReq& r, OpHost& h) {
  if (source_of(r.shape->req)->retired.load(std::memory_order_acquire))
    return Status(Code::kFailedPrecondition,
                  "prepared transfer: its source region was unregistered (unreg_mr); prepare it "
                  "again from a registered region");
  return std::visit([&](const auto& b) { return ops::prepare(s, b, h); }, r.shape->req);
}

ShardPlan plan(Slot& s, const PreparedReq& r, OpHost& h) {
  return std::visit([&](const auto& b) { return ops::plan(s, b, h); }, r.shape->req);
}

PostStep post(Slot& s, const PreparedReq& r, Cursor& c, const PostTarget& t, OpHost& h) {
  return std::visit([&](const auto& b) { return ops::post(s, b, c, t, h); }, r.shape->req);
}

const NetAddr* peer(const PreparedReq& r, uint8_t nic) {
  return std::visit([&](const auto& b) { return ops::peer(b, nic); }, r.shape->req);
}

}  // namespace ferry::core::ops

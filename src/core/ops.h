// One operation per transfer kind (single, paged, scatter, barrier, send; an
// immediate is a zero-byte single write). Each kind's steps live in one file,
// op_<kind>.cpp, and the worker reaches them through one std::visit per step:
//
//   prepare  resolve peers and local descriptors once (worker thread)
//   plan     cut the transfer into shards, one cursor per NIC ring
//   post     hand a cursor's next writes to its NIC (fill WriteDescs, or a
//            page list, or a send), advancing the cursor past what was taken
//   peer     the address a transport failure on NIC `nic` is blamed on
//   release  give back what the request holds when its slot is freed
//
// A new request kind is one new request type in requests.h and one file here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/domain.h"
#include "core/requests.h"
#include "core/sharding.h"
#include "core/stats.h"
#include "core/transfer.h"

namespace ferry::core {

struct BufferPool;
class SendBuffers;

// What an operation may use of its worker.
class OpHost {
 public:
  virtual ~OpHost() = default;
  // Provider peer id of `addr` on NIC `nic` (cached); sets *err when it cannot.
  virtual PeerId resolve(uint8_t nic, const NetAddr& addr, Status* err) = 0;
  // The resolved peers ([target * kMaxNics + nic]) of a peer group of
  // `targets` targets; null with *err set when it is unknown, stale or the
  // wrong size.
  virtual const std::vector<PeerId>* group_peers(PeerGroupHandle g, size_t targets,
                                                 Status* err) = 0;
  uint8_t nic_count = 1;
  uint32_t* rr = nullptr;  // the group's rotating NIC cursor (sharding.h)
  BufferPool* send_pool = nullptr;
  SendBuffers* send_free = nullptr;
  // The send pool's registration: the source of immediates (set by the
  // engine once its workers run, before anything can be submitted).
  const RegRef* send_reg = nullptr;
};

// The NIC a post goes to, and room for one batch of writes.
struct PostTarget {
  Domain* domain = nullptr;
  const DomainInfo* info = nullptr;
  uint8_t nic = 0;
  size_t want = 0;  // at most this many writes (pages, sends)
  std::span<WriteDesc> batch;
  uint32_t* units = nullptr;  // batch.size() entries: the unit each write came from
};

// What one post did: `tried` writes offered, `result.posted` taken.
struct PostStep {
  size_t tried = 0;
  PostResult result;
  uint64_t bytes = 0;  // bytes of the writes taken (statistics)
};

namespace ops {

Status prepare(Slot& s, const SingleReq& r, OpHost& h);
Status prepare(Slot& s, const PagedReq& r, OpHost& h);
Status prepare(Slot& s, const ScatterReq& r, OpHost& h);
Status prepare(Slot& s, BarrierReq& r, OpHost& h);
Status prepare(Slot& s, SendReq& r, OpHost& h);
Status prepare(Slot& s, PreparedReq& r, OpHost& h);

ShardPlan plan(Slot& s, const SingleReq& r, OpHost& h);
ShardPlan plan(Slot& s, const PagedReq& r, OpHost& h);
ShardPlan plan(Slot& s, const ScatterReq& r, OpHost& h);
ShardPlan plan(Slot& s, const BarrierReq& r, OpHost& h);
ShardPlan plan(Slot& s, const SendReq& r, OpHost& h);
ShardPlan plan(Slot& s, const PreparedReq& r, OpHost& h);

PostStep post(Slot& s, const SingleReq& r, Cursor& c, const PostTarget& t, OpHost& h);
PostStep post(Slot& s, const PagedReq& r, Cursor& c, const PostTarget& t, OpHost& h);
PostStep post(Slot& s, const ScatterReq& r, Cursor& c, const PostTarget& t, OpHost& h);
PostStep post(Slot& s, const BarrierReq& r, Cursor& c, const PostTarget& t, OpHost& h);
PostStep post(Slot& s, const SendReq& r, Cursor& c, const PostTarget& t, OpHost& h);
PostStep post(Slot& s, const PreparedReq& r, Cursor& c, const PostTarget& t, OpHost& h);

// Point-to-point kinds name their peer; group kinds fail only their transfer.
inline const NetAddr* peer(const SingleReq& r, uint8_t nic) {
  return r.dst.nics[nic].addr;
}
inline const NetAddr* peer(const PagedReq& r, uint8_t nic) {
  return r.dst.nics[nic].addr;
}
inline const NetAddr* peer(const ScatterReq&, uint8_t) {
  return nullptr;
}
inline const NetAddr* peer(const BarrierReq&, uint8_t) {
  return nullptr;
}
inline const NetAddr* peer(const SendReq& r, uint8_t) {
  return r.addr;
}
const NetAddr* peer(const PreparedReq& r, uint8_t nic);

inline void release(SingleReq&, OpHost&) {}
inline void release(PagedReq&, OpHost&) {}
inline void release(ScatterReq&, OpHost&) {}
inline void release(BarrierReq&, OpHost&) {}
void release(SendReq& r, OpHost& h);
inline void release(PreparedReq&, OpHost&) {}

// The immediate a request carries.
inline std::optional<uint32_t> imm_of(const SingleReq& r) {
  return r.imm;
}
inline std::optional<uint32_t> imm_of(const PagedReq& r) {
  return r.imm;
}
inline std::optional<uint32_t> imm_of(const ScatterReq& r) {
  return r.imm;
}
inline std::optional<uint32_t> imm_of(const BarrierReq& r) {
  return r.imm;
}
inline std::optional<uint32_t> imm_of(const SendReq&) {
  return std::nullopt;
}
inline std::optional<uint32_t> imm_of(const PreparedReq& r) {
  return r.imm;
}

// Shared by the kinds that post WriteDescs: fill a batch with `fill`, post it,
// and move the cursor back to the first write the NIC did not take.
template <typename Fill>
PostStep post_filled(Cursor& c, const PostTarget& t, Fill&& fill) {
  PostStep step;
  const size_t want = std::min(t.want, t.batch.size());
  step.tried = fill(t.batch.first(want), t.units);
  if (step.tried == 0) return step;
  step.result = t.domain->post_writes(t.batch.first(step.tried));
  if constexpr (kStatsEnabled)
    for (size_t i = 0; i < step.result.posted; ++i) step.bytes += t.batch[i].len;
  if (step.result.posted < step.tried) c.next = t.units[step.result.posted];
  return step;
}

}  // namespace ops
}  // namespace ferry::core

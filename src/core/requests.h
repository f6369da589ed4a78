// What a submitter hands a worker: one request type per transfer kind, and
// the internal requests (receive re-posts, control calls).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/addr_table.h"
#include "core/domain.h"
#include "core/sharding.h"
#include "ferry/engine.h"

namespace ferry::core {

using Clock = std::chrono::steady_clock;

// A registered region and its per-NIC registrations. Shared by the engine's
// table and by transfers in flight, so an unregistered region stays valid
// until the NICs are done with it; destroyed on its worker thread.
struct Registration {
  uint64_t id = 0;
  uint8_t* ptr = nullptr;
  uint64_t len = 0;
  Device device;
  size_t group = 0;
  std::vector<std::unique_ptr<DomainMr>> mrs;  // one per NIC of the group
  std::array<void*, kMaxNics> local_desc{};
  // Set by unreg_mr: prepared transfers holding the region fail from then on.
  std::atomic<bool> retired{false};
};
using RegRef = std::shared_ptr<Registration>;

// What a write needs of a destination descriptor, held without heap
// allocation and without touching the caller's address: addresses are the
// engine's interned copies (core/addr_table.h), alive as long as the table.
struct DstRef {
  struct Nic {
    const NetAddr* addr = nullptr;
    uint64_t rkey = 0;
    uint64_t base = 0;
  };
  std::array<Nic, kMaxNics> nics{};
  uint8_t count = 0;
  static DstRef of(const MrDesc& d, AddrTable& addrs) {
    DstRef r;
    r.count = static_cast<uint8_t>(std::min(d.nics.size(), kMaxNics));
    for (size_t i = 0; i < r.count; ++i)
      r.nics[i] = Nic{addrs.intern(d.nics[i].addr), d.nics[i].rkey, d.nics[i].base};
    return r;
  }
};

struct SingleReq {
  RegRef src;  // null: an immediate (len 0), written from the send pool
  uint64_t src_offset = 0, len = 0;
  DstRef dst;
  uint64_t dst_offset = 0;
  std::optional<uint32_t> imm;
  WriteRoute route;
};
struct PagedReq {
  RegRef src;
  uint64_t page_len = 0;
  Pages src_pages, dst_pages;
  DstRef dst;
  std::optional<uint32_t> imm;
};
struct ScatterReq {
  RegRef src;
  std::vector<ScatterDst> dsts;
  std::optional<PeerGroupHandle> group;
  std::optional<uint32_t> imm;
  GroupRoute route;
};
struct BarrierReq {
  std::vector<MrDesc> dsts;
  std::optional<PeerGroupHandle> group;
  uint32_t imm = 0;
  GroupRoute route;
};
struct SendReq {
  const NetAddr* addr = nullptr;  // interned (core/addr_table.h)
  uint32_t buffer = 0;            // index into the engine's send pool
  uint64_t len = 0;
};
// A transfer shape validated once (TransferEngine::prepare_*) and posted many
// times: the submitter only adds the immediate. The base request carries no
// immediate of its own.
using PreparedBase = std::variant<SingleReq, PagedReq, ScatterReq>;
struct PreparedReq {
  std::shared_ptr<const PreparedTransfer::State> shape;
  std::optional<uint32_t> imm;
};
struct RecvPostReq {
  uint32_t pool = 0;
  uint32_t buffer = 0;
};
// Runs on the worker thread. Captures only what it owns (shared state, not
// the caller's stack): a caller that timed out leaves it safe to run later.
struct ControlReq {
  std::function<void()> fn;
};

// One alternative per transfer kind; each has its operation in op_<kind>.cpp.
using TransferReq = std::variant<SingleReq, PagedReq, ScatterReq, BarrierReq, SendReq, PreparedReq>;
using Request = std::variant<SingleReq, PagedReq, ScatterReq, BarrierReq, SendReq, PreparedReq,
                             RecvPostReq, ControlReq>;

// The one-line forms of a command: whole in the first line of its ring cell
// (with the cell's sequence number and the fields before them), so the worker
// reads that line and nothing else and the hand-off moves one line instead of
// the four or five a request in `req` fills. Each form starts with `kind`;
// the union's members share it (a common initial sequence). Plain aggregates:
// a union of members with initialisers would have no default constructor.
enum class FastKind : uint8_t { kNone, kImm, kSend, kRecvPost };
// An immediate with no OnDone to a group of one NIC.
struct FastImm {
  FastKind kind;
  uint32_t imm;
  const NetAddr* addr;  // interned
  uint64_t rkey;
  uint64_t base;
};
// A send with no OnDone: SendReq.
struct FastSend {
  FastKind kind;
  uint32_t buffer;
  const NetAddr* addr;  // interned
  uint64_t len;
};
// A receive buffer the user has seen, back to the NIC: RecvPostReq.
struct FastRecvPost {
  FastKind kind;
  uint32_t pool;
  uint32_t buffer;
};
union FastCmd {
  struct Tag {
    FastKind kind;
  } tag = {FastKind::kNone};  // kNone: the command is in `req`
  FastImm imm;
  FastSend send;
  FastRecvPost recv_post;
  FastKind kind() const { return tag.kind; }
  // A one-line immediate or send: what Worker::post_fast posts without a slot.
  bool postable() const { return tag.kind == FastKind::kImm || tag.kind == FastKind::kSend; }
};

struct Command {
  // The first 56 bytes: a one-line command whole.
  TransferId id = 0;
  Clock::time_point deadline{};  // epoch = none
  int64_t submit_ns = 0;         // core::now_ns() at submit (statistics; 0 = not taken)
  FastCmd fast;                  // kImm, kSend: admitted, no OnDone; the fields below are not read
  bool is_fast() const { return fast.kind() != FastKind::kNone; }
  bool admitted = false;  // counted in the group's requests in flight
  OnDone on_done;
  Request req;
};
// The ring cell's sequence number takes the line's first 8 bytes.
static_assert(sizeof(TransferId) + sizeof(Clock::time_point) + sizeof(int64_t) + sizeof(FastCmd) <=
              56);
static_assert(std::is_standard_layout_v<FastCmd> && std::is_standard_layout_v<FastImm> &&
              std::is_standard_layout_v<FastSend> && std::is_standard_layout_v<FastRecvPost>);

}  // namespace ferry::core

// The library's side of a prepared transfer (ferry/engine.h).
struct ferry::PreparedTransfer::State {
  core::PreparedBase req;
  size_t group = 0;              // the worker that owns the source region
  const void* engine = nullptr;  // the engine that prepared it
  uint64_t incarnation = 0;      // ...and its incarnation: an address can be reused
  // The destination's interned addresses stay valid as long as this.
  std::shared_ptr<const core::AddrTable> addrs;
};

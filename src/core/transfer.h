// A transfer while its worker owns it: its slot and the cursors over its
// shards that wait in the NICs' rings.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/requests.h"
#include "core/sharding.h"

namespace ferry::core {

inline constexpr uint32_t kNoSlot = UINT32_MAX;

// Per-transfer state, tracked by slot index (no maps on the datapath).
struct Slot {
  uint32_t gen = 0;
  bool active = false;
  bool finished = false;  // user already signalled (deadline or error); draining
  bool admitted = false;
  TransferId id = 0;
  OnDone on_done;
  Clock::time_point deadline{};
  // Intrusive list of slots with a deadline, in deadline order.
  uint32_t dl_prev = kNoSlot, dl_next = kNoSlot;
  bool on_deadline_list = false;
  uint32_t cursors_live = 0;
  uint64_t posted = 0, completed = 0;
  Status error;
  TransferReq req;
  // The immediate every write carries (none: plain writes), from the request
  // or, for a prepared transfer, from its submit.
  std::optional<uint32_t> imm;
  // Resolved per NIC: local source descriptor; single/paged destination.
  std::array<void*, kMaxNics> src_desc{};
  std::array<PeerId, kMaxNics> peer{};
  Split split;
  // Scatter / barrier: peers[target * kMaxNics + nic].
  std::vector<PeerId> peers;
  const std::vector<PeerId>* group_peers = nullptr;
  // Statistics and the timeline (core/stats.h, worker_stats.cpp).
  int64_t submit_ns = 0, first_post_ns = 0;
  int64_t picked_ns = 0;                        // traced only: when the worker took the command up
  std::array<uint64_t, kMaxNics> stat_bytes{};  // bytes posted per NIC
  bool stat_p2p = false;                        // prepared, with one peer (s.peer[nic])
  uint8_t stat_nic = UINT8_MAX;                 // first NIC posted to
};
struct Cursor {
  uint32_t slot = 0;
  uint32_t gen = 0;
  Shard shard;
  uint32_t next = 0;
};

}  // namespace ferry::core

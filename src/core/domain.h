// The seam between the transport-agnostic core and one NIC (or one NVLink
// endpoint). Everything above it (sharding, counters, callbacks, deadlines)
// is shared; a new NIC family implements this interface in its own folder.
//
// Threading: a Domain is owned by exactly one worker thread and every method
// is called from that thread only (libfabric FI_THREAD_DOMAIN, verbs TD).
// Nothing here blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/info.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::core {

// Domain-local handle of a resolved peer (libfabric fi_addr_t, verbs peer index).
using PeerId = uint64_t;

struct DomainInfo {
  std::string name;      // NIC / libfabric domain name
  std::string provider;  // "efa", "tcp;ofi_rxm", "shm", "verbs", ...
  std::string fabric;    // libfabric fabric name
  uint64_t link_speed_bps = 0;
  uint64_t max_msg_size = 0;  // largest single write / send the NIC takes
  Transport transport = Transport::kFabric;
  // How the worker feeds this domain: writes handed over per loop iteration
  // and writes posted but not yet completed. A NIC queue wants them small (the
  // send queue is bounded); a domain that batches writes into one launch (NVLink)
  // wants them large, or it only ever sees a fraction of one transfer.
  uint32_t post_budget = 64;
  uint32_t max_outstanding = 1024;
  // The worker hands paged writes over as page lists (post_paged) instead of one
  // WriteDesc per page: for domains whose per-page work is cheaper done in bulk.
  bool native_paged = false;
  // Any thread may call the domain, one at a time (libfabric FI_THREAD_DOMAIN
  // serialised by the caller): a submitter may then post on it itself while
  // the worker idles (EngineConfig::spin_before_block). NVLink's CUDA calls
  // need the worker's device context, so it stays on its worker.
  bool any_thread = false;
  // A zero-byte write with an immediate is done when its post returns: the
  // worker may post it with post_imm_at_post and then expects no local
  // completion for it (shm delivers it into the peer's queue at the post).
  bool imm_at_post = false;
  // Sends of at most this many bytes may go through post_send_at_post: done
  // when the call returns, the payload copied out, no completion (0: none may,
  // not even an empty one).
  uint64_t send_at_post_max = 0;
};

// A registration on one NIC. Destroying it deregisters.
class DomainMr {
 public:
  virtual ~DomainMr() = default;
  void* local_desc = nullptr;  // passed back in WriteDesc/post_send (fi_mr_desc, lkey)
  uint64_t rkey = 0;           // remote key peers use
  uint64_t remote_base = 0;    // address peers write byte 0 at (ptr or 0 in offset mode)
};

// One RDMA write, all fields resolved. `ctx` comes back in the completion.
struct WriteDesc {
  const void* src = nullptr;
  uint64_t len = 0;  // 0 = immediate-only write (still carries a valid rkey)
  void* local_desc = nullptr;
  PeerId peer = 0;
  uint64_t remote_addr = 0;
  uint64_t rkey = 0;
  uint32_t imm = 0;
  bool has_imm = false;
  uint64_t ctx = 0;
};

// A run of pages of one paged write: page k copies page_len bytes from
// src + src_idx[k] * src_stride to remote_base + dst_idx[k] * dst_stride. The
// index arrays stay valid until every page of the run has completed.
struct PagedDesc {
  const uint8_t* src = nullptr;
  uint64_t src_stride = 0;
  const uint32_t* src_idx = nullptr;
  uint64_t remote_base = 0;
  uint64_t dst_stride = 0;
  const uint32_t* dst_idx = nullptr;
  uint32_t count = 0;
  uint64_t page_len = 0;
  void* local_desc = nullptr;
  PeerId peer = 0;
  uint64_t rkey = 0;
  uint32_t imm = 0;
  bool has_imm = false;
  uint64_t ctx = 0;
};

// Writes out.size() pages of p (fewer at its end) from page `first` on, one
// WriteDesc each; returns how many.
inline size_t spell_out_pages(const PagedDesc& p, uint32_t first, std::span<WriteDesc> out) {
  const size_t n = std::min<size_t>(out.size(), p.count - first);
  for (size_t i = 0; i < n; ++i) {
    WriteDesc& w = out[i];
    w.src = p.src + uint64_t(p.src_idx[first + i]) * p.src_stride;
    w.len = p.page_len;
    w.local_desc = p.local_desc;
    w.peer = p.peer;
    w.remote_addr = p.remote_base + uint64_t(p.dst_idx[first + i]) * p.dst_stride;
    w.rkey = p.rkey;
    w.imm = p.imm;
    w.has_imm = p.has_imm;
    w.ctx = p.ctx;
  }
  return n;
}

struct Completion {
  enum class Kind : uint8_t {
    kWrite,      // a write we posted finished locally (ctx valid)
    kSend,       // a send we posted finished (ctx valid)
    kRecv,       // a receive buffer was filled (ctx = its post ctx, len valid)
    kRemoteImm,  // a peer's write-with-immediate landed here (imm valid; data visible)
  };
  Kind kind = Kind::kWrite;
  uint64_t ctx = 0;
  uint64_t len = 0;
  uint32_t imm = 0;
  // kWrite: how many writes of ctx finished (all with this status); kRemoteImm:
  // how many immediates of value imm arrived. Domains that finish work in
  // batches report a run in one entry instead of one per page.
  uint32_t count = 1;
  Status status;  // non-OK: the operation of ctx failed (message names NIC and call)
};

// Result of a post: how many of the requests were accepted. `error` is set
// when posting stopped because of a failure rather than back-pressure
// (would-block is flow control, not failure: the caller retries later).
struct PostResult {
  size_t posted = 0;
  Status error;
};

// A peer's memory mapped into this process; `keep` holds the mapping open
// (null where none is needed: the peer's memory is this process's own).
struct MappedRemote {
  void* ptr = nullptr;
  std::shared_ptr<const void> keep;
};

class Domain {
 public:
  virtual ~Domain() = default;

  virtual const DomainInfo& info() const = 0;
  // Raw endpoint address (fi_getname bytes, verbs UD address); the core wraps
  // it in a NetAddr with the engine's incarnation.
  virtual std::span<const uint8_t> raw_address() const = 0;

  virtual std::unique_ptr<DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                                Status* error) = 0;

  // Resolve a peer's raw address (idempotent: the same bytes give the same id).
  virtual PeerId add_peer(std::span<const uint8_t> raw, Status* error) = 0;
  virtual void remove_peer(PeerId peer) = 0;

  // Post writes in order until one would block or fails.
  virtual PostResult post_writes(std::span<const WriteDesc> writes) = 0;
  // Post a prefix of p's pages, as post_writes would post them one by one (one
  // completion per page, or runs of them). Called only when info().native_paged;
  // this default spells the pages out for domains that set it without overriding.
  virtual PostResult post_paged(const PagedDesc& p) {
    PostResult total;
    WriteDesc batch[64];
    while (total.posted < p.count) {
      const size_t n = spell_out_pages(p, uint32_t(total.posted), batch);
      PostResult r = post_writes(std::span(batch, n));
      total.posted += r.posted;
      if (r.posted < n) {
        total.error = std::move(r.error);
        break;
      }
    }
    return total;
  }
  // Only where info().imm_at_post: a zero-byte write with an immediate, done
  // when the call returns (no source, no completion).
  virtual PostResult post_imm_at_post(PeerId peer, uint32_t imm, uint64_t remote_addr,
                                      uint64_t rkey) {
    (void)peer, (void)imm, (void)remote_addr, (void)rkey;
    PostResult r;
    r.error = Status(Code::kUnimplemented, "this NIC posts no write without a completion");
    return r;
  }
  virtual PostResult post_send(PeerId peer, const void* buf, size_t len, void* local_desc,
                               uint64_t ctx) = 0;
  // Only where len <= info().send_at_post_max; `buf` may be reused at return.
  virtual PostResult post_send_at_post(PeerId peer, const void* buf, size_t len) {
    (void)peer, (void)buf, (void)len;
    PostResult r;
    r.error = Status(Code::kUnimplemented, "this NIC posts no send without a completion");
    return r;
  }
  virtual PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) = 0;

  // Drain up to out.size() completions; returns how many were written.
  virtual size_t poll(std::span<Completion> out) = 0;

  // For adaptive polling: a file descriptor that becomes readable when the
  // domain has completions, or -1 if the domain cannot be waited on.
  virtual int wait_fd() { return -1; }
  // True when it is safe to block on wait_fd() now (libfabric fi_trywait).
  virtual bool can_block() { return false; }

  // [remote_addr, +len) of a peer's region (rkey) as an address this process
  // can store to: what kernels write straight into a peer's memory with, where
  // the transport shares memory with its peers (NVLink within a node, the
  // in-process fake NIC). Others refuse with kUnimplemented.
  virtual MappedRemote map_remote(PeerId peer, uint64_t rkey, uint64_t remote_addr, size_t len,
                                  Status* error) {
    (void)peer, (void)rkey, (void)remote_addr, (void)len;
    *error =
        Status(Code::kUnimplemented, "this transport cannot map a peer's memory into this process");
    return {};
  }
};

// Options the engine hands to a domain factory.
struct DomainOptions {
  std::string provider;
  std::string nic_name;  // empty = first available
  size_t nic_index = 0;  // which of the provider's domains when nic_name is empty
  size_t position = 0;   // this NIC's index within its group
  Device device;         // the group's device (for HMEM capability checks)
  // verbs only: GID table index (EngineConfig::verbs_gid_index); -1 =
  // FERRY_VERBS_GID_INDEX if set, else automatic. Validated at open.
  int gid_index = -1;
  // Non-empty: wrap the domain in the fault injector (src/testing/fault_domain.h).
  std::string fault_injection;
};

// Opens one NIC; sets *error and returns null when it cannot. The engine hands
// its workers one of these, so the core never names a transport.
using DomainOpener = std::function<std::unique_ptr<Domain>(const DomainOptions&, Status*)>;

// A NIC family as each transport folder declares it and the engine's registry
// (src/engine/domain_families.h) lists it.
struct DomainFamily {
  std::string_view name;  // "verbs", "nvlink", "fabric", "fake"
  // Whether EngineConfig::provider names this family. libfabric serves every
  // provider string no other family claims ("efa", "tcp;ofi_rxm", "shm").
  bool (*serves)(std::string_view provider) = nullptr;
  std::unique_ptr<Domain> (*open)(const DomainOptions& options, Status* error) = nullptr;
  // The NICs `open` would find for `provider` (ferry/info.h).
  ProviderListing (*list)(const std::string& provider) = nullptr;
};

}  // namespace ferry::core

// Private: the NVLink Domain implementation shared by nvlink_domain.cpp (open,
// registration, peers and their regions), nvlink_datapath.cpp (posting writes,
// launching the gather kernel, polling batches and immediates) and
// nvlink_messages.cpp (two-sided send / recv through the message ring).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/domain.h"
#include "nvlink/nvlink_domain.h"
#include "nvlink/nvlink_kernels.h"
#include "nvlink/nvlink_liveness.h"
#include "nvlink/nvlink_shm.h"

namespace ferry::nvlink {

// Writes this large go to the copy engines (cudaMemcpyAsync), which reach
// ~395 GB/s on their own and leave the SMs alone; smaller ones are cut into
// <= 32 KiB ops of the next gather launch (or the copy engine for a lone write).
// FERRY_NVLINK_COPY_ENGINE_MIN (bytes) moves the line, e.g. for a GPU whose
// SMs are busy with the model while the KV writes of its layers go out.
inline constexpr uint64_t kCopyEngineMin = 4 << 20;
inline constexpr uint64_t kLoneCopyMax = 256 << 10;
inline constexpr uint32_t kBatches = 32;  // launches in flight
inline constexpr uint32_t kStreams = 2;
inline constexpr uint32_t kMaxBatchOps = 4096;  // ops per launch
// A batch is launched once it is this big, when poll() runs without a post
// since the last poll (the worker has nothing more to add right now), or at
// once when the GPU has nothing else of ours to do (a lone small write should
// not wait for a worker iteration). Under load a launch takes several
// transfers: a launch costs the worker ~4 us, and at 4 KiB pages one launch
// per 1 024-page transfer held the engine to 210 GB/s where 4 096 ops per
// launch reach 280-320 (ferry-nvlink-bench, docs/PERFORMANCE.md).
inline constexpr uint32_t kFlushOps = kMaxBatchOps;
inline constexpr uint64_t kFlushBytes = 16 << 20;
// Worker feeding (core::DomainInfo): a launch covers as many pages as the
// worker hands over, so hand over several transfers' worth per iteration.
inline constexpr uint32_t kPostBudget = 4096;
inline constexpr uint32_t kMaxOutstanding = 16384;

inline std::string cuda_msg(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

inline void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}

// One opened IPC handle. A process may open a given handle only once, so the
// mappings are shared process-wide (several engines, several peers' regions
// in one allocation) and closed when the last user drops it.
struct IpcMapping {
  uint8_t* base = nullptr;
  ~IpcMapping() {
    if (base != nullptr) cudaIpcCloseMemHandle(base);
  }
};

// The mapping of `handle` exported by process `pid`, opened once per process
// (cudaIpcOpenMemHandle); null with *error set when it cannot be opened.
std::shared_ptr<IpcMapping> open_ipc(uint32_t pid, const uint8_t* handle, Status* error);

struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};

// Registration: unpublishes its IPC handle when destroyed; keeps the segment
// alive so it may outlive the domain (the engine closes MRs after domains
// may already be gone in error paths).
class NvlinkMr final : public core::DomainMr {
 public:
  NvlinkMr(std::shared_ptr<ShmSegment> shm, std::shared_ptr<std::mutex> mu)
      : shm_(std::move(shm)), mu_(std::move(mu)) {}
  ~NvlinkMr() override {
    if (shm_ && rkey != 0) {
      std::lock_guard lk(*mu_);
      shm_->unpublish(rkey);
    }
  }

 private:
  std::shared_ptr<ShmSegment> shm_;
  std::shared_ptr<std::mutex> mu_;
};

class NvlinkDomain final : public core::Domain {
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can name Key: a domain is made by it alone.
  explicit NvlinkDomain(Key) {}
  static std::unique_ptr<core::Domain> open(const core::DomainOptions& options, Status* error);
  ~NvlinkDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }
  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override;
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override;
  void remove_peer(core::PeerId peer) override;
  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_paged(const core::PagedDesc& pd) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;
  // An idle worker (adaptive polling) blocks on the mailbox's wake socket, but
  // only with no copy of ours in flight: CUDA events have no descriptor, so
  // then it naps and polls them.
  core::MappedRemote map_remote(core::PeerId peer, uint64_t rkey, uint64_t remote_addr, size_t len,
                                Status* error) override;
  int wait_fd() override { return shm_->wake_fd(); }
  bool can_block() override {
    if (issued_ > 0 || !done_.empty() || inbox_pos_ != inbox_len_ || !sent_.empty()) return false;
    if (const Batch* b = open_batch(); b != nullptr && !b->items.empty()) return false;
    armed_ = true;
    // A message waiting for a receive buffer is no reason to stay awake.
    return shm_->prepare_to_sleep(/*messages_count=*/!recvs_.empty());
  }

 private:
  struct Target {
    std::shared_ptr<IpcMapping> map;  // null for a peer in this process
    uint8_t* base = nullptr;          // our address of the region's byte 0
    uint64_t reg_ptr = 0;             // the owner's address of byte 0
    uint64_t len = 0;
  };
  struct Peer {
    std::string key;
    RawAddress addr;
    std::unique_ptr<ShmSegment> shm;
    bool same_process = false;
    std::unordered_map<uint64_t, Target> targets;
    uint64_t last_rkey = 0;
    Target* last = nullptr;
    std::unique_ptr<PeerLiveness> live;  // null for a peer in this process
  };
  // A run of writes of one transfer (same ctx, peer and immediate): the pages
  // of a paged write become one item, one completion and one mailbox run.
  struct Item {
    uint64_t ctx;
    uint32_t peer;
    uint32_t imm;
    bool has_imm;
    uint32_t count = 1;
    bool same_run(const Item& o) const {
      return ctx == o.ctx && peer == o.peer && imm == o.imm && has_imm == o.has_imm;
    }
  };
  struct Done {
    Item item;
    Status status;
  };
  struct Batch {
    cudaEvent_t event = nullptr;
    CopyOp* ops = nullptr;  // kMaxBatchOps entries of pinned mapped memory
    uint32_t nops = 0;
    uint64_t bytes = 0;
    std::vector<Item> items;
  };

  Target* resolve(Peer& p, uint64_t rkey, Status* error);
  Batch* open_batch() {
    return issued_ < kBatches ? &batches_[(head_ + issued_) % kBatches] : nullptr;
  }
  void flush();
  void fail_batch(Batch& b, const Status& s);
  // poll()'s part for two-sided messages (nvlink_messages.cpp): completions of
  // sends, then received messages into posted buffers, from out[n] on; returns
  // the new n.
  size_t poll_messages(std::span<core::Completion> out, size_t n);
  Peer* peer_of(core::PeerId id, Status* error) {
    if (id < peers_.size() && peers_[id]) return peers_[id].get();
    *error = Status(Code::kInvalidArgument,
                    fmt::format("nvlink {}: unknown peer id {}", info_.name, id));
    return nullptr;
  }
  // A peer whose process has exited is refused like one a NIC reports dead.
  Peer* live_peer(core::PeerId id, PeerLiveness::Clock::time_point now, Status* error) {
    Peer* p = peer_of(id, error);
    if (p != nullptr && p->live && !p->live->alive(now)) {
      *error = Status(Code::kUnavailable, fmt::format("nvlink {}: the peer ({}) has exited",
                                                      info_.name, peer_name(*p)));
      return nullptr;
    }
    return p;
  }
  static bool outside(const Target& t, uint64_t addr, uint64_t len) {
    const uint64_t off = addr - t.reg_ptr;
    return addr < t.reg_ptr || off > t.len || len > t.len - off;
  }
  // Ops of at most kMaxOpBytes for one copy; the caller made room (ops_for).
  static void append_ops(Batch& b, uint64_t src, uint64_t dst, uint64_t len) {
    for (uint64_t o = 0; o < len; o += kMaxOpBytes)
      b.ops[b.nops++] = CopyOp{src + o, dst + o, std::min(kMaxOpBytes, len - o)};
  }
  static uint32_t ops_for(uint64_t len) { return uint32_t((len + kMaxOpBytes - 1) / kMaxOpBytes); }
  static void add_item(std::vector<Item>& items, const Item& it) {
    if (!items.empty() && items.back().same_run(it) &&
        items.back().count < UINT32_MAX / 2 - it.count)
      items.back().count += it.count;
    else
      items.push_back(it);
  }
  void add_done(const Item& it, Status st) {
    if (!done_.empty() && st.is_ok() && done_.back().status.is_ok() &&
        done_.back().item.same_run(it) && done_.back().item.count < UINT32_MAX / 2 - it.count)
      done_.back().item.count += it.count;
    else
      done_.push_back({it, std::move(st)});
  }
  std::string peer_name(const Peer& p) const {
    return fmt::format("pid {} cuda:{}", p.addr.pid, p.addr.device);
  }

  int device_ = 0;
  uint64_t copy_engine_min_ = kCopyEngineMin;
  core::DomainInfo info_;
  std::vector<uint8_t> address_;
  RawAddress self_;
  std::shared_ptr<ShmSegment> shm_;
  std::shared_ptr<std::mutex> shm_mu_ = std::make_shared<std::mutex>();
  // Batches alternate between two streams: one launch's tail overlaps the
  // next one's start (1 024 x 4 KiB, kernel alone: 261 GB/s on one stream,
  // 303 on two; ferry-nvlink-probe). Transfers carry no order, so nothing is
  // lost; batches still retire in launch order.
  cudaStream_t streams_[kStreams] = {};
  cudaStream_t stream_of(const Batch& b) const {
    return streams_[size_t(&b - batches_) % kStreams];
  }
  std::unique_ptr<CopyOp, HostFree> ops_mem_;
  Batch batches_[kBatches];
  uint32_t head_ = 0;    // oldest launched batch
  uint32_t issued_ = 0;  // launched, not yet retired
  bool posted_since_poll_ = false;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unordered_map<std::string, core::PeerId> peer_ids_;
  std::deque<Done> done_;  // finished locally; immediates not yet pushed
  // Runs taken from our mailbox but not yet reported (poll's `out` was full).
  std::array<ImmRun, 256> inbox_{};
  size_t inbox_pos_ = 0, inbox_len_ = 0;
  bool armed_ = false;  // prepare_to_sleep ran since the last poll
  // Two-sided messages: sends are copied into the peer's ring at once, so
  // they complete on the next poll; receive buffers wait here in post order.
  struct PostedRecv {
    void* buf;
    size_t len;
    uint64_t ctx;
  };
  std::vector<uint64_t> sent_;
  std::deque<PostedRecv> recvs_;
  // Slots of our rings skipped because their writer died mid-push, as last
  // reported in the log.
  uint64_t lost_runs_seen_ = 0, lost_msgs_seen_ = 0;
  void report_lost();
};

}  // namespace ferry::nvlink

// Private: the libfabric Domain implementation shared by fabric_domain.cpp
// (control path) and fabric_datapath.cpp (post / poll).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/domain.h"
#include "fabric/fabric_domain.h"
#include "fabric/fabric_handles.h"

namespace ferry::fabric {

inline constexpr uint32_t kFabricApiVersion = FI_VERSION(1, 17);
// Receives kept posted for remote CQ data when the provider has FI_RX_CQ_DATA.
inline constexpr size_t kInternalRecvs = 64;

// Hints shared by discovery and open, so list_fabric_nics() offers exactly the
// domains open_fabric_domain() accepts. nullptr only on allocation failure.
InfoPtr make_hints(const std::string& provider, bool hmem, const std::string& domain_name);
// Exact provider match (no layered fallback) plus the features we rely on.
bool info_usable(const fi_info* info, const std::string& provider) noexcept;
std::string mr_mode_string(uint64_t mr_mode);
// kInvalidArgument when ptr is not memory of `device` (host vs GPU, or another
// GPU); kUnimplemented for GPU memory in a build without CUDA.
Status check_memory_kind(const void* ptr, Device device);

enum class OpKind : uint8_t { kFree, kWrite, kSend, kRecv, kInternalRecv };

const char* op_kind_name(OpKind kind) noexcept;

// Per-operation context handed to libfabric. Providers with FI_CONTEXT /
// FI_CONTEXT2 own the fi_context2 until the completion, so it must be stable
// memory; using it for every provider also gives one uniform way back from a
// completion to the caller's ctx.
struct OpEntry {
  fi_context2 ctx;  // first member: op_context == this
  uint64_t user_ctx;
  // Receives only: kept so a receive consumed by remote CQ data
  // (FI_RX_CQ_DATA) can be posted again.
  void* buf;
  void* desc;
  uint64_t len;
  OpKind kind;
};

// Fixed-size free list, allocated once at open: the data path never allocates.
class OpPool {
 public:
  explicit OpPool(size_t capacity);
  OpPool(const OpPool&) = delete;
  OpPool& operator=(const OpPool&) = delete;

  // nullptr when exhausted (back-pressure, not failure).
  OpEntry* acquire(OpKind kind, uint64_t user_ctx) noexcept;
  void release(OpEntry* entry) noexcept;
  // Maps an op_context from a completion back to its entry; nullptr when the
  // pointer is not one of ours (e.g. remote-write completions carry none).
  OpEntry* from_context(void* op_context) noexcept;
  size_t capacity() const noexcept { return capacity_; }
  size_t in_use() const noexcept { return capacity_ - free_count_; }

 private:
  size_t capacity_;
  std::unique_ptr<OpEntry[]> entries_;
  std::unique_ptr<uint32_t[]> free_;
  size_t free_count_;
};

// Everything libfabric may still reference while a registration or a posted
// operation lives. Shared with every FabricMr so an MR released after its
// Domain still closes before the domain fid. Members are in open order so
// they close in reverse; the pool and info outlive the endpoint.
struct FabricResources {
  std::string nic_name;
  InfoPtr info;
  std::unique_ptr<OpPool> pool;
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_cq> cq;
  FidPtr<fid_av> av;
  FidPtr<fid_ep> ep;
  uint64_t mr_mode = 0;  // as granted by the provider
  std::atomic<uint64_t> next_key{1};
};

class FabricMr final : public core::DomainMr {
 public:
  FabricMr(std::shared_ptr<FabricResources> res, FidPtr<fid_mr> mr)
      : res_(std::move(res)), mr_(std::move(mr)) {}

 private:
  // Declared first so it is released last: the MR closes before the domain.
  std::shared_ptr<FabricResources> res_;
  FidPtr<fid_mr> mr_;
};

class FabricDomain final : public core::Domain {
 public:
  static std::unique_ptr<core::Domain> open(const core::DomainOptions& options, Status* error);
  ~FabricDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }

  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override;
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override;
  void remove_peer(core::PeerId peer) override;

  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;

  int wait_fd() override { return wait_fd_; }
  bool can_block() override;

 private:
  FabricDomain() = default;

  const char* missing_shm_peer(std::span<const uint8_t> raw) const;
  const char* foreign_address(std::span<const uint8_t> raw) const;
  Status post_error(const char* call, ssize_t ret) const;
  // Posts (or re-posts) the receive described by `entry`.
  ssize_t post_recv_entry(OpEntry* entry) noexcept;
  bool post_internal_recvs();
  // Receives consumed by remote CQ data whose re-post would block; retried at
  // the start of the next poll. Writes at most one Completion per hard failure.
  size_t retry_reposts(std::span<core::Completion> out);
  void repost_or_defer(OpEntry* entry);
  // Turns one successful CQ entry into at most one Completion.
  bool map_completion(const fi_cq_data_entry& e, core::Completion* out);
  // 1: wrote *out, 0: consumed an entry without a Completion, -1: nothing read.
  int map_error(core::Completion* out);

  std::shared_ptr<FabricResources> res_;
  // Hot-path copies of res_ members.
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  OpPool* pool_ = nullptr;

  core::DomainInfo info_;
  std::vector<uint8_t> address_;
  size_t peer_addr_len_ = 0;  // bytes the provider may read from an fi_av_insert address
  std::unordered_map<std::string, fi_addr_t> peers_;

  std::unique_ptr<OpEntry*[]> repost_;  // capacity = pool capacity
  size_t repost_count_ = 0;

  int wait_fd_ = -1;
  bool rx_cq_data_ = false;  // FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  // Set once a provider refuses iov_count == 0 for a zero-length write.
  bool zero_len_needs_iov_ = false;
  bool cq_failure_logged_ = false;

  // Write template: invariant fields filled once, per-op fields patched.
  iovec iov_{};
  void* desc_[1] = {nullptr};
  fi_rma_iov rma_iov_{};
  fi_msg_rma msg_{};
};

}  // namespace ferry::fabric

// libfabric Domain memory registration: the memory-kind check, fi_mr_regattr,
// and the registrations the Domain revokes at close (FabricResources).
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include "cuda/pointer_info.h"

#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

// A host buffer registered as GPU memory (or the reverse) would make the
// provider pick the wrong copy path and fail far from the cause, or corrupt
// memory with cudaMemcpy on a host address: refuse it here, naming both.
Status check_memory_kind(const void* ptr, Device device) {
  int ordinal = -1;
  Status probe;
  const bool on_gpu = cuda::is_device_pointer(ptr, &ordinal, &probe);
  if (device.kind == Device::Kind::kCuda) {
    if (!probe.is_ok()) return probe;  // kUnimplemented without CUDA
    if (!on_gpu)
      return Status(Code::kInvalidArgument,
                    fmt::format("{} is host memory, registered as {}", ptr, device.to_string()));
    if (ordinal != device.ordinal)
      return Status(Code::kInvalidArgument, fmt::format("{} is memory of cuda:{}, registered as {}",
                                                        ptr, ordinal, device.to_string()));
    return Status::ok();
  }
  // Host registrations: without CUDA nothing can be device memory.
  if (probe.is_ok() && on_gpu)
    return Status(Code::kInvalidArgument,
                  fmt::format("{} is GPU memory of cuda:{}, registered as {}", ptr, ordinal,
                              device.to_string()));
  return Status::ok();
}

std::unique_ptr<core::DomainMr> FabricDomain::register_mr(void* ptr, size_t len, Device device,
                                                          bool remote, Status* error) {
  const std::string& nic = res_->nic_name;
  if (ptr == nullptr || len == 0) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("fabric NIC '{}': fi_mr_regattr: null pointer or zero "
                                        "length ({} bytes at {})",
                                        nic, len, ptr)));
    return nullptr;
  }
  const bool cuda = device.kind == Device::Kind::kCuda;
  if (Status s = check_memory_kind(ptr, device); !s.is_ok()) {
    set_error(error, Status(s.code(), fmt::format("fabric NIC '{}': {}", nic, s.message())));
    return nullptr;
  }
  if (cuda && (res_->info->caps & FI_HMEM) == 0) {
    set_error(error, Status(Code::kFailedPrecondition,
                            fmt::format("fabric NIC '{}': fi_mr_regattr: CUDA memory on a domain "
                                        "opened without FI_HMEM",
                                        nic)));
    return nullptr;
  }

  iovec iov{ptr, len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV | FI_WRITE | FI_READ;
  if (remote) attr.access |= FI_REMOTE_WRITE | FI_REMOTE_READ;
  // Without FI_MR_PROV_KEY the application picks keys, unique per domain.
  if ((res_->mr_mode & FI_MR_PROV_KEY) == 0) {
    attr.requested_key = res_->next_key.fetch_add(1, std::memory_order_relaxed);
  }
  if (cuda) {
    // DMA-BUF (cuMemGetHandleForAddressRange + FI_MR_DMABUF) would be tried
    // first, but libfabric 1.17 has no FI_MR_DMABUF / struct fi_mr_dmabuf
    // (they arrived in 1.20): the iov with FI_HMEM_CUDA is the only path.
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device.ordinal;
  } else {
    attr.iface = FI_HMEM_SYSTEM;
  }

  fid_mr* raw_mr = nullptr;
  int ret = fi_mr_regattr(res_->domain.get(), &attr, 0, &raw_mr);
  if (ret == -FI_ENOSYS && cuda) {
    // Seen on the H200 with Debian's libfabric 1.17: fi_getinfo grants
    // FI_HMEM, but the library was built without CUDA support.
    set_error(error, Status(Code::kUnimplemented,
                            fmt::format("fabric NIC '{}': fi_mr_regattr(FI_HMEM_CUDA, {} bytes at "
                                        "{}, {}): not implemented: this libfabric was built "
                                        "without CUDA support",
                                        nic, len, ptr, device.to_string())));
    return nullptr;
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_regattr", ret));
    return nullptr;
  }
  FidPtr<fid_mr> mr(raw_mr);
  if ((res_->mr_mode & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(mr.get(), &res_->ep->fid, 0);
    if (ret != 0) {
      set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_bind", ret));
      return nullptr;
    }
    ret = fi_mr_enable(mr.get());
    if (ret != 0) {
      set_error(error, fi_failure(Code::kUnavailable, nic, "fi_mr_enable", ret));
      return nullptr;
    }
  }
  const uint64_t key = fi_mr_key(mr.get());
  if (key == FI_KEY_NOTAVAIL) {
    // Only FI_MR_RAW providers do this, and we do not ask for raw keys.
    set_error(error,
              Status(Code::kUnimplemented,
                     fmt::format("fabric NIC '{}': fi_mr_key: provider uses raw keys", nic)));
    return nullptr;
  }

  // The descriptor is passed even without FI_MR_LOCAL: with FI_HMEM it is how
  // the provider learns that a buffer is device memory.
  void* desc = fi_mr_desc(mr.get());
  const uint64_t id = res_->add_mr(std::move(mr));
  if (id == 0) {
    set_error(error,
              Status(Code::kFailedPrecondition,
                     fmt::format("fabric NIC '{}': fi_mr_regattr: the domain is closing", nic)));
    return nullptr;
  }
  auto out = std::make_unique<FabricMr>(res_, id);
  out->local_desc = desc;
  out->rkey = key;
  // Without FI_MR_VIRT_ADDR the target addresses are offsets into the region.
  out->remote_base = (res_->mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uint64_t>(ptr) : 0;
  set_error(error, Status::ok());
  return out;
}

uint64_t FabricResources::add_mr(FidPtr<fid_mr> mr) {
  std::lock_guard lk(mr_mu_);
  if (mrs_closed_) return 0;  // `mr` closes on return
  const uint64_t id = next_mr_id_++;
  mrs_.emplace(id, std::move(mr));
  return id;
}

void FabricResources::close_mr(uint64_t id) noexcept {
  FidPtr<fid_mr> mr;
  {
    std::lock_guard lk(mr_mu_);
    auto it = mrs_.find(id);
    if (it == mrs_.end()) return;  // the Domain closed it already
    mr = std::move(it->second);
    mrs_.erase(it);
  }
}

size_t FabricResources::close_all_mrs() noexcept {
  std::unordered_map<uint64_t, FidPtr<fid_mr>> mrs;
  {
    std::lock_guard lk(mr_mu_);
    mrs_closed_ = true;
    mrs.swap(mrs_);
  }
  return mrs.size();  // closed here
}

}  // namespace ferry::fabric

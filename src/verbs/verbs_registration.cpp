// verbs Domain memory registration: host memory through ibv_reg_mr, GPU
// memory as a dma-buf when the CUDA driver can export one.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "core/unique_fd.h"
#include "cuda/driver_symbol.h"
#include "verbs/verbs_domain_impl.h"

namespace ferry::verbs {

namespace {

using core::UniqueFd;

// GPU memory as a dma-buf, through the CUDA driver API looked up at run time
// so that ferry needs no CUDA at build time. No fd (with *why) when not
// available: no libcuda loaded, a driver without the call, no current
// context; the caller then falls back to ibv_reg_mr (nvidia-peermem).
UniqueFd cuda_dmabuf_fd(void* ptr, size_t len, uint64_t* offset, std::string* why) {
  // CUresult cuMemGetHandleForAddressRange(void*, CUdeviceptr, size_t,
  //                                        CUmemRangeHandleType, unsigned long long)
  using Fn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
  constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
  // Only a loaded driver: a process that registers CUDA memory has it.
  static Fn fn = reinterpret_cast<Fn>(cuda::loaded_driver_symbol("cuMemGetHandleForAddressRange"));
  if (fn == nullptr) {
    *why = "libcuda.so.1 not loaded or without cuMemGetHandleForAddressRange";
    return UniqueFd();
  }
  // The range must be host-page aligned; the MR covers the caller's bytes
  // through the offset into the dma-buf.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto p = reinterpret_cast<uint64_t>(ptr);
  const uint64_t base = p & ~(page - 1);
  const uint64_t end = (p + len + page - 1) & ~(page - 1);
  int fd = -1;
  const int ret = fn(&fd, base, end - base, kDmaBufFd, 0);
  if (ret != 0 || fd < 0) {
    *why = fmt::format("cuMemGetHandleForAddressRange returned CUresult {}", ret);
    return UniqueFd();
  }
  *offset = p - base;
  return UniqueFd(fd);
}

}  // namespace

std::unique_ptr<core::DomainMr> VerbsDomain::register_mr(void* ptr, size_t len, Device device,
                                                         bool remote, Status* error) {
  const std::string& nic = res_->nic_name;
  if (ptr == nullptr || len == 0) {
    set_error(error, Status(Code::kInvalidArgument,
                            fmt::format("verbs NIC '{}': ibv_reg_mr: null pointer or zero length "
                                        "({} bytes at {})",
                                        nic, len, ptr)));
    return nullptr;
  }
  // Relaxed ordering lets the PCIe root complex reorder the NIC's writes;
  // without it ConnectX throughput stays under ~200 Gb/s on many hosts. It
  // is an optional flag: devices without it ignore it.
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
  if (remote) access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const bool cuda = device.kind == Device::Kind::kCuda;

  MrPtr mr;
  std::string how = "ibv_reg_mr";
  if (cuda) {
    uint64_t offset = 0;
    std::string why;
    UniqueFd fd = cuda_dmabuf_fd(ptr, len, &offset, &why);
    if (fd.get() >= 0) {
      mr.reset(ibv_reg_dmabuf_mr(res_->pd.get(), offset, len, reinterpret_cast<uint64_t>(ptr),
                                 fd.get(), access));
      if (mr) {
        how = "ibv_reg_dmabuf_mr";
      } else {
        why = fmt::format("ibv_reg_dmabuf_mr: {}", std::strerror(errno));
      }
    }
    if (!mr) {
      core::log().debug(
          "verbs NIC '{}': dma-buf registration of {} unavailable ({}); using "
          "ibv_reg_mr (needs nvidia-peermem)",
          nic, ptr, why);
    }
  }
  if (!mr) mr.reset(ibv_reg_mr(res_->pd.get(), ptr, len, access));
  if (!mr) {
    const int err = errno;
    set_error(
        error,
        Status(Code::kUnavailable,
               fmt::format("verbs NIC '{}': ibv_reg_mr of {} bytes at {} ({}) failed: {} "
                           "({}){}",
                           nic, len, ptr, device.to_string(), std::strerror(err), err,
                           cuda ? "; GPU memory needs dma-buf support or nvidia-peermem" : "")));
    return nullptr;
  }
  core::log().debug("verbs NIC '{}': {} {} bytes at {} lkey {:#x} rkey {:#x}", nic, how, len, ptr,
                    mr->lkey, mr->rkey);
  auto out = std::make_unique<VerbsMr>(res_, std::move(mr), !cuda);
  // Peers address our memory by virtual address (iova = ptr for dma-buf too).
  out->remote_base = reinterpret_cast<uint64_t>(ptr);
  set_error(error, Status::ok());
  return out;
}

}  // namespace ferry::verbs

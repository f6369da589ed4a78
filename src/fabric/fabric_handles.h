// RAII owners for libfabric objects, so that every fid is owned from the line
// that opens it and a half-finished open unwinds by itself.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <memory>

#include "core/log.h"

namespace ferry::fabric {

inline const char* fid_kind_name(const fid_fabric*) {
  return "fabric";
}
inline const char* fid_kind_name(const fid_domain*) {
  return "domain";
}
inline const char* fid_kind_name(const fid_cq*) {
  return "cq";
}
inline const char* fid_kind_name(const fid_av*) {
  return "av";
}
inline const char* fid_kind_name(const fid_ep*) {
  return "ep";
}
inline const char* fid_kind_name(const fid_mr*) {
  return "mr";
}

// Closing can fail (e.g. a domain with live MRs returns -FI_EBUSY); the
// destructor cannot report it, so it is logged instead of lost.
template <typename T>
struct FidCloser {
  void operator()(T* obj) const noexcept {
    const int ret = fi_close(&obj->fid);
    if (ret != 0) {
      core::log().warn("ferry fabric: fi_close({}) failed: {} ({})", fid_kind_name(obj),
                       fi_strerror(-ret), ret);
    }
  }
};

template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser<T>>;

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

}  // namespace ferry::fabric

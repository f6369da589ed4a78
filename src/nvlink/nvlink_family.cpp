// ferry's CUDA IPC domain for GPUs of one host (docs/NVLINK.md); in builds
// without CUDA its open reports kUnimplemented (nvlink_none.cpp).
#include "nvlink/nvlink_domain.h"

namespace ferry::nvlink {

const core::DomainFamily& nvlink_family() {
  static const core::DomainFamily f{"nvlink", [](std::string_view p) { return p == "nvlink"; },
                                    &open_nvlink_domain};
  return f;
}

}  // namespace ferry::nvlink

#include "core/domain_factory.h"

#include "fabric/fabric_domain.h"
#include "nvlink/nvlink_domain.h"
#include "testing/fault_domain.h"
#include "verbs/verbs_domain.h"

namespace ferry::core {

std::unique_ptr<Domain> open_domain(const DomainOptions& options, Status* error) {
  // "verbs" is ferry's own libibverbs domain; libfabric's layered verbs
  // provider keeps its own name ("verbs;ofi_rxm").
  // "nvlink" is ferry's CUDA IPC domain for GPUs of one host (docs/NVLINK.md).
  std::unique_ptr<Domain> d = options.provider == "verbs" ? verbs::open_verbs_domain(options, error)
                              : options.provider == "nvlink"
                                  ? nvlink::open_nvlink_domain(options, error)
                                  : fabric::open_fabric_domain(options, error);
  if (d && !options.fault_injection.empty())
    d = testing::wrap_with_faults(std::move(d), options.fault_injection, options.position, error);
  return d;
}

}  // namespace ferry::core

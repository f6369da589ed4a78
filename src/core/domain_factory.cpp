#include "core/domain_factory.h"

#include "fabric/fabric_domain.h"
#include "testing/fault_domain.h"

namespace ferry::core {

std::unique_ptr<Domain> open_domain(const DomainOptions& options, Status* error) {
  std::unique_ptr<Domain> d = fabric::open_fabric_domain(options, error);
  if (d && !options.fault_injection.empty())
    d = testing::wrap_with_faults(std::move(d), options.fault_injection, options.nic_index, error);
  return d;
}

}  // namespace ferry::core

#include "core/domain_factory.h"

#include "fabric/fabric_domain.h"

namespace ferry::core {

std::unique_ptr<Domain> open_domain(const DomainOptions& options, Status* error) {
  return fabric::open_fabric_domain(options, error);
}

}  // namespace ferry::core

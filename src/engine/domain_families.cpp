#include "engine/domain_families.h"

#include <array>

#include "fabric/fabric_domain.h"
#include "nvlink/nvlink_domain.h"
#include "testing/fake_domain.h"
#include "testing/fault_domain.h"
#include "verbs/verbs_domain.h"

namespace ferry::engine {

std::span<const core::DomainFamily* const> domain_families() {
  static const std::array<const core::DomainFamily*, 4> families{
      &verbs::verbs_family(), &nvlink::nvlink_family(), &testing::fake_family(),
      &fabric::fabric_family()};
  return families;
}

const core::DomainFamily& family_for(std::string_view provider) {
  for (const auto* f : domain_families())
    if (f->serves(provider)) return *f;
  return fabric::fabric_family();
}

core::DomainOpener domain_opener() {
  return [](const core::DomainOptions& options, Status* error) -> std::unique_ptr<core::Domain> {
    std::unique_ptr<core::Domain> d = family_for(options.provider).open(options, error);
    if (d && !options.fault_injection.empty())
      d = testing::wrap_with_faults(std::move(d), options.fault_injection, options.position, error);
    return d;
  };
}

}  // namespace ferry::engine

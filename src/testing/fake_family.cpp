#include "testing/fake_domain.h"

namespace ferry::testing {

const core::DomainFamily& fake_family() {
  static const core::DomainFamily f{"fake", [](std::string_view p) { return p == "fake"; },
                                    &open_fake_domain};
  return f;
}

}  // namespace ferry::testing

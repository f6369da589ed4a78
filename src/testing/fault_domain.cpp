#include "testing/fault_domain.h"

namespace ferry::testing {

std::unique_ptr<core::Domain> wrap_with_faults(std::unique_ptr<core::Domain> inner,
                                               const std::string& spec, size_t, Status* error) {
  *error = Status(Code::kUnimplemented, "fault injection is not built yet (spec '" + spec + "')");
  inner.reset();
  return nullptr;
}

}  // namespace ferry::testing

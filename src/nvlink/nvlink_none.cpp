// Builds without CUDA: the provider name exists and says why it cannot open.
#include "nvlink/nvlink_domain.h"

namespace ferry::nvlink {

std::unique_ptr<core::Domain> open_nvlink_domain(const core::DomainOptions&, Status* error) {
  if (error != nullptr)
    *error = Status(Code::kUnimplemented,
                    "nvlink: ferry was built without CUDA (FERRY_CUDA=OFF or no toolkit)");
  return nullptr;
}

}  // namespace ferry::nvlink

// libibverbs Domain (NVIDIA ConnectX and other RC-capable verbs NICs).
// Deliberately free of <infiniband/verbs.h>: the core includes this header.
#pragma once

#include <memory>

#include "core/domain.h"

namespace ferry::verbs {

// Opens one RDMA device: options.nic_name ("mlx5_0") or the options.nic_index-th
// device with an active port. kUnavailable when the host has no RDMA device.
std::unique_ptr<core::Domain> open_verbs_domain(const core::DomainOptions& options, Status* error);

}  // namespace ferry::verbs

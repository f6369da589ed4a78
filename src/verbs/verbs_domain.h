// libibverbs Domain (NVIDIA ConnectX and other RC-capable verbs NICs).
// Deliberately free of <infiniband/verbs.h>: the engine includes this header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/domain.h"
#include "verbs/rdma_device.h"

namespace ferry::verbs {

// Opens one RDMA device: options.nic_name ("mlx5_0") or the options.nic_index-th
// device with an active port. kUnavailable when the host has no RDMA device.
std::unique_ptr<core::Domain> open_verbs_domain(const core::DomainOptions& options, Status* error);

// This family for the engine's registry (verbs_family.cpp).
const core::DomainFamily& verbs_family();

// For provider "auto": the devices libibverbs lists, described from the sysfs
// tree at sysfs_root ("/sys/class/infiniband"). *note says why the list is
// empty.
std::vector<RdmaDevice> probe_verbs_devices(const std::string& sysfs_root, std::string* note);

}  // namespace ferry::verbs

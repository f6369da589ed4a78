// NIC discovery through fi_getinfo.
#include <rdma/fabric.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"

#include "fabric/fabric_domain.h"
#include "fabric/fabric_domain_impl.h"

namespace ferry::fabric {

InfoPtr make_hints(const std::string& provider, bool hmem, const std::string& domain_name) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return nullptr;
  hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
  if (hmem) hints->caps |= FI_HMEM;
  // Modes we can honour: every op gets a pooled fi_context2, and receives
  // consumed by remote CQ data are re-posted by the data path.
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                FI_MR_ENDPOINT | FI_MR_HMEM;
  // fi_freeinfo() frees these strings, hence strdup.
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!domain_name.empty()) hints->domain_attr->name = strdup(domain_name.c_str());
  return hints;
}

bool info_usable(const fi_info* info, const std::string& provider) noexcept {
  if (info == nullptr || info->fabric_attr == nullptr || info->domain_attr == nullptr) {
    return false;
  }
  const char* prov = info->fabric_attr->prov_name;
  if (prov == nullptr || provider != prov) return false;
  if (info->domain_attr->name == nullptr) return false;
  // Immediates are 32 bits of remote CQ data.
  return info->domain_attr->cq_data_size >= 4;
}

std::string mr_mode_string(uint64_t mr_mode) {
  static constexpr struct {
    uint64_t bit;
    const char* name;
  } kBits[] = {{FI_MR_LOCAL, "LOCAL"},         {FI_MR_RAW, "RAW"},
               {FI_MR_VIRT_ADDR, "VIRT_ADDR"}, {FI_MR_ALLOCATED, "ALLOCATED"},
               {FI_MR_PROV_KEY, "PROV_KEY"},   {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
               {FI_MR_RMA_EVENT, "RMA_EVENT"}, {FI_MR_ENDPOINT, "ENDPOINT"},
               {FI_MR_HMEM, "HMEM"},           {FI_MR_COLLECTIVE, "COLLECTIVE"}};
  std::string out;
  for (const auto& b : kBits) {
    if ((mr_mode & b.bit) == 0) continue;
    if (!out.empty()) out += '|';
    out += b.name;
  }
  return out.empty() ? "none" : out;
}

namespace {

InfoPtr query(const std::string& provider, bool hmem, int* ret_out) {
  InfoPtr hints = make_hints(provider, hmem, {});
  if (!hints) {
    *ret_out = -FI_ENOMEM;
    return nullptr;
  }
  fi_info* list = nullptr;
  *ret_out = fi_getinfo(kFabricApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  return InfoPtr(*ret_out == 0 ? list : nullptr);
}

std::string pci_address(const fi_info* info) {
  if (info->nic == nullptr || info->nic->bus_attr == nullptr ||
      info->nic->bus_attr->bus_type != FI_BUS_PCI) {
    return {};
  }
  const fi_pci_attr& pci = info->nic->bus_attr->attr.pci;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", pci.domain_id, pci.bus_id, pci.device_id,
                pci.function_id);
  return buf;
}

}  // namespace

std::vector<std::string> usable_domain_names(const std::string& provider, bool hmem, int* ret) {
  std::vector<std::string> names;
  InfoPtr list = query(provider, hmem, ret);
  for (const fi_info* info = list.get(); info != nullptr; info = info->next) {
    if (!info_usable(info, provider)) continue;
    if (hmem && (info->caps & FI_HMEM) == 0) continue;
    std::string name = info->domain_attr->name;
    if (std::find(names.begin(), names.end(), name) == names.end())
      names.push_back(std::move(name));
  }
  return names;
}

std::vector<FabricNicInfo> list_fabric_nics(const std::string& provider, std::string* note) {
  std::vector<FabricNicInfo> nics;
  int ret = 0;
  InfoPtr list = query(provider, /*hmem=*/false, &ret);
  if (!list) {
    core::log().debug("ferry fabric: fi_getinfo(provider '{}') found nothing: {}", provider,
                      fi_strerror(-ret));
    if (note) *note = std::string("fi_getinfo: ") + fi_strerror(-ret);
    return nics;
  }
  for (const fi_info* info = list.get(); info != nullptr; info = info->next) {
    if (!info_usable(info, provider)) continue;
    const std::string domain = info->domain_attr->name;
    bool seen = false;
    for (const auto& n : nics) seen = seen || n.domain == domain;
    if (seen) continue;
    FabricNicInfo nic;
    nic.provider = info->fabric_attr->prov_name;
    nic.fabric = info->fabric_attr->name != nullptr ? info->fabric_attr->name : "";
    nic.domain = domain;
    if (info->nic != nullptr && info->nic->link_attr != nullptr) {
      nic.link_speed_bps = info->nic->link_attr->speed;
    }
    nic.pci_address = pci_address(info);
    nic.hmem = (info->caps & FI_HMEM) != 0;
    nics.push_back(std::move(nic));
  }

  // FI_HMEM is optional: a provider without it simply returns nothing here.
  int hmem_ret = 0;
  InfoPtr hmem_list = query(provider, /*hmem=*/true, &hmem_ret);
  for (const fi_info* info = hmem_list.get(); info != nullptr; info = info->next) {
    if (!info_usable(info, provider) || (info->caps & FI_HMEM) == 0) continue;
    for (auto& n : nics) {
      if (n.domain == info->domain_attr->name) n.hmem = true;
    }
  }
  return nics;
}

}  // namespace ferry::fabric

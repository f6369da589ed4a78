#include "ferry/info.h"

#include "engine/domain_families.h"

namespace ferry {

ProviderListing list_provider(const std::string& provider) {
  const core::DomainFamily& f = engine::family_for(provider);
  if (f.list) return f.list(provider);
  ProviderListing out;
  out.provider = provider;
  out.family = std::string(f.name);
  out.note = "this NIC family cannot list its NICs";
  return out;
}

}  // namespace ferry

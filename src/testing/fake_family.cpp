#include "testing/fake_domain.h"

namespace ferry::testing {

namespace {

ProviderListing list(const std::string& provider) {
  ProviderListing out;
  out.provider = provider;
  out.family = "fake";
  out.nics.push_back(NicListing{"fake", "fake", "fake", 100'000'000'000ull, "", false});
  out.note = "in-process fake NIC for tests (src/testing); any name opens";
  return out;
}

}  // namespace

const core::DomainFamily& fake_family() {
  static const core::DomainFamily f{"fake", [](std::string_view p) { return p == "fake"; },
                                    &open_fake_domain, &list};
  return f;
}

}  // namespace ferry::testing

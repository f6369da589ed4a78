// ferry/info.h lists what the engine would open: every NIC it lists for a
// provider opens as an engine NIC, and an absent provider says why.
#include "ferry/info.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "ferry/ferry.h"

namespace ferry {
namespace {

bool has(const ProviderListing& l, const std::string& name) {
  return std::any_of(l.nics.begin(), l.nics.end(), [&](const auto& n) { return n.name == name; });
}

TEST(ListProvider, EveryListedLibfabricNicOpens) {
  for (const char* provider : {"tcp;ofi_rxm", "shm"}) {
    SCOPED_TRACE(provider);
    const ProviderListing l = list_provider(provider);
    EXPECT_EQ(l.family, "fabric");
    ASSERT_FALSE(l.nics.empty()) << l.note;
    for (const auto& nic : l.nics) {
      EngineConfig c;
      c.provider = provider;
      c.groups[0].nic_names = {nic.name};
      c.groups[0].insist = true;
      EXPECT_NO_THROW({ TransferEngine e(c); }) << nic.name;
    }
  }
  EXPECT_TRUE(has(list_provider("tcp;ofi_rxm"), "lo"));
  EXPECT_TRUE(has(list_provider("shm"), "shm"));
}

TEST(ListProvider, AnAbsentProviderIsEmptyAndSaysWhy) {
  const ProviderListing l = list_provider("no-such-provider");
  EXPECT_EQ(l.family, "fabric");
  EXPECT_TRUE(l.nics.empty());
  EXPECT_NE(l.note.find("fi_getinfo"), std::string::npos) << l.note;
}

TEST(ListProvider, FerrysOwnFamiliesAnswerForThemselves) {
  EXPECT_EQ(list_provider("verbs").family, "verbs");
  EXPECT_EQ(list_provider("nvlink").family, "nvlink");
  EXPECT_EQ(list_provider("verbs;ofi_rxm").family, "fabric") << "libfabric's layered verbs";
  const ProviderListing fake = list_provider("fake");
  EXPECT_EQ(fake.family, "fake");
  EXPECT_TRUE(has(fake, "fake"));
}

}  // namespace
}  // namespace ferry

// map_remote (ferry/engine.h): a peer's registered memory as an address of
// this process. The in-process fake NIC maps host memory (engines of one
// process share it); libfabric's providers refuse with kUnimplemented. The
// nvlink provider's mapping is run on the GPU machine (tests/python/rl).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <string>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::code_of;
using test::region;
using test::Region;

TEST(MapRemote, StoresLandInThePeersRegionAndAnImmediateSaysWhenTheyAreDone) {
  TransferEngine a(test::config_for("fake")), b(test::config_for("fake"));
  Region dst = region(b, 1 << 16);
  MappedRegion m = a.map_remote(dst.d, 4096, 8192);
  ASSERT_TRUE(m.valid());
  EXPECT_EQ(m.size(), 8192u);
  EXPECT_EQ(m.data(), dst.buf.data() + 4096);
  std::memset(m.data(), 0x5A, m.size());
  ImmCounter c = b.imm_counter(0x77);
  a.submit_imm(0x77, dst.d, {});
  ASSERT_TRUE(c.wait(1, 20s).is_ok());
  for (size_t i = 0; i < dst.buf.size(); ++i)
    ASSERT_EQ(dst.buf[i], (i >= 4096 && i < 4096 + 8192) ? 0x5A : 0) << i;
}

TEST(MapRemote, OutOfBoundsReadOnlyAndZeroLengthAreTypedErrors) {
  TransferEngine a(test::config_for("fake")), b(test::config_for("fake"));
  Region dst = region(b, 4096);
  EXPECT_EQ(code_of([&] { a.map_remote(dst.d, 4000, 200); }), Code::kOutOfRange);
  EXPECT_EQ(code_of([&] { a.map_remote(dst.d, 1ull << 63, 1ull << 63); }), Code::kOutOfRange);
  EXPECT_EQ(code_of([&] { a.map_remote(dst.d, 0, 0); }), Code::kInvalidArgument);
  // A descriptor lying about its length: the NIC's own bounds still hold.
  MrDesc longer = dst.d;
  longer.len = 1 << 20;
  EXPECT_EQ(code_of([&] { a.map_remote(longer, 8192, 64); }), Code::kOutOfRange);
  const size_t len = 1 << 16;
  void* ro = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  auto [rh, rd] = b.reg_mr(ro, len);
  EXPECT_EQ(code_of([&] { a.map_remote(rd, 0, 64); }), Code::kFailedPrecondition);
  b.unreg_mr(rh);
  ::munmap(ro, len);
}

TEST(MapRemote, AnUnregisteredRegionIsRefused) {
  TransferEngine a(test::config_for("fake")), b(test::config_for("fake"));
  Region dst = region(b, 4096);
  EXPECT_TRUE(a.map_remote(dst.d, 0, 64).valid());
  b.unreg_mr(dst.h);
  EXPECT_EQ(code_of([&] { a.map_remote(dst.d, 0, 64); }), Code::kNotFound);
}

TEST(MapRemote, APeerThatIsGoneIsRefused) {
  TransferEngine a(test::config_for("fake"));
  MrDesc d;
  {
    TransferEngine b(test::config_for("fake"));
    Region dst = region(b, 4096);
    d = dst.d;
  }
  const Code c = code_of([&] { a.map_remote(d, 0, 64); });
  EXPECT_TRUE(c == Code::kUnavailable || c == Code::kFailedPrecondition) << int(c);
}

class MapRemoteFabric : public ::testing::TestWithParam<std::string> {};

TEST_P(MapRemoteFabric, LibfabricProvidersRefuseWithUnimplemented) {
  TransferEngine a(test::config_for(GetParam())), b(test::config_for(GetParam()));
  Region dst = region(b, 4096);
  EXPECT_EQ(code_of([&] { a.map_remote(dst.d, 0, 64); }), Code::kUnimplemented);
  // The engine stays usable: a write to the same region still lands.
  Region src = region(a, 4096, 9);
  ImmCounter c = b.imm_counter(5);
  std::atomic<uint64_t> done{0}, failed{0};
  a.submit_single_write(64, 5, src.h, 0, dst.d, 0, OnDone::counter(done, &failed));
  const bool arrived = c.wait(1, 20s).is_ok();
  // The source stays in use until the sender's own completion, which may come
  // after the receiver counted the immediate: wait for it before `src` goes.
  ASSERT_TRUE(test::wait_until([&] { return done.load() + failed.load() == 1; }, 20s));
  EXPECT_EQ(failed.load(), 0u);
  ASSERT_TRUE(arrived);
  EXPECT_EQ(std::memcmp(dst.buf.data(), src.buf.data(), 64), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, MapRemoteFabric, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace ferry

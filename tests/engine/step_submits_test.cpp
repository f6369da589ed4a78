// StepSubmits (ferry/step_submits.h): prepared transfers posted as a step
// counter passes their values, from the host (advance) and from the watcher
// thread over host memory standing in for the UVM word (no GPU needed).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/mapped_memory.h"
#include "cuda/watcher.h"
#include "ferry/ferry.h"
#include "ferry/step_submits.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::region;
using test::Region;

constexpr uint64_t kPage = 1024;
constexpr uint32_t kPagesPerStep = 8;

// Step s writes pages [s*8, s*8+8) of src to the reversed pages of dst's step block.
std::vector<std::vector<StepTransfer>> make_steps(TransferEngine& e, const Region& src,
                                                  const Region& dst, uint32_t steps, uint32_t imm) {
  std::vector<std::vector<StepTransfer>> out(steps);
  for (uint32_t s = 0; s < steps; ++s) {
    Pages sp, dp;
    for (uint32_t i = 0; i < kPagesPerStep; ++i) {
      sp.indices.push_back(s * kPagesPerStep + i);
      dp.indices.push_back(s * kPagesPerStep + kPagesPerStep - 1 - i);
    }
    sp.stride = dp.stride = kPage;
    out[s].push_back({e.prepare_paged_writes(kPage, src.h, sp, dst.d, dp), imm});
    // A second transfer per step (the V of a K/V pair): one single write.
    out[s].push_back({e.prepare_single_write(64, src.h, s * 64, dst.d,
                                             uint64_t(steps) * kPagesPerStep * kPage + s * 64),
                      imm});
  }
  return out;
}

bool step_landed(const Region& src, const Region& dst, uint32_t s, uint32_t steps) {
  for (uint32_t i = 0; i < kPagesPerStep; ++i) {
    const uint64_t from = (s * kPagesPerStep + i) * kPage;
    const uint64_t to = (s * kPagesPerStep + kPagesPerStep - 1 - i) * kPage;
    if (std::memcmp(dst.buf.data() + to, src.buf.data() + from, kPage) != 0) return false;
  }
  const uint64_t tail = uint64_t(steps) * kPagesPerStep * kPage + s * 64;
  return std::memcmp(dst.buf.data() + tail, src.buf.data() + s * 64, 64) == 0;
}

struct Done {
  std::atomic<int> calls{0};
  std::atomic<int> code{-1};
  StepSubmits::Finished fn() {
    return [this](const Status& s) {
      code.store(int(s.code()));
      calls.fetch_add(1);
    };
  }
};

class StepSubmitsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    a_ = std::make_unique<TransferEngine>(test::config_for(GetParam()));
    b_ = std::make_unique<TransferEngine>(test::config_for(GetParam()));
  }
  std::unique_ptr<TransferEngine> a_, b_;
};

TEST_P(StepSubmitsTest, StepsArePostedAsTheCounterPassesThemAndOnlyThen) {
  constexpr uint32_t kSteps = 6, kImm = 0x515;
  Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 5);
  Region dst = region(*b_, src.buf.size(), std::nullopt);
  ImmCounter c = b_->imm_counter(kImm);
  auto steps = StepSubmits::host(*a_);
  Done done;
  StepJob job = steps->add(10, make_steps(*a_, src, dst, kSteps, kImm), done.fn());
  const uint64_t per_step = kPagesPerStep + 1;  // ImmPlan: one per page, one single write
  steps->advance(10);                           // the job's values start at 11
  EXPECT_EQ(job.steps_posted(), 0u);
  steps->advance(12);  // values 11 and 12: steps 0 and 1
  ASSERT_TRUE(c.wait(2 * per_step, 20s).is_ok()) << c.value();
  EXPECT_TRUE(step_landed(src, dst, 0, kSteps) && step_landed(src, dst, 1, kSteps));
  EXPECT_FALSE(step_landed(src, dst, 2, kSteps));
  steps->advance(11);  // never backwards: nothing happens
  EXPECT_EQ(job.steps_posted(), 2u);
  EXPECT_EQ(done.calls.load(), 0);
  steps->advance(100);  // the rest, in order
  ASSERT_TRUE(c.wait((kSteps - 2) * per_step, 20s).is_ok());
  ASSERT_TRUE(job.wait(20s).is_ok());
  for (uint32_t s = 0; s < kSteps; ++s) EXPECT_TRUE(step_landed(src, dst, s, kSteps)) << s;
  EXPECT_EQ(job.transfers_posted(), 2u * kSteps);
  EXPECT_EQ(job.transfers_done(), 2u * kSteps);
  EXPECT_EQ(job.transfers_failed(), 0u);
  EXPECT_TRUE(job.finished());
  EXPECT_EQ(done.calls.load(), 1);
  EXPECT_EQ(done.code.load(), int(Code::kOk));
  EXPECT_EQ(steps->live_jobs(), 0u);
  EXPECT_EQ(c.value(), 0);  // exactly the planned immediates, none left over
}

TEST_P(StepSubmitsTest, CancelStopsPostingAndReportsWhatWasPosted) {
  constexpr uint32_t kSteps = 5, kImm = 0x516;
  Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 9);
  Region dst = region(*b_, src.buf.size(), std::nullopt);
  ImmCounter c = b_->imm_counter(kImm);
  auto steps = StepSubmits::host(*a_);
  Done done;
  StepJob job = steps->add(0, make_steps(*a_, src, dst, kSteps, kImm), done.fn());
  steps->advance(2);
  EXPECT_EQ(job.cancel(), 2u);
  steps->advance(5);
  ASSERT_TRUE(job.wait(20s).is_ok());
  EXPECT_EQ(job.steps_posted(), 2u);
  ASSERT_TRUE(c.wait(2 * (kPagesPerStep + 1), 20s).is_ok());
  EXPECT_EQ(done.calls.load(), 1);
  EXPECT_FALSE(step_landed(src, dst, 2, kSteps));
  EXPECT_EQ(steps->live_jobs(), 0u);
  EXPECT_EQ(job.cancel(), 2u);  // idempotent
}

TEST_P(StepSubmitsTest, JobsSharingABaseAndAddedLateArePostedFromTheCurrentValue) {
  constexpr uint32_t kSteps = 3;
  Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 3);
  Region d1 = region(*b_, src.buf.size(), std::nullopt), d2 = region(*b_, src.buf.size());
  ImmCounter c1 = b_->imm_counter(1), c2 = b_->imm_counter(2);
  auto steps = StepSubmits::host(*a_);
  steps->advance(2);
  StepJob j1 = steps->add(0, make_steps(*a_, src, d1, kSteps, 1));  // 2 steps passed already
  StepJob j2 = steps->add(2, make_steps(*a_, src, d2, kSteps, 2));
  EXPECT_EQ(j1.steps_posted(), 2u);
  EXPECT_EQ(j2.steps_posted(), 0u);
  steps->advance(5);
  ASSERT_TRUE(j1.wait(20s).is_ok() && j2.wait(20s).is_ok());
  ASSERT_TRUE(c1.wait(kSteps * (kPagesPerStep + 1), 20s).is_ok());
  ASSERT_TRUE(c2.wait(kSteps * (kPagesPerStep + 1), 20s).is_ok());
  for (uint32_t s = 0; s < kSteps; ++s)
    EXPECT_TRUE(step_landed(src, d1, s, kSteps) && step_landed(src, d2, s, kSteps));
}

TEST_P(StepSubmitsTest, AnUnregisteredSourceEndsTheJobWithFailedPrecondition) {
  constexpr uint32_t kSteps = 4;
  Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 1);
  Region dst = region(*b_, src.buf.size());
  auto steps = StepSubmits::host(*a_);
  Done done;
  ImmCounter c = b_->imm_counter(3);
  StepJob job = steps->add(0, make_steps(*a_, src, dst, kSteps, 3), done.fn());
  steps->advance(1);
  ASSERT_TRUE(c.wait(kPagesPerStep + 1, 20s).is_ok());
  a_->unreg_mr(src.h);
  steps->advance(4);
  // finished() turns true after on_finished returned, so wait on the job, not
  // on the callback's count (which is bumped before finished() is true).
  ASSERT_TRUE(job.wait(20s).is_ok());
  EXPECT_EQ(done.calls.load(), 1);
  EXPECT_EQ(done.code.load(), int(Code::kFailedPrecondition));
  EXPECT_TRUE(job.finished());
  EXPECT_EQ(steps->live_jobs(), 0u);
}

TEST_P(StepSubmitsTest, CloseCancelsEveryJobAndRefusesNewOnes) {
  Region src = region(*a_, 4 * kPagesPerStep * kPage + 4 * 64, 1);
  Region dst = region(*b_, src.buf.size());
  auto steps = StepSubmits::host(*a_);
  Done done;
  StepJob job = steps->add(0, make_steps(*a_, src, dst, 4, 4), done.fn());
  steps->close();
  EXPECT_TRUE(job.finished());
  EXPECT_EQ(done.calls.load(), 1);
  EXPECT_EQ(job.steps_posted(), 0u);
  EXPECT_EQ(test::code_of([&] { steps->add(0, {}); }), Code::kFailedPrecondition);
}

// The watcher thread polling a host word (what alloc_uvm_watcher_submits arms
// over pinned device-mapped memory): a host thread plays the kernel, bumping
// the word once per layer with release stores, as device.cuh's bump does.
TEST_P(StepSubmitsTest, AWatcherWordPostsEveryStepItPasses) {
  constexpr uint32_t kSteps = 32, kImm = 0x517;
  Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 7);
  Region dst = region(*b_, src.buf.size());
  ImmCounter c = b_->imm_counter(kImm);
  auto steps = StepSubmits::host(*a_);
  StepJob job = steps->add(0, make_steps(*a_, src, dst, kSteps, kImm));
  cuda::WatcherService ws(
      std::make_shared<cuda::SlotPool>(cuda::alloc_host_for_testing(4 * cuda::kSlotBytes)), -1);
  uint64_t* word = ws.alloc([s = steps](uint64_t, uint64_t now) {
    s->advance(now);
    return true;
  });
  std::thread kernel([word] {
    for (uint64_t v = 1; v <= kSteps; ++v)
      std::atomic_ref<uint64_t>(*word).fetch_add(1, std::memory_order_release);
  });
  kernel.join();
  ASSERT_TRUE(job.wait(20s).is_ok()) << job.steps_posted();
  ASSERT_TRUE(c.wait(kSteps * (kPagesPerStep + 1), 20s).is_ok()) << c.value();
  for (uint32_t s = 0; s < kSteps; ++s) EXPECT_TRUE(step_landed(src, dst, s, kSteps)) << s;
  ws.stop();
}

// The engine's own word (alloc_uvm_watcher_submits) over host memory standing
// in for the mapped block, swept by the watcher thread or by the worker, whose
// callback posts the steps in the same turn.
TEST_P(StepSubmitsTest, TheEnginesWordPostsEveryStepOnTheWatcherThreadAndOnTheWorker) {
  ::setenv("FERRY_TESTING_HOST_WATCHERS", "1", 1);
  constexpr uint32_t kSteps = 16, kImm = 0x518;
  for (WatchOn on : {WatchOn::kWatcherThread, WatchOn::kWorker}) {
    Region src = region(*a_, kSteps * kPagesPerStep * kPage + kSteps * 64, 9);
    Region dst = region(*b_, src.buf.size());
    ImmCounter c = b_->imm_counter(kImm);
    auto steps = a_->alloc_uvm_watcher_submits(on);
    ASSERT_NE(steps->word(), nullptr);
    StepJob job = steps->add(0, make_steps(*a_, src, dst, kSteps, kImm));
    for (uint64_t v = 1; v <= kSteps; ++v)
      std::atomic_ref<uint64_t>(*steps->word()).fetch_add(1, std::memory_order_release);
    ASSERT_TRUE(job.wait(20s).is_ok()) << job.steps_posted();
    ASSERT_TRUE(c.wait(kSteps * (kPagesPerStep + 1), 20s).is_ok()) << c.value();
    for (uint32_t s = 0; s < kSteps; ++s) EXPECT_TRUE(step_landed(src, dst, s, kSteps)) << s;
    steps->close();
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, StepSubmitsTest, ::testing::Values("fake", "tcp", "shm"));

// Without CUDA (or without a GPU) the watcher word cannot be allocated: a
// typed error, as for alloc_uvm_watcher; with one, a device-visible word.
TEST(StepSubmitsApi, AWatcherWordIsAllocatedOrRefusedWithATypedError) {
  TransferEngine e(test::config_for("fake"));
  const Code c = test::code_of([&] {
    auto s = e.alloc_uvm_watcher_submits();
    EXPECT_NE(s->word(), nullptr);
    s->close();
  });
  EXPECT_NE(c, Code::kInternal);
}

}  // namespace
}  // namespace ferry

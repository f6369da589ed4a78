// Bad input gets a typed error before anything is posted, and loses nothing:
// one test per case. The engine writes to itself over a real provider.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "ferry/ferry.h"
#include "support/checks.h"
#include "support/engine_config.h"
#include "support/process.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

using test::code_of;

class MisuseTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<TransferEngine>(test::config_for(GetParam()));
    buf_.resize(1 << 16);
    std::tie(h_, d_) = engine_->reg_mr(buf_.data(), buf_.size());
    counter_ = engine_->imm_counter(77);
  }
  // Nothing arrived: a rejected request must not have posted a write.
  void expect_nothing_posted() {
    std::atomic<bool> done{false};
    engine_->submit_imm(78, d_, OnDone::flag(done));
    ASSERT_TRUE(test::wait_until([&] { return done.load(); }));
    EXPECT_EQ(counter_.value(), 0);
  }
  std::unique_ptr<TransferEngine> engine_;
  std::vector<uint8_t> buf_;
  MrHandle h_;
  MrDesc d_;
  ImmCounter counter_;
};

TEST_P(MisuseTest, UnregisteredSourceIsNotFound) {
  MrHandle bogus{buf_.data(), 12345};
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(8, 77, bogus, 0, d_, 0, {}); }),
            Code::kNotFound);
  expect_nothing_posted();
}

TEST_P(MisuseTest, SourceRangePastRegionEndIsOutOfRange) {
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(16, 77, h_, buf_.size() - 8, d_, 0, {}); }),
            Code::kOutOfRange);
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(~0ull, 77, h_, 8, d_, 0, {}); }),
            Code::kOutOfRange);
  expect_nothing_posted();
}

TEST_P(MisuseTest, DestinationRangePastRegionEndIsOutOfRange) {
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(16, 77, h_, 0, d_, buf_.size() - 15, {}); }),
            Code::kOutOfRange);
  EXPECT_EQ(code_of([&] {
              engine_->submit_paged_writes(4096, 77, h_, Pages{{0}, 4096, 0}, d_,
                                           Pages{{16}, 4096, 0}, {});
            }),
            Code::kOutOfRange);
  expect_nothing_posted();
}

TEST_P(MisuseTest, MalformedAddressAndDescriptorBytesAreInvalidArgument) {
  auto addr = engine_->main_address();  // the span below points into it
  auto good = addr.bytes();
  std::vector<uint8_t> truncated(good.begin(), good.end() - 1);
  EXPECT_EQ(code_of([&] { NetAddr::from_bytes(truncated); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { NetAddr::from_hex("zz"); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { NetAddr::from_hex("abc"); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { NetAddr::from_bytes({}); }), Code::kInvalidArgument);
  auto desc = d_.to_bytes();
  EXPECT_EQ(MrDesc::from_bytes(desc), d_);
  std::vector<uint8_t> cut(desc.begin(), desc.begin() + desc.size() / 2);
  EXPECT_EQ(code_of([&] { MrDesc::from_bytes(cut); }), Code::kInvalidArgument);
  auto trailing = desc;
  trailing.push_back(0);
  EXPECT_EQ(code_of([&] { MrDesc::from_bytes(trailing); }), Code::kInvalidArgument);
  auto bad_version = desc;
  bad_version[0] = 99;
  EXPECT_EQ(code_of([&] { MrDesc::from_bytes(bad_version); }), Code::kInvalidArgument);
}

TEST_P(MisuseTest, UnreachablePeerFailsTheTransferWithinTheDeadline) {
  MrDesc dead_desc;
  NetAddr dead_addr;
  std::vector<uint8_t> other(4096);
  {
    auto cfg = test::config_for(GetParam());
    TransferEngine dead(cfg);
    dead_desc = dead.reg_mr(other.data(), other.size()).second;
    dead_addr = dead.main_address();
  }  // stopped and gone: nobody listens at that address any more
  // tcp retries connecting until the deadline; shm refuses the peer at once.
  auto cfg = test::config_for(GetParam());
  cfg.default_deadline = 3s;
  engine_ = std::make_unique<TransferEngine>(cfg);
  std::tie(h_, d_) = engine_->reg_mr(buf_.data(), buf_.size());
  counter_ = engine_->imm_counter(77);
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> done{false}, failed{false};
  engine_->submit_single_write(64, 77, h_, 0, dead_desc, 0, OnDone::flag(done, &failed));
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }, 40s));
  EXPECT_TRUE(failed.load());
  Status send_status;
  std::atomic<bool> send_done{false};
  engine_->submit_send(dead_addr, std::vector<uint8_t>(10, 1), [&](const Status& s) {
    send_status = s;
    send_done = true;
  });
  ASSERT_TRUE(test::wait_until([&] { return send_done.load(); }, 40s));
  EXPECT_FALSE(send_status.is_ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "errors must arrive within the deadline";
  EXPECT_EQ(counter_.value(), 0);
}

TEST_P(MisuseTest, ZeroCountsAreInvalidArgument) {
  EXPECT_EQ(code_of([&] { engine_->expect_imm_count(1, 0, [] {}); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->submit_recvs(0, 4, [](auto) {}); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->submit_recvs(64, 0, [](auto) {}); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->reg_mr(buf_.data(), 0); }), Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->reg_mr(nullptr, 64); }), Code::kInvalidArgument);
}

TEST_P(MisuseTest, UseAfterUnregIsNotFound) {
  std::vector<uint8_t> other(4096);
  auto [h, d] = engine_->reg_mr(other.data(), other.size());
  engine_->unreg_mr(h);
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(8, 77, h, 0, d_, 0, {}); }),
            Code::kNotFound);
  EXPECT_EQ(code_of([&] { engine_->unreg_mr(h); }), Code::kNotFound);
  expect_nothing_posted();
}

TEST_P(MisuseTest, DescriptorWithAnotherNicCountIsRejected) {
  MrDesc two = d_;
  two.nics.push_back(two.nics[0]);
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(8, 77, h_, 0, two, 0, {}); }),
            Code::kFailedPrecondition);
  EXPECT_EQ(code_of([&] { engine_->submit_imm(77, two, {}); }), Code::kFailedPrecondition);
  expect_nothing_posted();
}

TEST_P(MisuseTest, CallsAfterStopAreFailedPrecondition) {
  engine_->stop();
  EXPECT_EQ(code_of([&] { engine_->submit_single_write(8, 77, h_, 0, d_, 0, {}); }),
            Code::kFailedPrecondition);
  EXPECT_EQ(code_of([&] { engine_->reg_mr(buf_.data(), 64); }), Code::kFailedPrecondition);
}

TEST_P(MisuseTest, ThrowingCallbackDoesNotStopTheEngine) {
  std::atomic<bool> second{false};
  engine_->submit_imm(79, d_, [](const Status&) { throw std::runtime_error("user bug"); });
  engine_->submit_imm(79, d_, [&](const Status& s) { second = s.is_ok(); });
  EXPECT_TRUE(test::wait_until([&] { return second.load(); }));
}

TEST_P(MisuseTest, PageListsOfDifferentLengthsAreInvalidArgument) {
  EXPECT_EQ(
      code_of([&] {
        engine_->submit_paged_writes(64, 77, h_, Pages{{0, 1}, 64, 0}, d_, Pages{{0}, 64, 0}, {});
      }),
      Code::kInvalidArgument);
  expect_nothing_posted();
}

TEST_P(MisuseTest, PinnedNicOutOfRangeIsInvalidArgument) {
  EXPECT_EQ(code_of([&] {
              engine_->submit_single_write(8, 77, h_, 0, d_, 0, {}, WriteRoute::pinned(3));
            }),
            Code::kInvalidArgument);
  EXPECT_EQ(
      code_of([&] { engine_->submit_single_write(8, 77, h_, 0, d_, 0, {}, WriteRoute::split(2)); }),
      Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->submit_imm(77, d_, {}, WriteRoute::pinned(1)); }),
            Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              engine_->submit_scatter(std::nullopt, {}, 77, h_, {ScatterDst{8, 0, d_, 0}},
                                      GroupRoute::pinned(2));
            }),
            Code::kInvalidArgument);
  expect_nothing_posted();
}

TEST_P(MisuseTest, UnknownOrMismatchedPeerGroupFailsTheTransfer) {
  Status unknown, mismatch;
  std::atomic<int> ended{0};
  engine_->submit_barrier(PeerGroupHandle(999),
                          [&](const Status& s) {
                            unknown = s;
                            ++ended;
                          },
                          77, {d_});
  auto g = engine_->add_peer_group(std::vector<MrDesc>{d_, d_});
  engine_->submit_barrier(g,
                          [&](const Status& s) {
                            mismatch = s;
                            ++ended;
                          },
                          77, {d_});
  ASSERT_TRUE(test::wait_until([&] { return ended.load() == 2; }));
  EXPECT_EQ(unknown.code(), Code::kNotFound) << unknown.to_string();
  EXPECT_EQ(mismatch.code(), Code::kInvalidArgument) << mismatch.to_string();
  expect_nothing_posted();
}

TEST_P(MisuseTest, SendLargerThanTheSendBufferIsInvalidArgument) {
  std::vector<uint8_t> big((64 << 10) + 1);
  EXPECT_EQ(code_of([&] { engine_->submit_send(engine_->main_address(), big, {}); }),
            Code::kInvalidArgument);
  EXPECT_EQ(code_of([&] { engine_->submit_send(NetAddr(), std::vector<uint8_t>(4), {}); }),
            Code::kInvalidArgument);
}

TEST_P(MisuseTest, AddressOfAnotherTransportFailsTheTransfer) {
  MrDesc foreign = d_;
  foreign.nics[0].addr = NetAddr(Transport::kVerbs, 1, std::vector<uint8_t>(26, 1));
  Status st;
  std::atomic<bool> done{false};
  engine_->submit_single_write(8, 77, h_, 0, foreign, 0, [&](const Status& s) {
    st = s;
    done = true;
  });
  ASSERT_TRUE(test::wait_until([&] { return done.load(); }));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  expect_nothing_posted();
}

TEST_P(MisuseTest, CounterWaitPastItsTimeoutIsDeadlineExceeded) {
  auto st = counter_.wait(1, 20ms);
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(code_of([&] { engine_->remove_imm_count(12345); }), Code::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Providers, MisuseTest, ::testing::Values("tcp", "shm", "fake"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry

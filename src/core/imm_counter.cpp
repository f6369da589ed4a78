#include <chrono>
#include <thread>

#include "core/callback_thread.h"
#include "core/imm_table.h"

namespace ferry {

int64_t ImmCounter::value() const { return s_ ? s_->value.load(std::memory_order_acquire) : 0; }

bool ImmCounter::try_consume(int64_t n) {
  if (!s_) return false;
  int64_t v = s_->value.load(std::memory_order_acquire);
  while (v >= n) {
    if (s_->value.compare_exchange_weak(v, v - n, std::memory_order_acq_rel)) return true;
  }
  return false;
}

Status ImmCounter::wait(int64_t n, std::chrono::nanoseconds timeout) {
  if (!s_) return Status(Code::kFailedPrecondition, "ImmCounter::wait on an empty counter");
  if (n < 0) return Status(Code::kInvalidArgument, "ImmCounter::wait: negative count");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // Arrivals are often microseconds away: spin a little before sleeping.
  for (int i = 0; i < 2000; ++i) {
    if (try_consume(n)) return {};
    if (i > 200) std::this_thread::yield();
  }
  s_->waiters.fetch_add(1, std::memory_order_seq_cst);
  std::unique_lock lk(s_->mu);
  bool ok = true;
  for (;;) {
    if (try_consume(n)) break;
    if (s_->cv.wait_until(lk, deadline) == std::cv_status::timeout) {
      ok = try_consume(n);
      break;
    }
  }
  lk.unlock();
  s_->waiters.fetch_sub(1, std::memory_order_seq_cst);
  if (!ok)
    return Status(Code::kDeadlineExceeded,
                  "ImmCounter::wait: " + std::to_string(n) + " arrivals not reached (have " +
                      std::to_string(value()) + ")");
  return {};
}

namespace core {

void ImmTable::expect(uint32_t imm, uint32_t count, ImmCountCallback cb) {
  auto e = std::make_shared<ExpectedCount>();
  e->every = count;
  e->cb = std::move(cb);
  std::unique_lock lk(mu_);
  map_[imm] = Entry{nullptr, std::move(e)};
}

ImmCounter ImmTable::counter(uint32_t imm) {
  std::unique_lock lk(mu_);
  auto& e = map_[imm];
  if (!e.counter) e = Entry{std::make_shared<ImmCounter::State>(), nullptr};
  return ImmCounter(e.counter);
}

bool ImmTable::remove(uint32_t imm) {
  std::unique_lock lk(mu_);
  return map_.erase(imm) > 0;
}

void ImmTable::add_plain_callback(ImmCallback cb) {
  std::lock_guard lk(plain_mu_);
  plain_.push_back(std::move(cb));
}

void ImmTable::on_arrival(uint32_t imm) {
  std::shared_lock lk(mu_);
  auto it = map_.find(imm);
  if (it == map_.end()) {
    lk.unlock();
    callbacks_->push(PlainImmEvent{imm});
    return;
  }
  if (it->second.counter) {
    it->second.counter->add(1);
    return;
  }
  auto& ex = it->second.expected;
  // Each arrival sees a distinct value of the monotonic count, so exactly one
  // worker observes each multiple of `every`: once per `every` arrivals.
  uint64_t now = ex->arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now % ex->every == 0) callbacks_->push(ImmCountEvent{ex});
}

void ImmTable::run_plain_callbacks(uint32_t imm) {
  std::lock_guard lk(plain_mu_);
  for (auto& cb : plain_) cb(imm);
}

}  // namespace core
}  // namespace ferry

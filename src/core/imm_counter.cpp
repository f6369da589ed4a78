#include <chrono>
#include <thread>

#include "core/callback_thread.h"
#include "core/imm_table.h"

namespace ferry {

int64_t ImmCounter::value() const {
  return s_ ? s_->value.load(std::memory_order_acquire) : 0;
}

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
    return Status(Code::kDeadlineExceeded, "ImmCounter::wait: " + std::to_string(n) +
                                               " arrivals not reached (have " +
                                               std::to_string(value()) + ")");
  return {};
}

namespace core {

void ImmTable::expect(uint32_t imm, uint32_t count, ImmCountCallback cb) {
  auto e = std::make_shared<ExpectedCount>();
  e->every = count;
  e->cb = std::move(cb);
  std::unique_lock lk(mu_);
  map_[imm] = Entry{nullptr, std::move(e), nullptr};
}

void ImmTable::expect_gpu_flag(uint32_t imm, uint32_t count, uint32_t* flag,
                               std::shared_ptr<void> keep) {
  auto g = std::make_shared<GpuFlagCount>();
  g->every = count;
  g->flag = flag;
  g->keep = std::move(keep);
  std::unique_lock lk(mu_);
  map_[imm] = Entry{nullptr, nullptr, std::move(g)};
}

ImmCounter ImmTable::counter(uint32_t imm) {
  std::unique_lock lk(mu_);
  auto& e = map_[imm];
  if (!e.counter) e = Entry{std::make_shared<ImmCounter::State>(), nullptr, nullptr};
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

void ImmTable::on_arrival(uint32_t imm, uint32_t n) {
  if (n == 0) return;
  std::shared_lock lk(mu_);
  auto it = map_.find(imm);
  if (it == map_.end()) {
    lk.unlock();
    // Plain callbacks still see every immediate: the event carries the count.
    callbacks_->push(PlainImmEvent{imm, n});
    return;
  }
  if (it->second.counter) {
    it->second.counter->add(n);
    return;
  }
  if (auto& g = it->second.gpu) {
    // Ordering (docs/GPU.md): this worker read the completion of this
    // immediate before counting it, and with the libfabric host-memory
    // providers the data is already in host memory when its completion is
    // read (shm copies before it writes the completion; a NIC's DMA writes
    // precede its CQE on the same PCIe path). The acq_rel add chains every
    // earlier arrival's count (from any worker) before ours, so the release
    // store below is ordered after all their data; a kernel that observes the
    // flag with ld.acquire.sys therefore reads the data, not older bytes.
    const uint64_t before = g->arrived.fetch_add(n, std::memory_order_acq_rel);
    const uint64_t now = before + n;
    if (now / g->every != before / g->every) {  // crossed at least one multiple
      auto gen = uint32_t(now / g->every);
      std::atomic_ref<uint32_t> f(*g->flag);
      // Two workers can reach generations k and k+1 and store out of order: a
      // wrap-safe max keeps the flag from going backwards.
      uint32_t cur = f.load(std::memory_order_relaxed);
      while (int32_t(gen - cur) > 0 && !f.compare_exchange_weak(cur, gen, std::memory_order_release,
                                                                std::memory_order_relaxed)) {
      }
    }
    return;
  }
  auto& ex = it->second.expected;
  // Each arrival run sees a distinct range of the monotonic count, so exactly
  // one worker observes each multiple of `every`: once per `every` arrivals.
  const uint64_t before = ex->arrived.fetch_add(n, std::memory_order_acq_rel);
  for (uint64_t k = before / ex->every; k < (before + n) / ex->every; ++k)
    callbacks_->push(ImmCountEvent{ex});
}

void ImmTable::run_plain_callbacks(uint32_t imm) {
  std::lock_guard lk(plain_mu_);
  for (auto& cb : plain_) cb(imm);
}

}  // namespace core
}  // namespace ferry

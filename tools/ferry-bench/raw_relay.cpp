#include "raw_relay.h"

#include <rdma/fi_errno.h>
#include <sched.h>

#include "core/log.h"

namespace ferry_bench {

RawRelay::RawRelay(RawFabric& rf, int cpu, bool yield, const void* src, uint64_t raddr,
                   uint64_t key, uint32_t imm)
    : rf_(rf), src_(src), raddr_(raddr), key_(key), imm_(imm) {
  thread_ = std::thread([this, cpu, yield] { run(cpu, yield); });
}

RawRelay::~RawRelay() {
  stop_.store(true, std::memory_order_release);
  thread_.join();
}

std::string RawRelay::error() const {
  const int e = error_.load(std::memory_order_acquire);
  return e == 0 ? std::string() : std::string("raw relay: ") + fi_strerror(e);
}

void RawRelay::run(int cpu, bool yield) {
  if (cpu >= 0) ferry::core::pin_current_thread(cpu, "raw relay");
  RawEvent ev[32];
  uint64_t posted = 0, arrived = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    const size_t n = rf_.poll(0, ev, 32);
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].kind == RawEvent::Kind::kRemoteData) {
        arrived_.store(++arrived, std::memory_order_release);
      } else if (ev[i].kind == RawEvent::Kind::kError && error_.load() == 0) {
        error_.store(int(ev[i].data), std::memory_order_release);
      }
    }
    const uint64_t want = requested_.load(std::memory_order_acquire);
    while (posted < want) {
      const int ret = rf_.write(0, src_, 0, raddr_, key_, imm_, uint64_t(3) << 32);
      if (ret == -FI_EAGAIN) break;
      if (ret != 0) {
        if (error_.load() == 0) error_.store(-ret, std::memory_order_release);
        break;
      }
      ++posted;
    }
    if (yield && n == 0) sched_yield();
  }
}

}  // namespace ferry_bench

// RAII owners for libibverbs objects, declared in the order a domain opens
// them (device list, context, PD, TD, parent domain, completion channel, CQ,
// SRQ, QP, AH, MR).
// Members holding them must be declared in the same order so that they are
// destroyed in reverse: a QP before its SRQ and CQ, everything before the PD,
// the PD before the context, the CQ before its completion channel.
#pragma once

#include <infiniband/verbs.h>

#include <cstring>
#include <memory>

#include "core/log.h"
#include "verbs/verbs_notify.h"

namespace ferry::verbs {

// Destroy calls can fail (EBUSY: a PD with live MRs); a destructor cannot
// report it, so it is logged instead of lost.
inline void log_destroy_failure(const char* call, int ret) {
  if (ret != 0) {
    core::log().warn("ferry verbs: {} failed: {} ({})", call, std::strerror(ret), ret);
  }
}

struct DeviceListDeleter {
  void operator()(ibv_device** l) const noexcept { ibv_free_device_list(l); }
};
struct ContextDeleter {
  void operator()(ibv_context* c) const noexcept {
    log_destroy_failure("ibv_close_device", ibv_close_device(c));
  }
};
struct PdDeleter {  // protection domains and parent domains alike
  void operator()(ibv_pd* p) const noexcept {
    log_destroy_failure("ibv_dealloc_pd", ibv_dealloc_pd(p));
  }
};
struct TdDeleter {
  void operator()(ibv_td* t) const noexcept {
    log_destroy_failure("ibv_dealloc_td", ibv_dealloc_td(t));
  }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* c) const noexcept {
    log_destroy_failure("ibv_destroy_comp_channel", ibv_destroy_comp_channel(c));
  }
};
// A CQ attached to a completion channel carries the channel's bookkeeping:
// ibv_destroy_cq blocks until every event taken with ibv_get_cq_event is
// acked, so the events not acked yet are acked first. The CqNotify must
// outlive the CQ (declare it before the CqPtr).
struct CqDeleter {
  CqNotify* notify = nullptr;
  void operator()(ibv_cq* c) const noexcept {
    if (notify != nullptr) {
      if (const uint32_t n = notify->take_unacked(); n > 0) ibv_ack_cq_events(c, n);
    }
    log_destroy_failure("ibv_destroy_cq", ibv_destroy_cq(c));
  }
};
struct SrqDeleter {
  void operator()(ibv_srq* s) const noexcept {
    log_destroy_failure("ibv_destroy_srq", ibv_destroy_srq(s));
  }
};
struct QpDeleter {
  void operator()(ibv_qp* q) const noexcept {
    log_destroy_failure("ibv_destroy_qp", ibv_destroy_qp(q));
  }
};
struct AhDeleter {
  void operator()(ibv_ah* a) const noexcept {
    log_destroy_failure("ibv_destroy_ah", ibv_destroy_ah(a));
  }
};
struct MrDeleter {
  void operator()(ibv_mr* m) const noexcept {
    log_destroy_failure("ibv_dereg_mr", ibv_dereg_mr(m));
  }
};

using DeviceListPtr = std::unique_ptr<ibv_device*, DeviceListDeleter>;
using ContextPtr = std::unique_ptr<ibv_context, ContextDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using TdPtr = std::unique_ptr<ibv_td, TdDeleter>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using SrqPtr = std::unique_ptr<ibv_srq, SrqDeleter>;
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;
using AhPtr = std::unique_ptr<ibv_ah, AhDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;

}  // namespace ferry::verbs

// Completion-channel bookkeeping for adaptive polling (pure: no verbs types).
//
// The verbs domain attaches its CQ to an ibv_comp_channel whose fd the worker
// blocks on. A notification is one-shot: ibv_req_notify_cq arms the CQ for
// the next CQE, that CQE puts one event on the channel, and the CQ stays
// disarmed until armed again. Every event taken with ibv_get_cq_event must be
// acked (ibv_ack_cq_events) before the CQ is destroyed; acking takes a lock,
// so acks are batched.
//
// Before blocking (Domain::can_block) the order is:
//   1. drain the channel without blocking (each event disarmed the CQ), and
//      ack once a batch has accumulated;
//   2. arm the CQ unless it is still armed;
//   3. poll the CQ once. A CQE that arrived after the domain's last poll but
//      before arming raises no event, so blocking now could sleep through it:
//      if one is there the worker must not block (the CQE is kept by the
//      caller for its next poll).
#pragma once

#include <cstdint>

namespace ferry::verbs {

class CqNotify {
 public:
  static constexpr uint32_t kDefaultAckBatch = 32;

  explicit CqNotify(uint32_t ack_batch = kDefaultAckBatch)
      : ack_batch_(ack_batch == 0 ? 1 : ack_batch) {}

  // The steps above. Ops provides the raw calls:
  //   bool get_event();        non-blocking ibv_get_cq_event: true if one was taken
  //   void ack(uint32_t n);    ibv_ack_cq_events(cq, n)
  //   int arm();               ibv_req_notify_cq(cq, 0): 0 or an errno value
  //   bool poll_one();         ibv_poll_cq(cq, 1, ...) keeping the CQE: true if one was there
  // Returns true when blocking on the channel fd is safe now.
  template <class Ops>
  bool can_block(Ops& ops) {
    while (ops.get_event()) {
      armed_ = false;
      ++events_;
      if (++unacked_ >= ack_batch_) {
        ops.ack(unacked_);
        unacked_ = 0;
      }
    }
    if (!armed_) {
      if (ops.arm() != 0) {
        ++arm_failures_;
        return false;  // cannot be woken: keep polling
      }
      armed_ = true;
      ++arms_;
    }
    if (ops.poll_one()) {
      ++raced_;
      return false;
    }
    return true;
  }

  // Events taken and not yet acked, reset to 0: the owner acks them before
  // destroying the CQ (ibv_destroy_cq waits for every event to be acked).
  uint32_t take_unacked() {
    const uint32_t n = unacked_;
    unacked_ = 0;
    return n;
  }

  bool armed() const { return armed_; }
  uint32_t unacked() const { return unacked_; }
  uint32_t ack_batch() const { return ack_batch_; }
  uint64_t events() const { return events_; }
  uint64_t arms() const { return arms_; }
  uint64_t arm_failures() const { return arm_failures_; }
  // can_block calls that found a CQE after arming (the race it closes).
  uint64_t raced() const { return raced_; }

 private:
  uint32_t ack_batch_;
  uint32_t unacked_ = 0;
  bool armed_ = false;
  uint64_t events_ = 0;
  uint64_t arms_ = 0;
  uint64_t arm_failures_ = 0;
  uint64_t raced_ = 0;
};

}  // namespace ferry::verbs

// Private: the verbs Domain shared by the .cpp files of this folder: the
// control path (verbs_domain.cpp: open; verbs_registration.cpp;
// verbs_peers.cpp: peers and the handshake driver; verbs_rc_qps.cpp) and
// verbs_datapath.cpp (post / poll).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/domain.h"
#include "verbs/verbs_chain.h"
#include "verbs/verbs_completion.h"
#include "verbs/verbs_domain.h"
#include "verbs/verbs_handles.h"
#include "verbs/verbs_handshake.h"

namespace ferry::verbs {

// One CQ for everything. Every WR we post (both queues) is signaled and holds
// one credit until its CQE is polled, so this also bounds outstanding work.
inline constexpr int kCqDepth = 4096;
inline constexpr uint32_t kSrqDepth = 1024;
// Zero-length receives kept on the rma SRQ; each incoming write-with-imm
// consumes one (RNR retry is infinite, so running dry only stalls the peer).
inline constexpr uint32_t kRmaRecvs = 512;
inline constexpr uint32_t kQpSendDepth = 1024;
inline constexpr uint32_t kWantInline =
    64;  // max_inline_data asked for; the QP reports what it got
inline constexpr uint32_t kUdDepth = 128;
inline constexpr uint32_t kUdRecvs = 64;
inline constexpr uint32_t kUdSends = 16;
inline constexpr size_t kGrhSize = 40;  // UD receives start with the GRH (or 40 unused bytes)
inline constexpr size_t kUdBufSize = 256;
static_assert(kGrhSize + HandshakeMsg::kSize <= kUdBufSize);
inline constexpr uint32_t kQKey =
    0x46525259;  // "FRRY": UD datagrams with another qkey are dropped by the NIC
inline constexpr int kPollBatch = 32;
inline constexpr uint32_t kNoQp = UINT32_MAX;

// "verbs NIC '<nic>': <call> failed: <strerror> (<err>)".
Status verbs_failure(Code code, const std::string& nic, const char* call, int err);
inline void set_error(Status* error, Status s) {
  if (error != nullptr) *error = std::move(s);
}

// Everything a registration needs alive until it is deregistered: shared with
// every VerbsMr so an MR released after its Domain still deregisters before
// the PD is freed. Members in open order, destroyed in reverse.
struct VerbsResources {
  std::string nic_name;
  ContextPtr ctx;
  PdPtr pd;
  TdPtr td;      // null when the device has no thread domains
  PdPtr parent;  // parent domain (pd + td): lock-free QPs for a single-thread owner
  ibv_pd* qp_pd() const noexcept { return parent ? parent.get() : pd.get(); }
};

class VerbsMr final : public core::DomainMr {
 public:
  VerbsMr(std::shared_ptr<VerbsResources> res, MrPtr mr, bool host)
      : res_(std::move(res)), mr_(std::move(mr)) {
    key_.lkey = mr_->lkey;
    key_.host = host;
    local_desc = &key_;
    rkey = mr_->rkey;
  }

 private:
  // Declared first so it is released last: the MR deregisters before the PD.
  std::shared_ptr<VerbsResources> res_;
  MrPtr mr_;
  LocalKey key_;
};

class VerbsDomain final : public core::Domain {
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can name Key: a domain is made by it alone.
  explicit VerbsDomain(Key) {}
  static std::unique_ptr<core::Domain> open(const core::DomainOptions& options, Status* error);
  ~VerbsDomain() override;

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }

  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device device, bool remote,
                                              Status* error) override;
  core::PeerId add_peer(std::span<const uint8_t> raw, Status* error) override;
  void remove_peer(core::PeerId peer) override;

  core::PostResult post_writes(std::span<const core::WriteDesc> writes) override;
  core::PostResult post_send(core::PeerId peer, const void* buf, size_t len, void* local_desc,
                             uint64_t ctx) override;
  core::PostResult post_recv(void* buf, size_t len, void* local_desc, uint64_t ctx) override;
  size_t poll(std::span<core::Completion> out) override;

  // Adaptive polling: the completion channel's fd (-1 without a channel);
  // can_block drains and acks channel events, arms the CQ and polls once
  // (CqNotify); a CQE found then is kept for the next poll.
  int wait_fd() override { return channel_ ? channel_->fd : -1; }
  bool can_block() override;

 private:
  struct QpSlot {
    QpPtr qp;
    uint32_t outstanding = 0;  // send-queue WRs not yet completed
    bool retired = false;      // in ERR, destroyed once outstanding reaches 0
  };
  struct Peer {
    UdAddress ud;
    AhPtr ah;
    uint32_t msg_qp = kNoQp;  // index into qps_
    uint32_t rma_qp = kNoQp;
    bool bound = false;  // QPs moved past INIT towards some peer endpoint
    bool live = false;
    std::unique_ptr<HandshakeMachine> hs;
    Status failure;  // set when the handshake gave up or a transition failed
  };

  // --- control path (verbs_domain.cpp, verbs_peers.cpp, verbs_rc_qps.cpp)
  Status open_queues();
  core::PeerId find_or_create_peer(const UdAddress& ud, Status* error);
  bool create_endpoint(Peer& p, core::PeerId id, HsClock::time_point now);
  bool create_rc_qp(ibv_srq* srq, uint32_t* slot, Status* error);
  Status connect_qps(Peer& p, const HsAction& a);
  Status modify_rc(ibv_qp* qp, bool rma, uint32_t remote_qpn, uint32_t remote_psn,
                   uint32_t local_psn, uint8_t mtu, const UdAddress& peer_ud, bool reset_first);
  void retire_qp(uint32_t slot);
  void reap_retired();
  void run_actions(core::PeerId id, const HsActions& actions);
  // Drives the handshake: delivers the event again after installing a fresh
  // endpoint when the machine asks for one.
  void hs_connect(core::PeerId id, HsClock::time_point now);
  void hs_datagram(const HandshakeMsg& m, HsClock::time_point now);
  void hs_ticks(HsClock::time_point now);
  void ud_send(const Peer& p, const HandshakeMsg& m);
  bool post_ud_recv(uint32_t index);
  bool post_rma_recv(uint32_t index);
  std::string peer_name(core::PeerId id) const;

  // --- data path helpers (verbs_datapath.cpp)
  // The peer if it can take work now; nullptr with *error unset means "not
  // yet" (handshake in progress: back-pressure), with *error set a failure.
  Peer* ready_peer(core::PeerId id, Status* error);
  Status post_error(const char* call, int ret) const;
  void on_ud_recv(uint32_t index, const ibv_wc& wc);
  // One CQE: bookkeeping, re-posts, handshake; true when *out was filled.
  bool handle_wc(const ibv_wc& wc, core::Completion* out);

  // Declared first: released last, after every QP, SRQ, CQ and AH below.
  std::shared_ptr<VerbsResources> res_;
  // Optional (null: no blocking wait, the worker naps instead). Destroyed
  // after the CQ attached to it; notify_ outlives cq_, whose deleter acks the
  // events still unacked.
  CompChannelPtr channel_;
  CqNotify notify_;
  CqPtr cq_;
  SrqPtr msg_srq_;
  SrqPtr rma_srq_;
  QpPtr ud_qp_;
  std::unique_ptr<uint8_t[]> ud_buf_;  // (kUdRecvs + kUdSends) * kUdBufSize, host memory
  MrPtr ud_mr_;
  std::vector<QpSlot> qps_;
  std::vector<Peer> peers_;  // PeerId = index; never shrinks (ids stay unique)
  std::unordered_map<std::string, core::PeerId> by_addr_;

  std::unique_ptr<CompletionTracker> tracker_;
  WriteChain chain_;
  ibv_send_wr send_wr_{};
  ibv_sge send_sge_{};

  core::DomainInfo info_;
  std::vector<uint8_t> address_;
  LocalIdentity local_;
  HandshakeConfig hs_cfg_;
  uint32_t next_epoch_ = 1;
  std::mt19937_64 rng_;

  uint8_t port_ = 1;
  int gid_index_ = 0;
  bool ethernet_ = false;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint32_t max_msg_ = 1u << 30;
  uint32_t max_inline_ = 0;  // what the RC QPs granted

  std::array<uint32_t, kUdSends> ud_send_free_{};
  uint32_t ud_send_free_count_ = 0;
  size_t connecting_ = 0;  // peers whose handshake timer runs
  size_t retired_ = 0;     // qps_ entries in ERR awaiting their last completions
  HsClock::time_point next_tick_{};
  bool cq_failure_logged_ = false;
  // A CQE polled by can_block after arming, handed out by the next poll.
  ibv_wc stashed_wc_{};
  bool stashed_ = false;
  bool channel_failure_logged_ = false;
};

}  // namespace ferry::verbs

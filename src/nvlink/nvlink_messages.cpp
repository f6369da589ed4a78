// NVLink Domain, two-sided messages: a send is copied into the peer's message
// ring at once (complete on the next poll); received messages are copied out
// of our ring into receive buffers in post order. docs/NVLINK.md, "Send/recv".
#include <cstdint>

#include <fmt/format.h>

#include "core/coarse_clock.h"
#include "nvlink/nvlink_domain_impl.h"

namespace ferry::nvlink {

core::PostResult NvlinkDomain::post_send(core::PeerId peer, const void* buf, size_t len, void*,
                                         uint64_t ctx) {
  Status err;
  Peer* p = live_peer(peer, core::coarse_now(), &err);
  if (p == nullptr) return {0, err};
  if (len > kMsgBytes)
    return {0, Status(Code::kInvalidArgument,
                      fmt::format("nvlink {}: a message of {} bytes to {}: at most {} bytes "
                                  "(send_buffer_size)",
                                  info_.name, len, peer_name(*p), kMsgBytes))};
  if (!p->shm->push_msg(buf, len)) return {0, Status::ok()};  // ring full: retry later
  sent_.push_back(ctx);
  return {1, Status::ok()};
}

core::PostResult NvlinkDomain::post_recv(void* buf, size_t len, void*, uint64_t ctx) {
  recvs_.push_back({buf, len, ctx});
  return {1, Status::ok()};
}

size_t NvlinkDomain::poll_messages(std::span<core::Completion> out, size_t n) {
  size_t k = 0;
  for (; k < sent_.size() && n < out.size(); ++k) {
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kSend;
    c.ctx = sent_[k];
  }
  sent_.erase(sent_.begin(), sent_.begin() + ptrdiff_t(k));
  while (n < out.size() && !recvs_.empty()) {
    const PostedRecv r = recvs_.front();
    const int64_t len = shm_->pop_msg(r.buf, r.len);
    if (len < 0) break;
    recvs_.pop_front();
    core::Completion& c = out[n++];
    c = core::Completion{};
    c.kind = core::Completion::Kind::kRecv;
    c.ctx = r.ctx;
    c.len = uint64_t(len);
    if (uint64_t(len) > r.len)
      c.status = Status(Code::kOutOfRange,
                        fmt::format("nvlink {}: a message of {} bytes for a receive buffer of {} "
                                    "(truncated)",
                                    info_.name, len, r.len));
  }
  return n;
}

}  // namespace ferry::nvlink

// TransferEngine's submissions (include/ferry/engine.h): two-sided, one-sided,
// prepared transfers, peer groups, scatter and barrier. Each validates before
// anything is queued; the worker does the rest.
#include <fmt/format.h>

#include "core/recv_queue_state.h"
#include "engine/engine_impl.h"

namespace ferry {

// -------------------------------------------------------------- two-sided

TransferId TransferEngine::submit_send(const NetAddr& addr, std::span<const uint8_t> msg,
                                       OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (addr.empty()) throw Error(Code::kInvalidArgument, "submit_send: empty address");
  if (msg.size() > im.send_pool.buf_len)
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_send: {} bytes exceed the send buffer size {} "
                            "(EngineConfig::send_buffer_size)",
                            msg.size(), im.send_pool.buf_len));
  const int64_t submit_ns = im.sampled_submit_ns();
  // A small send the NIC copies out inside its post needs no send buffer, no
  // deadline and no command where the submitting thread may post it now.
  core::Worker& w0 = *im.workers[0];
  if (on_done.empty() && w0.try_send_at_post(im.addrs->intern(addr), msg, submit_ns))
    return im.next_id();
  const TransferEngine::Impl::SubmitTime t{im.default_deadline(submit_ns), submit_ns};
  const Clock::time_point dl = t.deadline;
  uint32_t buf = 0;
  // A callback run on a worker (CallbackOn::kWorker) must not wait for a
  // buffer: the workers are what give them back.
  const bool wait =
      im.shared.config.queue_full == QueueFull::kBlock && !core::Worker::on_worker_thread();
  Status st = im.send_free.acquire(dl, wait, &buf);
  if (!st.is_ok()) throw Error(st);
  if (!msg.empty()) std::memcpy(im.send_pool.buffer(buf), msg.data(), msg.size());
  try {
    if (on_done.empty()) return im.submit_fast_send(w0, addr, buf, msg.size(), t);
    return im.submit(w0, std::move(on_done), core::SendReq{im.addrs->intern(addr), buf, msg.size()},
                     t);
  } catch (...) {
    im.send_free.release(buf);
    throw;
  }
}

void TransferEngine::submit_recvs(size_t len, size_t count, RecvCallback on_recv) {
  submit_recvs(len, count, std::move(on_recv), CallbackOn::kCallbackThread);
}

namespace {

// A pool of `count` receive buffers of `len` bytes, registered on the main
// group's NIC 0 and posted there; setup(pool, index) says where its messages go.
template <typename Setup>
void add_recv_pool(TransferEngine::Impl& im, size_t len, size_t count, const char* what,
                   Setup&& setup) {
  if (len == 0 || count == 0)
    throw Error(Code::kInvalidArgument, fmt::format("{}: len and count must be positive", what));
  if (count > (1u << 24) || len > (1ull << 32))
    throw Error(Code::kInvalidArgument, fmt::format("{}: too many or too large buffers", what));
  std::lock_guard lk(im.recv_mu);
  if (im.num_recv_pools >= kMaxRecvPools)
    throw Error(Code::kResourceExhausted, fmt::format("{}: too many receive pools", what));
  auto pool = std::make_unique<core::RecvPool>();
  pool->allocate(len, count);
  auto reg = std::make_shared<core::Registration>();
  reg->ptr = pool->mem.get();
  reg->len = len * count;
  auto& w = *im.workers[0];
  core::Worker* wp = &w;
  im.call(w, [wp, reg] {
    Status e;
    wp->register_wt(*reg, false, &e);
    return e;
  });
  pool->reg = reg;
  const auto index = uint32_t(im.num_recv_pools);
  setup(*pool, index);
  im.recv_pools[index] = std::move(pool);
  ++im.num_recv_pools;
  for (uint32_t i = 0; i < count; ++i) {
    Command c;
    c.req = core::RecvPostReq{index, i};
    w.submit(std::move(c));
  }
}

}  // namespace

void TransferEngine::submit_recvs(size_t len, size_t count, RecvCallback on_recv, CallbackOn on) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (!on_recv) throw Error(Code::kInvalidArgument, "submit_recvs: empty callback");
  add_recv_pool(im, len, count, "submit_recvs", [&](core::RecvPool& p, uint32_t) {
    p.on_recv = std::move(on_recv);
    p.on_worker = on == CallbackOn::kWorker;
  });
}

RecvQueue TransferEngine::recv_queue(size_t len, size_t count) {
  auto& im = *impl_;
  auto entered = im.enter();
  std::shared_ptr<RecvQueue::State> q;
  add_recv_pool(im, len, count, "recv_queue", [&](core::RecvPool& p, uint32_t index) {
    q = std::make_shared<RecvQueue::State>(count, len, p.mem, im.workers[0].get(), index);
    q->help = im.help;
    p.queue = q;
  });
  return RecvQueue(std::move(q));
}

namespace {

// Validated requests, shared by submit_* and prepare_*: throw before anything
// is queued, and say which worker owns the source region.
core::SingleReq single_req(TransferEngine::Impl& im, uint64_t len, std::optional<uint32_t> imm,
                           MrHandle src, uint64_t src_offset, const MrDesc& dst,
                           uint64_t dst_offset, WriteRoute route, const char* what, size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  im.check_desc(dst, w.nics(), what);
  im.check_writable(dst, what);
  if (!fits(src_offset, len, reg->len))
    throw Error(Code::kOutOfRange,
                fmt::format("{}: source [{}, +{}) is outside the region of {} bytes", what,
                            src_offset, len, reg->len));
  if (!fits(dst_offset, len, dst.len))
    throw Error(Code::kOutOfRange, fmt::format("{}: destination [{}, +{}) is outside the remote "
                                               "region of {} bytes",
                                               what, dst_offset, len, dst.len));
  if (route.kind == WriteRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: pinned NIC {} of {}", what, route.nic, w.nics()));
  if (route.max_shards > w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: {} shards over {} NICs", what, route.max_shards, w.nics()));
  *owner = reg->group;
  return core::SingleReq{std::move(reg), src_offset, len,  core::DstRef::of(dst, *im.addrs),
                         dst_offset,     imm,        route};
}

core::PagedReq paged_req(TransferEngine::Impl& im, uint64_t page_len, std::optional<uint32_t> imm,
                         MrHandle src, Pages src_pages, const MrDesc& dst, Pages dst_pages,
                         const char* what, size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  im.check_desc(dst, w.nics(), what);
  im.check_writable(dst, what);
  if (src_pages.indices.size() != dst_pages.indices.size())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: {} source pages but {} destination pages", what,
                            src_pages.indices.size(), dst_pages.indices.size()));
  if (src_pages.indices.size() > UINT32_MAX)
    throw Error(Code::kInvalidArgument, fmt::format("{}: more than 2^32 pages", what));
  // One pass for the largest index bounds every page.
  auto check = [&](const Pages& p, uint64_t limit, const char* side) {
    if (p.indices.empty()) return;
    uint32_t max = *std::max_element(p.indices.begin(), p.indices.end());
    uint64_t end = 0;
    bool overflow = __builtin_mul_overflow(uint64_t(max), p.stride, &end) ||
                    __builtin_add_overflow(end, p.offset, &end) ||
                    __builtin_add_overflow(end, page_len, &end);
    if (overflow || end > limit)
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: {} page {} (stride {}, offset {}, length {}) "
                              "ends past the region of {} bytes",
                              what, side, max, p.stride, p.offset, page_len, limit));
  };
  check(src_pages, reg->len, "source");
  check(dst_pages, dst.len, "destination");
  *owner = reg->group;
  return core::PagedReq{std::move(reg),
                        page_len,
                        std::move(src_pages),
                        std::move(dst_pages),
                        core::DstRef::of(dst, *im.addrs),
                        imm};
}

core::ScatterReq scatter_req(TransferEngine::Impl& im, std::optional<PeerGroupHandle> group,
                             std::optional<uint32_t> imm, MrHandle src,
                             std::vector<ScatterDst> dsts, GroupRoute route, const char* what,
                             size_t* owner) {
  RegRef reg = im.lookup(src, what);
  auto& w = *im.workers[reg->group];
  if (route.kind == GroupRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("{}: pinned NIC {} of {}", what, route.nic, w.nics()));
  if (dsts.size() > UINT32_MAX)
    throw Error(Code::kInvalidArgument, fmt::format("{}: too many targets", what));
  for (size_t i = 0; i < dsts.size(); ++i) {
    const auto& t = dsts[i];
    im.check_desc(t.dst, w.nics(), what);
    im.check_writable(t.dst, what);
    if (!fits(t.src_offset, t.len, reg->len))
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: target {} source [{}, +{}) outside the region of {} "
                              "bytes",
                              what, i, t.src_offset, t.len, reg->len));
    if (!fits(t.dst_offset, t.len, t.dst.len))
      throw Error(Code::kOutOfRange,
                  fmt::format("{}: target {} destination [{}, +{}) outside the remote "
                              "region of {} bytes",
                              what, i, t.dst_offset, t.len, t.dst.len));
  }
  *owner = reg->group;
  return core::ScatterReq{std::move(reg), std::move(dsts), group, imm, route};
}

}  // namespace

// -------------------------------------------------------------- one-sided

TransferId TransferEngine::submit_single_write(uint64_t len, std::optional<uint32_t> imm,
                                               MrHandle src, uint64_t src_offset, const MrDesc& dst,
                                               uint64_t dst_offset, OnDone on_done,
                                               WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req =
      single_req(im, len, imm, src, src_offset, dst, dst_offset, route, "submit_single_write", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_single_write(uint64_t len, MrHandle src,
                                                      uint64_t src_offset, const MrDesc& dst,
                                                      uint64_t dst_offset, WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = im.prepared_state();
  st->req = single_req(im, len, std::nullopt, src, src_offset, dst, dst_offset, route,
                       "prepare_single_write", &st->group);
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit_paged_writes(uint64_t page_len, std::optional<uint32_t> imm,
                                               MrHandle src, Pages src_pages, const MrDesc& dst,
                                               Pages dst_pages, OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req = paged_req(im, page_len, imm, src, std::move(src_pages), dst, std::move(dst_pages),
                       "submit_paged_writes", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_paged_writes(uint64_t page_len, MrHandle src,
                                                      Pages src_pages, const MrDesc& dst,
                                                      Pages dst_pages) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = im.prepared_state();
  st->req = paged_req(im, page_len, std::nullopt, src, std::move(src_pages), dst,
                      std::move(dst_pages), "prepare_paged_writes", &st->group);
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit_imm(uint32_t imm, const MrDesc& dst, OnDone on_done,
                                      WriteRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto& w = *im.workers[0];
  // The common case in one pass: one NIC, nothing to call back, a target that
  // the checks below would let through.
  if (w.nics() == 1 && on_done.empty() && dst.nics.size() == 1 && dst.writable &&
      !dst.nics[0].addr.empty() && (route.kind != WriteRoute::Kind::kPinned || route.nic == 0))
    return im.submit_fast_imm(w, imm, dst.nics[0]);
  im.check_desc(dst, w.nics(), "submit_imm");
  im.check_writable(dst, "submit_imm");
  if (route.kind == WriteRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_imm: pinned NIC {} of {}", route.nic, w.nics()));
  if (w.nics() == 1 && on_done.empty()) return im.submit_fast_imm(w, imm, dst.nics[0]);
  // An immediate is one zero-byte write: never split.
  if (route.kind == WriteRoute::Kind::kSplit) route = WriteRoute::pinned(0);
  return im.submit(w, std::move(on_done),
                   core::SingleReq{nullptr, 0, 0, core::DstRef::of(dst, *im.addrs), 0, imm, route});
}

// ------------------------------------------------------------ peer groups

PeerGroupHandle TransferEngine::add_peer_group(const std::vector<std::vector<NetAddr>>& peers) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (peers.empty()) throw Error(Code::kInvalidArgument, "add_peer_group: no peers");
  size_t nics = im.workers[0]->nics();
  for (size_t i = 0; i < peers.size(); ++i)
    if (peers[i].size() != nics)
      throw Error(Code::kFailedPrecondition,
                  fmt::format("add_peer_group: peer {} has {} addresses, this group has {} NICs", i,
                              peers[i].size(), nics));
  std::optional<PeerGroupHandle> handle;
  for (auto& owned : im.workers) {
    core::Worker* wp = owned.get();
    auto h = std::make_shared<PeerGroupHandle>(0);
    im.call(*wp, [wp, peers, h] {
      Status e;
      *h = wp->add_peer_group_wt(peers, &e);
      return e;
    });
    if (handle && *handle != *h)
      throw Error(Code::kInternal, "add_peer_group: workers disagree on the handle");
    handle = *h;
  }
  return *handle;
}

PeerGroupHandle TransferEngine::add_peer_group(const std::vector<MrDesc>& peers) {
  std::vector<std::vector<NetAddr>> addrs;
  addrs.reserve(peers.size());
  for (const auto& d : peers) {
    std::vector<NetAddr> a;
    for (const auto& n : d.nics) a.push_back(n.addr);
    addrs.push_back(std::move(a));
  }
  return add_peer_group(addrs);
}

TransferId TransferEngine::submit_scatter(std::optional<PeerGroupHandle> group, OnDone on_done,
                                          std::optional<uint32_t> imm, MrHandle src,
                                          std::vector<ScatterDst> dsts, GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  size_t g = 0;
  auto req = scatter_req(im, group, imm, src, std::move(dsts), route, "submit_scatter", &g);
  return im.submit(*im.workers[g], std::move(on_done), std::move(req));
}

PreparedTransfer TransferEngine::prepare_scatter(std::optional<PeerGroupHandle> group, MrHandle src,
                                                 std::vector<ScatterDst> dsts, GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto st = im.prepared_state();
  st->req = scatter_req(im, group, std::nullopt, src, std::move(dsts), route, "prepare_scatter",
                        &st->group);
  return PreparedTransfer(std::move(st));
}

TransferId TransferEngine::submit(const PreparedTransfer& prepared, std::optional<uint32_t> imm,
                                  OnDone on_done) {
  auto& im = *impl_;
  auto entered = im.enter();
  if (!prepared.valid()) throw Error(Code::kInvalidArgument, "submit: empty PreparedTransfer");
  const auto& st = prepared.s_;
  if (st->engine != &im || st->incarnation != im.shared.incarnation)
    throw Error(Code::kInvalidArgument,
                "submit: the PreparedTransfer was prepared by another TransferEngine");
  // Caught here for the caller's sake; the worker checks again (unreg_mr may
  // race this submit).
  const bool retired = std::visit(
      [](const auto& r) { return r.src->retired.load(std::memory_order_acquire); }, st->req);
  if (retired)
    throw Error(Code::kFailedPrecondition,
                "submit: the prepared transfer's source region was unregistered (unreg_mr)");
  return im.submit(*im.workers[st->group], std::move(on_done), core::PreparedReq{st, imm});
}

TransferId TransferEngine::submit_barrier(std::optional<PeerGroupHandle> group, OnDone on_done,
                                          uint32_t imm, std::vector<MrDesc> dsts,
                                          GroupRoute route) {
  auto& im = *impl_;
  auto entered = im.enter();
  auto& w = *im.workers[0];
  if (route.kind == GroupRoute::Kind::kPinned && route.nic >= w.nics())
    throw Error(Code::kInvalidArgument,
                fmt::format("submit_barrier: pinned NIC {} of {}", route.nic, w.nics()));
  for (const auto& d : dsts) {
    im.check_desc(d, w.nics(), "submit_barrier");
    im.check_writable(d, "submit_barrier");
  }
  return im.submit(w, std::move(on_done), core::BarrierReq{std::move(dsts), group, imm, route});
}

}  // namespace ferry

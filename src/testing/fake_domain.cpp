#include "testing/fake_domain.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "core/unique_fd.h"

namespace ferry::testing {

namespace {

using core::Completion;
using core::PeerId;
using core::PostResult;
using core::WriteDesc;

struct Region {
  uint8_t* ptr = nullptr;
  uint64_t len = 0;
  bool remote_write = false;
  uint64_t base() const { return reinterpret_cast<uint64_t>(ptr); }
  // [addr, +n) not inside the region (without overflow).
  bool outside(uint64_t addr, uint64_t n) const {
    return addr < base() || n > len || addr - base() > len - n;
  }
};

struct RecvBuf {
  void* buf = nullptr;
  size_t len = 0;
  uint64_t ctx = 0;
};

// The part of a fake NIC that peers touch: its registrations and its inbound
// completions. Shared, so a peer that still holds it after the NIC closed sees
// `open == false` instead of freed memory.
struct Endpoint {
  uint64_t id = 0;
  std::atomic<bool> open{true};
  // Held shared while a peer copies into a region, exclusively to deregister:
  // once a deregistration returns, nothing lands in that memory any more.
  std::shared_mutex mr_mu;
  std::unordered_map<uint64_t, Region> mrs;
  std::mutex in_mu;
  std::vector<Completion> inbound;
  std::deque<RecvBuf> recvs;
  std::atomic<size_t> inbound_size{0};
  // Closed with the last reference: a peer may still be waking us while our
  // NIC closes.
  core::UniqueFd efd;

  void deliver(const Completion& c) {
    {
      std::lock_guard lk(in_mu);
      inbound.push_back(c);
      inbound_size.store(inbound.size(), std::memory_order_release);
    }
    uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(efd.get(), &one, sizeof(one));
  }
};

// Every open fake NIC of the process, by endpoint id.
struct Fabric {
  std::mutex mu;
  std::unordered_map<uint64_t, std::shared_ptr<Endpoint>> eps;
  std::atomic<uint64_t> next{1};
  static Fabric& get() {
    static Fabric f;
    return f;
  }
};

class FakeMr final : public core::DomainMr {
 public:
  FakeMr(std::shared_ptr<Endpoint> ep, uint64_t key) : ep_(std::move(ep)), key_(key) {}
  ~FakeMr() override {
    std::unique_lock lk(ep_->mr_mu);
    ep_->mrs.erase(key_);
  }

 private:
  std::shared_ptr<Endpoint> ep_;
  uint64_t key_;
};

class FakeDomain final : public core::Domain {
 public:
  FakeDomain(const core::DomainOptions& o, bool discard) : discard_(discard) {
    ep_ = std::make_shared<Endpoint>();
    ep_->efd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    auto& fab = Fabric::get();
    ep_->id = fab.next.fetch_add(1);
    {
      std::lock_guard lk(fab.mu);
      fab.eps.emplace(ep_->id, ep_);
    }
    address_.resize(sizeof(uint64_t));
    std::memcpy(address_.data(), &ep_->id, sizeof(uint64_t));
    info_.name = o.nic_name.empty() ? fmt::format("fake{}", o.nic_index) : o.nic_name;
    info_.provider = "fake";
    info_.fabric = "fake";
    info_.link_speed_bps = 100'000'000'000ull;
    info_.max_msg_size = 1ull << 32;
    info_.transport = Transport::kFake;
    info_.any_thread = true;
    done_.reserve(4096);
    spare_.reserve(4096);
  }

  ~FakeDomain() override {
    ep_->open.store(false, std::memory_order_release);
    auto& fab = Fabric::get();
    {
      std::lock_guard lk(fab.mu);
      fab.eps.erase(ep_->id);
    }
  }

  const core::DomainInfo& info() const override { return info_; }
  std::span<const uint8_t> raw_address() const override { return address_; }

  std::unique_ptr<core::DomainMr> register_mr(void* ptr, size_t len, Device, bool remote,
                                              Status* error) override {
    const uint64_t key = next_key_++;
    {
      std::unique_lock lk(ep_->mr_mu);
      ep_->mrs[key] = Region{static_cast<uint8_t*>(ptr), len, remote};
    }
    auto mr = std::make_unique<FakeMr>(ep_, key);
    mr->rkey = key;
    mr->remote_base = reinterpret_cast<uint64_t>(ptr);
    *error = Status();
    return mr;
  }

  PeerId add_peer(std::span<const uint8_t> raw, Status* error) override {
    if (discard_) return 1;
    uint64_t id = 0;
    if (raw.size() != sizeof(id)) {
      *error = Status(Code::kInvalidArgument,
                      fmt::format("fake NIC {}: address of {} bytes", info_.name, raw.size()));
      return 0;
    }
    std::memcpy(&id, raw.data(), sizeof(id));
    auto& fab = Fabric::get();
    std::lock_guard lk(fab.mu);
    auto it = fab.eps.find(id);
    if (it == fab.eps.end()) {
      *error = Status(
          Code::kUnavailable,
          fmt::format("fake NIC {}: add_peer: no fake NIC {} in this process", info_.name, id));
      return 0;
    }
    peers_[id] = it->second;
    return id;
  }
  void remove_peer(PeerId peer) override { peers_.erase(peer); }

  PostResult post_writes(std::span<const WriteDesc> writes) override {
    PostResult r;
    for (const auto& w : writes) {
      if (discard_) {
        done_.push_back(local(Completion::Kind::kWrite, w.ctx, Status()));
        ++r.posted;
        continue;
      }
      Endpoint* peer = find(w.peer, &r.error, "post_writes");
      if (!peer) return r;
      done_.push_back(local(Completion::Kind::kWrite, w.ctx, write_into(*peer, w)));
      ++r.posted;
    }
    return r;
  }

  PostResult post_send(PeerId peer_id, const void* buf, size_t len, void*, uint64_t ctx) override {
    PostResult r;
    if (discard_) {
      done_.push_back(local(Completion::Kind::kSend, ctx, Status()));
      r.posted = 1;
      return r;
    }
    Endpoint* peer = find(peer_id, &r.error, "post_send");
    if (!peer) return r;
    RecvBuf rb;
    {
      std::lock_guard lk(peer->in_mu);
      if (peer->recvs.empty()) return r;  // receiver not ready: back-pressure
      rb = peer->recvs.front();
      peer->recvs.pop_front();
    }
    Completion in;
    in.kind = Completion::Kind::kRecv;
    in.ctx = rb.ctx;
    in.len = std::min(len, rb.len);
    if (len > rb.len)
      in.status = Status(Code::kOutOfRange, fmt::format("fake NIC {}: message of {} bytes into a "
                                                        "receive buffer of {}",
                                                        info_.name, len, rb.len));
    else if (len > 0)
      std::memcpy(rb.buf, buf, len);
    peer->deliver(in);
    done_.push_back(local(Completion::Kind::kSend, ctx, Status()));
    r.posted = 1;
    return r;
  }

  PostResult post_recv(void* buf, size_t len, void*, uint64_t ctx) override {
    std::lock_guard lk(ep_->in_mu);
    ep_->recvs.push_back(RecvBuf{buf, len, ctx});
    return {1, {}};
  }

  size_t poll(std::span<Completion> out) override {
    size_t n = 0;
    while (n < out.size() && head_ < done_.size()) out[n++] = std::move(done_[head_++]);
    if (head_ == done_.size()) head_ = 0, done_.clear();
    if (n < out.size() && ep_->inbound_size.load(std::memory_order_acquire) > 0) {
      // Take the inbound queue in one swap; what does not fit in `out`
      // waits in the local queue for the next poll.
      {
        std::lock_guard lk(ep_->in_mu);
        spare_.swap(ep_->inbound);
        ep_->inbound_size.store(0, std::memory_order_release);
      }
      for (auto& c : spare_) {
        if (n < out.size())
          out[n++] = std::move(c);
        else
          done_.push_back(std::move(c));
      }
      spare_.clear();
      uint64_t v;
      [[maybe_unused]] auto rd = ::read(ep_->efd.get(), &v, sizeof(v));
    }
    return n;
  }

  // Engines of one process share its memory, so a peer's region is its own
  // pointer; the key and the bounds are checked as a write would check them.
  core::MappedRemote map_remote(PeerId peer_id, uint64_t rkey, uint64_t remote_addr, size_t len,
                                Status* error) override {
    if (discard_) {
      *error = Status(Code::kUnimplemented,
                      fmt::format("fake NIC {}: a discarding NIC maps nothing", info_.name));
      return {};
    }
    Endpoint* peer = find(peer_id, error, "map_remote");
    if (!peer) return {};
    std::shared_lock lk(peer->mr_mu);
    auto it = peer->mrs.find(rkey);
    if (it == peer->mrs.end()) {
      *error = Status(Code::kNotFound,
                      fmt::format("fake NIC {}: map_remote: key {} is not registered at peer {}",
                                  info_.name, rkey, peer->id));
      return {};
    }
    if (!it->second.remote_write) {
      *error = Status(Code::kFailedPrecondition,
                      fmt::format("fake NIC {}: map_remote: key {} of peer {} is not writable",
                                  info_.name, rkey, peer->id));
      return {};
    }
    const Region& reg = it->second;
    if (reg.outside(remote_addr, len)) {
      *error = Status(Code::kOutOfRange,
                      fmt::format("fake NIC {}: map_remote of {} bytes at {:#x} outside peer {}'s "
                                  "region [{:#x}, +{})",
                                  info_.name, len, remote_addr, peer->id, reg.base(), reg.len));
      return {};
    }
    *error = Status();
    return {reinterpret_cast<void*>(remote_addr), peers_.at(peer_id)};
  }

  int wait_fd() override { return ep_->efd.get(); }
  bool can_block() override {
    return head_ == done_.size() && ep_->inbound_size.load(std::memory_order_acquire) == 0;
  }

 private:
  static Completion local(Completion::Kind kind, uint64_t ctx, Status st) {
    Completion c;
    c.kind = kind;
    c.ctx = ctx;
    c.status = std::move(st);
    return c;
  }

  Endpoint* find(PeerId id, Status* error, const char* call) {
    auto it = peers_.find(id);
    if (it == peers_.end() || !it->second->open.load(std::memory_order_acquire)) {
      *error = Status(Code::kUnavailable,
                      fmt::format("fake NIC {}: {}: peer {} is closed", info_.name, call, id));
      return nullptr;
    }
    return it->second.get();
  }

  // The remote side of one write, as a NIC would do it: check the key and the
  // bounds, copy, then deliver the immediate (after the data, as RDMA does).
  Status write_into(Endpoint& peer, const WriteDesc& w) {
    {
      std::shared_lock lk(peer.mr_mu);
      auto it = peer.mrs.find(w.rkey);
      if (it == peer.mrs.end())
        return Status(Code::kFailedPrecondition,
                      fmt::format("fake NIC {}: write to peer {}: key {} is not registered there",
                                  info_.name, peer.id, w.rkey));
      const Region& reg = it->second;
      // Zero bytes (an immediate) touch no memory: only the key is checked.
      if (!reg.remote_write && w.len > 0)
        return Status(Code::kFailedPrecondition,
                      fmt::format("fake NIC {}: write to peer {}: key {} is not remotely writable",
                                  info_.name, peer.id, w.rkey));
      if (reg.outside(w.remote_addr, w.len))
        return Status(Code::kFailedPrecondition,
                      fmt::format("fake NIC {}: write of {} bytes at {:#x} outside peer {}'s "
                                  "region [{:#x}, +{})",
                                  info_.name, w.len, w.remote_addr, peer.id, reg.base(), reg.len));
      if (w.len > 0) std::memcpy(reinterpret_cast<void*>(w.remote_addr), w.src, w.len);
    }
    if (w.has_imm) {
      Completion c;
      c.kind = Completion::Kind::kRemoteImm;
      c.imm = w.imm;
      peer.deliver(c);
    }
    return Status();
  }

  bool discard_;
  std::shared_ptr<Endpoint> ep_;
  std::vector<uint8_t> address_;
  core::DomainInfo info_;
  std::unordered_map<uint64_t, std::shared_ptr<Endpoint>> peers_;
  std::vector<Completion> done_, spare_;
  size_t head_ = 0;
  uint64_t next_key_ = 1;
};

}  // namespace

std::unique_ptr<core::Domain> open_fake_domain(const core::DomainOptions& options, Status* error) {
  *error = Status();
  const bool discard = options.nic_name.rfind("discard", 0) == 0;
  return std::make_unique<FakeDomain>(options, discard);
}

}  // namespace ferry::testing

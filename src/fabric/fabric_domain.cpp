// libfabric Domain: opening the provider's objects and closing them again
// (registrations: fabric_registration.cpp; peers: fabric_peers.cpp,
// shm_peers.cpp, socket_peers.cpp; the shm lock rescuer: shm_rescuer.cpp;
// the datapath: fabric_datapath.cpp).
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include "core/log.h"

#include "fabric/fabric_domain.h"
#include "fabric/fabric_domain_impl.h"
#include "fabric/shm_leftovers.h"
#include "fabric/shm_parking.h"

namespace ferry::fabric {

namespace {

// Enough for every provider we open (efa 32 B, tcp sockaddr_in6, shm names);
// fi_getname tells us when it is not.
constexpr size_t kInitialAddrLen = 256;
// The pool bounds outstanding ops; the provider's own queue depth is the
// natural bound, clamped so a provider reporting huge queues does not cost
// megabytes per NIC.
constexpr size_t kMinPoolEntries = 4096;
constexpr size_t kMaxPoolEntries = 16384;

}  // namespace

Status fi_failure(Code code, const std::string& nic, const char* call, int ret) {
  return Status(code, fmt::format("fabric NIC '{}': {} failed: {} ({})", nic, call,
                                  fi_strerror(ret < 0 ? -ret : ret), ret));
}

std::unique_ptr<core::Domain> open_fabric_domain(const core::DomainOptions& options,
                                                 Status* error) {
  return FabricDomain::open(options, error);
}

std::unique_ptr<core::Domain> FabricDomain::open(const core::DomainOptions& options,
                                                 Status* error) {
  const std::string& provider = options.provider;
  if (provider.empty()) {
    set_error(error, Status(Code::kInvalidArgument, "fabric: no libfabric provider given"));
    return nullptr;
  }
  const bool want_hmem = options.device.kind == Device::Kind::kCuda;
  InfoPtr hints = make_hints(provider, want_hmem, options.nic_name);
  if (!hints) {
    set_error(error, Status(Code::kResourceExhausted, "fabric: fi_allocinfo failed"));
    return nullptr;
  }
  fi_info* raw_list = nullptr;
  int ret = fi_getinfo(kFabricApiVersion, nullptr, nullptr, 0, hints.get(), &raw_list);
  InfoPtr list(ret == 0 ? raw_list : nullptr);
  const std::string wanted = options.nic_name.empty() ? fmt::format("#{}", options.nic_index)
                                                      : fmt::format("'{}'", options.nic_name);
  const char* hmem_note = want_hmem ? " with FI_HMEM" : "";

  // Several entries may describe one domain (e.g. tcp offers IPv4 and IPv6
  // fabrics on "lo"); the first one of a domain wins.
  const fi_info* chosen = nullptr;
  std::vector<std::string> seen;
  for (const fi_info* i = list.get(); i != nullptr; i = i->next) {
    if (!info_usable(i, provider)) continue;
    const std::string name = i->domain_attr->name;
    const bool first_of_domain = std::find(seen.begin(), seen.end(), name) == seen.end();
    if (first_of_domain) seen.push_back(name);
    if (chosen != nullptr) continue;
    if (!options.nic_name.empty()) {
      if (name == options.nic_name) chosen = i;
    } else if (first_of_domain && seen.size() - 1 == options.nic_index) {
      chosen = i;
    }
  }
  if (chosen == nullptr) {
    // The hints name the NIC, so fi_getinfo answers "no data" for a name it
    // does not know: ask again for every domain, to say which ones exist.
    int all_ret = 0;
    std::vector<std::string> offered =
        options.nic_name.empty() ? seen : usable_domain_names(provider, want_hmem, &all_ret);
    if (offered.empty()) {
      const int why = ret != 0 ? ret : all_ret != 0 ? all_ret : -FI_ENODATA;
      set_error(error, Status(Code::kUnavailable,
                              fmt::format("fabric: provider '{}' offers no usable domain{} (RDM, "
                                          "RMA and 4-byte remote CQ data): fi_getinfo failed: "
                                          "{} ({})",
                                          provider, hmem_note, fi_strerror(-why), why)));
      return nullptr;
    }
    set_error(error, Status(Code::kNotFound,
                            fmt::format("fabric: provider '{}' has no domain {}{}; the domains it "
                                        "offers with RDM, RMA and 4-byte remote CQ data are [{}]",
                                        provider, wanted, hmem_note, fmt::join(offered, ", "))));
    return nullptr;
  }

  auto res = std::make_shared<FabricResources>();
  res->info.reset(fi_dupinfo(chosen));
  list.reset();
  if (!res->info) {
    set_error(error, Status(Code::kResourceExhausted, "fabric: fi_dupinfo failed"));
    return nullptr;
  }
  const fi_info* info = res->info.get();
  res->nic_name = info->domain_attr->name;
  res->mr_mode = info->domain_attr->mr_mode;
  // Keys we choose start at a random point: a descriptor kept from a previous
  // run of this process names keys the new run (almost surely) never issues,
  // so a stale writer gets a key error instead of writing into new memory.
  {
    const size_t key_size = info->domain_attr->mr_key_size;
    const int bits = key_size == 0 || key_size >= 8 ? 64 : int(key_size * 8);
    std::random_device rd;
    uint64_t r = (uint64_t(rd()) << 32) ^ rd();
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    // Start in the lower half of the key space so the counter never wraps.
    res->next_key = bits > 24 ? (r & (mask >> 1)) + 1 : 1;
  }
  const std::string& nic = res->nic_name;

  const size_t queue_depth = (info->tx_attr != nullptr ? info->tx_attr->size : 0) +
                             (info->rx_attr != nullptr ? info->rx_attr->size : 0);
  res->pool = std::make_unique<OpPool>(std::clamp(queue_depth, kMinPoolEntries, kMaxPoolEntries));

  fid_fabric* fabric = nullptr;
  ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_fabric", ret));
    return nullptr;
  }
  res->fabric.reset(fabric);

  fid_domain* domain = nullptr;
  ret = fi_domain(res->fabric.get(), res->info.get(), &domain, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_domain", ret));
    return nullptr;
  }
  res->domain.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_FD;
  fid_cq* cq = nullptr;
  ret = fi_cq_open(res->domain.get(), &cq_attr, &cq, nullptr);
  std::string wait_note = "yes";
  if (ret != 0) {
    // A CQ without a wait object still works; the engine just cannot sleep on it.
    wait_note = fmt::format("no (fi_cq_open with FI_WAIT_FD: {})", fi_strerror(-ret));
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(res->domain.get(), &cq_attr, &cq, nullptr);
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_cq_open", ret));
    return nullptr;
  }
  res->cq.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type =
      info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  fid_av* av = nullptr;
  ret = fi_av_open(res->domain.get(), &av_attr, &av, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_av_open", ret));
    return nullptr;
  }
  res->av.reset(av);

  if (res->info->fabric_attr->prov_name != nullptr &&
      std::string_view(res->info->fabric_attr->prov_name) == "shm")
    remove_own_stale_shm_regions();
  fid_ep* ep = nullptr;
  ret = fi_endpoint(res->domain.get(), res->info.get(), &ep, nullptr);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_endpoint", ret));
    return nullptr;
  }
  res->ep.reset(ep);
  ret = fi_ep_bind(ep, &res->cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_ep_bind(cq)", ret));
    return nullptr;
  }
  ret = fi_ep_bind(ep, &res->av->fid, 0);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_ep_bind(av)", ret));
    return nullptr;
  }
  ret = fi_enable(ep);
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_enable", ret));
    return nullptr;
  }

  auto d = std::make_unique<FabricDomain>(Key{});
  d->address_.resize(kInitialAddrLen);
  size_t addrlen = d->address_.size();
  ret = fi_getname(&ep->fid, d->address_.data(), &addrlen);
  if (ret == -FI_ETOOSMALL) {
    d->address_.resize(addrlen);
    ret = fi_getname(&ep->fid, d->address_.data(), &addrlen);
  }
  if (ret != 0) {
    set_error(error, fi_failure(Code::kUnavailable, nic, "fi_getname", ret));
    return nullptr;
  }
  d->address_.resize(addrlen);
  d->peer_addr_len_ = std::max({addrlen, info->src_addrlen, info->dest_addrlen});

  if (cq_attr.wait_obj == FI_WAIT_FD) {
    int fd = -1;
    ret = fi_control(&res->cq->fid, FI_GETWAIT, &fd);
    if (ret == 0 && fd >= 0) {
      d->wait_fd_ = fd;
    } else {
      wait_note = fmt::format("no (fi_control FI_GETWAIT: {})", fi_strerror(-ret));
    }
  }

  d->res_ = std::move(res);
  d->ep_ = d->res_->ep.get();
  d->cq_ = d->res_->cq.get();
  d->pool_ = d->res_->pool.get();
  d->repost_.reset(new OpEntry*[d->pool_->capacity()]);
  d->rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
  if (d->rx_cq_data_ && !d->post_internal_recvs()) {
    set_error(error, Status(Code::kUnavailable,
                            fmt::format("fabric NIC '{}': fi_recv failed while posting receives "
                                        "for remote CQ data (FI_RX_CQ_DATA)",
                                        nic)));
    return nullptr;
  }

  d->msg_.msg_iov = &d->iov_;
  d->msg_.desc = d->desc_;
  d->msg_.iov_count = 1;
  d->msg_.rma_iov = &d->rma_iov_;
  d->msg_.rma_iov_count = 1;

  d->info_.name = nic;
  d->info_.provider = info->fabric_attr->prov_name;
  d->info_.fabric = info->fabric_attr->name != nullptr ? info->fabric_attr->name : "";
  if (info->nic != nullptr && info->nic->link_attr != nullptr) {
    d->info_.link_speed_bps = info->nic->link_attr->speed;
  }
  d->info_.max_msg_size = info->ep_attr != nullptr ? info->ep_attr->max_msg_size : 0;
  d->info_.transport = Transport::kFabric;
  d->info_.any_thread = true;
  d->rxm_ = d->info_.provider.find("ofi_rxm") != std::string::npos;
  d->shm_ = d->info_.provider == "shm";
  // shm hands an immediate to the peer's queue inside the post; tcp;ofi_rxm
  // and the RDMA providers may still fail it later, which needs a context.
  d->info_.imm_at_post = d->shm_;
  if (d->shm_ && info->tx_attr != nullptr) d->info_.send_at_post_max = info->tx_attr->inject_size;
  d->socket_probe_ = d->info_.provider.starts_with("tcp") && ConnectProbe::is_inet(d->address_);
  if (d->shm_) {
    ShmParking::instance().opened();  // closes through it (close_all)
    const std::string_view own(
        reinterpret_cast<const char*>(d->address_.data()),
        strnlen(reinterpret_cast<const char*>(d->address_.data()), d->address_.size()));
    d->own_region_ = map_own_shm_region(own, &d->shm_version_, &d->own_region_len_);
    d->shm_layout_ok_ = d->own_region_ != nullptr;
    if (d->shm_layout_ok_)
      d->own_lock_ =
          reinterpret_cast<int*>(static_cast<uint8_t*>(d->own_region_) + shm_layout::kLock);
  }

  core::log().info(
      "ferry fabric: opened provider={} fabric={} domain={} mr_mode={} mode={:#x} "
      "cq_data_size={} wait_fd={} ops={}{}",
      d->info_.provider, d->info_.fabric, nic, mr_mode_string(d->res_->mr_mode), info->mode,
      info->domain_attr->cq_data_size, wait_note, d->pool_->capacity(),
      (info->caps & FI_HMEM) != 0 ? " hmem" : "");
  set_error(error, Status::ok());
  return d;
}

FabricDomain::~FabricDomain() {
  close_all();
}

bool FabricDomain::can_block() {
  if (wait_fd_ < 0) return false;
  fid* fids[1] = {&cq_->fid};
  return fi_trywait(res_->fabric.get(), fids, 1) == FI_SUCCESS;
}

// How long an rxm endpoint must stay quiet before it is closed, and the most
// the whole drain may take.
static constexpr auto kRxmQuiet = std::chrono::milliseconds(20);
static constexpr auto kDrainLimit = std::chrono::seconds(2);

void FabricDomain::release_drained(void* op_context) {
  OpEntry* op = pool_->from_context(op_context);
  if (op == nullptr || op->kind == OpKind::kFree) return;
  if ((op->kind == OpKind::kWrite || op->kind == OpKind::kSend) && tx_in_flight_ > 0)
    --tx_in_flight_;
  pool_->release(op);
}

// libfabric 1.17's ofi_rxm crashes in fi_close(ep) when a peer's write with
// remote CQ data is half received: the tcp endpoint of that connection
// reports it cancelled with no operation context, and rxm's
// rxm_handle_comp_error dereferences the null context (SIGSEGV in
// rxm_close_conn, seen when an engine stops while a peer streams writes into
// it). Closing the registrations first makes every later write on a
// connection fail its key check, which shuts that connection down cleanly
// between two writes; progressing until the endpoint is quiet lets the write
// under way finish first. Our own writes are drained too, so that no peer is
// left with half of one of ours.
void FabricDomain::quiesce() {
  const size_t revoked = res_->close_all_mrs();
  if (ep_ == nullptr || cq_ == nullptr) return;
  for (size_t i = 0; i < pool_->capacity(); ++i) {
    OpEntry* op = pool_->at(i);
    if (op->kind == OpKind::kRecv || op->kind == OpKind::kInternalRecv)
      (void)fi_cancel(&ep_->fid, op);
  }
  const Clock::duration quiet = rxm_ ? Clock::duration(kRxmQuiet) : Clock::duration::zero();
  const auto start = Clock::now();
  auto last = start;
  auto next_orphan_check = start;
  size_t drained = 0;
  for (;;) {
    fi_cq_data_entry entries[16];
    const ssize_t ret = fi_cq_read(cq_, entries, 16);
    const auto now = Clock::now();
    if (ret > 0) {
      for (ssize_t i = 0; i < ret; ++i) release_drained(entries[i].op_context);
      drained += size_t(ret);
      last = now;
      continue;
    }
    if (ret == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        release_drained(err.op_context);
        ++drained;
        last = now;
        continue;
      }
    } else if (ret != -FI_EAGAIN) {
      break;
    }
    if (now - start >= kDrainLimit) {
      if (tx_in_flight_ > 0 || rxm_)
        core::log().warn(
            "fabric NIC '{}': closing after {} ms with {} write(s)/send(s) of ours still in "
            "flight",
            res_->nic_name,
            std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(),
            tx_in_flight_);
      break;
    }
    // Dead shm peers never complete what was posted to them.
    if ((shm_ || dead_socket_peers_ > 0) && tx_in_flight_ > 0 && now >= next_orphan_check) {
      orphan_dead_peers(now);
      next_orphan_check = now + std::chrono::milliseconds(100);
    }
    const bool waiting_for_tx = tx_in_flight_ > 0;
    if (!waiting_for_tx && now - last >= quiet) break;
    std::this_thread::yield();
  }
  core::log().debug(
      "fabric NIC '{}': closing: {} registration(s) revoked, {} completion(s) drained",
      res_->nic_name, revoked, drained);
}

void FabricDomain::close_all() {
  stop_rescuer();
  if (!res_) return;
  quiesce();
  if (shm_) {
    // Another endpoint of this process may still use our region through its
    // own pointer to it (shm_parking.h). res_ is gone after this: a second
    // close_all returns above.
    ep_ = nullptr;
    cq_ = nullptr;
    ShmParking::instance().closed(std::move(res_));
  } else {
    // libfabric's order: the endpoint, then what it was bound to, then the
    // domain's remaining objects, then the domain and the fabric.
    // Registrations went first (quiesce).
    res_->ep.reset();
    ep_ = nullptr;
    res_->av.reset();
    res_->cq.reset();
    cq_ = nullptr;
    res_->domain.reset();
    res_->fabric.reset();
  }
  shm_peers_.clear();
  removed_shm_peers_.clear();
  if (own_region_ != nullptr) ::munmap(own_region_, own_region_len_);
  own_region_ = nullptr;
}

}  // namespace ferry::fabric

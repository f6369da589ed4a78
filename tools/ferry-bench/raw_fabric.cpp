#include "raw_fabric.h"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace ferry_bench {

namespace {

// The API version the engine asks for: the baseline must get the same provider behaviour.
constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
constexpr size_t kMinCtx = 4096, kMaxCtx = 65536;

void check(int ret, const std::string& nic, const char* call) {
  if (ret != 0)
    throw std::runtime_error(
        fmt::format("raw fabric NIC '{}': {} failed: {} ({})", nic, call, fi_strerror(-ret), ret));
}

}  // namespace

RawFabric::RawFabric(const std::string& provider, const std::vector<std::string>& nics, bool hmem)
    : provider_(provider) {
  eps_.resize(nics.size());
  for (size_t k = 0; k < nics.size(); ++k) {
    Ep& e = eps_[k];
    e.name = nics[k];
    // The engine's hints (src/fabric/fabric_devinfo.cpp) minus FI_RX_CQ_DATA,
    // which no provider this baseline targets asks for.
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    if (hmem) {
      hints->caps |= FI_HMEM;
      hints->domain_attr->mr_mode |= FI_MR_HMEM;
    }
    hints->fabric_attr->prov_name = strdup(provider.c_str());
    hints->domain_attr->name = strdup(e.name.c_str());
    fi_info* list = nullptr;
    int ret = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints, &list);
    fi_freeinfo(hints);
    check(ret, e.name, "fi_getinfo");
    // Exact provider and domain match, as the engine does (no layered fallback).
    for (fi_info* i = list; i && !e.info; i = i->next)
      if (i->fabric_attr->prov_name && provider == i->fabric_attr->prov_name &&
          i->domain_attr->name && e.name == i->domain_attr->name &&
          i->domain_attr->cq_data_size >= 4 && (!hmem || (i->caps & FI_HMEM) != 0))
        e.info = fi_dupinfo(i);
    fi_freeinfo(list);
    if (!e.info)
      throw std::runtime_error(
          fmt::format("raw fabric: provider '{}' has no domain '{}'", provider, e.name));
    e.mr_mode = e.info->domain_attr->mr_mode;
    check(fi_fabric(e.info->fabric_attr, &e.fabric, nullptr), e.name, "fi_fabric");
    check(fi_domain(e.fabric, e.info, &e.domain, nullptr), e.name, "fi_domain");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_FD;
    if (fi_cq_open(e.domain, &cq_attr, &e.cq, nullptr) != 0) {
      cq_attr.wait_obj = FI_WAIT_NONE;  // shm: no wait object, busy polling only
      check(fi_cq_open(e.domain, &cq_attr, &e.cq, nullptr), e.name, "fi_cq_open");
    }
    fi_av_attr av_attr{};
    av_attr.type =
        e.info->domain_attr->av_type != FI_AV_UNSPEC ? e.info->domain_attr->av_type : FI_AV_TABLE;
    check(fi_av_open(e.domain, &av_attr, &e.av, nullptr), e.name, "fi_av_open");
    check(fi_endpoint(e.domain, e.info, &e.ep, nullptr), e.name, "fi_endpoint");
    check(fi_ep_bind(e.ep, &e.cq->fid, FI_TRANSMIT | FI_RECV), e.name, "fi_ep_bind(cq)");
    check(fi_ep_bind(e.ep, &e.av->fid, 0), e.name, "fi_ep_bind(av)");
    check(fi_enable(e.ep), e.name, "fi_enable");
    if (cq_attr.wait_obj == FI_WAIT_FD && fi_control(&e.cq->fid, FI_GETWAIT, &e.wait_fd) != 0)
      e.wait_fd = -1;
    size_t depth = (e.info->tx_attr ? e.info->tx_attr->size : 0) +
                   (e.info->rx_attr ? e.info->rx_attr->size : 0);
    size_t n = std::clamp(depth, kMinCtx, kMaxCtx);
    e.num_ctx = n;
    e.ctxs = std::make_unique<fi_context2[]>(n);
    e.user_ctx = std::make_unique<uint64_t[]>(n);
    for (size_t i = n; i-- > 0;) e.free.push_back(uint32_t(i));
  }
}

RawFabric::~RawFabric() {
  for (auto& e : eps_) {
    for (auto* mr : e.mrs) fi_close(&mr->fid);
    if (e.ep) fi_close(&e.ep->fid);
    if (e.av) fi_close(&e.av->fid);
    if (e.cq) fi_close(&e.cq->fid);
    if (e.domain) fi_close(&e.domain->fid);
    if (e.fabric) fi_close(&e.fabric->fid);
    if (e.info) fi_freeinfo(e.info);
  }
}

std::vector<uint8_t> RawFabric::address(size_t nic) const {
  std::vector<uint8_t> a(256);
  size_t len = a.size();
  int ret = fi_getname(&eps_[nic].ep->fid, a.data(), &len);
  if (ret == -FI_ETOOSMALL) {
    a.resize(len);
    ret = fi_getname(&eps_[nic].ep->fid, a.data(), &len);
  }
  check(ret, eps_[nic].name, "fi_getname");
  a.resize(len);
  return a;
}

RawRegion RawFabric::register_region(void* ptr, size_t len, bool remote, int gpu) {
  RawRegion r;
  for (auto& e : eps_) {
    fid_mr* mr = nullptr;
    uint64_t access = FI_SEND | FI_RECV | FI_WRITE | FI_READ;
    if (remote) access |= FI_REMOTE_WRITE | FI_REMOTE_READ;
    uint64_t requested = (e.mr_mode & FI_MR_PROV_KEY) ? 0 : next_key_++;
    iovec iov{ptr, len};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = requested;
    attr.iface = gpu >= 0 ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
    attr.device.cuda = gpu >= 0 ? gpu : 0;
    check(fi_mr_regattr(e.domain, &attr, 0, &mr), e.name, "fi_mr_regattr");
    e.mrs.push_back(mr);
    if (e.mr_mode & FI_MR_ENDPOINT) {
      check(fi_mr_bind(mr, &e.ep->fid, 0), e.name, "fi_mr_bind");
      check(fi_mr_enable(mr), e.name, "fi_mr_enable");
    }
    e.mr_desc = fi_mr_desc(mr);
    r.keys.push_back(fi_mr_key(mr));
    r.bases.push_back((e.mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(ptr) : 0);
  }
  return r;
}

void RawFabric::insert_peer(const std::vector<std::vector<uint8_t>>& addrs) {
  for (size_t k = 0; k < eps_.size(); ++k) {
    Ep& e = eps_[k];
    // fi_av_insert reads as many bytes as the provider's format says: pad.
    std::vector<uint8_t> buf(std::max<size_t>(addrs[k].size(), 256), 0);
    std::memcpy(buf.data(), addrs[k].data(), addrs[k].size());
    if (fi_av_insert(e.av, buf.data(), 1, &e.peer, 0, nullptr) != 1)
      throw std::runtime_error(fmt::format("raw fabric NIC '{}': fi_av_insert failed", e.name));
  }
}

fi_context2* RawFabric::take_ctx(Ep& e, uint64_t ctx) {
  if (e.free.empty()) return nullptr;
  uint32_t i = e.free.back();
  e.free.pop_back();
  e.user_ctx[i] = ctx;
  return &e.ctxs[i];
}

int RawFabric::write(size_t nic, const void* src, size_t len, uint64_t raddr, uint64_t key,
                     std::optional<uint32_t> data, uint64_t ctx) {
  Ep& e = eps_[nic];
  if (inject_imms_ && data && len == 0)
    return int(fi_inject_writedata(e.ep, src, 0, *data, e.peer, raddr, key));
  fi_context2* c = take_ctx(e, ctx);
  if (!c) return -FI_EAGAIN;
  ssize_t ret = data ? fi_writedata(e.ep, src, len, e.mr_desc, *data, e.peer, raddr, key, c)
                     : fi_write(e.ep, src, len, e.mr_desc, e.peer, raddr, key, c);
  if (ret != 0) e.free.push_back(uint32_t(c - e.ctxs.get()));
  return int(ret);
}

int RawFabric::send(size_t nic, const void* buf, size_t len, uint64_t ctx) {
  Ep& e = eps_[nic];
  fi_context2* c = take_ctx(e, ctx);
  if (!c) return -FI_EAGAIN;
  ssize_t ret = fi_send(e.ep, buf, len, e.mr_desc, e.peer, c);
  if (ret != 0) e.free.push_back(uint32_t(c - e.ctxs.get()));
  return int(ret);
}

int RawFabric::recv(size_t nic, void* buf, size_t len, uint64_t ctx) {
  Ep& e = eps_[nic];
  fi_context2* c = take_ctx(e, ctx);
  if (!c) return -FI_EAGAIN;
  ssize_t ret = fi_recv(e.ep, buf, len, e.mr_desc, FI_ADDR_UNSPEC, c);
  if (ret != 0) e.free.push_back(uint32_t(c - e.ctxs.get()));
  return int(ret);
}

size_t RawFabric::poll(size_t nic, RawEvent* out, size_t max) {
  Ep& e = eps_[nic];
  fi_cq_data_entry entries[32];
  ssize_t ret = fi_cq_read(e.cq, entries, std::min<size_t>(max, 32));
  if (ret == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(e.cq, &err, 0) <= 0) return 0;
    out[0].kind = RawEvent::Kind::kError;
    out[0].ctx = 0;
    out[0].data = uint32_t(err.err);
    auto* c = static_cast<fi_context2*>(err.op_context);
    if (c >= e.ctxs.get() && c < e.ctxs.get() + e.num_ctx) {
      out[0].ctx = e.user_ctx[c - e.ctxs.get()];
      e.free.push_back(uint32_t(c - e.ctxs.get()));
    }
    return 1;
  }
  if (ret <= 0) return 0;
  for (ssize_t i = 0; i < ret; ++i) {
    const fi_cq_data_entry& c = entries[i];
    RawEvent& ev = out[i];
    if ((c.flags & FI_REMOTE_CQ_DATA) && ((c.flags & FI_RMA) || !c.op_context)) {
      ev.kind = RawEvent::Kind::kRemoteData;
      ev.data = uint32_t(c.data);
      continue;
    }
    auto* ctx = static_cast<fi_context2*>(c.op_context);
    uint32_t idx = uint32_t(ctx - e.ctxs.get());
    ev.kind = (c.flags & FI_RECV) ? RawEvent::Kind::kRecv : RawEvent::Kind::kLocal;
    ev.ctx = e.user_ctx[idx];
    ev.len = c.len;
    e.free.push_back(idx);
  }
  return size_t(ret);
}

bool RawFabric::wait(int timeout_ms, int extra_fd) {
  pollfd fds[8];
  nfds_t n = 0;
  for (auto& e : eps_) {
    if (e.wait_fd < 0 || n >= 7) return false;
    // Blocking is only safe once the provider has nothing left to progress.
    fid* f = &e.cq->fid;
    if (fi_trywait(e.fabric, &f, 1) != FI_SUCCESS) return true;
    fds[n++] = {e.wait_fd, POLLIN, 0};
  }
  if (extra_fd >= 0) fds[n++] = {extra_fd, POLLIN, 0};
  ::poll(fds, n, timeout_ms);
  return true;
}

}  // namespace ferry_bench

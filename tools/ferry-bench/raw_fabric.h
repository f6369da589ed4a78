// The raw libfabric baseline of ferry-bench: the same provider, driven
// directly (fi_getinfo / fabric / domain / CQ / AV / endpoint / MR), one
// endpoint per NIC name, single-threaded. Nothing of the engine is used, so
// the ratio ferry / raw isolates what the engine adds on top of the provider.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry_bench {

// One registration as a peer sees it: per NIC the key and the address of byte 0.
struct RawRegion {
  std::vector<uint64_t> keys;
  std::vector<uint64_t> bases;
};

// One completion of interest to the benchmark loops.
struct RawEvent {
  enum class Kind : uint8_t { kLocal, kRemoteData, kRecv, kError };
  Kind kind = Kind::kLocal;
  uint64_t ctx = 0;  // caller's context of a local completion or receive
  uint32_t data = 0;
  uint64_t len = 0;
};

class RawFabric {
 public:
  // Opens one endpoint per name in `nics` on `provider`, asking for FI_HMEM
  // when `hmem` (GPU regions). Throws std::runtime_error.
  RawFabric(const std::string& provider, const std::vector<std::string>& nics, bool hmem = false);
  ~RawFabric();
  RawFabric(const RawFabric&) = delete;
  RawFabric& operator=(const RawFabric&) = delete;

  size_t nics() const { return eps_.size(); }
  std::vector<uint8_t> address(size_t nic) const;
  // Registers [ptr, ptr+len) on every NIC (remote write access when `remote`);
  // memory of CUDA device `gpu` when gpu >= 0 (FI_HMEM_CUDA, as the engine does).
  RawRegion register_region(void* ptr, size_t len, bool remote, int gpu = -1);
  void* local_desc(size_t nic) const { return eps_[nic].mr_desc; }
  // Resolves the peer's address of each NIC (the same NIC index on both sides).
  void insert_peer(const std::vector<std::vector<uint8_t>>& addrs);

  // Data path: 0, -FI_EAGAIN (queue full: poll, then retry) or another
  // negative libfabric error. `ctx` comes back in the local completion.
  int write(size_t nic, const void* src, size_t len, uint64_t raddr, uint64_t key,
            std::optional<uint32_t> data, uint64_t ctx);
  // Zero-byte writes with data go out as fi_inject_writedata: no local
  // completion (the baseline of an engine that posts its immediates so).
  void inject_immediates(bool on) { inject_imms_ = on; }
  bool injecting_immediates() const { return inject_imms_; }
  int send(size_t nic, const void* buf, size_t len, uint64_t ctx);
  int recv(size_t nic, void* buf, size_t len, uint64_t ctx);

  // Reads up to out.size() events of NIC `nic`; returns how many.
  size_t poll(size_t nic, RawEvent* out, size_t max);
  // Blocks up to `timeout_ms` for any CQ, the engine's adaptive way (fi_trywait
  // then poll(2) on the wait fds), adding `extra_fd` (-1 = none) to the set.
  // Returns false when the CQs cannot be waited on (caller naps instead).
  bool wait(int timeout_ms, int extra_fd);
  const std::string& provider() const { return provider_; }

 private:
  bool inject_imms_ = false;
  struct Ep {
    std::string name;
    fi_info* info = nullptr;
    fid_fabric* fabric = nullptr;
    fid_domain* domain = nullptr;
    fid_cq* cq = nullptr;
    fid_av* av = nullptr;
    fid_ep* ep = nullptr;
    int wait_fd = -1;
    uint64_t mr_mode = 0;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    void* mr_desc = nullptr;  // of the most recent registration (one per side in practice)
    std::vector<fid_mr*> mrs;
    // Per-op contexts for providers that ask for FI_CONTEXT(2); indexed by a
    // free list so a completion maps back to the caller's ctx.
    size_t num_ctx = 0;
    std::unique_ptr<fi_context2[]> ctxs;
    std::unique_ptr<uint64_t[]> user_ctx;
    std::vector<uint32_t> free;
  };
  fi_context2* take_ctx(Ep& e, uint64_t ctx);

  std::string provider_;
  std::vector<Ep> eps_;
  uint64_t next_key_ = 1;
};

// For the length of one ping-pong: its immediates injected (--raw-inject).
class InjectImmediates {
 public:
  InjectImmediates(RawFabric& rf, bool on) : rf_(rf), was_(rf.injecting_immediates()) {
    rf_.inject_immediates(on);
  }
  ~InjectImmediates() { rf_.inject_immediates(was_); }
  InjectImmediates(const InjectImmediates&) = delete;
  InjectImmediates& operator=(const InjectImmediates&) = delete;

 private:
  RawFabric& rf_;
  bool was_;
};

}  // namespace ferry_bench

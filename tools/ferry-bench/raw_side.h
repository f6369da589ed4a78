// The baseline side of a point: raw libfabric on the same provider (client
// loops and the server that answers and verifies them), or for the nvlink
// provider one cudaMemcpyAsync per write into the peer's region.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "driver.h"
#include "gpu.h"
#include "options.h"
#include "plan.h"
#include "raw_fabric.h"

namespace ferry_bench {

enum class RawMode : uint32_t { kSink, kPingWrite, kPingSend };

RawMode raw_mode(const Point& p);

class RawClient {
 public:
  RawClient(RawFabric& rf, uint8_t* region, uint64_t region_len, RawRegion peer, const Options& o)
      : rf_(rf),
        region_(region),
        msg_(region + region_len - kMsgArea),
        peer_(std::move(peer)),
        o_(o) {}

  Result throughput(const Point& p, const Layout& l, const DriveConfig& dc, uint64_t* next_req);

  // Half round trip of a zero-byte write with data, or of a send/recv pair.
  Result pingpong_(const Point& p, const DriveConfig& dc);

 private:
  // The immediate ping-pong through a NIC thread (--raw-relay).
  Result relayed_pingpong(const DriveConfig& dc);

  RawFabric& rf_;
  uint8_t* region_;
  uint8_t* msg_;
  RawRegion peer_;
  const Options& o_;
  bool recvs_posted_ = false;
};

// Serves one raw phase until the client's kRawStop, then waits for what is
// still on the wire and verifies. Replies {arrivals, verify text}.
void serve_raw(RawFabric& rf, Region& reg, const RawRegion& client, const Options& o, int fd,
               const Point& p, RawMode mode, uint64_t seed, bool* recvs_posted);

// The server half of a CUDA baseline phase: the client's copies are complete
// when it sends kRawStop (it waited for their events), so only the check is left.
void serve_copies(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed);

// The client half: every write of a request one cudaMemcpyAsync (requests
// round robin over PeerCopier's streams), as NIXL's and Mooncake's NVLink
// paths copy descriptor by descriptor.
class CopyClient {
 public:
  CopyClient(Region& region, std::vector<uint8_t> peer_handle, const Options& o)
      : region_(region), peer_handle_(std::move(peer_handle)), o_(o) {}

  static bool covers(const Point& p) {
    return p.kind == Kind::kSingle || p.kind == Kind::kPaged || p.kind == Kind::kScatter;
  }

  Result throughput(const Layout& l, const DriveConfig& dc, uint64_t* next_req);

 private:
  Region& region_;
  std::vector<uint8_t> peer_handle_;
  const Options& o_;
};

}  // namespace ferry_bench

// The ferry side of a point: a fresh engine pair per phase, the server half
// (register, respond, settle, verify) and the client half (the same loops as
// the baseline, with engine requests).
#pragma once

#include <cstdint>
#include <vector>

#include "driver.h"
#include "ferry/ferry.h"
#include "gpu.h"
#include "options.h"
#include "plan.h"

namespace ferry_bench {

// Server half of a ferry phase: engine up, descriptors out, respond or wait,
// then settle, verify and stop the engine. Replies {arrivals, verify text}.
void serve_ferry(Region& reg, const Options& o, int fd, const Point& p, uint64_t seed,
                 const ferry::MrDesc& client);

class FerryClient {
 public:
  FerryClient(Region& region, const Options& o, int fd) : region_(region), o_(o), fd_(fd) {}

  Result run(uint64_t index, const Point& p, const DriveConfig& dc, uint64_t seed);

 private:
  Result throughput(ferry::TransferEngine& e, ferry::MrHandle h,
                    const std::vector<ferry::MrDesc>& descs, const Point& p, const Layout& l,
                    const DriveConfig& dc, uint64_t* next_req);

  Region& region_;
  const Options& o_;
  int fd_;
};

}  // namespace ferry_bench

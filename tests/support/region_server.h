// The receiving side used by engine tests: a peer process registers a region,
// publishes its descriptor, then answers text commands:
//   counter <imm>            start counting imm
//   count <imm> <n>          wait for n arrivals; answers "ok <surplus>"
//   expect <imm> <n>         expect_imm_count(imm, n) with a firing counter
//   fires <imm> <n>          wait until fired n times; answers "fired <k>"
//   check <off> <len> <seed> verify the pattern; answers "ok" or the first bad byte
//   quit
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/engine.h"
#include "support/process.h"

namespace ferry::test {

struct Buffer {
  explicit Buffer(size_t n) : data(new(std::align_val_t(4096)) uint8_t[n]()), len(n) {}
  std::unique_ptr<uint8_t[]> data;
  size_t len;
  uint8_t* get() const { return data.get(); }
};

int serve_region(Channel& ch, const EngineConfig& cfg, size_t len);
std::string ask(Channel& ch, const std::string& cmd);
std::string check_cmd(uint64_t off, uint64_t len, uint64_t seed);

}  // namespace ferry::test

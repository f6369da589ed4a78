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
#include <new>
#include <string>

#include "ferry/engine.h"
#include "support/process.h"

namespace ferry::test {

struct Buffer {
  static constexpr std::align_val_t kAlign{4096};
  // Memory from an aligned new[] must go back through the aligned delete[]
  // (plain delete[] is undefined behaviour; ASan: new-delete-type-mismatch).
  struct AlignedDelete {
    void operator()(uint8_t* p) const { ::operator delete[](p, kAlign); }
  };
  explicit Buffer(size_t n) : data(new (kAlign) uint8_t[n]()), len(n) {}
  std::unique_ptr<uint8_t[], AlignedDelete> data;
  size_t len;
  uint8_t* get() const { return data.get(); }
};

int serve_region(Channel& ch, const EngineConfig& cfg, size_t len);
std::string ask(Channel& ch, const std::string& cmd);
std::string check_cmd(uint64_t off, uint64_t len, uint64_t seed);

}  // namespace ferry::test

#include "support/region_server.h"

#include <atomic>
#include <cstdio>
#include <unordered_map>

#include "support/tsan.h"

namespace ferry::test {

using namespace std::chrono_literals;

int serve_region(Channel& ch, const EngineConfig& cfg, size_t len) {
  // The region outlives the engine: destroyed in reverse order, the engine's
  // workers stop (and the provider stops writing into the region) before the
  // memory is freed. Freed first, a write still landing from the peer (tcp and
  // shm copy it in software) hits unmapped memory (SIGSEGV seen under TSan).
  Buffer buf(len);
  TransferEngine e(cfg);
  auto [h, d] = e.reg_mr(buf.get(), len);
  ch.send(d.to_bytes());
  std::unordered_map<uint64_t, ImmCounter> counters;
  std::unordered_map<uint64_t, std::shared_ptr<std::atomic<int>>> fires;
  for (;;) {
    auto cmd = ch.recv_str(300s);
    if (!cmd) return 10;
    char op[16] = {};
    unsigned long a = 0, b = 0, c = 0;
    std::sscanf(cmd->c_str(), "%15s %lu %lu %lu", op, &a, &b, &c);
    std::string o(op);
    if (o == "quit") return 0;
    if (o == "counter") {
      counters[a] = e.imm_counter(a);
      ch.send(std::string("ok"));
    } else if (o == "count") {
      Status st = counters.at(a).wait(int64_t(b), 30s);
      ch.send(st.is_ok() ? "ok " + std::to_string(counters.at(a).value()) : st.to_string());
    } else if (o == "expect") {
      auto f = std::make_shared<std::atomic<int>>(0);
      fires[a] = f;
      e.expect_imm_count(a, b, [f] { f->fetch_add(1); });
      ch.send(std::string("ok"));
    } else if (o == "fires") {
      auto f = fires.at(a);
      wait_until([&] { return f->load() >= int(b); }, 30s);
      ch.send("fired " + std::to_string(f->load()));
    } else if (o == "check") {
      int64_t bad;
      {
        // The sender's next write may land on these bytes after our answer;
        // TSan cannot see that order (support/tsan.h).
        NicMemoryAccess scope;
        bad = check_pattern(buf.get() + a, b, c);
      }
      ch.send(bad < 0 ? std::string("ok") : "mismatch at " + std::to_string(a + bad));
    } else {
      ch.send("unknown command " + o);
    }
  }
}

std::string ask(Channel& ch, const std::string& cmd) {
  ch.send(cmd);
  return ch.recv_str(120s).value_or("no answer");
}

std::string check_cmd(uint64_t off, uint64_t len, uint64_t seed) {
  return "check " + std::to_string(off) + " " + std::to_string(len) + " " + std::to_string(seed);
}

}  // namespace ferry::test

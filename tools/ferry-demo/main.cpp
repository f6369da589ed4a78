// ferry-demo: two processes on one machine; the client writes a buffer into
// the server's registered memory with single writes carrying an immediate,
// the server counts the immediates, checks every byte and reports.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "forked_pair.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

bool send_all(int fd, const std::vector<uint8_t>& b) {
  uint64_t n = b.size();
  if (::write(fd, &n, 8) != 8) return false;
  return ::write(fd, b.data(), b.size()) == ssize_t(b.size());
}

std::optional<std::vector<uint8_t>> recv_all(int fd) {
  uint64_t n;
  if (::read(fd, &n, 8) != 8 || n > (1 << 20)) return std::nullopt;
  std::vector<uint8_t> b(n);
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::read(fd, b.data() + off, n - off);
    if (r <= 0) return std::nullopt;
    off += r;
  }
  return b;
}

uint8_t byte_at(uint64_t i) {
  return uint8_t((i * 2654435761u) >> 13);
}

struct Options {
  std::string provider = "tcp;ofi_rxm";
  std::string nic = "lo";
  uint64_t total_mib = 512;
  uint64_t write_kib = 4096;
  int window = 16;
};

int server(int fd, const Options& o, uint64_t total) {
  ferry::EngineConfig cfg;
  cfg.provider = o.provider;
  cfg.groups[0].nic_names = {o.nic};
  ferry::TransferEngine e(cfg);
  std::vector<uint8_t> buf(total, 0);
  auto [h, desc] = e.reg_mr(buf.data(), buf.size());
  auto counter = e.imm_counter(1);
  send_all(fd, desc.to_bytes());
  uint64_t writes = total / (o.write_kib << 10);
  auto st = counter.wait(int64_t(writes), 300s);
  if (!st.is_ok()) {
    std::fprintf(stderr, "server: %s\n", st.to_string().c_str());
    return 2;
  }
  for (uint64_t i = 0; i < total; ++i)
    if (buf[i] != byte_at(i)) {
      std::fprintf(stderr, "server: byte %lu differs\n", (unsigned long)i);
      return 3;
    }
  std::printf("server: %lu immediates counted, %lu bytes verified\n", (unsigned long)writes,
              (unsigned long)total);
  send_all(fd, {1});
  return 0;
}

int client(int fd, const Options& o, uint64_t total) {
  ferry::EngineConfig cfg;
  cfg.provider = o.provider;
  cfg.groups[0].nic_names = {o.nic};
  cfg.default_deadline = 60s;
  ferry::TransferEngine e(cfg);
  std::vector<uint8_t> buf(total);
  for (uint64_t i = 0; i < total; ++i) buf[i] = byte_at(i);
  auto [h, mine] = e.reg_mr(buf.data(), buf.size());
  auto bytes = recv_all(fd);
  if (!bytes) return 4;
  auto desc = ferry::MrDesc::from_bytes(*bytes);
  uint64_t chunk = o.write_kib << 10, writes = total / chunk;
  std::atomic<uint64_t> done{0}, errors{0};
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < writes; ++i) {
    while (i - done.load(std::memory_order_acquire) >= uint64_t(o.window))
      std::this_thread::yield();
    e.submit_single_write(chunk, 1, h, i * chunk, desc, i * chunk,
                          ferry::OnDone::counter(done, &errors));
  }
  while (done.load() < writes) std::this_thread::yield();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto ack = recv_all(fd);
  std::printf(
      "client: provider %s, NIC %s: %lu writes of %lu KiB = %.1f MiB in %.3f s: %.2f GB/s "
      "(%.1f Gbps), %lu errors, remote check %s\n",
      e.provider().c_str(), o.nic.c_str(), (unsigned long)writes, (unsigned long)o.write_kib,
      total / 1048576.0, secs, total / secs / 1e9, total * 8 / secs / 1e9,
      (unsigned long)errors.load(), ack ? "passed" : "FAILED");
  return errors.load() == 0 && ack ? 0 : 5;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ferry-demo: a verified two-process transfer over one libfabric provider"};
  app.add_option("--provider", o.provider, "libfabric provider (tcp;ofi_rxm, shm, efa)");
  app.add_option("--nic", o.nic, "NIC (libfabric domain) name: lo, shm, an interface");
  app.add_option("--total-mib", o.total_mib, "bytes to move, MiB")->check(CLI::Range(1, 16384));
  app.add_option("--write-kib", o.write_kib, "bytes per write, KiB")->check(CLI::Range(1, 1 << 20));
  app.add_option("--window", o.window, "writes in flight")->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  if (o.provider == "shm" && o.nic == "lo") o.nic = "shm";
  uint64_t chunk = o.write_kib << 10;
  uint64_t total = (o.total_mib << 20) / chunk * chunk;
  if (total == 0) {
    std::fprintf(stderr, "--total-mib must hold at least one write\n");
    return 1;
  }
  return ferry::tools::run_forked_pair([&](int fd) { return server(fd, o, total); },
                                       [&](int fd) { return client(fd, o, total); }, 6);
}

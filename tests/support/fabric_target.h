// A libfabric Domain in a child process that tests kill: it registers a region,
// sends its address, key and base over the channel and polls until it dies
// (or a minute passes). Used by the fabric tests of peers that die.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/domain.h"
#include "fabric/fabric_domain.h"
#include "support/process.h"

namespace ferry::test {

inline std::unique_ptr<core::Domain> open_fabric_nic(const std::string& provider,
                                                     const std::string& nic) {
  core::DomainOptions opts;
  opts.provider = provider;
  opts.nic_name = nic;
  Status st;
  auto d = fabric::open_fabric_domain(opts, &st);
  EXPECT_NE(d, nullptr) << provider << " on " << nic << ": " << st.message();
  return d;
}

// The child's body: exit code 2 when the NIC does not open, 3 when the region
// does not register, 0 after a minute of polling.
inline int serve_fabric_target(Channel& ch, const std::string& provider, const std::string& nic,
                               size_t region_bytes) {
  std::vector<uint8_t> region(region_bytes, 0);
  auto d = open_fabric_nic(provider, nic);
  if (!d) return 2;
  Status st;
  auto mr = d->register_mr(region.data(), region.size(), Device::host(), true, &st);
  if (!mr) return 3;
  std::vector<uint8_t> msg(d->raw_address().begin(), d->raw_address().end());
  msg.resize(msg.size() + 16);
  std::memcpy(msg.data() + msg.size() - 16, &mr->rkey, 8);
  std::memcpy(msg.data() + msg.size() - 8, &mr->remote_base, 8);
  ch.send(msg);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  core::Completion buf[32];
  while (std::chrono::steady_clock::now() < until) d->poll(buf);
  return 0;
}

// The parent's view of a started target; `proc` is null (or `raw` empty) when
// it did not start or sent nothing.
struct FabricTarget {
  std::unique_ptr<Peer> proc;
  std::vector<uint8_t> raw;
  uint64_t rkey = 0;
  uint64_t base = 0;
  bool ok() const { return proc && !raw.empty(); }
};

inline FabricTarget spawn_fabric_target(PeerSpawner& spawner) {
  FabricTarget t;
  t.proc = spawner.spawn();
  if (!t.proc) return t;
  auto msg = t.proc->channel().recv(std::chrono::seconds(30));
  if (!msg || msg->size() < 17) return t;
  t.raw.assign(msg->begin(), msg->end() - 16);
  std::memcpy(&t.rkey, msg->data() + msg->size() - 16, 8);
  std::memcpy(&t.base, msg->data() + msg->size() - 8, 8);
  return t;
}

}  // namespace ferry::test

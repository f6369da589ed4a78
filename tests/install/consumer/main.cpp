#include <ferry/ferry.h>

#include <cstdio>

int main() {
  ferry::EngineConfig cfg;
  cfg.provider = "shm";
  cfg.groups[0].nic_names = {"shm"};
  ferry::TransferEngine engine(cfg);
  auto addr = ferry::NetAddr::from_hex(engine.main_address().to_hex());
  std::printf("ferry %s consumer: engine up at %s\n", ferry::kVersion, addr.brief().c_str());
  return addr == engine.main_address() ? 0 : 1;
}

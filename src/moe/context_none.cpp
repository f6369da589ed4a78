// ferry::moe::AllToAll in builds without CUDA: the sizes work, the rest
// throws kUnimplemented.
#include "ferry/moe.h"

namespace ferry::moe {
namespace {
[[noreturn]] void none() {
  throw Error(Code::kUnimplemented, "moe: this build of ferry has no CUDA");
}
}  // namespace

struct AllToAll::Impl {
  AllToAllConfig cfg;
};

AllToAll::AllToAll(TransferEngine&, AllToAllConfig) {
  none();
}
AllToAll::~AllToAll() = default;
const AllToAllConfig& AllToAll::config() const {
  none();
}
BufferSizes AllToAll::sizes() const {
  none();
}
std::vector<uint8_t> AllToAll::local_info() const {
  none();
}
void AllToAll::connect(const std::vector<std::vector<uint8_t>>&) {
  none();
}
void AllToAll::dispatch(const DispatchArgs&, bool, bool, void*) {
  none();
}
void AllToAll::combine(const CombineArgs&, bool, bool, void*) {
  none();
}
Status AllToAll::status() const {
  none();
}
ProxyLatency AllToAll::proxy_latency() const {
  none();
}
void AllToAll::destroy() {}

}  // namespace ferry::moe

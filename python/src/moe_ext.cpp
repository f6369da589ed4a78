// Bindings of ferry::moe (ferry._ferry._moe; use ferry.moe). Kernels take raw
// device pointers and the CUDA stream as integers (tensor.data_ptr(),
// torch.cuda.current_stream().cuda_stream), so no torch C++ extension is
// built. The object owns its own TransferEngine: the MoE traffic never shares
// immediates or queues with the caller's engine.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/moe.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

using moe::AllToAllConfig;
using moe::DType;

DType dtype_of(const std::string& s) {
  if (s == "float32") return DType::kF32;
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float8_e4m3fn") return DType::kF8E4M3;
  throw Error(Code::kInvalidArgument,
              "moe: dtype must be float32, bfloat16 or float8_e4m3fn, got " + s);
}

AllToAllConfig config_of(uint32_t max_num_tokens, uint32_t num_experts, uint32_t experts_per_token,
                         uint32_t hidden, uint32_t hidden_scale, const std::string& in_dtype,
                         const std::string& out_dtype, uint32_t expert_padding,
                         uint32_t max_private_tokens, uint32_t rank, uint32_t world_size,
                         uint32_t node_size, uint32_t instance, int device, bool host_buffers,
                         double deadline) {
  AllToAllConfig c;
  c.max_num_tokens = max_num_tokens;
  c.num_experts = num_experts;
  c.experts_per_token = experts_per_token;
  c.hidden = hidden;
  c.hidden_scale = hidden_scale;
  c.in_dtype = dtype_of(in_dtype);
  c.out_dtype = dtype_of(out_dtype);
  c.expert_padding = expert_padding;
  c.max_private_tokens = max_private_tokens;
  c.rank = rank;
  c.world_size = world_size;
  c.node_size = node_size;
  c.instance = instance;
  c.device = device;
  c.host_buffers = host_buffers;
  c.deadline = std::chrono::milliseconds(static_cast<int64_t>(deadline * 1000.0 + 0.5));
  return c;
}

class PyAllToAll {
 public:
  PyAllToAll(const std::string& provider, std::vector<std::string> nics, AllToAllConfig cfg) {
    EngineConfig ec;
    ec.provider = provider;
    GroupConfig host;
    host.nic_names = nics;
    ec.groups = {host};
    // Payloads in GPU memory with remote nodes need a group serving the GPU.
    if (!cfg.host_buffers && cfg.node_size < cfg.world_size) {
      GroupConfig gpu;
      gpu.device = Device::cuda(cfg.device);
      gpu.nic_names = std::move(nics);
      ec.groups.push_back(gpu);
    }
    ec.default_deadline = cfg.deadline;
    nb::gil_scoped_release nogil;
    engine_ = std::make_unique<TransferEngine>(ec);
    a2a_ = std::make_unique<moe::AllToAll>(*engine_, cfg);
  }
  ~PyAllToAll() { destroy(); }

  nb::bytes local_info() const {
    auto b = a2a_->local_info();
    return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }

  void connect(const std::vector<nb::bytes>& infos) {
    std::vector<std::vector<uint8_t>> v;
    for (const nb::bytes& b : infos) {
      const auto* p = static_cast<const uint8_t*>(b.data());
      v.emplace_back(p, p + b.size());
    }
    a2a_->connect(v);
  }

  void dispatch(uintptr_t out_num, uintptr_t out_x, uint64_t out_x_stride, uintptr_t out_scale,
                uint64_t out_scale_stride, uintptr_t x, uint64_t x_stride, uintptr_t x_scale,
                uint64_t x_scale_stride, uintptr_t indices, uint64_t indices_stride,
                uint32_t num_tokens, uintptr_t bound_m, bool do_send, bool do_recv,
                uintptr_t stream) {
    moe::DispatchArgs a;
    a.out_expert_num_tokens = reinterpret_cast<int32_t*>(out_num);
    a.out_expert_x = reinterpret_cast<void*>(out_x);
    a.out_x_stride = out_x_stride;
    a.out_expert_x_scale = reinterpret_cast<float*>(out_scale);
    a.out_scale_stride = out_scale_stride;
    a.x = reinterpret_cast<const void*>(x);
    a.x_stride = x_stride;
    a.x_scale = reinterpret_cast<const float*>(x_scale);
    a.x_scale_stride = x_scale_stride;
    a.indices = reinterpret_cast<const int32_t*>(indices);
    a.indices_stride = indices_stride;
    a.num_tokens = num_tokens;
    a.bound_m = reinterpret_cast<const int32_t*>(bound_m);
    live().dispatch(a, do_send, do_recv, reinterpret_cast<void*>(stream));
  }

  void combine(uintptr_t out, uint64_t out_stride, uintptr_t weights, uint64_t weights_stride,
               uintptr_t y, uint64_t y_stride, bool accumulate, bool do_send, bool do_recv,
               uintptr_t stream) {
    moe::CombineArgs a;
    a.out_tokens = reinterpret_cast<void*>(out);
    a.out_stride = out_stride;
    a.weights = reinterpret_cast<const float*>(weights);
    a.weights_stride = weights_stride;
    a.expert_y = reinterpret_cast<const void*>(y);
    a.y_stride = y_stride;
    a.accumulate = accumulate;
    live().combine(a, do_send, do_recv, reinterpret_cast<void*>(stream));
  }

  void check() const {
    if (Status s = live().status(); !s.is_ok()) throw Error(s);
  }

  std::tuple<std::vector<uint64_t>, std::vector<uint64_t>> proxy_latency() const {
    auto l = live().proxy_latency();
    return {l.signal_to_first_post_ns, l.routes_to_second_post_ns};
  }

  nb::dict sizes() const { return sizes_dict(live().sizes()); }

  void destroy() {
    nb::gil_scoped_release nogil;
    if (a2a_) a2a_->destroy();
    a2a_.reset();
    if (engine_) engine_->stop();
    engine_.reset();
  }

  static nb::dict sizes_dict(const moe::BufferSizes& s) {
    nb::dict d;
    d["out_rows"] = s.out_rows;
    d["dispatch_stride"] = s.dispatch_stride;
    d["combine_stride"] = s.combine_stride;
    d["recv_rows"] = s.recv_rows;
    d["bytes"] = s.bytes;
    d["max_private_tokens"] = s.max_private_tokens;
    return d;
  }

 private:
  moe::AllToAll& live() const {
    if (!a2a_) throw Error(Code::kFailedPrecondition, "moe: AllToAll destroyed");
    return *a2a_;
  }
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<moe::AllToAll> a2a_;
};

}  // namespace

void register_moe(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("_moe", "MoE dispatch/combine (use ferry.moe).");
  m.def("config", &config_of, "max_num_tokens"_a, "num_experts"_a, "experts_per_token"_a,
        "hidden"_a, "hidden_scale"_a, "in_dtype"_a, "out_dtype"_a, "expert_padding"_a,
        "max_private_tokens"_a, "rank"_a, "world_size"_a, "node_size"_a, "instance"_a, "device"_a,
        "host_buffers"_a, "deadline"_a);
  nb::class_<AllToAllConfig>(m, "Config");
  m.def("buffer_size_hint",
        [](const AllToAllConfig& c) { return PyAllToAll::sizes_dict(moe::buffer_size_hint(c)); });
  nb::class_<PyAllToAll>(m, "AllToAll")
      .def(nb::init<const std::string&, std::vector<std::string>, AllToAllConfig>(), "provider"_a,
           "nics"_a, "config"_a)
      .def("local_info", &PyAllToAll::local_info)
      .def("connect", &PyAllToAll::connect)
      .def("dispatch", &PyAllToAll::dispatch)
      .def("combine", &PyAllToAll::combine)
      .def("check", &PyAllToAll::check)
      .def("proxy_latency", &PyAllToAll::proxy_latency)
      .def("sizes", &PyAllToAll::sizes)
      .def("destroy", &PyAllToAll::destroy);
}

}  // namespace ferry::py

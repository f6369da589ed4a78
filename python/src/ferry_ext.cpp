// ferry._ferry: the nanobind layer of the Python package. It converts types and
// bridges threads (the GIL and the engine's callback thread); transfer logic
// stays in the C++ library, Python conveniences live in python/ferry/*.py.
// The module is declared here; what it binds lives in
//  * py_runtime.h: the GIL, the callback thread and errors (with the threading
//    rules every binding keeps);
//  * py_args.h: arguments converted from Python objects, with errors that name them;
//  * py_types.h: the wrapped values (regions, prepared transfers, counters);
//  * engine_ext.h: the engine;
//  * stats_ext.h, kv_ext.h, moe_ext.cpp, map_ext.cpp: the other parts of the library.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine_ext.h"
#include "ferry/ferry.h"
#include "kv_ext.h"
#include "py_args.h"
#include "py_runtime.h"
#include "py_types.h"
#include "stats_ext.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::py {
namespace {

template <typename T>
nb::bytes to_pybytes(const T& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

std::string write_route_repr(const WriteRoute& r) {
  switch (r.kind) {
    case WriteRoute::Kind::kSplit:
      return "WriteRoute.split(max_shards=" + std::to_string(r.max_shards) +
             ", min_piece=" + std::to_string(r.min_piece) + ")";
    case WriteRoute::Kind::kPinned:
      return "WriteRoute.pinned(" + std::to_string(r.nic) + ")";
    case WriteRoute::Kind::kRoundRobin:
      return "WriteRoute.round_robin()";
  }
  return "WriteRoute(?)";
}

std::string group_route_repr(const GroupRoute& r) {
  switch (r.kind) {
    case GroupRoute::Kind::kShardPeers:
      return "GroupRoute.shard_peers()";
    case GroupRoute::Kind::kShardBytes:
      return "GroupRoute.shard_bytes()";
    case GroupRoute::Kind::kPinned:
      return "GroupRoute.pinned(" + std::to_string(r.nic) + ")";
  }
  return "GroupRoute(?)";
}

uint8_t nic_index(nb::handle nic, const char* name) {
  return uint8_t(int_arg(nic, name, 0, 255, "[0, 255]"));
}

PreparedTransfer prepared_of(nb::handle p) {  // for kv_ext.cpp
  return obj_arg<PyPreparedTransfer>(p, "prepared", kPreparedType).h->p;
}

}  // namespace
void register_moe(nb::module_& m);  // moe_ext.cpp

}  // namespace ferry::py

using namespace ferry;
using namespace ferry::py;

NB_MODULE(_ferry, m) {
  m.doc() = "Low-level bindings of the ferry transfer engine (use the `ferry` package).";
  m.attr("__version__") = kVersion;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object exc = make_error(e.status());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const ArgTypeError& e) {
      PyObject* cls = g_type_error_class ? g_type_error_class : PyExc_TypeError;
      nb::object exc = nb::handle(cls)(nb::str(e.what()));
      if (g_type_error_class) exc.attr("code") = nb::str("INVALID_ARGUMENT");
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  exit_gate().main_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));

  // Drop the Python objects held in C++ globals before the interpreter tears
  // modules down (registered first: runs after ferry's own atexit handlers,
  // which call _begin_exit themselves; calling it again does nothing).
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    begin_exit();
    Py_CLEAR(g_error_hook);
    Py_CLEAR(g_error_classes);
    Py_CLEAR(g_type_error_class);
  }));

  m.def(
      "_set_error_classes",
      [](nb::dict classes) {
        Py_XDECREF(g_error_classes);
        g_error_classes = classes.inc_ref().ptr();
      },
      "classes"_a, "Installs the exception class of every status code name (ferry/_errors.py).");
  m.def(
      "_set_type_error_class",
      [](nb::handle cls) {
        Py_XDECREF(g_type_error_class);
        g_type_error_class = cls.inc_ref().ptr();
      },
      "cls"_a, "Installs the exception class of wrongly typed arguments (InvalidArgumentType).");
  m.def("_begin_exit", &begin_exit,
        "Called at interpreter exit (atexit): from now on threads coming back from a ferry call "
        "that released the GIL park instead of re-taking it.");
  m.def(
      "_blocked_waits", [] { return g_blocked_waits.load(); },
      "Threads inside ImmCounter.wait or TransferCounter.wait (for tests).");
  m.def(
      "_set_callback_error_hook",
      [](nb::callable hook) {
        Py_XDECREF(g_error_hook);
        g_error_hook = hook.inc_ref().ptr();
      },
      "hook"_a,
      "hook(where, exc) is called (GIL held) for every exception a user callback raises.");
  m.def(
      "make_error",
      [](const std::string& code, const std::string& message) {
        for (int c = 0; c <= int(Code::kAborted); ++c)
          if (code_name(Code(c)) == code) return make_error(Status(Code(c), message));
        invalid("unknown status code '" + code + "'");
      },
      "code"_a, "message"_a, "The ferry exception for a status code name such as 'NOT_FOUND'.");
  m.def(
      "in_callback", [] { return t_callback_depth > 0; },
      "True while running inside a ferry callback (on the engine's callback thread).");
  m.def("describe_buffer", &describe_buffer, "obj"_a,
        "(ptr, nbytes, device, readonly, c_contiguous) of an object exposing DLPack or the buffer "
        "protocol.");
  m.def("probe_provider", &probe_provider, "provider"_a,
        "What the engine would open for one provider (ferry/info.h): (note or '', [(domain, "
        "fabric, provider, hmem)]).");
  m.def("build_info", &build_info, "Version and build options of this extension.");
  m.def(
      "_thread_states",
      [] {
        size_t n = 0;
        for (PyThreadState* t = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
             t != nullptr; t = PyThreadState_Next(t))
          ++n;
        return n;
      },
      "Python thread states of this interpreter (tests: engines leave none behind).");

  // ---- addresses and descriptors
  nb::class_<NetAddr>(m, "NetAddr",
                      "The address of one NIC endpoint of one engine incarnation (opaque bytes).")
      .def(
          "__init__",
          [](NetAddr* self, nb::handle b) {
            new (self) NetAddr(NetAddr::from_bytes(ByteView(b, "NetAddr").span()));
          },
          "data"_a, "Same as NetAddr.from_bytes(data).")
      .def_static(
          "from_bytes",
          [](nb::handle b) {
            return NetAddr::from_bytes(ByteView(b, "NetAddr.from_bytes").span());
          },
          "data"_a, "Decodes bytes produced by bytes(); raises InvalidArgument when malformed.")
      .def_static(
          "from_hex", [](nb::handle t) { return NetAddr::from_hex(str_arg(t, "text")); },
          "text"_a.none(), nb::sig("def from_hex(text: str) -> NetAddr"), "Decodes hex() output.")
      .def(
          "bytes", [](const NetAddr& a) { return to_pybytes(a.bytes()); }, "The wire form.")
      .def("hex", &NetAddr::to_hex, "The wire form as lowercase hex.")
      .def_prop_ro(
          "transport",
          [](const NetAddr& a) {
            switch (a.transport()) {
              case Transport::kFabric:
                return "fabric";
              case Transport::kVerbs:
                return "verbs";
              case Transport::kNvlink:
                return "nvlink";
              case Transport::kFake:
                return "fake";
            }
            return "?";
          },
          "Transport family: 'fabric', 'verbs' or 'nvlink'.")
      .def_prop_ro("incarnation", &NetAddr::incarnation, "Random id of the owning engine's run.")
      .def_prop_ro(
          "raw", [](const NetAddr& a) { return to_pybytes(a.raw()); },
          "The provider's raw endpoint name.")
      .def(
          "__eq__", [](const NetAddr& a, const NetAddr& b) { return a == b; }, nb::is_operator())
      .def(
          "__ne__", [](const NetAddr& a, const NetAddr& b) { return !(a == b); }, nb::is_operator())
      .def("__hash__", [](const NetAddr& a) { return a.hash(); })
      .def("__repr__", [](const NetAddr& a) { return "NetAddr(" + a.brief() + ")"; })
      .def("__reduce__", [](nb::handle self) {
        const NetAddr& a = nb::cast<const NetAddr&>(self);
        return nb::make_tuple(self.type(), nb::make_tuple(to_pybytes(a.bytes())));
      });

  nb::class_<MrDesc>(m, "MrDesc",
                     "Serialisable descriptor of a registered region: what a peer needs to write "
                     "into it. Send it to peers with bytes()/hex() or pickle.")
      .def(
          "__init__",
          [](MrDesc* self, nb::handle b) {
            new (self) MrDesc(MrDesc::from_bytes(ByteView(b, "MrDesc").span()));
          },
          "data"_a, "Same as MrDesc.from_bytes(data).")
      .def_static(
          "from_bytes",
          [](nb::handle b) { return MrDesc::from_bytes(ByteView(b, "MrDesc.from_bytes").span()); },
          "data"_a, "Decodes bytes produced by bytes(); raises InvalidArgument when malformed.")
      .def_static(
          "from_hex", [](nb::handle t) { return MrDesc::from_hex(str_arg(t, "text")); },
          "text"_a.none(), nb::sig("def from_hex(text: str) -> MrDesc"), "Decodes hex() output.")
      .def(
          "bytes", [](const MrDesc& d) { return to_pybytes(d.to_bytes()); }, "The wire form.")
      .def("hex", &MrDesc::to_hex, "The wire form as lowercase hex.")
      .def_ro("ptr", &MrDesc::ptr, "The owner's virtual base address (informational).")
      .def_ro("length", &MrDesc::len, "Size of the region in bytes.")
      .def_prop_ro(
          "device", [](const MrDesc& d) { return device_str(d.device); }, "'cpu' or 'cuda:N'.")
      .def_ro("writable", &MrDesc::writable,
              "False for a region registered read-only: peers may not write into it (a write "
              "is refused on the sender with FailedPrecondition).")
      .def_prop_ro(
          "addresses",
          [](const MrDesc& d) {
            std::vector<NetAddr> v;
            for (const auto& n : d.nics) v.push_back(n.addr);
            return v;
          },
          "The owner's NIC addresses, in NIC order.")
      .def_prop_ro(
          "nics",
          [](const MrDesc& d) {
            std::vector<std::tuple<NetAddr, uint64_t, uint64_t>> v;
            for (const auto& n : d.nics) v.emplace_back(n.addr, n.rkey, n.base);
            return v;
          },
          "[(address, rkey, base)] per NIC of the owner's group.")
      .def(
          "__eq__", [](const MrDesc& a, const MrDesc& b) { return a == b; }, nb::is_operator())
      .def(
          "__ne__", [](const MrDesc& a, const MrDesc& b) { return !(a == b); }, nb::is_operator())
      .def("__hash__",
           [](const MrDesc& d) {
             auto b = d.to_bytes();
             return std::hash<std::string_view>{}(
                 std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
           })
      .def("__repr__",
           [](const MrDesc& d) {
             return "MrDesc(" + std::to_string(d.len) + " bytes on " + device_str(d.device) + ", " +
                    std::to_string(d.nics.size()) + " NIC(s), owner " +
                    (d.nics.empty() ? std::string("?") : d.nics[0].addr.brief()) + ")";
           })
      .def("__reduce__", [](nb::handle self) {
        const MrDesc& d = nb::cast<const MrDesc&>(self);
        return nb::make_tuple(self.type(), nb::make_tuple(to_pybytes(d.to_bytes())));
      });

  nb::class_<PyMrHandle>(m, "MrHandle",
                         "Local handle of a registered region. Holds a reference to the registered "
                         "object; pass it to unregister() when done.")
      .def_prop_ro(
          "ptr", [](const PyMrHandle& h) { return uint64_t(uintptr_t(h.h.ptr)); },
          "Base address of the region.")
      .def_prop_ro(
          "id", [](const PyMrHandle& h) { return h.h.id; }, "Registration id.")
      .def_ro("length", &PyMrHandle::len, "Size of the region in bytes.")
      .def_prop_ro(
          "device", [](const PyMrHandle& h) { return device_str(h.device); }, "'cpu' or 'cuda:N'.")
      .def_ro("writable", &PyMrHandle::writable,
              "False when registered with writable=False (a read-only source).")
      .def_ro("registered", &PyMrHandle::registered, "False after unregister().")
      .def_ro("obj", &PyMrHandle::owner, "The registered Python object (None for register_memory).")
      .def_ro("desc", &PyMrHandle::desc, "The region's descriptor (also returned by register).")
      .def("__repr__", [](const PyMrHandle& h) {
        return "MrHandle(id=" + std::to_string(h.h.id) + ", " + std::to_string(h.len) +
               " bytes on " + device_str(h.device) + (h.registered ? "" : ", unregistered") + ")";
      });

  // ---- routes
  nb::class_<WriteRoute>(m, "WriteRoute", "How a single write is placed on the group's NICs.")
      .def_static(
          "split",
          [](nb::handle max_shards, nb::handle min_piece) {
            return WriteRoute::split(nic_index(max_shards, "max_shards"),
                                     count_arg(min_piece, "min_piece"));
          },
          "max_shards"_a.none() = 0, "min_piece"_a.none() = 256 << 10,
          nb::sig("def split(max_shards: int = 0, min_piece: int = 262144) -> WriteRoute"),
          "Cut into up to max_shards pieces (0 = all NICs) of at least min_piece bytes.")
      .def_static(
          "pinned", [](nb::handle nic) { return WriteRoute::pinned(nic_index(nic, "nic")); },
          "nic"_a.none(), nb::sig("def pinned(nic: int) -> WriteRoute"),
          "The whole write on NIC `nic`.")
      .def_static("round_robin", &WriteRoute::round_robin,
                  "The whole write on the next NIC of a per-group rotation.")
      .def_prop_ro("kind",
                   [](const WriteRoute& r) {
                     return r.kind == WriteRoute::Kind::kSplit    ? "split"
                            : r.kind == WriteRoute::Kind::kPinned ? "pinned"
                                                                  : "round_robin";
                   })
      .def_ro("nic", &WriteRoute::nic)
      .def_ro("max_shards", &WriteRoute::max_shards)
      .def_ro("min_piece", &WriteRoute::min_piece)
      .def(
          "__eq__",
          [](const WriteRoute& a, const WriteRoute& b) {
            return a.kind == b.kind && a.nic == b.nic && a.max_shards == b.max_shards &&
                   a.min_piece == b.min_piece;
          },
          nb::is_operator())
      .def("__repr__", &write_route_repr);

  nb::class_<GroupRoute>(m, "GroupRoute", "How scatter and barrier spread targets over NICs.")
      .def_static("shard_peers", &GroupRoute::shard_peers,
                  "Targets divided into contiguous runs, one run per NIC.")
      .def_static("shard_bytes", &GroupRoute::shard_bytes,
                  "Every target's bytes divided over all NICs.")
      .def_static(
          "pinned", [](nb::handle nic) { return GroupRoute::pinned(nic_index(nic, "nic")); },
          "nic"_a.none(), nb::sig("def pinned(nic: int) -> GroupRoute"), "Everything on NIC `nic`.")
      .def_prop_ro("kind",
                   [](const GroupRoute& r) {
                     return r.kind == GroupRoute::Kind::kShardPeers   ? "shard_peers"
                            : r.kind == GroupRoute::Kind::kShardBytes ? "shard_bytes"
                                                                      : "pinned";
                   })
      .def_ro("nic", &GroupRoute::nic)
      .def(
          "__eq__",
          [](const GroupRoute& a, const GroupRoute& b) {
            return a.kind == b.kind && a.nic == b.nic;
          },
          nb::is_operator())
      .def("__repr__", &group_route_repr);

  nb::class_<ScatterDst>(m, "ScatterDst", "One target of submit_scatter.")
      .def(
          "__init__",
          [](ScatterDst* self, nb::handle length, nb::handle src_offset, nb::handle dst,
             nb::handle dst_offset) {
            const uint64_t l = byte_arg(length, "length"), so = byte_arg(src_offset, "src_offset");
            const MrDesc& d = obj_arg<MrDesc>(dst, "dst", kDescType);
            new (self) ScatterDst{l, so, d, byte_arg(dst_offset, "dst_offset")};
          },
          "length"_a.none(), "src_offset"_a.none(), "dst"_a.none(), "dst_offset"_a.none() = 0,
          nb::sig("def __init__(self, length: int, src_offset: int, dst: MrDesc, "
                  "dst_offset: int = 0) -> None"))
      .def_ro("length", &ScatterDst::len)
      .def_ro("src_offset", &ScatterDst::src_offset)
      .def_ro("dst", &ScatterDst::dst)
      .def_ro("dst_offset", &ScatterDst::dst_offset)
      .def("__repr__", [](const ScatterDst& s) {
        return "ScatterDst(length=" + std::to_string(s.len) +
               ", src_offset=" + std::to_string(s.src_offset) +
               ", dst_offset=" + std::to_string(s.dst_offset) + ")";
      });

  // ---- immediate plans
  nb::class_<ImmPlan>(
      m, "ImmPlan", "Number of immediates the receiver gets for a request, for both sides to use.")
      .def_static(
          "single_write",
          [](nb::handle len, nb::handle route, nb::handle nics) {
            return ImmPlan::single_write(byte_arg(len, "length"),
                                         obj_arg<WriteRoute>(route, "route", "a ferry.WriteRoute"),
                                         count_arg(nics, "nics"));
          },
          "length"_a.none(), "route"_a.none(), "nics"_a.none(),
          nb::sig("def single_write(length: int, route: WriteRoute, nics: int) -> int"),
          "Immediates for one submit_write of `length` bytes.")
      .def_static(
          "paged_writes", [](nb::handle pages) { return count_arg(pages, "pages"); },
          "pages"_a.none(), nb::sig("def paged_writes(pages: int) -> int"),
          "One immediate per page.")
      .def_static(
          "scatter_target",
          [](nb::handle len, nb::handle route, nb::handle nics) {
            return ImmPlan::scatter_target(
                byte_arg(len, "length"), obj_arg<GroupRoute>(route, "route", "a ferry.GroupRoute"),
                count_arg(nics, "nics"));
          },
          "length"_a.none(), "route"_a.none(), "nics"_a.none(),
          nb::sig("def scatter_target(length: int, route: GroupRoute, nics: int) -> int"),
          "Immediates one scatter target receives.")
      .def_static("barrier_target", &ImmPlan::barrier_target, "One per barrier target.")
      .def_static("imm", &ImmPlan::imm, "One per submit_imm.");

  // ---- counters
  nb::class_<PyImmCounter>(m, "ImmCounter",
                           "Counts arrivals of one immediate value; wait(n) consumes n arrivals.")
      .def_prop_ro("value", &PyImmCounter::value, "Arrivals not yet consumed.")
      .def_prop_ro("imm", &PyImmCounter::imm, "The immediate value counted.")
      .def("try_consume", &PyImmCounter::try_consume, "n"_a.none() = 1,
           nb::sig("def try_consume(self, n: int = 1) -> bool"),
           "Consume n arrivals if they are there; never blocks. Returns whether it consumed.")
      .def("wait", &PyImmCounter::wait, "n"_a.none() = 1, "timeout"_a.none() = nb::none(),
           nb::kw_only(), "spin"_a = false,
           nb::sig("def wait(self, n: int = 1, timeout: float | None = None, *, "
                   "spin: bool = False) -> None"),
           "Wait (GIL released) until n arrivals can be consumed, then consume them. Raises "
           "ferry.Timeout (consuming nothing) after `timeout` seconds; None waits forever. "
           "Raises ferry.Cancelled when the engine stops first (or remove_imm_count removes the "
           "counter). spin: poll without ever sleeping (a core busy for the whole wait; no "
           "wake-up, which takes tens to hundreds of microseconds on an idle host).")
      .def("__repr__", [](const PyImmCounter& c) {
        return "ImmCounter(imm=" + std::to_string(c.imm()) +
               ", value=" + std::to_string(c.value()) + ")";
      });

  nb::class_<PyRecvQueue>(m, "RecvQueue",
                          "Messages taken by polling (TransferEngine.recv_queue): no callback.")
      .def("try_get", &PyRecvQueue::try_get, nb::sig("def try_get(self) -> bytes | None"),
           "The oldest message not yet taken (a copy; its buffer goes back to the NIC at "
           "once), or None; never blocks.")
      .def("get", &PyRecvQueue::get, "timeout"_a.none() = nb::none(), nb::kw_only(),
           "spin"_a = false,
           nb::sig("def get(self, timeout: float | None = None, *, spin: bool = False) -> bytes"),
           "Wait (GIL released) for the next message and return a copy of it. Raises "
           "ferry.Timeout after `timeout` seconds (None waits forever), ferry.Cancelled once "
           "the engine stopped and no message is left. spin: as ImmCounter.wait.")
      .def("__len__", &PyRecvQueue::size, "Messages waiting to be taken (approximate).")
      .def_prop_ro("buffer_len", &PyRecvQueue::buffer_len, "Bytes per receive buffer.")
      .def_prop_ro("buffer_count", &PyRecvQueue::buffer_count, "Receive buffers posted.")
      .def("__repr__", [](const PyRecvQueue& q) {
        return "RecvQueue(buffers=" + std::to_string(q.buffer_count()) + " x " +
               std::to_string(q.buffer_len()) + " B, waiting=" + std::to_string(q.size()) + ")";
      });

  nb::class_<PyTransferCounter>(m, "TransferCounter",
                                "Completion counter for bulk submits: pass counter= to a submit_* "
                                "call; completions are counted in C++ with no Python callback.")
      .def(nb::init<>())
      .def_prop_ro("done", &PyTransferCounter::done, "Transfers ended (success or failure).")
      .def_prop_ro("errors", &PyTransferCounter::errors, "Transfers that failed.")
      .def("wait", &PyTransferCounter::wait, "n"_a.none(), "timeout"_a.none() = nb::none(),
           nb::sig("def wait(self, n: int, timeout: float | None = None) -> None"),
           "Wait (GIL released) until `done` reaches n; raises ferry.Timeout after `timeout` s.")
      .def("__repr__", [](const PyTransferCounter& c) {
        return "TransferCounter(done=" + std::to_string(c.done()) +
               ", errors=" + std::to_string(c.errors()) + ")";
      });

  nb::class_<PyPreparedTransfer>(
      m, "PreparedTransfer",
      "A transfer shape validated once by a TransferEngine.prepare_* call; post it with "
      "TransferEngine.submit(prepared, imm) as many times as needed. Opaque.")
      .def_prop_ro(
          "kind", [](const PyPreparedTransfer& p) { return std::string(p.kind); },
          "'single_write', 'paged_writes' or 'scatter'.")
      .def("__repr__", [](const PyPreparedTransfer& p) {
        const std::string what = std::string(p.kind) == "single_write"   ? " bytes"
                                 : std::string(p.kind) == "paged_writes" ? " pages"
                                                                         : " targets";
        return "PreparedTransfer(" + std::string(p.kind) + ", " + std::to_string(p.count) + what +
               ", src=" + std::to_string(p.src_id) + ")";
      });

  // ---- engine
  nb::class_<GroupSpec>(m, "_GroupSpec")
      .def(nb::init<std::string, std::vector<std::string>, int>(), "device"_a, "nics"_a,
           "worker_cpu"_a);

  using E = PyEngine;
  const auto none = nb::none();
  nb::class_<E>(m, "Engine", "The C++ TransferEngine (use ferry.TransferEngine).")
      .def(nb::init<std::string, std::vector<GroupSpec>, size_t, bool, int, double, size_t, size_t,
                    int, size_t, std::string, std::string, std::string, uint32_t, bool,
                    std::string>(),
           "provider"_a, "groups"_a, "nics_per_group"_a, "busy"_a, "callback_cpu"_a,
           "default_timeout"_a, "send_buffer_size"_a, "send_buffer_count"_a,
           "verbs_gid_index"_a = -1, "max_requests_in_flight"_a = 65536, "queue_full"_a = "block",
           "metrics_address"_a = "", "trace_file"_a = "", "latency_sample_every"_a = 16,
           "busy_step_aside"_a = true, "spin_yield"_a = "auto")
      .def_prop_ro("main_address", &E::main_address)
      .def("addresses", &E::addresses, "group"_a.none() = 0)
      .def_prop_ro("num_groups", &E::num_groups)
      .def_prop_ro("nics_per_group", &E::nics_per_group)
      .def_prop_ro("provider", &E::provider)
      .def_prop_ro("incarnation", &E::incarnation)
      .def_prop_ro("callback_errors", &E::callback_errors)
      .def_prop_ro("stopped", &E::stopped)
      .def("register_memory", &E::register_memory, "ptr"_a.none(), "length"_a.none(),
           "device"_a.none(), "owner"_a.none(), "writable"_a)
      .def("unregister", &E::unregister, "handle"_a.none())
      .def("submit_send", &E::submit_send, "addr"_a.none(), "data"_a.none(), "future"_a.none(),
           "on_done"_a.none(), "counter"_a.none())
      .def("submit_recvs", &E::submit_recvs, "length"_a.none(), "count"_a.none(),
           "callback"_a.none())
      .def("submit_write", &E::submit_write, "src"_a.none(), "src_offset"_a.none(),
           "length"_a.none(), "dst"_a.none(), "dst_offset"_a.none(), "imm"_a.none(),
           "route"_a.none(), "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("submit_paged_writes", &E::submit_paged_writes, "page_len"_a.none(), "src"_a.none(),
           "src_pages"_a.none(), "src_stride"_a.none(), "src_offset"_a.none(), "dst"_a.none(),
           "dst_pages"_a.none(), "dst_stride"_a.none(), "dst_offset"_a.none(), "imm"_a.none(),
           "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("submit_imm", &E::submit_imm, "imm"_a.none(), "dst"_a.none(), "route"_a.none(),
           "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("add_peer_group", &E::add_peer_group, "peers"_a.none())
      .def("submit_scatter", &E::submit_scatter, "src"_a.none(), "dsts"_a.none(), "imm"_a.none(),
           "group"_a.none(), "route"_a.none(), "future"_a.none(), "on_done"_a.none(),
           "counter"_a.none())
      .def("submit_barrier", &E::submit_barrier, "imm"_a.none(), "dsts"_a.none(), "group"_a.none(),
           "route"_a.none(), "future"_a.none(), "on_done"_a.none(), "counter"_a.none())
      .def("prepare_single_write", &E::prepare_single_write, "src"_a.none(), "src_offset"_a.none(),
           "length"_a.none(), "dst"_a.none(), "dst_offset"_a.none(), "route"_a.none())
      .def("prepare_paged_writes", &E::prepare_paged_writes, "page_len"_a.none(), "src"_a.none(),
           "src_pages"_a.none(), "src_stride"_a.none(), "src_offset"_a.none(), "dst"_a.none(),
           "dst_pages"_a.none(), "dst_stride"_a.none(), "dst_offset"_a.none())
      .def("prepare_scatter", &E::prepare_scatter, "src"_a.none(), "dsts"_a.none(),
           "group"_a.none(), "route"_a.none())
      .def("submit", &E::submit, "prepared"_a.none(), "imm"_a.none(), "future"_a.none(),
           "on_done"_a.none(), "counter"_a.none())
      .def("expect_imm_count", &E::expect_imm_count, "imm"_a.none(), "count"_a.none(),
           "callback"_a.none())
      .def("remove_imm_count", &E::remove_imm_count, "imm"_a.none())
      .def("recv_queue", &E::recv_queue, "length"_a.none(), "count"_a.none())
      .def("imm_counter", &E::imm_counter, "imm"_a.none())
      .def("on_imm", &E::on_imm, "callback"_a.none())
      .def("alloc_uvm_watcher", &E::alloc_uvm_watcher, "callback"_a.none())
      .def("imm_counter_gpu", &E::imm_counter_gpu, "imm"_a.none(), "count"_a.none())
      .def("stop", &E::stop);
  (void)none;
  register_stats(m, [](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).observed(); });
  register_moe(m);  // ferry._ferry._moe (moe_ext.cpp)
  bind_kv(m, EngineAccess{[](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).native(); },
                          &prepared_of, &retake_gil});  // ferry.kv (kv_ext.cpp)
  bind_map_remote(
      m, EngineAccess{[](nb::handle e) -> TransferEngine& { return nb::cast<E&>(e).native(); },
                      &prepared_of, &retake_gil});  // map_ext.cpp
}

// ferry._ferry.Engine's calls (engine_ext.h): each converts its arguments, then
// calls the C++ engine with the GIL released; user callbacks are wrapped to run
// on the callback thread through run_py.
#include "engine_ext.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <rdma/fabric.h>

#include <span>
#include <thread>
#include <tuple>
#include <utility>

namespace ferry::py {

// ------------------------------------------------------------------ engine

PyEngine::PyEngine(std::string provider, std::vector<GroupSpec> groups, size_t nics_per_group,
                   bool busy, int callback_cpu, double default_timeout, size_t send_buffer_size,
                   size_t send_buffer_count, int verbs_gid_index, size_t max_requests_in_flight,
                   std::string queue_full, std::string metrics_address, std::string trace_file,
                   uint32_t latency_sample_every, bool busy_step_aside, std::string spin_yield)
    : shared_(std::make_shared<Shared>()) {
  EngineConfig c;
  c.metrics_address = std::move(metrics_address);  // observability: stats_ext.cpp
  c.trace_file = std::move(trace_file);
  c.latency_sample_every = latency_sample_every;
  if (max_requests_in_flight == 0) invalid("max_requests_in_flight must be positive");
  c.max_requests_in_flight = max_requests_in_flight;
  if (queue_full == "block")
    c.queue_full = QueueFull::kBlock;
  else if (queue_full == "refuse")
    c.queue_full = QueueFull::kRefuse;
  else
    invalid("queue_full must be 'block' or 'refuse'");
  c.provider = std::move(provider);
  c.verbs_gid_index = verbs_gid_index;  // checked by the engine, as from C++
  c.groups.clear();
  for (auto& g : groups) {
    GroupConfig gc;
    gc.device = parse_device(g.device);
    gc.nic_names = std::move(g.nics);
    gc.worker_cpu = g.worker_cpu;
    c.groups.push_back(std::move(gc));
  }
  if (c.groups.empty()) c.groups.push_back(GroupConfig{});
  if (nics_per_group == 0) invalid("nics_per_group must be positive");
  c.nics_per_group = nics_per_group;
  c.poll_mode = busy ? PollMode::kBusy : PollMode::kAdaptive;
  c.busy_step_aside = busy_step_aside;
  if (spin_yield == "auto")
    c.spin_yield = SpinYield::kAuto;
  else if (spin_yield == "yield")
    c.spin_yield = SpinYield::kYield;
  else if (spin_yield == "no_yield")
    c.spin_yield = SpinYield::kNoYield;
  else
    invalid("spin_yield must be 'auto', 'yield' or 'no_yield'");
  c.callback_cpu = callback_cpu;
  if (!(default_timeout >= 0)) invalid("default_timeout must be a non-negative number of seconds");
  c.default_deadline = std::chrono::milliseconds(int64_t(default_timeout * 1000.0 + 0.5));
  if (default_timeout > 0 && c.default_deadline.count() == 0)
    c.default_deadline = std::chrono::milliseconds(1);
  c.send_buffer_size = send_buffer_size;
  c.send_buffer_count = send_buffer_count;
  engine_ = without_gil([&] { return std::make_unique<TransferEngine>(std::move(c)); });
  for (size_t g = 0; g < engine_->num_groups(); ++g) addresses_.push_back(engine_->addresses(g));
  provider_ = engine_->provider();
  nics_ = engine_->nics_per_group();
  incarnation_ = engine_->incarnation();
}

std::vector<NetAddr> PyEngine::addresses(nb::handle group_arg) const {
  const auto group = size_t(count_arg(group_arg, "group"));
  if (group >= addresses_.size())
    throw Error(Code::kOutOfRange,
                "group " + std::to_string(group) + " of " + std::to_string(addresses_.size()));
  return addresses_[group];
}

nb::tuple PyEngine::register_memory(nb::handle ptr_arg, nb::handle len_arg, nb::handle device_arg,
                                    nb::object owner, bool writable) {
  const uint64_t ptr = addr_arg(ptr_arg, "ptr");
  const uint64_t len = byte_arg(len_arg, "length");
  const Device d =
      parse_device(str_arg(device_arg, "device", "a device name (\"cpu\" or \"cuda:N\")"));
  check_running();
  auto r = without_gil([&] { return engine_->reg_mr(reinterpret_cast<void*>(ptr), len, d); });
  auto h = std::make_unique<PyMrHandle>();
  h->h = r.first;
  h->len = len;
  h->device = d;
  h->writable = writable;
  h->owner = owner;
  h->desc = r.second;
  owners_[r.first.id] = std::move(owner);  // alive until unregister or stop
  nb::object desc = nb::cast(std::move(r.second));
  return nb::make_tuple(nb::cast(h.release(), nb::rv_policy::take_ownership), desc);
}

void PyEngine::unregister(nb::handle handle) {
  PyMrHandle& h = obj_arg<PyMrHandle>(handle, "handle", kHandleType);
  check_running();
  without_gil([&] { engine_->unreg_mr(h.h); });
  h.registered = false;
  owners_.erase(h.h.id);
}

uint64_t PyEngine::submit_send(nb::handle addr_obj, nb::handle data, nb::handle future,
                               nb::handle on_done, nb::handle counter) {
  const NetAddr& addr =
      obj_arg<NetAddr>(addr_obj, "addr", "a ferry.NetAddr (the peer's main_address)");
  check_running();
  ByteView bytes(data, "submit_send");
  OnDone done = completion(future, on_done, counter);
  return without_gil([&] { return engine_->submit_send(addr, bytes.span(), std::move(done)); });
}

void PyEngine::submit_recvs(nb::handle len_arg, nb::handle count_arg_, nb::handle cb_arg) {
  const uint64_t l = byte_arg(len_arg, "length"), n = count_arg(count_arg_, "count");
  nb::handle cb = callable_arg(cb_arg, "callback");
  check_running();
  auto slot = add_slot(cb);
  auto sh = shared_;
  RecvCallback f = [slot, sh](std::span<const uint8_t> msg) {
    run_py(*sh, "receive callback", [&] {
      if (!slot->fn) return;
      nb::object mv = nb::steal(
          PyMemoryView_FromMemory(reinterpret_cast<char*>(const_cast<uint8_t*>(msg.data())),
                                  Py_ssize_t(msg.size()), PyBUF_READ));
      if (!mv.is_valid()) throw nb::python_error();
      bool ok = true;
      try {
        slot->fn.get()(mv);
      } catch (nb::python_error&) {
        ok = false;
        release_view(mv, false);
        throw;
      }
      if (ok) release_view(mv, true);
    });
  };
  without_gil([&] { engine_->submit_recvs(l, n, std::move(f)); });
}

uint64_t PyEngine::submit_write(nb::handle src_arg, nb::handle src_offset, nb::handle len,
                                nb::handle dst_arg, nb::handle dst_offset, nb::handle imm,
                                nb::handle route_arg, nb::handle future, nb::handle on_done,
                                nb::handle counter) {
  const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
  const auto so = byte_arg(src_offset, "src_offset");
  const auto l = byte_arg(len, "length");
  const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
  const auto doff = byte_arg(dst_offset, "dst_offset");
  const auto i = opt_u32_arg(imm, "imm");
  const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
  check_running();
  check_handle(src);
  OnDone done = completion(future, on_done, counter);
  return without_gil([&] {
    return engine_->submit_single_write(l, i, src.h, so, dst, doff, std::move(done), route);
  });
}

namespace {

// The arguments submit_paged_writes and prepare_paged_writes share, converted
// in the order both check them; the page lists come after the engine's running
// check (and the submit's immediate), so they are converted by pages().
struct PagedArgs {
  uint64_t page_len, src_stride, src_offset, dst_stride, dst_offset;
  const PyMrHandle* src;
  const MrDesc* dst;
  std::pair<Pages, Pages> pages(nb::handle src_pages, nb::handle dst_pages) const {
    return {Pages{page_indices(src_pages, "source"), src_stride, src_offset},
            Pages{page_indices(dst_pages, "destination"), dst_stride, dst_offset}};
  }
};

PagedArgs paged_args(nb::handle page_len, nb::handle src_arg, nb::handle src_stride,
                     nb::handle src_offset, nb::handle dst_arg, nb::handle dst_stride,
                     nb::handle dst_offset) {
  PagedArgs a{};
  a.page_len = byte_arg(page_len, "page_len");
  a.src = &obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
  a.src_stride = byte_arg(src_stride, "src_stride");
  a.src_offset = byte_arg(src_offset, "src_offset");
  a.dst = &obj_arg<MrDesc>(dst_arg, "dst", kDescType);
  a.dst_stride = byte_arg(dst_stride, "dst_stride");
  a.dst_offset = byte_arg(dst_offset, "dst_offset");
  return a;
}

}  // namespace

uint64_t PyEngine::submit_paged_writes(nb::handle page_len, nb::handle src_arg,
                                       nb::handle src_pages, nb::handle src_stride,
                                       nb::handle src_offset, nb::handle dst_arg,
                                       nb::handle dst_pages, nb::handle dst_stride,
                                       nb::handle dst_offset, nb::handle imm, nb::handle future,
                                       nb::handle on_done, nb::handle counter) {
  const PagedArgs a =
      paged_args(page_len, src_arg, src_stride, src_offset, dst_arg, dst_stride, dst_offset);
  const auto i = opt_u32_arg(imm, "imm");
  check_running();
  check_handle(*a.src);
  auto [sp, dp] = a.pages(src_pages, dst_pages);
  OnDone done = completion(future, on_done, counter);
  return without_gil([&] {
    return engine_->submit_paged_writes(a.page_len, i, a.src->h, std::move(sp), *a.dst,
                                        std::move(dp), std::move(done));
  });
}

uint64_t PyEngine::submit_imm(nb::handle imm, nb::handle dst_arg, nb::handle route_arg,
                              nb::handle future, nb::handle on_done, nb::handle counter) {
  const auto i = u32_arg(imm, "imm");
  const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
  const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
  check_running();
  OnDone done = completion(future, on_done, counter);
  return without_gil([&] { return engine_->submit_imm(i, dst, std::move(done), route); });
}

uint32_t PyEngine::add_peer_group(nb::handle peers_arg) {
  if (!PyList_Check(peers_arg.ptr())) wrong_type("peers", "a list", peers_arg);
  nb::list peers = nb::borrow<nb::list>(peers_arg);
  const size_t n = nb::len(peers);
  if (n > 0 && nb::isinstance<MrDesc>(list_item(peers, 0))) {
    std::vector<MrDesc> descs;
    descs.reserve(n);
    for (size_t k = 0; k < n; ++k)
      descs.push_back(obj_arg<MrDesc>(list_item(peers, k), "peers[" + std::to_string(k) + "]",
                                      "a ferry.MrDesc like peers[0]"));
    check_running();
    return without_gil([&] { return engine_->add_peer_group(descs); });
  }
  std::vector<std::vector<NetAddr>> addrs(n);
  for (size_t k = 0; k < n; ++k) {
    nb::handle p = list_item(peers, k);
    const std::string name = "peers[" + std::to_string(k) + "]";
    if (!PyList_Check(p.ptr()) && !PyTuple_Check(p.ptr()))
      wrong_type(name, "a ferry.MrDesc or a list of the peer's ferry.NetAddr", p);
    nb::sequence seq = nb::borrow<nb::sequence>(p);
    size_t j = 0;
    for (nb::handle a : seq)
      addrs[k].push_back(
          obj_arg<NetAddr>(a, name + "[" + std::to_string(j++) + "]", "a ferry.NetAddr"));
  }
  check_running();
  return without_gil([&] { return engine_->add_peer_group(addrs); });
}

uint64_t PyEngine::submit_scatter(nb::handle src_arg, nb::handle dsts_arg, nb::handle imm,
                                  nb::handle group, nb::handle route_arg, nb::handle future,
                                  nb::handle on_done, nb::handle counter) {
  const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
  std::vector<ScatterDst> dsts = scatter_dsts(dsts_arg);
  const auto i = opt_u32_arg(imm, "imm");
  const auto g = opt_u32_arg(group, "group");
  const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
  check_running();
  check_handle(src);
  OnDone done = completion(future, on_done, counter);
  return without_gil([&] {
    return engine_->submit_scatter(g, std::move(done), i, src.h, std::move(dsts), route);
  });
}

uint64_t PyEngine::submit_barrier(nb::handle imm, nb::handle dsts_arg, nb::handle group,
                                  nb::handle route_arg, nb::handle future, nb::handle on_done,
                                  nb::handle counter) {
  const auto i = u32_arg(imm, "imm");
  if (!PyList_Check(dsts_arg.ptr())) wrong_type("dsts", "a list of ferry.MrDesc", dsts_arg);
  nb::list dl = nb::borrow<nb::list>(dsts_arg);
  std::vector<MrDesc> dsts;
  dsts.reserve(nb::len(dl));
  for (size_t k = 0, n = nb::len(dl); k < n; ++k)
    dsts.push_back(obj_arg<MrDesc>(list_item(dl, k), "dsts[" + std::to_string(k) + "]", kDescType));
  const auto g = opt_u32_arg(group, "group");
  const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
  check_running();
  OnDone done = completion(future, on_done, counter);
  return without_gil(
      [&] { return engine_->submit_barrier(g, std::move(done), i, std::move(dsts), route); });
}

PyPreparedTransfer PyEngine::prepare_single_write(nb::handle src_arg, nb::handle src_offset,
                                                  nb::handle len, nb::handle dst_arg,
                                                  nb::handle dst_offset, nb::handle route_arg) {
  const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
  const auto so = byte_arg(src_offset, "src_offset");
  const auto l = byte_arg(len, "length");
  const MrDesc& dst = obj_arg<MrDesc>(dst_arg, "dst", kDescType);
  const auto doff = byte_arg(dst_offset, "dst_offset");
  const WriteRoute& route = obj_arg<WriteRoute>(route_arg, "route", "a ferry.WriteRoute or None");
  check_running();
  check_handle(src);
  PreparedTransfer p =
      without_gil([&] { return engine_->prepare_single_write(l, src.h, so, dst, doff, route); });
  return keep_prepared(std::move(p), "single_write", l, src);
}

PyPreparedTransfer PyEngine::prepare_paged_writes(nb::handle page_len, nb::handle src_arg,
                                                  nb::handle src_pages, nb::handle src_stride,
                                                  nb::handle src_offset, nb::handle dst_arg,
                                                  nb::handle dst_pages, nb::handle dst_stride,
                                                  nb::handle dst_offset) {
  const PagedArgs a =
      paged_args(page_len, src_arg, src_stride, src_offset, dst_arg, dst_stride, dst_offset);
  check_running();
  check_handle(*a.src);
  auto [sp, dp] = a.pages(src_pages, dst_pages);
  const uint64_t pages = sp.indices.size();
  PreparedTransfer p = without_gil([&] {
    return engine_->prepare_paged_writes(a.page_len, a.src->h, std::move(sp), *a.dst,
                                         std::move(dp));
  });
  return keep_prepared(std::move(p), "paged_writes", pages, *a.src);
}

PyPreparedTransfer PyEngine::prepare_scatter(nb::handle src_arg, nb::handle dsts_arg,
                                             nb::handle group, nb::handle route_arg) {
  const PyMrHandle& src = obj_arg<PyMrHandle>(src_arg, "src", kHandleType);
  std::vector<ScatterDst> dsts = scatter_dsts(dsts_arg);
  const auto g = opt_u32_arg(group, "group");
  const GroupRoute& route = obj_arg<GroupRoute>(route_arg, "route", "a ferry.GroupRoute or None");
  check_running();
  check_handle(src);
  const uint64_t targets = dsts.size();
  PreparedTransfer p =
      without_gil([&] { return engine_->prepare_scatter(g, src.h, std::move(dsts), route); });
  return keep_prepared(std::move(p), "scatter", targets, src);
}

uint64_t PyEngine::submit(nb::handle prepared_arg, nb::handle imm, nb::handle future,
                          nb::handle on_done, nb::handle counter) {
  const PyPreparedTransfer& prepared =
      obj_arg<PyPreparedTransfer>(prepared_arg, "prepared", kPreparedType);
  const auto i = opt_u32_arg(imm, "imm");
  check_running();
  OnDone done = completion(future, on_done, counter);
  PreparedTransfer p = prepared.h->p;  // stop() may empty the holder meanwhile
  return without_gil([&] {
    auto dropped = std::move(p);  // released before the GIL is taken back
    return engine_->submit(dropped, i, std::move(done));
  });
}

void PyEngine::expect_imm_count(nb::handle imm, nb::handle count, nb::handle cb_arg) {
  const auto i = u32_arg(imm, "imm");
  const auto n = u32_arg(count, "count");
  nb::handle cb = callable_arg(cb_arg, "callback");
  check_running();
  auto slot = add_slot(cb);
  auto sh = shared_;
  without_gil([&] {
    engine_->expect_imm_count(i, n, [slot, sh] {
      run_py(*sh, "expect_imm_count callback", [&] {
        if (slot->fn) slot->fn.get()();
      });
    });
  });
}

void PyEngine::remove_imm_count(nb::handle imm) {
  const auto i = u32_arg(imm, "imm");
  check_running();
  engine_->remove_imm_count(i);
}

PyRecvQueue PyEngine::recv_queue(nb::handle len_arg, nb::handle count_arg_) {
  const uint64_t l = byte_arg(len_arg, "length"), n = count_arg(count_arg_, "count");
  check_running();
  return PyRecvQueue(without_gil([&] { return engine_->recv_queue(l, n); }), shared_);
}

PyImmCounter PyEngine::imm_counter(nb::handle imm) {
  const auto i = u32_arg(imm, "imm");
  check_running();
  return PyImmCounter(engine_->imm_counter(i), i, shared_);
}

void PyEngine::on_imm(nb::handle cb_arg) {
  nb::handle cb = callable_arg(cb_arg, "callback");
  check_running();
  auto slot = add_slot(cb);
  auto sh = shared_;
  without_gil([&] {
    engine_->on_imm([slot, sh](uint32_t imm) {
      run_py(*sh, "on_imm callback", [&] {
        if (slot->fn) slot->fn.get()(imm);
      });
    });
  });
}

uintptr_t PyEngine::alloc_uvm_watcher(nb::handle cb_arg) {
  nb::handle cb = callable_arg(cb_arg, "callback");
  check_running();
  auto slot = add_slot(cb);
  auto sh = shared_;
  uint64_t* word = without_gil([&] {
    return engine_->alloc_uvm_watcher([slot, sh](uint64_t old_v, uint64_t new_v) {
      bool keep = false;  // an exception releases the watcher
      run_py(*sh, "uvm watcher callback", [&] {
        if (slot->fn) keep = nb::cast<bool>(slot->fn.get()(old_v, new_v));
      });
      return keep;
    });
  });
  return reinterpret_cast<uintptr_t>(word);
}

uintptr_t PyEngine::imm_counter_gpu(nb::handle imm, nb::handle count) {
  const auto i = u32_arg(imm, "imm");
  const auto n = u32_arg(count, "count");
  check_running();
  return reinterpret_cast<uintptr_t>(without_gil([&] { return engine_->imm_counter_gpu(i, n); }));
}

void PyEngine::stop() {
  if (t_callback_depth > 0)
    throw Error(Code::kFailedPrecondition,
                "stop() cannot be called from a ferry callback: it waits for the callback "
                "thread to drain");
  shutdown();
}

PyPreparedTransfer PyEngine::keep_prepared(PreparedTransfer p, const char* kind, uint64_t count,
                                           const PyMrHandle& src) {
  auto h = std::make_shared<PyPreparedTransfer::Holder>(PyPreparedTransfer::Holder{std::move(p)});
  if (prepared_.size() >= 2 * prepared_live_ + 64) {  // amortised pruning of dropped shapes
    std::erase_if(prepared_, [](const auto& w) { return w.expired(); });
    prepared_live_ = prepared_.size();
  }
  prepared_.push_back(h);
  return PyPreparedTransfer{std::move(h), kind, count, src.h.id, src.owner};
}

std::vector<ScatterDst> PyEngine::scatter_dsts(nb::handle dsts_arg) {
  if (!PyList_Check(dsts_arg.ptr())) wrong_type("dsts", "a list of ferry.ScatterDst", dsts_arg);
  nb::list dl = nb::borrow<nb::list>(dsts_arg);
  std::vector<ScatterDst> dsts;
  dsts.reserve(nb::len(dl));
  for (size_t k = 0, n = nb::len(dl); k < n; ++k)
    dsts.push_back(obj_arg<ScatterDst>(list_item(dl, k), "scatter target " + std::to_string(k),
                                       "a ferry.ScatterDst"));
  return dsts;
}

void PyEngine::check_handle(const PyMrHandle& h) {
  if (!h.registered)
    throw Error(Code::kNotFound,
                "memory region " + std::to_string(h.h.id) + " was unregistered: register it again");
}

std::shared_ptr<Slot> PyEngine::add_slot(nb::handle fn) {
  auto s = std::make_shared<Slot>();
  s->fn = PyRef(fn);
  slots_.push_back(s);
  return s;
}

void PyEngine::release_view(nb::handle mv, bool raise) {
  PyObject* r = PyObject_CallMethod(mv.ptr(), "release", nullptr);
  if (r != nullptr) {
    Py_DECREF(r);
    return;
  }
  PyErr_Clear();
  if (raise)
    throw Error(Code::kFailedPrecondition,
                "a view of a received message outlived its callback (the buffer is reused "
                "right after the callback): copy the message with bytes(m) instead");
}

OnDone PyEngine::completion(nb::handle future, nb::handle on_done, nb::handle counter_arg) {
  const bool has_future = future.is_valid() && !future.is_none();
  const bool has_cb = callable_arg(on_done, "on_done", true).is_valid();
  if (counter_arg.is_valid() && !counter_arg.is_none()) {
    PyTransferCounter& counter =
        obj_arg<PyTransferCounter>(counter_arg, "counter", "a ferry.TransferCounter or None");
    if (has_cb || has_future) invalid("counter= cannot be combined with on_done= or a Transfer");
    counters_.insert(counter.state());  // the worker writes the atomics: keep them alive
    return OnDone::counter(counter.state()->done, &counter.state()->errors);
  }
  if (!has_future && !has_cb) return OnDone::none();
  struct Completion {
    PyRef future, on_done;
    std::shared_ptr<Shared> sh;
  };
  auto c = std::make_shared<Completion>(Completion{PyRef(future), PyRef(on_done), shared_});
  return OnDone([c](const Status& s) {
    run_py(*c->sh, "transfer completion", [&] {
      PyRef fut = std::move(c->future), cb = std::move(c->on_done);
      nb::object err = s.is_ok() ? nb::none() : make_error(s);
      if (fut) {
        try {
          if (s.is_ok())
            fut.get().attr("set_result")(nb::none());
          else
            fut.get().attr("set_exception")(err);
        } catch (nb::python_error& e) {
          e.restore();
          report_current(*c->sh, "resolving a Transfer");
        }
      }
      if (cb) cb.get()(err);
    });
  });
}

void PyEngine::shutdown() {
  if (!engine_ || stopped_) return;
  stopped_ = true;
  shared_->stopped.store(true, std::memory_order_release);  // counter waits: Cancelled
  for (auto& s : slots_) s->fn.reset();
  slots_.clear();
  for (auto& w : prepared_)  // their registrations go before the NICs close
    if (auto h = w.lock()) h->p = PreparedTransfer{};
  prepared_.clear();
  if (t_callback_depth > 0) {
    // The last reference went away inside a callback: stopping here would
    // join the callback thread from itself. Stop on a helper thread, keeping
    // the registered objects alive until the NICs are closed.
    auto owners = std::make_shared<std::vector<PyRef>>();
    for (auto& [id, o] : owners_) owners->emplace_back(o);
    owners_.clear();
    std::thread([e = std::move(engine_), owners]() mutable {
      e->stop();
      e.reset();
      owners->clear();
    }).detach();
    return;
  }
  // The callback thread drains (taking the GIL) and joins.
  without_gil([&] { engine_->stop(); });
  owners_.clear();
}

// ------------------------------------------------------------------ buffers and providers

nb::tuple describe_buffer(nb::handle obj) {
  auto describe = [](const auto& a, bool readonly) {
    bool contig = true;
    int64_t expect = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != expect) contig = false;
      expect *= int64_t(a.shape(i));
    }
    if (a.size() == 0) contig = true;  // empty: reg_mr reports the zero length
    std::string dev;
    switch (a.device_type()) {
      case nb::device::cpu::value:
      case nb::device::cuda_host::value:
        dev = "cpu";
        break;
      case nb::device::cuda::value:
      case nb::device::cuda_managed::value:
        dev = "cuda:" + std::to_string(a.device_id());
        break;
      default:
        invalid("cannot register memory of DLPack device type " + std::to_string(a.device_type()));
    }
    return nb::make_tuple(uint64_t(reinterpret_cast<uintptr_t>(a.data())),
                          uint64_t(a.itemsize() * a.size()), dev, readonly, contig);
  };
  nb::ndarray<> rw;
  if (nb::try_cast(obj, rw, false)) return describe(rw, false);
  nb::ndarray<nb::ro> ro;
  if (nb::try_cast(obj, ro, false)) return describe(ro, true);
  if (nb::hasattr(obj, "__dlpack__")) {
    // Say why the producer refused (e.g. torch: a tensor that requires grad).
    try {
      obj.attr("__dlpack__")();
    } catch (nb::python_error& e) {
      invalid(std::string("cannot register this ") + nb::type_name(obj.type()).c_str() +
              ": its __dlpack__() failed: " + e.what());
    }
  }
  invalid(std::string("cannot register an object of type ") + nb::type_name(obj.type()).c_str() +
          ": it exposes neither DLPack (__dlpack__) nor the buffer protocol; use "
          "register_memory(ptr, length, device) for raw memory");
}

nb::tuple probe_provider(const std::string& prov) {
  ferry::ProviderListing l;
  without_gil([&] { l = ferry::list_provider(prov); });
  std::vector<std::tuple<std::string, std::string, std::string, bool>> domains;
  for (const auto& n : l.nics) domains.emplace_back(n.name, n.fabric, n.provider, n.hmem);
  return nb::make_tuple(l.nics.empty() ? l.note : std::string(), nb::cast(domains));
}

nb::dict build_info() {
  nb::dict d;
  d["version"] = kVersion;
#ifdef FERRY_PY_CUDA
  d["cuda"] = true;
#else
  d["cuda"] = false;
#endif
  d["libfabric_headers"] =
      std::to_string(FI_MAJOR_VERSION) + "." + std::to_string(FI_MINOR_VERSION);
  uint32_t v = fi_version();
  d["libfabric_runtime"] = std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  d["nanobind"] = std::to_string(NB_VERSION_MAJOR) + "." + std::to_string(NB_VERSION_MINOR) + "." +
                  std::to_string(NB_VERSION_PATCH);
  d["compiler"] = __VERSION__;
  d["cxx_standard"] = long(__cplusplus);
#ifdef NDEBUG
  d["assertions"] = false;
#else
  d["assertions"] = true;
#endif
  return d;
}

}  // namespace ferry::py

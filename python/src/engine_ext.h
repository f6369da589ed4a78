// ferry._ferry.Engine: the C++ TransferEngine as the Python package drives it
// (ferry.TransferEngine wraps it), and the probes of buffers and providers that
// come before an engine.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/ferry.h"
#include "py_args.h"
#include "py_runtime.h"
#include "py_types.h"

namespace ferry::py {

class PyEngine {
 public:
  PyEngine(std::string provider, std::vector<GroupSpec> groups, size_t nics_per_group, bool busy,
           int callback_cpu, double default_timeout, size_t send_buffer_size,
           size_t send_buffer_count, int verbs_gid_index, size_t max_requests_in_flight,
           std::string queue_full, std::string metrics_address, std::string trace_file,
           uint32_t latency_sample_every, bool busy_step_aside, std::string spin_yield);

  // The C++ engine, for the bindings of other files (stats_ext.cpp).
  TransferEngine& native() {
    if (stopped_ || !engine_)
      throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
    return *engine_;
  }
  // The same, stopped or not, for what a stopped engine still answers
  // (statistics as stop() left them; trace spans, dropped after stop).
  TransferEngine& observed() {
    if (!engine_) throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
    return *engine_;
  }

  ~PyEngine() { shutdown(); }
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // --- identity (cached: still readable after stop())
  const NetAddr& main_address() const { return addresses_.at(0).at(0); }
  std::vector<NetAddr> addresses(nb::handle group_arg) const;
  size_t num_groups() const { return addresses_.size(); }
  size_t nics_per_group() const { return nics_; }
  const std::string& provider() const { return provider_; }
  uint64_t incarnation() const { return incarnation_; }
  uint64_t callback_errors() const { return shared_->callback_errors.load(); }
  bool stopped() const { return stopped_; }

  // --- memory
  nb::tuple register_memory(nb::handle ptr_arg, nb::handle len_arg, nb::handle device_arg,
                            nb::object owner, bool writable);
  void unregister(nb::handle handle);

  // --- two-sided
  uint64_t submit_send(nb::handle addr_obj, nb::handle data, nb::handle future, nb::handle on_done,
                       nb::handle counter);
  void submit_recvs(nb::handle len_arg, nb::handle count_arg_, nb::handle cb_arg);

  // --- one-sided
  uint64_t submit_write(nb::handle src_arg, nb::handle src_offset, nb::handle len,
                        nb::handle dst_arg, nb::handle dst_offset, nb::handle imm,
                        nb::handle route_arg, nb::handle future, nb::handle on_done,
                        nb::handle counter);
  uint64_t submit_paged_writes(nb::handle page_len, nb::handle src_arg, nb::handle src_pages,
                               nb::handle src_stride, nb::handle src_offset, nb::handle dst_arg,
                               nb::handle dst_pages, nb::handle dst_stride, nb::handle dst_offset,
                               nb::handle imm, nb::handle future, nb::handle on_done,
                               nb::handle counter);
  uint64_t submit_imm(nb::handle imm, nb::handle dst_arg, nb::handle route_arg, nb::handle future,
                      nb::handle on_done, nb::handle counter);

  // --- peer groups
  // peers: a list of MrDesc, or a list of lists of NetAddr (every NIC of each peer).
  uint32_t add_peer_group(nb::handle peers_arg);
  uint64_t submit_scatter(nb::handle src_arg, nb::handle dsts_arg, nb::handle imm, nb::handle group,
                          nb::handle route_arg, nb::handle future, nb::handle on_done,
                          nb::handle counter);
  uint64_t submit_barrier(nb::handle imm, nb::handle dsts_arg, nb::handle group,
                          nb::handle route_arg, nb::handle future, nb::handle on_done,
                          nb::handle counter);

  // --- prepared transfers: the arguments and checks of the submit_* of the same
  // name, less the immediate and the completion; submit() posts one.
  PyPreparedTransfer prepare_single_write(nb::handle src_arg, nb::handle src_offset, nb::handle len,
                                          nb::handle dst_arg, nb::handle dst_offset,
                                          nb::handle route_arg);
  PyPreparedTransfer prepare_paged_writes(nb::handle page_len, nb::handle src_arg,
                                          nb::handle src_pages, nb::handle src_stride,
                                          nb::handle src_offset, nb::handle dst_arg,
                                          nb::handle dst_pages, nb::handle dst_stride,
                                          nb::handle dst_offset);
  PyPreparedTransfer prepare_scatter(nb::handle src_arg, nb::handle dsts_arg, nb::handle group,
                                     nb::handle route_arg);
  // An unregistered source is the engine's to refuse (kFailedPrecondition).
  uint64_t submit(nb::handle prepared_arg, nb::handle imm, nb::handle future, nb::handle on_done,
                  nb::handle counter);

  // --- immediates
  void expect_imm_count(nb::handle imm, nb::handle count, nb::handle cb_arg);
  void remove_imm_count(nb::handle imm);
  PyImmCounter imm_counter(nb::handle imm);
  PyRecvQueue recv_queue(nb::handle len_arg, nb::handle count_arg_);
  void on_imm(nb::handle cb_arg);

  // --- GPU signalling (builds without CUDA raise Unimplemented)
  uintptr_t alloc_uvm_watcher(nb::handle cb_arg);
  uintptr_t imm_counter_gpu(nb::handle imm, nb::handle count);

  void stop();

 private:
  void check_running() const {
    if (stopped_) throw Error(Code::kFailedPrecondition, "the transfer engine is stopped");
  }

  PyPreparedTransfer keep_prepared(PreparedTransfer p, const char* kind, uint64_t count,
                                   const PyMrHandle& src);
  static std::vector<ScatterDst> scatter_dsts(nb::handle dsts_arg);
  static void check_handle(const PyMrHandle& h);
  std::shared_ptr<Slot> add_slot(nb::handle fn);
  static void release_view(nb::handle mv, bool raise);
  // The OnDone for one submit: nothing, a C++ counter (no Python at all on
  // completion), or a callback that resolves the future and calls on_done
  // with None or the ferry exception, on the callback thread.
  OnDone completion(nb::handle future, nb::handle on_done, nb::handle counter_arg);
  void shutdown();

  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<Shared> shared_;
  std::vector<std::vector<NetAddr>> addresses_;
  std::string provider_;
  size_t nics_ = 0;
  uint64_t incarnation_ = 0;
  bool stopped_ = false;
  std::vector<std::shared_ptr<Slot>> slots_;
  std::unordered_map<uint64_t, nb::object> owners_;
  std::set<std::shared_ptr<PyTransferCounter::State>> counters_;
  std::vector<std::weak_ptr<PyPreparedTransfer::Holder>> prepared_;
  size_t prepared_live_ = 0;
};

// ------------------------------------------------------------------ buffers and providers

// (ptr, nbytes, device, readonly, c_contiguous) of an object exposing DLPack or
// the buffer protocol; raises InvalidArgument for anything else.
nb::tuple describe_buffer(nb::handle obj);

// What the engine would open for `prov` (ferry/info.h, the engine's own
// listing): (note when nothing was found or "", [(domain, fabric, provider, hmem)]).
nb::tuple probe_provider(const std::string& prov);

// Version and build options of this extension (python -m ferry.info).
nb::dict build_info();

}  // namespace ferry::py

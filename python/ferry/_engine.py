"""The Python face of ferry::TransferEngine (see ferry/__init__.py for the tour)."""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from . import _ferry
from ._args import _desc_list, _gid_index, _int_arg, _list_arg, _seconds_arg, _str_list_arg
from ._stats import _Observability
from ._errors import (
    BY_CODE,
    FerryError,
    InvalidArgument,
    InvalidArgumentType,
)
from ._ferry import (
    GroupRoute,
    ImmCounter,
    RecvQueue,
    MrDesc,
    MrHandle,
    NetAddr,
    PreparedTransfer,
    ScatterDst,
    TransferCounter,
    WriteRoute,
)
from ._transfer import Transfer

__all__ = ["TransferEngine", "Transfer", "Group", "OnDone", "PageList"]

log = logging.getLogger("ferry")

OnDone = Callable[[Optional[FerryError]], Any]
"""on_done(error): error is None on success, else the ferry exception."""

PageList = Any
"""1-D int32/uint32/int64/uint64 array (NumPy, torch CPU, DLPack, buffer protocol) or a list of
ints; every index must be below 2**32 (else OutOfRange)."""


def _report_callback_error(where: str, exc: BaseException) -> None:
    log.error(
        "exception in a ferry %s (the engine keeps running)",
        where,
        exc_info=(type(exc), exc, exc.__traceback__),
    )


_ferry._set_error_classes(dict(BY_CODE))
_ferry._set_type_error_class(InvalidArgumentType)
_ferry._set_callback_error_hook(_report_callback_error)


class Group:
    """One worker thread and its NICs, serving one device (advanced; see TransferEngine).

    nics=None: for a GPU group ("cuda:N") on provider "efa" or "verbs", the
    nics_per_group NICs the machine's topology puts closest to that GPU (as CUDA
    numbers it in this process, CUDA_VISIBLE_DEVICES included); otherwise the
    provider's first domains.
    """

    def __init__(self, device: str = "cpu", nics: Optional[Sequence[str]] = None, worker_cpu: int = -1):
        self.device = device
        self.nics = _str_list_arg(nics, "nics") if nics is not None else []
        self.worker_cpu = worker_cpu

    def __repr__(self) -> str:
        return f"Group(device={self.device!r}, nics={self.nics!r}, worker_cpu={self.worker_cpu})"


_live_engines: "weakref.WeakSet[TransferEngine]" = weakref.WeakSet()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_engines() -> None:
    # Before the interpreter finalises. First, threads still inside a ferry call that
    # released the GIL (an ImmCounter.wait in a daemon thread) park when they come back
    # instead of re-taking the GIL: re-taking it during finalisation ends the thread
    # with pthread_exit, which aborts the process when it unwinds through C++. Then
    # the engines stop, so that no callback thread takes the GIL of a dying interpreter.
    _ferry._begin_exit()
    with _live_lock:
        engines = list(_live_engines)
    for e in engines:
        try:
            e.stop()
        except Exception:  # pragma: no cover
            log.exception("stopping a ferry engine at exit failed")


class TransferEngine(_Observability):
    """RDMA-style transfers (one-sided writes with 32-bit immediates, send/recv).

    Args:
        provider: "verbs" (ConnectX), "nvlink", or a libfabric provider ("efa",
            "tcp;ofi_rxm", "shm", ...). "auto" picks "verbs" when an RDMA NIC other
            than EFA has an active port, else "efa" if libfabric reports it, else
            raises. None uses the FERRY_PROVIDER environment variable, else "auto".
        nics: NIC (libfabric domain) names of the host group, e.g. ["lo"] for tcp or
            ["shm"]; None takes the first `nics_per_group` domains the provider reports.
            Naming a NIC twice opens two endpoints on it.
        nics_per_group: NICs per group when `nics` is None.
        worker_cpu: core to pin the worker thread to (-1: no pinning).
        callback_cpu: core to pin the callback thread to (-1: no pinning).
        poll_mode: "adaptive" (spin, then block; default) or "busy" (spin forever: the worker
            and the callback thread each take a core).
        busy_step_aside: with poll_mode "busy" (libfabric providers), the worker steps aside
            while a thread spins on a counter or queue (``wait``, ``try_consume``, ``pop``) or
            the callback thread spins for events, and that thread polls the NICs and posts
            its own submissions: no thread crossing on the way to or from the wire
            (docs/ARCHITECTURE.md, "Polling modes"). With poll_mode "adaptive" the same
            during the worker's spin phase where its idle polls do not yield (see
            spin_yield). False keeps every post and poll on the spinning worker. Default True.
        spin_yield: whether an adaptive worker yields the CPU between idle polls: "auto"
            (default: where the process may run on fewer than 8 CPUs), "yield" (a container
            whose CPU quota is smaller than the CPUs it sees) or "no_yield".
        default_timeout: deadline in seconds for transfers and sends (default 30; None or
            0: none).
        groups: advanced: a list of ferry.Group (one per device, e.g. per GPU); replaces
            nics/worker_cpu.
        send_buffer_size, send_buffer_count: the pool that copies submit_send payloads.
        verbs_gid_index: provider "verbs" only: the GID table index every NIC uses
            (``show_gids`` lists them). -1 (default): the FERRY_VERBS_GID_INDEX
            environment variable if set, else automatic (on RoCE the RoCEv2 GID of the
            interface's IP address, on InfiniBand index 0). Below -1 raises
            InvalidArgument; an index naming no populated entry fails start-up with
            InvalidArgument naming the NIC. Ignored, with a warning, by other providers.
        max_requests_in_flight: requests per group admitted and not yet finished (queued
            or on the NICs); bounds every queue of the engine.
        queue_full: what a submit does when its group is full: "block" (default) waits
            for room until the request's deadline (then DeadlineExceeded), "refuse" raises
            ResourceExhausted at once. Either way the request is not queued.
        metrics: "host:port" to serve Prometheus metrics on (GET /metrics; port 0: a free
            port, see `metrics_address`). None: the FERRY_METRICS environment variable,
            else off.
        trace: a file to write a Chrome trace-event JSON timeline to at stop() (Perfetto,
            chrome://tracing). None: FERRY_TRACE, else off. docs/OBSERVABILITY.md.
        latency_sample_every: the statistics time the latency and queueing delay of one
            submission in this many per submitting thread (the first included), and of every
            one while tracing: a precise clock read is on the way to the wire. 1: every
            submission. Transfer counts are exact either way. Counter waits
            (``counter_wait``) are timed for one wait in this many per waiting thread.

    Use it as a context manager, or call stop(): ``with TransferEngine(...) as e: ...``.
    Callbacks (on_done, receive, immediates) run on the engine's callback thread with the
    GIL held; an exception they raise is logged on the "ferry" logger and counted in
    `callback_errors`, it never stops the engine.
    """

    def __init__(
        self,
        provider: Optional[str] = None,
        nics: Optional[Sequence[str]] = None,
        nics_per_group: int = 1,
        worker_cpu: int = -1,
        callback_cpu: int = -1,
        poll_mode: str = "adaptive",
        default_timeout: Optional[float] = 30.0,
        *,
        groups: Optional[Sequence[Group]] = None,
        send_buffer_size: int = 64 << 10,
        send_buffer_count: int = 256,
        verbs_gid_index: int = -1,
        max_requests_in_flight: int = 65536,
        queue_full: str = "block",
        metrics: Optional[str] = None,
        trace: Optional[str] = None,
        latency_sample_every: int = 16,
        busy_step_aside: bool = True,
        spin_yield: str = "auto",
    ) -> None:
        if provider is not None and not isinstance(provider, str):
            raise InvalidArgumentType(f"provider must be a str or None, got {type(provider).__name__}")
        if poll_mode not in ("adaptive", "busy"):
            raise InvalidArgument(f"poll_mode must be 'adaptive' or 'busy', got {poll_mode!r}")
        verbs_gid_index = _gid_index(verbs_gid_index)
        if nics is not None:
            nics = _str_list_arg(nics, "nics")
        explicit = groups is not None
        if not explicit:
            groups = [Group("cpu", nics, worker_cpu)]
        elif nics is not None or worker_cpu != -1:
            raise InvalidArgument("pass either groups= or nics=/worker_cpu=, not both")
        specs = []
        for i, g in enumerate(_list_arg(groups, "groups", "ferry.Group")):
            if not isinstance(g, Group):
                raise InvalidArgumentType(f"groups[{i}] must be a ferry.Group, got {type(g).__name__}")
            if not isinstance(g.device, str):
                raise InvalidArgumentType(
                    f"groups[{i}].device must be a str ('cpu', 'cuda:N'), got {type(g.device).__name__}"
                )
            where = f"groups[{i}]." if explicit else ""
            cpu = _int_arg(g.worker_cpu, f"{where}worker_cpu", -1, 2**31 - 1, "[-1, 2**31)")
            specs.append(_ferry._GroupSpec(g.device, _str_list_arg(g.nics, f"{where}nics"), cpu))
        nics_per_group = _int_arg(nics_per_group, "nics_per_group", -(2**63), 2**63 - 1, "[1, 2**63)")
        if nics_per_group <= 0:
            raise InvalidArgument(f"nics_per_group must be positive (got {nics_per_group})")
        callback_cpu = _int_arg(callback_cpu, "callback_cpu", -1, 2**31 - 1, "[-1, 2**31)")
        timeout = _seconds_arg(default_timeout, "default_timeout")
        send_buffer_size = _int_arg(send_buffer_size, "send_buffer_size", 0, 2**63 - 1, "[0, 2**63)")
        send_buffer_count = _int_arg(send_buffer_count, "send_buffer_count", 0, 2**63 - 1, "[0, 2**63)")
        max_requests_in_flight = _int_arg(
            max_requests_in_flight, "max_requests_in_flight", 1, 2**63 - 1, "[1, 2**63)"
        )
        if queue_full not in ("block", "refuse"):
            raise InvalidArgument(f"queue_full must be 'block' or 'refuse', got {queue_full!r}")
        latency_sample_every = _int_arg(
            latency_sample_every, "latency_sample_every", 1, 2**32 - 1, "[1, 2**32)"
        )
        if not isinstance(busy_step_aside, bool):
            raise InvalidArgumentType(f"busy_step_aside must be a bool, got {type(busy_step_aside).__name__}")
        if spin_yield not in ("auto", "yield", "no_yield"):
            raise InvalidArgument(f"spin_yield must be 'auto', 'yield' or 'no_yield', got {spin_yield!r}")
        self._e = _ferry.Engine(
            provider or "",
            specs,
            nics_per_group,
            poll_mode == "busy",
            callback_cpu,
            timeout or 0.0,
            send_buffer_size,
            send_buffer_count,
            verbs_gid_index,
            max_requests_in_flight,
            queue_full,
            metrics or "",
            trace or "",
            latency_sample_every,
            busy_step_aside,
            spin_yield,
        )
        with _live_lock:
            _live_engines.add(self)

    # ------------------------------------------------------------------ identity

    @property
    def main_address(self) -> NetAddr:
        """Address of NIC 0 of group 0: what peers pass to submit_send."""
        return self._e.main_address

    @property
    def addresses(self) -> list[NetAddr]:
        """Addresses of every NIC of group 0 (see group_addresses for the others)."""
        return self._e.addresses(0)

    def group_addresses(self, group: int) -> list[NetAddr]:
        """Addresses of every NIC of one group."""
        return self._e.addresses(group)

    @property
    def num_groups(self) -> int:
        """Number of groups (worker threads)."""
        return self._e.num_groups

    @property
    def nics_per_group(self) -> int:
        """NICs in every group."""
        return self._e.nics_per_group

    @property
    def provider(self) -> str:
        """The provider in use ("auto" resolved)."""
        return self._e.provider

    @property
    def incarnation(self) -> int:
        """Random id of this engine run (part of every address and descriptor)."""
        return self._e.incarnation

    @property
    def callback_errors(self) -> int:
        """Number of exceptions raised by user callbacks so far (each one was logged)."""
        return self._e.callback_errors

    @property
    def stopped(self) -> bool:
        """True after stop()."""
        return self._e.stopped

    # ------------------------------------------------------------------ memory

    def register(self, obj: Any, writable: bool = True) -> tuple[MrHandle, MrDesc]:
        """Register a buffer for one-sided transfers; returns (handle, descriptor).

        `obj` is anything exposing DLPack (``__dlpack__``: torch tensors on CPU or CUDA,
        CuPy, NumPy >= 1.22) or the buffer protocol (NumPy, bytearray, memoryview, mmap).
        It must be C-contiguous (else InvalidArgument). A read-only buffer is refused
        unless ``writable=False`` (it may then only be a source of writes; peers must not
        be given its descriptor as a target). The handle keeps `obj` alive until
        unregister() or stop(). Send the descriptor to peers (pickle, bytes(), hex()).
        """
        ptr, nbytes, device, readonly, contiguous = _ferry.describe_buffer(obj)
        if not contiguous:
            raise InvalidArgument(
                f"cannot register a non-contiguous {type(obj).__name__}: registered memory must "
                "be C-contiguous (copy it first, e.g. numpy.ascontiguousarray or tensor.contiguous())"
            )
        if readonly and writable:
            raise InvalidArgument(
                f"cannot register a read-only {type(obj).__name__} as a write target: pass "
                "writable=False to use it only as a source"
            )
        return self._e.register_memory(ptr, nbytes, device, obj, bool(writable))

    def register_memory(
        self, ptr: int, length: int, device: str = "cpu", *, owner: Any = None
    ) -> tuple[MrHandle, MrDesc]:
        """Register raw memory [ptr, ptr+length) on "cpu" or "cuda:N".

        `owner` (optional) is kept alive until unregister(); the caller guarantees the
        memory stays valid while registered.
        """
        return self._e.register_memory(ptr, length, device, owner, True)

    def unregister(self, handle: MrHandle) -> None:
        """Deregister a region (raises NotFound if it is not registered)."""
        self._e.unregister(handle)

    # ------------------------------------------------------------------ two-sided

    def submit_send(
        self,
        addr: NetAddr,
        data: Any,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Send a message (bytes-like; copied at once, so `data` may be reused) to `addr`.

        The peer must have posted receives (submit_recvs) at least as large.
        """
        if counter is not None:
            self._e.submit_send(addr, data, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit_send(addr, data, t, on_done, None)
        return t

    def submit_recvs(self, length: int, count: int, callback: Callable[[memoryview], Any]) -> None:
        """Post `count` receive buffers of `length` bytes; callback(message) runs per message.

        The memoryview is only valid during the callback (its buffer is re-posted right
        after): keep a copy with ``bytes(m)`` or ``numpy.array(m)``, never the view.
        """
        self._e.submit_recvs(length, count, callback)

    def recv_queue(self, length: int, count: int) -> RecvQueue:
        """Post `count` receive buffers of `length` bytes whose messages are taken by polling.

        ``q.get(timeout)`` waits with the GIL released and returns a copy (bytes);
        ``q.try_get()`` never blocks. No callback runs and no Python thread is borrowed:
        the engine's worker hands each message straight to the queue.
        """
        return self._e.recv_queue(length, count)

    # ------------------------------------------------------------------ one-sided

    def submit_write(
        self,
        src: MrHandle,
        src_offset: int,
        length: int,
        dst: MrDesc,
        dst_offset: int = 0,
        imm: Optional[int] = None,
        route: Optional[WriteRoute] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Write `length` bytes from src[src_offset:] to dst[dst_offset:], then `imm` (if given).

        The receiver counts `imm` once per piece (ferry.ImmPlan); with the default route
        that is one immediate unless the group has several NICs. Returns a Transfer
        (None when counter= is given).
        """
        r = route if route is not None else _SPLIT
        if counter is not None:
            self._e.submit_write(src, src_offset, length, dst, dst_offset, imm, r, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit_write(src, src_offset, length, dst, dst_offset, imm, r, t, on_done, None)
        return t

    def submit_paged_writes(
        self,
        page_len: int,
        src: MrHandle,
        src_pages: PageList,
        src_stride: int,
        src_offset: int,
        dst: MrDesc,
        dst_pages: PageList,
        dst_stride: int,
        dst_offset: int = 0,
        imm: Optional[int] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Write page i: src[src_offset + src_pages[i]*src_stride : +page_len] to the same
        place of dst computed from dst_pages[i], dst_stride and dst_offset.

        Page lists are 1-D int32/uint32/int64 arrays (NumPy, torch CPU, DLPack) copied into
        C++ with one memcpy (no per-page Python objects); lists of ints are accepted too.
        The receiver gets one `imm` per page.
        """
        if counter is not None:
            self._e.submit_paged_writes(
                page_len, src, src_pages, src_stride, src_offset, dst, dst_pages, dst_stride,
                dst_offset, imm, None, on_done, counter,
            )
            return None
        t = Transfer()
        t.id = self._e.submit_paged_writes(
            page_len, src, src_pages, src_stride, src_offset, dst, dst_pages, dst_stride,
            dst_offset, imm, t, on_done, None,
        )
        return t

    def submit_imm(
        self,
        imm: int,
        dst: MrDesc,
        route: Optional[WriteRoute] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """A zero-byte write carrying only the immediate `imm` to the owner of `dst`."""
        r = route if route is not None else _PINNED0
        if counter is not None:
            self._e.submit_imm(imm, dst, r, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit_imm(imm, dst, r, t, on_done, None)
        return t

    # ------------------------------------------------------------------ load/store access

    def map_remote(self, dst: MrDesc, offset: int = 0, length: Optional[int] = None,
                   device: str = "cpu") -> "_ferry.MappedRegion":
        """A peer's registered memory (`dst`'s bytes [offset, offset+length), to its end by
        default) as an address of this process, for kernels on `device` ("cuda:N": a peer's
        GPU memory over the nvlink provider) or the CPU (the in-process fake NIC) to store
        into: ``torch.as_tensor(m, device="cuda")`` views it as bytes. Stores carry no
        immediate: say when they are done with one (``submit_imm``) after they completed.
        Raises Unimplemented where the transport cannot map a peer's memory (tcp, shm,
        efa, verbs), FailedPrecondition for a read-only region, NotFound for one the peer
        unregistered, OutOfRange past its end. The returned object holds the mapping open."""
        n = dst.length - offset if length is None else length
        return _ferry.map_remote(self._e, dst, offset, n, device)

    # ------------------------------------------------------------------ peer groups

    def add_peer_group(self, peers: Union[Sequence[MrDesc], Sequence[Sequence[NetAddr]]]) -> int:
        """Declare a set of peers (their descriptors, or every NIC address of each peer);
        returns a handle for submit_scatter/submit_barrier. Idempotent."""
        return self._e.add_peer_group(_list_arg(peers, "peers", "MrDesc or lists of NetAddr"))

    def submit_scatter(
        self,
        src: MrHandle,
        dsts: Iterable[Union[ScatterDst, tuple]],
        imm: Optional[int] = None,
        group: Optional[int] = None,
        route: Optional[GroupRoute] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Write one slice of `src` to each target: ScatterDst(length, src_offset, dst,
        dst_offset) or an equivalent tuple. `group` is an add_peer_group handle (optional)."""
        d = _desc_list(dsts)
        r = route if route is not None else _SHARD_PEERS
        if counter is not None:
            self._e.submit_scatter(src, d, imm, group, r, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit_scatter(src, d, imm, group, r, t, on_done, None)
        return t

    def submit_barrier(
        self,
        imm: int,
        dsts: Iterable[MrDesc],
        group: Optional[int] = None,
        route: Optional[GroupRoute] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Send the immediate `imm` once to the owner of every descriptor in `dsts`."""
        d = _list_arg(dsts, "dsts", "MrDesc")
        r = route if route is not None else _SHARD_PEERS
        if counter is not None:
            self._e.submit_barrier(imm, d, group, r, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit_barrier(imm, d, group, r, t, on_done, None)
        return t

    # ------------------------------------------------------------ prepared transfers
    # The arguments and checks of the submit_* of the same name, less the immediate and
    # the completion; they raise what it would raise. submit() posts the result.

    def prepare_single_write(
        self,
        src: MrHandle,
        src_offset: int,
        length: int,
        dst: MrDesc,
        dst_offset: int = 0,
        route: Optional[WriteRoute] = None,
    ) -> PreparedTransfer:
        """Validate a submit_write once; returns a PreparedTransfer for submit().

        Same arguments (less imm) and errors as submit_write.
        """
        r = route if route is not None else _SPLIT
        return self._e.prepare_single_write(src, src_offset, length, dst, dst_offset, r)

    def prepare_paged_writes(
        self,
        page_len: int,
        src: MrHandle,
        src_pages: PageList,
        src_stride: int,
        src_offset: int,
        dst: MrDesc,
        dst_pages: PageList,
        dst_stride: int,
        dst_offset: int = 0,
    ) -> PreparedTransfer:
        """Validate a submit_paged_writes once (page lists copied and checked now); returns
        a PreparedTransfer for submit().

        Same arguments (less imm) and errors as submit_paged_writes.
        """
        return self._e.prepare_paged_writes(
            page_len, src, src_pages, src_stride, src_offset, dst, dst_pages, dst_stride, dst_offset,
        )

    def prepare_scatter(
        self,
        src: MrHandle,
        dsts: Iterable[Union[ScatterDst, tuple]],
        group: Optional[int] = None,
        route: Optional[GroupRoute] = None,
    ) -> PreparedTransfer:
        """Validate a submit_scatter once; returns a PreparedTransfer for submit().

        Same arguments (less imm) and errors as submit_scatter.
        """
        d = _desc_list(dsts)
        r = route if route is not None else _SHARD_PEERS
        return self._e.prepare_scatter(src, d, group, r)

    def submit(
        self,
        prepared: PreparedTransfer,
        imm: Optional[int] = None,
        on_done: Optional[OnDone] = None,
        *,
        counter: Optional[TransferCounter] = None,
    ) -> Optional[Transfer]:
        """Post a prepared transfer with `imm` on every write (as its submit_* would), with
        no per-page validation or copy. May be called any number of times.

        The receiver counts `imm` as for the submit_* of the same name (ferry.ImmPlan).
        Raises FailedPrecondition when the source region was unregistered since it was
        prepared, and InvalidArgument for a PreparedTransfer of another engine. A peer that
        went away fails the Transfer (Unavailable), as a plain transfer to it would.
        Returns a Transfer (None when counter= is given).
        """
        if counter is not None:
            self._e.submit(prepared, imm, None, on_done, counter)
            return None
        t = Transfer()
        t.id = self._e.submit(prepared, imm, t, on_done, None)
        return t

    # ------------------------------------------------------------------ immediates

    def expect_imm_count(self, imm: int, count: int, callback: Callable[[], Any]) -> None:
        """Call callback() on the callback thread each time `count` immediates `imm` arrived.

        An immediate is counted one way at a time: raises ferry.AlreadyExists when `imm`
        already has an imm_counter or an imm_counter_gpu flag; remove_imm_count(imm)
        first to switch. A second expect_imm_count for `imm` replaces the first.
        """
        self._e.expect_imm_count(imm, count, callback)

    def remove_imm_count(self, imm: int) -> None:
        """Stop counting `imm` (NotFound if it is not counted), whichever way it was counted.

        Waits on its ImmCounter end with ferry.Cancelled.
        """
        self._e.remove_imm_count(imm)

    def imm_counter(self, imm: int) -> ImmCounter:
        """A counter of arrivals of `imm`: value, try_consume(n), wait(n, timeout).

        Raises ferry.AlreadyExists when `imm` is already counted another way (an
        expect_imm_count or an imm_counter_gpu flag); remove_imm_count(imm) first to
        switch. Every imm_counter(imm) shares one count. Its waits raise ferry.Cancelled
        once the engine stops or remove_imm_count(imm) removes it.
        """
        return self._e.imm_counter(imm)

    def on_imm(self, callback: Callable[[int], Any]) -> None:
        """callback(imm) for every immediate that no counter or expectation takes."""
        self._e.on_imm(callback)

    # ------------------------------------------------------------ GPU signalling

    def alloc_uvm_watcher(self, callback: Callable[[int, int], bool]) -> int:
        """Allocate a zeroed 64-bit word that GPU kernels (also inside CUDA graphs) update.

        Returns its address (device-visible, pass it to a kernel). callback(old, new) runs on
        the engine's watcher thread when the value changes (changes may be coalesced; the final
        value is always seen) and returns True to stay armed; False or an exception releases
        the word. Raises ferry.Unimplemented in builds without CUDA.
        """
        return self._e.alloc_uvm_watcher(callback)

    def imm_counter_gpu(self, imm: int, count: int) -> int:
        """Address of a device-visible 32-bit flag: each time `count` more immediates `imm`
        arrived, the NIC worker stores the next generation (1, 2, ...) with a release store.
        A kernel waits with ferry/device.cuh's wait_flag. Raises ferry.AlreadyExists when
        `imm` already has an imm_counter or expect_imm_count (a second imm_counter_gpu
        replaces the first). Raises ferry.Unimplemented in builds without CUDA."""
        return self._e.imm_counter_gpu(imm, count)

    # ------------------------------------------------------------------ lifetime

    def stop(self) -> None:
        """Stop the workers and the callback thread; outstanding transfers fail with
        ferry.Cancelled. Registered objects are released. Idempotent; not allowed from a
        callback."""
        self._e.stop()
        with _live_lock:
            _live_engines.discard(self)

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return (
            f"<ferry.TransferEngine {self.provider!r} {self.num_groups} group(s) x "
            f"{self.nics_per_group} NIC(s) {self.main_address!r} {state}>"
        )


_SPLIT = WriteRoute.split()
_PINNED0 = WriteRoute.pinned(0)
_SHARD_PEERS = GroupRoute.shard_peers()

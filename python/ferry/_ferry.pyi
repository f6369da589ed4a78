"""
Low-level bindings of the ferry transfer engine (use the `ferry` package).
"""

from collections.abc import Callable, Sequence


def make_error(code: str, message: str) -> object:
    """The ferry exception for a status code name such as 'NOT_FOUND'."""

def in_callback() -> bool:
    """
    True while running inside a ferry callback (on the engine's callback thread).
    """

def describe_buffer(obj: object) -> tuple:
    """
    (ptr, nbytes, device, readonly, c_contiguous) of an object exposing DLPack or the buffer protocol.
    """

def probe_provider(provider: str) -> tuple:
    """
    fi_getinfo for one provider: (error or '', [(domain, fabric, provider, hmem)]).
    """

def build_info() -> dict:
    """Version and build options of this extension."""

def _thread_states() -> int:
    """Python thread states of this interpreter (tests: engines leave none behind)."""

class NetAddr:
    """
    The address of one NIC endpoint of one engine incarnation (opaque bytes).
    """

    def __init__(self, data: object) -> None:
        """Same as NetAddr.from_bytes(data)."""

    @staticmethod
    def from_bytes(data: object) -> NetAddr:
        """
        Decodes bytes produced by bytes(); raises InvalidArgument when malformed.
        """

    @staticmethod
    def from_hex(text: str) -> NetAddr:
        """Decodes hex() output."""

    def bytes(self) -> bytes:
        """The wire form."""

    def hex(self) -> str:
        """The wire form as lowercase hex."""

    @property
    def transport(self) -> str:
        """Transport family: 'fabric', 'verbs' or 'nvlink'."""

    @property
    def incarnation(self) -> int:
        """Random id of the owning engine's run."""

    @property
    def raw(self) -> bytes:
        """The provider's raw endpoint name."""

    def __eq__(self, arg: NetAddr, /) -> bool: ...

    def __ne__(self, arg: NetAddr, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

    def __reduce__(self) -> tuple: ...

class MrDesc:
    """
    Serialisable descriptor of a registered region: what a peer needs to write into it. Send it to peers with bytes()/hex() or pickle.
    """

    def __init__(self, data: object) -> None:
        """Same as MrDesc.from_bytes(data)."""

    @staticmethod
    def from_bytes(data: object) -> MrDesc:
        """
        Decodes bytes produced by bytes(); raises InvalidArgument when malformed.
        """

    @staticmethod
    def from_hex(text: str) -> MrDesc:
        """Decodes hex() output."""

    def bytes(self) -> bytes:
        """The wire form."""

    def hex(self) -> str:
        """The wire form as lowercase hex."""

    @property
    def ptr(self) -> int:
        """The owner's virtual base address (informational)."""

    @property
    def length(self) -> int:
        """Size of the region in bytes."""

    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""

    @property
    def writable(self) -> bool:
        """
        False for a region registered read-only: peers may not write into it (a write is refused on the sender with FailedPrecondition).
        """

    @property
    def addresses(self) -> list[NetAddr]:
        """The owner's NIC addresses, in NIC order."""

    @property
    def nics(self) -> list[tuple[NetAddr, int, int]]:
        """[(address, rkey, base)] per NIC of the owner's group."""

    def __eq__(self, arg: MrDesc, /) -> bool: ...

    def __ne__(self, arg: MrDesc, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

    def __reduce__(self) -> tuple: ...

class MrHandle:
    """
    Local handle of a registered region. Holds a reference to the registered object; pass it to unregister() when done.
    """

    @property
    def ptr(self) -> int:
        """Base address of the region."""

    @property
    def id(self) -> int:
        """Registration id."""

    @property
    def length(self) -> int:
        """Size of the region in bytes."""

    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""

    @property
    def writable(self) -> bool:
        """False when registered with writable=False (a read-only source)."""

    @property
    def registered(self) -> bool:
        """False after unregister()."""

    @property
    def obj(self) -> object:
        """The registered Python object (None for register_memory)."""

    @property
    def desc(self) -> MrDesc:
        """The region's descriptor (also returned by register)."""

    def __repr__(self) -> str: ...

class WriteRoute:
    """How a single write is placed on the group's NICs."""

    @staticmethod
    def split(max_shards: int = 0, min_piece: int = 262144) -> WriteRoute:
        """
        Cut into up to max_shards pieces (0 = all NICs) of at least min_piece bytes.
        """

    @staticmethod
    def pinned(nic: int) -> WriteRoute:
        """The whole write on NIC `nic`."""

    @staticmethod
    def round_robin() -> WriteRoute:
        """The whole write on the next NIC of a per-group rotation."""

    @property
    def kind(self) -> str: ...

    @property
    def nic(self) -> int: ...

    @property
    def max_shards(self) -> int: ...

    @property
    def min_piece(self) -> int: ...

    def __eq__(self, arg: WriteRoute, /) -> bool: ...

    def __repr__(self) -> str: ...

class GroupRoute:
    """How scatter and barrier spread targets over NICs."""

    @staticmethod
    def shard_peers() -> GroupRoute:
        """Targets divided into contiguous runs, one run per NIC."""

    @staticmethod
    def shard_bytes() -> GroupRoute:
        """Every target's bytes divided over all NICs."""

    @staticmethod
    def pinned(nic: int) -> GroupRoute:
        """Everything on NIC `nic`."""

    @property
    def kind(self) -> str: ...

    @property
    def nic(self) -> int: ...

    def __eq__(self, arg: GroupRoute, /) -> bool: ...

    def __repr__(self) -> str: ...

class ScatterDst:
    """One target of submit_scatter."""

    def __init__(self, length: int, src_offset: int, dst: MrDesc, dst_offset: int = 0) -> None: ...

    @property
    def length(self) -> int: ...

    @property
    def src_offset(self) -> int: ...

    @property
    def dst(self) -> MrDesc: ...

    @property
    def dst_offset(self) -> int: ...

    def __repr__(self) -> str: ...

class ImmPlan:
    """
    Number of immediates the receiver gets for a request, for both sides to use.
    """

    @staticmethod
    def single_write(length: int, route: WriteRoute, nics: int) -> int:
        """Immediates for one submit_write of `length` bytes."""

    @staticmethod
    def paged_writes(pages: int) -> int:
        """One immediate per page."""

    @staticmethod
    def scatter_target(length: int, route: GroupRoute, nics: int) -> int:
        """Immediates one scatter target receives."""

    @staticmethod
    def barrier_target() -> int:
        """One per barrier target."""

    @staticmethod
    def imm() -> int:
        """One per submit_imm."""

class ImmCounter:
    """Counts arrivals of one immediate value; wait(n) consumes n arrivals."""

    @property
    def value(self) -> int:
        """Arrivals not yet consumed."""

    @property
    def imm(self) -> int:
        """The immediate value counted."""

    def try_consume(self, n: int = 1) -> bool:
        """
        Consume n arrivals if they are there; never blocks. Returns whether it consumed.
        """

    def wait(self, n: int = 1, timeout: float | None = None, *, spin: bool = False) -> None:
        """
        Wait (GIL released) until n arrivals can be consumed, then consume them. Raises ferry.Timeout (consuming nothing) after `timeout` seconds; None waits forever. Raises ferry.Cancelled when the engine stops first (or remove_imm_count removes the counter). spin: poll without ever sleeping (a core busy for the whole wait; no wake-up, which takes tens to hundreds of microseconds on an idle host).
        """

    def __repr__(self) -> str: ...

class RecvQueue:
    """Messages taken by polling (TransferEngine.recv_queue): no callback."""

    def try_get(self) -> bytes | None:
        """
        The oldest message not yet taken (a copy; its buffer goes back to the NIC at once), or None; never blocks.
        """

    def get(self, timeout: float | None = None, *, spin: bool = False) -> bytes:
        """
        Wait (GIL released) for the next message and return a copy of it. Raises ferry.Timeout after `timeout` seconds (None waits forever), ferry.Cancelled once the engine stopped and no message is left. spin: as ImmCounter.wait.
        """

    def __len__(self) -> int:
        """Messages waiting to be taken (approximate)."""

    @property
    def buffer_len(self) -> int:
        """Bytes per receive buffer."""

    @property
    def buffer_count(self) -> int:
        """Receive buffers posted."""

class TransferCounter:
    """
    Completion counter for bulk submits: pass counter= to a submit_* call; completions are counted in C++ with no Python callback.
    """

    def __init__(self) -> None: ...

    @property
    def done(self) -> int:
        """Transfers ended (success or failure)."""

    @property
    def errors(self) -> int:
        """Transfers that failed."""

    def wait(self, n: int, timeout: float | None = None) -> None:
        """
        Wait (GIL released) until `done` reaches n; raises ferry.Timeout after `timeout` s.
        """

    def __repr__(self) -> str: ...

class PreparedTransfer:
    """
    A transfer shape validated once by a TransferEngine.prepare_* call; post it with TransferEngine.submit(prepared, imm) as many times as needed. Opaque.
    """

    @property
    def kind(self) -> str:
        """'single_write', 'paged_writes' or 'scatter'."""

    def __repr__(self) -> str: ...

class MappedRegion:
    """
    A peer's registered memory mapped into this process (TransferEngine.map_remote): stores through it land in the peer's region with no transfer or immediate. Exposes __cuda_array_interface__ (GPU memory) or __array_interface__ (host memory) as bytes; holds the mapping open.
    """

    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def __cuda_array_interface__(self) -> dict: ...
    @property
    def __array_interface__(self) -> dict: ...

def map_remote(engine: Engine, dst: MrDesc, offset: int, length: int, device: str) -> MappedRegion: ...

class Engine:
    """The C++ TransferEngine (use ferry.TransferEngine)."""

    def __init__(self, provider: str, groups: Sequence[_GroupSpec], nics_per_group: int, busy: bool, callback_cpu: int, default_timeout: float, send_buffer_size: int, send_buffer_count: int, verbs_gid_index: int = -1, max_requests_in_flight: int = 65536, queue_full: str = 'block', metrics_address: str = '', trace_file: str = '', latency_sample_every: int = 16, busy_step_aside: bool = True, spin_yield: str = 'auto') -> None: ...

    @property
    def main_address(self) -> NetAddr: ...

    def addresses(self, group: int = 0) -> list[NetAddr]: ...

    @property
    def num_groups(self) -> int: ...

    @property
    def nics_per_group(self) -> int: ...

    @property
    def provider(self) -> str: ...

    @property
    def incarnation(self) -> int: ...

    @property
    def callback_errors(self) -> int: ...

    @property
    def stopped(self) -> bool: ...

    def register_memory(self, ptr: int, length: int, device: str, owner: object | None, writable: bool) -> tuple: ...

    def unregister(self, handle: MrHandle) -> None: ...

    def submit_send(self, addr: NetAddr, data: object, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def submit_recvs(self, length: int, count: int, callback: Callable) -> None: ...

    def submit_write(self, src: MrHandle, src_offset: int, length: int, dst: MrDesc, dst_offset: int, imm: int | None, route: WriteRoute, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def submit_paged_writes(self, page_len: int, src: MrHandle, src_pages: object, src_stride: int, src_offset: int, dst: MrDesc, dst_pages: object, dst_stride: int, dst_offset: int, imm: int | None, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def submit_imm(self, imm: int, dst: MrDesc, route: WriteRoute, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def add_peer_group(self, peers: list[MrDesc] | list[Sequence[NetAddr]]) -> int: ...

    def submit_scatter(self, src: MrHandle, dsts: Sequence[ScatterDst], imm: int | None, group: int | None, route: GroupRoute, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def submit_barrier(self, imm: int, dsts: Sequence[MrDesc], group: int | None, route: GroupRoute, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def prepare_single_write(self, src: MrHandle, src_offset: int, length: int, dst: MrDesc, dst_offset: int, route: WriteRoute) -> PreparedTransfer: ...

    def prepare_paged_writes(self, page_len: int, src: MrHandle, src_pages: object, src_stride: int, src_offset: int, dst: MrDesc, dst_pages: object, dst_stride: int, dst_offset: int) -> PreparedTransfer: ...

    def prepare_scatter(self, src: MrHandle, dsts: Sequence[ScatterDst], group: int | None, route: GroupRoute) -> PreparedTransfer: ...

    def submit(self, prepared: PreparedTransfer, imm: int | None, future: object | None, on_done: object | None, counter: TransferCounter | None) -> int: ...

    def expect_imm_count(self, imm: int, count: int, callback: Callable) -> None: ...

    def remove_imm_count(self, imm: int) -> None: ...

    def recv_queue(self, length: int, count: int) -> RecvQueue: ...

    def imm_counter(self, imm: int) -> ImmCounter: ...

    def on_imm(self, callback: Callable) -> None: ...

    def alloc_uvm_watcher(self, callback: Callable) -> int: ...

    def imm_counter_gpu(self, imm: int, count: int) -> int: ...

    def stop(self) -> None: ...

# --- added by hand after `python -m nanobind.stubgen -m ferry._ferry` (see docs/PYTHON.md)
__version__: str

def _set_error_classes(classes: dict) -> None: ...
def _set_type_error_class(cls: type) -> None: ...
def _set_callback_error_hook(hook: Callable[[str, BaseException], object]) -> None: ...
def _begin_exit() -> None: ...
def _blocked_waits() -> int: ...

class _GroupSpec:
    def __init__(self, device: str, nics: Sequence[str], worker_cpu: int) -> None: ...

# Observability (stats_ext.cpp, docs/OBSERVABILITY.md)
def _stats(engine: Engine) -> dict: ...
def _metrics_address(engine: Engine) -> str: ...
def _tracing(engine: Engine) -> bool: ...
def _trace_span(engine: Engine, name: str, start_ns: int, end_ns: int, track: str) -> None: ...
def trace_clock_ns() -> int: ...

"""ferry: RDMA-style transfers (one-sided writes with 32-bit immediates, send/recv) over libfabric.

A short tour (two processes; see docs/PYTHON.md)::

    import numpy as np, ferry

    with ferry.TransferEngine("tcp;ofi_rxm", nics=["lo"]) as e:
        buf = np.zeros(1 << 20, dtype=np.uint8)
        handle, desc = e.register(buf)          # desc: send it to the peer (pickle/bytes/hex)
        counter = e.imm_counter(7)
        ...                                     # the peer: e.submit_write(h, 0, n, desc, 0, imm=7)
        counter.wait(1, timeout=10)             # data visible once the immediate arrived

Completion: every submit_* returns a :class:`Transfer` (a concurrent.futures.Future that is
also awaitable) and accepts ``on_done=callable(error_or_None)``; bulk users may pass
``counter=ferry.TransferCounter()`` instead (no Python on the completion path).
Errors are :class:`FerryError` subclasses (``InvalidArgument``, ``NotFound``, ``Timeout``...).
``ferry.aio`` (asyncio helpers), ``ferry.info`` and ``ferry.bench`` load on first use.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
from typing import Any as _Any

# The C++ library logs through spdlog at level FERRY_LOG (trace..off); keep Python
# programs quiet unless asked (FERRY_LOG=info shows provider and worker set-up).
_os.environ.setdefault("FERRY_LOG", "warn")

from . import _ferry  # noqa: E402
from ._engine import Group, Transfer, TransferEngine
from ._stats import trace_clock_ns
from ._errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FerryError,
    Internal,
    InvalidArgument,
    InvalidArgumentType,
    NotFound,
    OutOfRange,
    ResourceExhausted,
    Timeout,
    Unavailable,
    Unimplemented,
)
from ._ferry import (
    GroupRoute,
    ImmCounter,
    ImmPlan,
    MrDesc,
    MrHandle,
    NetAddr,
    PreparedTransfer,
    RecvQueue,
    ScatterDst,
    TransferCounter,
    WriteRoute,
)

__version__: str = _ferry.__version__
"""The package version (from include/ferry/version.h)."""


def build_info() -> dict:
    """Version and build options of the extension (CUDA built, libfabric and nanobind versions)."""
    return dict(_ferry.build_info())


# Submodules reachable as attributes (``ferry.aio.wait_imm``) but imported on first use:
# ferry.aio imports asyncio, which `import ferry` alone does not need.
_LAZY_SUBMODULES = ("aio", "info", "bench")


def __getattr__(name: str) -> _Any:
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # also sets the attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


__all__ = [
    "__version__",
    "build_info",
    "TransferEngine",
    "trace_clock_ns",
    "Transfer",
    "Group",
    "NetAddr",
    "MrDesc",
    "MrHandle",
    "ScatterDst",
    "PreparedTransfer",
    "WriteRoute",
    "GroupRoute",
    "ImmCounter",
    "RecvQueue",
    "ImmPlan",
    "TransferCounter",
    "FerryError",
    "Cancelled",
    "InvalidArgument",
    "InvalidArgumentType",
    "Timeout",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "ResourceExhausted",
    "FailedPrecondition",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "Aborted",
]

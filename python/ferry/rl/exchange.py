"""Rendezvous and control traffic between the ranks of a weight transfer.

The pipeline needs four things from whatever already connects the ranks: an
all-gather of small objects (metadata, the schedule), point-to-point sends of shard
rows to the rank that materialises a parameter, and a barrier among trainers, each
with a deadline, each failing with a ferry error when a rank is gone:
``ferry.Unavailable`` (a rank left) or ``ferry.Timeout`` (the deadline passed).

``TorchExchange`` runs them on a torch.distributed group (gloo); ``CallableExchange``
takes plain callables, for frameworks that coordinate some other way.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

# Defined with the group helpers that ferry.moe shares; public here, as before.
from .._torch_exchange import TorchExchange  # noqa: F401


class Exchange(Protocol):
    rank: int
    world: int

    def all_gather(self, obj: Any, timeout: float) -> list:
        """Every rank's `obj`, in rank order."""

    def send(self, dst: int, tag: int, array: Any) -> None:
        """Queue `array` for rank `dst` (returns at once; `flush` waits for delivery)."""

    def recv(self, src: int, tag: int, out: Any, timeout: float) -> None:
        """Fill `out` with what `src` sent under `tag`."""

    def barrier(self, ranks: Sequence[int], timeout: float) -> None:
        """Returns when every rank in `ranks` has called it."""

    def flush(self, timeout: float) -> None:
        """Wait until this rank's sends were taken."""


class CallableExchange:
    """An Exchange from callables (all_gather(obj, timeout), send(dst, tag, a),
    recv(src, tag, out, timeout), barrier(ranks, timeout), flush(timeout) optional)."""

    def __init__(self, rank: int, world: int, all_gather: Callable, send: Callable, recv: Callable,
                 barrier: Callable, flush: Optional[Callable] = None):
        self.rank, self.world = rank, world
        self.all_gather, self.send, self.recv, self.barrier = all_gather, send, recv, barrier
        self.flush = flush or (lambda timeout: None)

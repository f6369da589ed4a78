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

import datetime
from typing import Any, Callable, Optional, Protocol, Sequence

from .._errors import Timeout, Unavailable


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


def _typed(e: BaseException, what: str) -> Exception:
    text = str(e)
    if "timed out" in text.lower() or "timeout" in text.lower():
        return Timeout(f"{what}: {text}")
    return Unavailable(f"{what}: {text}")


class TorchExchange:
    """Exchange over torch.distributed (gloo). All ranks of `group` construct it
    together: it creates one subgroup per rank set in `barrier_sets` (in order), which
    is a collective call; `barrier(ranks)` then uses the subgroup of exactly `ranks`
    (a gloo monitored barrier, which names the rank that did not arrive)."""

    def __init__(self, group: Any = None, barrier_sets: Sequence[Sequence[int]] = ()):
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self._sub = {}
        for ranks in barrier_sets:
            key = tuple(sorted(ranks))
            self._sub[key] = dist.new_group(list(key), backend="gloo")
        self._pending: list = []

    def all_gather(self, obj, timeout):
        out = [None] * self.world
        try:
            self._dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise _typed(e, "all_gather") from e
        return out

    def send(self, dst, tag, array):
        import torch

        t = array.contiguous().view(-1).view(torch.uint8)  # gloo moves bytes of any dtype
        if t.device.type != "cpu":  # ...of host memory: a GPU-resident shard goes through it
            t = t.cpu()
        self._pending.append((self._dist.isend(t, dst, group=self.group, tag=tag), t))

    def recv(self, src, tag, out, timeout):
        try:
            import torch

            work = self._dist.irecv(out.view(-1).view(torch.uint8), src, group=self.group, tag=tag)
            if not work.wait(datetime.timedelta(seconds=timeout)):
                raise Timeout(f"recv from rank {src} (tag {tag}) took more than {timeout} s")
        except RuntimeError as e:
            raise _typed(e, f"recv from rank {src}") from e

    def barrier(self, ranks, timeout):
        g = self._sub.get(tuple(sorted(ranks)))
        if g is None:
            raise ValueError(f"no barrier group for ranks {sorted(ranks)}: pass it in barrier_sets")
        try:
            self._dist.monitored_barrier(group=g, timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            raise _typed(e, "barrier") from e

    def flush(self, timeout):
        try:
            for w, _ in self._pending:
                w.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            raise _typed(e, "send") from e
        finally:
            self._pending.clear()

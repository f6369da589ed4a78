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
import pickle
import time
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


class TorchExchange:
    """Exchange over torch.distributed (gloo), built from its point-to-point sends only,
    so that every wait has this call's deadline and names the rank it waited for.

    * ``all_gather``: every rank sends its pickled object's length, then the object, to
      every other rank and receives theirs (n - 1 sends and receives per rank; each rank
      sends its object n - 1 times, as in a ring all-gather).
    * ``barrier(ranks)``: every rank of `ranks` sends a one-byte token to each other one
      and waits for all of theirs.
    * ``send`` / ``recv`` / ``flush``: gloo's isend / irecv of the array's bytes.

    A rank that died makes the wait for it raise ``ferry.Unavailable`` naming it at once
    (gloo sees its connection close); the others' connections to each other stay up. A
    rank that is alive but does not call makes the wait for it raise ``ferry.Timeout``
    naming it at the deadline, and gloo then closes *all* of this rank's connections of
    the group ("Application timeout caused pair closure"): every later call on it raises
    ``ferry.Unavailable``, and the other ranks see this rank as gone (the process's other
    groups are not touched). Either error ends the transfer; a new one needs a new
    group (and a new exchange).

    Construct it on every rank of `group` with the same `barrier_sets` (their order
    numbers the barriers' tags); ``barrier(ranks)`` takes exactly one of those sets, and
    returns at once on a rank outside it. Ranks are ranks of `group` (None: the default
    group). Tags from 2**30 up are the exchange's own; ``send`` takes the ones below."""

    _OWN = 1 << 30  # tag bit of the exchange's own messages (the pipeline's tags stay below 2**27)

    def __init__(self, group: Any = None, barrier_sets: Sequence[Sequence[int]] = ()):
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        # isend/irecv take global ranks, with a group too (torch 1.13 and 2.x)
        self._global = [r if group is None else _global_rank(dist, group, r) for r in range(self.world)]
        self._sets = {}  # sorted ranks -> (channel, calls so far)
        for i, ranks in enumerate(barrier_sets):
            self._sets.setdefault(tuple(sorted(ranks)), [2 + i, 0])
        self._gathers = 0
        self._pending: list = []  # (work, tensor, dst) of send()
        self._kept: list = []  # works given up on: their buffers stay alive while gloo may touch them

    def _tag(self, channel: int, seq: int) -> int:
        return self._OWN | ((channel & 0x3FF) << 20) | (seq & 0xFFFFF)

    def _post(self, send: bool, peer: int, t, tag: int, what: str):
        op = self._dist.isend if send else self._dist.irecv
        try:
            return op(t, self._global[peer], group=self.group, tag=tag)
        except RuntimeError as e:
            raise _typed(e, what, peer, None) from e

    def _wait(self, work, deadline: float, peer: int, what: str, timeout: float) -> None:
        # gloo raises when the wait times out; a zero timedelta would mean "no timeout"
        ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            done = work.wait(datetime.timedelta(milliseconds=ms))
        except RuntimeError as e:
            raise _typed(e, what, peer, timeout) from e
        if done is False:
            raise Timeout(f"{what}: rank {peer} did not answer within {timeout} s")

    def _swap(self, peers: Sequence[int], sends: dict, recvs: dict, tag: int, deadline: float,
              what: str, timeout: float) -> None:
        """Post `sends[p]` to and `recvs[p]` from every peer p, wait for them all."""
        posted = []
        try:
            rw = [(p, self._post(False, p, recvs[p], tag, what)) for p in peers]
            posted += [w for _, w in rw]
            sw = [(p, self._post(True, p, sends[p], tag, what)) for p in peers]
            posted += [w for _, w in sw]
            for p, w in rw + sw:
                self._wait(w, deadline, p, what, timeout)
        except BaseException:
            self._kept.append((posted, sends, recvs))
            raise

    def all_gather(self, obj, timeout):
        torch, me = self._torch, self.rank
        deadline = time.monotonic() + timeout
        seq, self._gathers = self._gathers, self._gathers + 1
        payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
        peers = [p for p in range(self.world) if p != me]
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        sizes = {p: torch.zeros(1, dtype=torch.int64) for p in peers}
        self._swap(peers, {p: size for p in peers}, sizes, self._tag(0, seq), deadline, "all_gather", timeout)
        bufs = {p: bytearray(int(sizes[p].item())) for p in peers}
        views = {p: torch.frombuffer(bufs[p], dtype=torch.uint8) for p in peers}
        self._swap(peers, {p: payload for p in peers}, views, self._tag(1, seq), deadline, "all_gather", timeout)
        return [obj if p == me else pickle.loads(bufs[p]) for p in range(self.world)]

    def send(self, dst, tag, array):
        torch = self._torch
        if not 0 <= tag < self._OWN:
            raise ValueError(f"tag {tag}: send takes tags in [0, 2**30)")
        t = array.contiguous().view(-1).view(torch.uint8)  # gloo moves bytes of any dtype
        if t.device.type != "cpu":  # ...of host memory: a GPU-resident shard goes through it
            t = t.cpu()
        self._pending.append((self._post(True, dst, t, tag, f"send to rank {dst} (tag {tag})"), t, dst))

    def recv(self, src, tag, out, timeout):
        what = f"recv from rank {src} (tag {tag})"
        t = out.view(-1).view(self._torch.uint8)
        work = self._post(False, src, t, tag, what)
        try:
            self._wait(work, time.monotonic() + timeout, src, what, timeout)
        except BaseException:
            self._kept.append((work, t))
            raise

    def barrier(self, ranks, timeout):
        key = tuple(sorted(ranks))
        entry = self._sets.get(key)
        if entry is None:
            raise ValueError(f"no barrier for ranks {list(key)}: pass the set in barrier_sets")
        if self.rank not in key:
            return  # as torch's collectives on a group without this rank
        channel, seq = entry
        entry[1] += 1
        torch = self._torch
        peers = [p for p in key if p != self.rank]
        token = torch.zeros(1, dtype=torch.uint8)
        got = {p: torch.zeros(1, dtype=torch.uint8) for p in peers}
        self._swap(peers, {p: token for p in peers}, got, self._tag(channel, seq), time.monotonic() + timeout,
                   f"barrier of ranks {list(key)}", timeout)

    def flush(self, timeout):
        deadline = time.monotonic() + timeout
        pending, self._pending = self._pending, []
        for i, (w, _, dst) in enumerate(pending):
            try:
                self._wait(w, deadline, dst, f"send to rank {dst}", timeout)
            except BaseException:
                self._kept.append(pending[i:])
                raise


def _global_rank(dist, group, r: int) -> int:
    get = getattr(dist, "get_global_rank", None)  # torch 2.x
    if get is None:
        get = dist.distributed_c10d._get_global_rank  # torch 1.13
    return get(group, r)


def _typed(e: BaseException, what: str, peer: int, timeout: Optional[float]) -> Exception:
    """gloo's RuntimeError as a ferry error: its own timeout ("Timed out waiting ... ms")
    -> Timeout; the group closed after an earlier timeout -> Unavailable; anything else
    (the peer's connection closed or reset) -> Unavailable naming the peer."""
    text = str(e)
    low = text.lower()
    if "pair closure" in low:
        return Unavailable(f"{what}: this rank's connections of the group were closed after an earlier "
                           f"timeout: {text}")
    if "timed out" in low or "timeout" in low:
        return Timeout(f"{what}: rank {peer} did not answer within {timeout} s: {text}")
    return Unavailable(f"{what}: rank {peer} left (or closed the group after a timeout of its own): {text}")

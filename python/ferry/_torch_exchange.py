"""Bounded rendezvous over a torch.distributed group: gloo point-to-point sends only.

torch's ``all_gather_object`` and ``barrier`` wait out the process group's own timeout
(30 min by default) when a rank is gone or does not call. ``TorchExchange`` builds an
all-gather, a barrier and point-to-point sends from gloo's ``isend`` / ``irecv``, each
wait bounded by the call's deadline and failing with a ferry error naming the rank it
waited for: ``ferry.Unavailable`` (the rank left) or ``ferry.Timeout`` (the deadline
passed). ``gloo_group`` gives a gloo group over the ranks of a group of another backend
(NCCL), for those sends. Used by ``ferry.rl.exchange`` (where ``TorchExchange`` is
public) and ``ferry.moe``.
"""

from __future__ import annotations

import datetime
import inspect
import pickle
import time
from typing import Any, Optional, Sequence

from ._errors import Timeout, Unavailable


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
    groups are not touched). Either error ends what the group served (a transfer, an
    AllToAll); a new one needs a new group (and a new exchange).

    Construct it on every rank of `group` with the same `barrier_sets` (their order
    numbers the barriers' tags); ``barrier(ranks)`` takes exactly one of those sets, and
    returns at once on a rank outside it. Ranks are ranks of `group` (None: the default
    group). Tags from 2**30 up are the exchange's own; ``send`` takes the ones below."""

    _OWN = 1 << 30  # tag bit of the exchange's own messages (ferry.rl's pipeline tags stay below 2**27)

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


def gloo_group(group: Any = None, timeout: float = 60.0) -> Any:
    """A gloo group over the ranks of `group` (None: the default group), for ``TorchExchange``.

    `group` itself when its backend is gloo. Otherwise (NCCL, or a group of several
    backends) a gloo group over the same ranks, made at the first call for those ranks and
    kept for the later ones (``forget_gloo_group`` drops it). Making it is collective, with
    `timeout` as its deadline: every rank of `group` calls; when `group` is not the whole
    default group, so do all the other ranks of the default group unless torch's
    ``new_group`` takes ``use_local_synchronization`` (torch 2.1 and later; before, a
    strict subgroup raises ``ValueError``: pass a gloo group over the ranks instead).
    Failing to make it raises ``ferry.Timeout`` (a rank did not come in time) or
    ``ferry.Unavailable``."""
    import torch.distributed as dist

    if str(dist.get_backend(group)) == "gloo":
        return group
    world = dist.get_world_size(group)
    ranks = tuple(_global_rank(dist, group, r) for r in range(world))
    default = dist.group.WORLD
    key = (id(default), ranks)
    if key in _made:  # (the entry holds the default group: its id is not reused)
        return _made[key][1]
    kw: dict = {}
    if world < dist.get_world_size():
        if "use_local_synchronization" not in inspect.signature(dist.new_group).parameters:
            raise ValueError(
                f"the group of ranks {list(ranks)} uses {dist.get_backend(group)}, not gloo, and this torch "
                "cannot make a gloo group over a subset of the ranks without every other rank: pass a gloo "
                "group over the same ranks (torch.distributed.new_group(ranks, backend='gloo'))")
        kw["use_local_synchronization"] = True
    try:
        made = dist.new_group(list(ranks), timeout=datetime.timedelta(seconds=timeout), backend="gloo", **kw)
    except RuntimeError as e:
        what = f"making a gloo group over ranks {list(ranks)}"
        low = str(e).lower()
        if "timed out" in low or "timeout" in low:
            raise Timeout(f"{what}: not every rank came within {timeout} s: {e}") from e
        raise Unavailable(f"{what}: {e}") from e
    if dist.get_rank(made) != dist.get_rank(group):
        raise ValueError(f"the gloo group over ranks {list(ranks)} numbers its ranks differently from the "
                         "group: pass a gloo group instead")
    _made[key] = (default, made)
    return made


def forget_gloo_group(made: Any) -> None:
    """Drop a group ``gloo_group`` made (after a failure on it: gloo closed its
    connections), so that the next call makes a new one; any other group: nothing."""
    for key, (_, g) in list(_made.items()):
        if g is made:
            del _made[key]


_made: dict = {}  # (id of the default group, global ranks) -> (default group, gloo group made for them)


def _global_rank(dist, group, r: int) -> int:
    if group is None or group is dist.group.WORLD:
        return r
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

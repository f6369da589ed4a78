"""ferry.moe's rendezvous on real gloo ranks, without a GPU: 4 rank processes (spawn),
FileStore. What ``AllToAll`` calls at construction and in ``destroy`` (``_Rendezvous``:
its gathers and barriers, ``_agree``: the first step), and ``AllToAll`` itself up to that
first step, which comes before anything touches CUDA.

One run of the 4 ranks (module fixture), in phases the test process orders through pipes:

A. every call delivers: the first step (host names; rank r's immediates counter r ahead,
   every rank agrees on the largest), a gather of descriptor-sized bytes, a barrier; the
   same over a group that is not gloo (the backend reported as nccl): a gloo group over
   its ranks is made once and kept for the next AllToAll;
B. rank 3 stays alive but does not call: a gather, a barrier, making the gloo group for
   a non-gloo group, and an AllToAll construction each raise Timeout naming rank 3 (the
   group: not every rank came) at the deadline, not before; the next gather on the
   timed-out group raises Unavailable at once;
C. rank 3 is killed (SIGKILL) while ranks 0-2 wait in a gather (deadline 30 s): each
   raises Unavailable naming rank 3 within seconds; so do a barrier and an AllToAll
   construction over the default group afterwards.

Skipped where torch (or its gloo backend) is absent.
"""

from __future__ import annotations

import datetime
import inspect
import os
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import ferry  # noqa: E402
from proc_world import ProcWorld  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed without gloo", allow_module_level=True)

WORLD = 4
SILENT = 3  # the rank that stays away in B and is killed in C
T_SILENT = 2.0  # deadline of the calls that wait for the silent rank
T_LONG = 30.0  # deadline of the calls that wait for the killed rank (they must fail long before)
SLACK = 3.0


def info(r: int) -> bytes:
    """About an engine descriptor's size, different per rank."""
    return bytes((r * 7 + i) % 256 for i in range(3000 + 100 * r))


def _call(fn):
    """('ok', result, seconds) or ('raised', class name, message, seconds)."""
    t0 = time.monotonic()
    try:
        out = fn()
        return ("ok", out, time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - reported to the test process
        return ("raised", type(e).__name__, str(e), time.monotonic() - t0)


def _a2a(moe, group, timeout):
    """An AllToAll of a small shape; with a rank missing it fails in its first step."""
    return moe.AllToAll(max_num_tokens=16, num_experts=8, experts_per_token=2, hidden=128, group=group,
                        device="cuda:0", provider="shm", timeout=timeout)


class _LooksNccl:
    """While active, every group reports the backend nccl to the code under test."""

    def __enter__(self):
        self.real = dist.get_backend
        dist.get_backend = lambda group=None: "nccl"

    def __exit__(self, *exc):
        dist.get_backend = self.real


def rank_main(rank: int, store_path: str, conn) -> None:
    try:
        import socket

        import ferry.moe as moe
        from ferry import _torch_exchange

        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        groups = [dist.new_group(list(range(WORLD)), backend="gloo") for _ in range(3)]  # B's, then unusable

        # A: delivery
        for _ in range(rank):
            next(moe._instances)
        rv = moe._Rendezvous(None, 20)
        hosts, instance = moe._agree(rv)
        res = {"hosts": hosts, "host": socket.gethostname(), "instance": instance,
               "next": next(moe._instances), "world": (rv.rank, rv.world)}
        res["infos"] = rv.all_gather(info(rank), "a test gather")
        rv.barrier("a test barrier")
        with _LooksNccl():
            made = [moe._Rendezvous(dist.group.WORLD, 20) for _ in range(2)]
            res["made_once"] = made[0]._group is made[1]._group
            res["made_is_new"] = made[0]._group not in (None, dist.group.WORLD)
            res["made_gather"] = made[1].all_gather(rank * 10, "a test gather")
            made[0].barrier("a test barrier")
        if "use_local_synchronization" not in inspect.signature(dist.new_group).parameters:
            # a strict subgroup that is not gloo: this torch cannot make its gloo group with
            # its ranks alone, which is said at once
            sub = dist.new_group([0, 1], backend="gloo")
            if rank < 2:
                with _LooksNccl():
                    res["subgroup"] = _call(lambda: moe._Rendezvous(sub, 20))
        _torch_exchange.forget_gloo_group(made[0]._group)  # B makes it again, without rank 3
        conn.send(("A", res))
        if rank == SILENT:
            conn.recv()  # alive, calling nothing, until the test process kills it in C
            return

        # B: rank 3 does not call
        gather = moe._Rendezvous(groups[0], T_SILENT)
        b = {"gather": _call(lambda: gather.all_gather(rank, "a test gather")),
             "after": _call(lambda: gather.all_gather(rank, "a test gather")),
             "barrier": _call(lambda: moe._Rendezvous(groups[1], T_SILENT).barrier("a test barrier")),
             "a2a": _call(lambda: _a2a(moe, groups[2], T_SILENT))}
        with _LooksNccl():
            b["make"] = _call(lambda: moe._Rendezvous(None, T_SILENT))
        conn.send(("B", b))

        # C: rank 3 is killed while the others wait for it
        conn.send(("entering C", None))
        rv = moe._Rendezvous(None, T_LONG)
        c = {"gather": _call(lambda: rv.all_gather(rank, "a test gather")),
             "barrier": _call(lambda: moe._Rendezvous(None, T_LONG).barrier("a test barrier")),
             "a2a": _call(lambda: _a2a(moe, None, T_LONG))}
        conn.send(("C", c))
    except BaseException as e:  # noqa: BLE001
        import traceback

        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        conn.close()
        # gloo's teardown with a dead peer is not what is tested: leave without it
        os._exit(0)


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    w = ProcWorld(WORLD, rank_main, str(tmp_path_factory.mktemp("gloo") / "store"))
    out = {}
    try:
        out["A"] = [w.expect(r, "A", 120) for r in range(WORLD)]  # includes starting torch
        t0 = time.monotonic()
        out["B"] = [w.expect(r, "B", 5 * (T_SILENT + SLACK)) for r in range(SILENT)]
        out["B_s"] = time.monotonic() - t0
        for r in range(SILENT):
            w.expect(r, "entering C", 10)
        out["silent_alive"] = w.procs[SILENT].is_alive()
        w.procs[SILENT].kill()
        w.procs[SILENT].join(10)
        out["C"] = [w.expect(r, "C", T_LONG) for r in range(SILENT)]
        yield out
    finally:
        w.close()


def _raised(res, cls: str, *, within: float, at_least: float = 0.0):
    assert res[0] == "raised", res
    _, name, msg, secs = res
    assert name == cls, res
    assert at_least <= secs <= within, res
    return msg


def test_delivery(phases):
    a = phases["A"]
    host = a[0]["host"]
    for r, res in enumerate(a):
        assert res["world"] == (r, WORLD)
        assert res["hosts"] == [host] * WORLD, r
        # rank 3's counter was 3 ahead: every rank takes its next value, and continues past it
        assert res["instance"] == WORLD - 1, (r, res["instance"])
        assert res["next"] == WORLD, (r, res["next"])
        assert res["infos"] == [info(q) for q in range(WORLD)], r
        assert res["made_once"] and res["made_is_new"], r
        assert res["made_gather"] == [10 * q for q in range(WORLD)], r
        if "subgroup" in res:  # torch without use_local_synchronization, ranks 0 and 1
            msg = _raised(res["subgroup"], "ValueError", within=SLACK)
            assert "pass a gloo group" in msg, msg


def test_silent_rank_times_out(phases):
    """B: Timeout naming rank 3 at the deadline, not before, not much after."""
    assert phases["silent_alive"]
    for r, res in enumerate(phases["B"]):
        for op in ("gather", "barrier", "a2a"):
            msg = _raised(res[op], ferry.Timeout.__name__, at_least=T_SILENT - 0.05, within=T_SILENT + SLACK)
            assert "rank 3" in msg and "ferry.moe AllToAll" in msg, (op, msg)
        assert "agreeing on the node size" in res["a2a"][2], res["a2a"]
        # the timeout closed the group's connections: the next call fails at once
        _raised(res["after"], ferry.Unavailable.__name__, within=SLACK)
        msg = _raised(res["make"], ferry.Timeout.__name__, at_least=T_SILENT - 0.05, within=2 * T_SILENT + SLACK)
        assert "gloo group over ranks [0, 1, 2, 3]" in msg, msg
    print(f"\nB: silent rank, deadline {T_SILENT} s: "
          + "; ".join(f"rank {r}: " + ", ".join(f"{op} {res[op][-1]:.2f} s" for op in ("gather", "after", "barrier",
                                                                                      "a2a", "make"))
                      for r, res in enumerate(phases["B"])))
    assert phases["B_s"] < 5 * (T_SILENT + SLACK)


def test_killed_rank_is_unavailable(phases):
    """C: Unavailable naming rank 3 within seconds (the deadline is 30 s)."""
    for r, res in enumerate(phases["C"]):
        for op in ("gather", "barrier", "a2a"):
            msg = _raised(res[op], ferry.Unavailable.__name__, within=10)
            assert "rank 3" in msg and "ferry.moe AllToAll" in msg, (r, op, msg)
    print(f"\nC: killed rank, deadline {T_LONG} s: "
          + "; ".join(f"rank {r}: " + ", ".join(f"{op} {res[op][-1]:.2f} s" for op in ("gather", "barrier", "a2a"))
                      for r, res in enumerate(phases["C"])))

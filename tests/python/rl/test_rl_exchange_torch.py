"""TorchExchange over a real gloo group: 4 rank processes (spawn), FileStore rendezvous.

One run of the 4 ranks (module fixture), in phases the test process orders through pipes:

A. every call delivers: two all-gathers, sends of three dtypes around the ring received
   in the opposite tag order, flush, barriers over all ranks and over two pairs;
B. rank 3 stays alive but does not call: the all-gather of ranks 0-2 raises Timeout
   naming it at the deadline; the next call on that group raises Unavailable at once (gloo
   closed the group's connections at the timeout);
C. the same on another group: recv from rank 3, send to it + flush, a barrier with it;
D. rank 3 is killed (SIGKILL) while ranks 0-2 wait in an all-gather (deadline 30 s): each
   raises Unavailable naming rank 3 within seconds; later calls that involve rank 3 do
   too, and a barrier of ranks 0 and 1 still passes.

Skipped where torch (or its gloo backend) is absent.
"""

from __future__ import annotations

import datetime
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
SILENT = 3  # the rank that stays away in B and C, and is killed in D
T_SILENT = 2.0  # deadline of the calls that wait for the silent rank
T_LONG = 30.0  # deadline of the calls that wait for the killed rank (they must fail long before)
SLACK = 3.0


def gathered(r: int):
    return {"rank": r, "blob": bytes(range(256)) * (1 + 400 * r), "tuple": (r, "x" * r, [r] * r)}


def ring_tensors(r: int):
    """What rank r sends to rank r + 1, by tag."""
    base = torch.arange(1000, dtype=torch.float32) * (r + 1)
    return {5: base, 6: (base - 500).to(torch.int16), 7: (base / 7).to(torch.bfloat16).reshape(10, 100)}


def _call(fn):
    """('ok', result, seconds) or ('raised', class name, message, seconds)."""
    t0 = time.monotonic()
    try:
        out = fn()
        return ("ok", out, time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - reported to the test process
        return ("raised", type(e).__name__, str(e), time.monotonic() - t0)


def rank_main(rank: int, store_path: str, conn) -> None:
    try:
        from ferry.rl.exchange import TorchExchange

        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        g1 = dist.new_group(list(range(WORLD)), backend="gloo")  # B's, then unusable
        g2 = dist.new_group(list(range(WORLD)), backend="gloo")  # C's, then unusable
        ex = TorchExchange(None, barrier_sets=[range(WORLD), [0, 1], [2, 3]])
        ex1 = TorchExchange(g1)
        ex2 = TorchExchange(g2, barrier_sets=[[2, 3]])

        # A: delivery
        res = {"gather1": ex.all_gather(gathered(rank), 20),
               "gather2": ex.all_gather({"sched": list(range(50))} if rank == 0 else None, 20)}
        nxt, prv = (rank + 1) % WORLD, (rank - 1) % WORLD
        for tag, t in ring_tensors(rank).items():
            ex.send(nxt, tag, t)
        got = {}
        for tag, like in sorted(ring_tensors(prv).items(), reverse=True):
            out = torch.zeros_like(like)
            ex.recv(prv, tag, out, 20)
            got[tag] = torch.equal(out, like)
        ex.flush(20)
        res["ring"] = got
        ex.barrier(range(WORLD), 20)
        ex.barrier([0, 1] if rank < 2 else [2, 3], 20)
        ex.barrier(range(WORLD), 20)
        res["not_member"] = ex.barrier([2, 3] if rank < 2 else [0, 1], 20)  # returns at once
        conn.send(("A", res))
        if rank == SILENT:
            conn.recv()  # alive, calling nothing, until the test process kills it in D
            return

        # B: rank 3 does not call the all-gather
        b = {"gather": _call(lambda: ex1.all_gather(rank, T_SILENT)),
             "after": _call(lambda: ex1.all_gather(rank, T_SILENT))}
        # C: nor receive what rank 1 sends, send what rank 0 waits for, or come to the barrier of 2 and 3
        c = {}
        if rank == 0:
            c["recv"] = _call(lambda: ex2.recv(SILENT, 7, torch.zeros(16), T_SILENT))
        elif rank == 1:
            ex2.send(SILENT, 7, torch.ones(16))
            c["flush"] = _call(lambda: ex2.flush(T_SILENT))
        else:
            c["barrier"] = _call(lambda: ex2.barrier([2, 3], T_SILENT))
        conn.send(("BC", {"B": b, "C": c}))

        # D: rank 3 is killed while the others wait for it
        conn.send(("entering D", None))
        d = {"gather": _call(lambda: ex.all_gather(rank, T_LONG))}
        d["recv"] = _call(lambda: ex.recv(SILENT, 8, torch.zeros(16), T_LONG))
        d["send+flush"] = _call(lambda: (ex.send(SILENT, 9, torch.ones(16)), ex.flush(T_LONG)))
        d["barrier"] = _call(lambda: ex.barrier(range(WORLD), T_LONG))
        if rank < 2:
            d["barrier01"] = _call(lambda: ex.barrier([0, 1], T_LONG))
        conn.send(("D", d))
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
        out["BC"] = [w.expect(r, "BC", 2 * (T_SILENT + SLACK)) for r in range(SILENT)]
        out["BC_s"] = time.monotonic() - t0
        for r in range(SILENT):
            w.expect(r, "entering D", 10)
        out["silent_alive"] = w.procs[SILENT].is_alive()  # others' timeouts closed its connections
        w.procs[SILENT].kill()
        w.procs[SILENT].join(10)
        out["D"] = [w.expect(r, "D", T_LONG) for r in range(SILENT)]
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
    expect1 = [gathered(r) for r in range(WORLD)]
    expect2 = [{"sched": list(range(50))}] + [None] * (WORLD - 1)
    for r, res in enumerate(phases["A"]):
        assert res["gather1"] == expect1, r
        assert res["gather2"] == expect2, r
        assert res["ring"] == {5: True, 6: True, 7: True}, r
        assert res["not_member"] is None


def test_silent_rank_times_out(phases):
    """B and C: Timeout naming rank 3 at the deadline, not before, not much after."""
    assert phases["silent_alive"]
    for r, res in enumerate(phases["BC"]):
        msg = _raised(res["B"]["gather"], ferry.Timeout.__name__, at_least=T_SILENT - 0.05, within=T_SILENT + SLACK)
        assert "rank 3" in msg, msg
        # the timeouts closed the group's connections: the next call fails at once ("pair
        # closure" after this rank's own timeout, or "closed by peer" after another's first)
        _raised(res["B"]["after"], ferry.Unavailable.__name__, within=SLACK)
        (op, got), = res["C"].items()
        msg = _raised(got, ferry.Timeout.__name__, at_least=T_SILENT - 0.05, within=T_SILENT + SLACK)
        assert "rank 3" in msg, (op, msg)
    assert phases["BC_s"] < 2 * (T_SILENT + SLACK)


def test_killed_rank_is_unavailable(phases):
    """D: Unavailable naming rank 3 within seconds (the deadline is 30 s)."""
    for r, res in enumerate(phases["D"]):
        for op in ("gather", "recv", "send+flush", "barrier"):
            msg = _raised(res[op], ferry.Unavailable.__name__, within=10)
            assert "rank 3" in msg, (r, op, msg)
        if r < 2:
            assert res["barrier01"][0] == "ok", res["barrier01"]

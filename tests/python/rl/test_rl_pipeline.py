"""The weight-transfer pipeline across processes over tcp;ofi_rxm: 2 trainer ranks
(FSDP shards, expert parallel slices) and 2 inference ranks (TP2 / EP2, fp8)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import threading
import time

import pytest

pytest.importorskip("ml_dtypes")
sys.path.insert(0, os.path.dirname(__file__))

import rl_ranks  # noqa: E402
from hub import Hub  # noqa: E402


def _ranks(case: dict) -> tuple[int, int]:
    """(trainer ranks, inference ranks) of a case."""
    T = 1
    for v in case["trainer"].values():
        T *= v if isinstance(v, int) and not isinstance(v, bool) else 1
    return T, case["inference"].get("instances", 1) * case["inference"]["ep"]


def run_ranks(case: dict, wait: float = 120.0):
    """The case's ranks as spawned processes, or (case["threads"]) as threads of this
    process over the in-process fake NIC: what needs peers that share this process's
    memory (mapped writes). Returns their reports and the processes (threads: stand-ins
    with exitcode 0)."""
    threads = bool(case.get("threads"))
    if threads:
        ctx, spawn, results = mp, threading.Thread, queue.Queue()
    else:
        ctx = mp.get_context("spawn")
        spawn, results = ctx.Process, ctx.Queue()
    T, I = _ranks(case)
    hub = Hub(ctx, T + I)
    ranks = []
    for w in range(T + I):
        role, idx = ("trainer", w) if w < T else ("inference", w - T)
        ranks.append(spawn(target=rl_ranks.main, args=(role, idx, w, hub.child_conns[w], results, case),
                           daemon=True))
    for r in ranks:
        r.start()
    hub.start(close_children=not threads)
    expect = T + I - (1 if case.get("die") else 0)
    out = []
    deadline = time.monotonic() + wait
    try:
        while len(out) < expect:
            out.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for r in ranks:
            r.join(timeout=30)
            if r.is_alive() and not threads:
                r.kill()
                r.join()
    assert not any(r.is_alive() for r in ranks)
    crashes = [r for r in out if r[2] == "crash"]
    assert not crashes, crashes[0][3]
    return out, [_Done() for _ in ranks] if threads else ranks


class _Done:
    exitcode = 0


CASE = dict(provider="tcp", model="tiny-qwen3-moe", trainer=dict(pp=1, ep=2, fsdp=1),
            inference=dict(instances=1, ep=2, tp=2), watermark=512 << 10, steps=2, timeout=60.0)


# default: the tiny model's pieces are mostly under DIRECT_MIN_BYTES, so most of the
# dense mesh's jobs are gathered; "direct": FSDP over both trainers and every cut allowed, so each rank
# writes its own rows; "gather": the seed's way, every piece on one owner
MODES = {"default": {}, "direct": dict(trainer=dict(pp=1, ep=1, fsdp=2), sender=dict(direct_min_bytes=1)),
         "gather": dict(sender=dict(direct=False)),
         # all direct, the shards kept in place, the device work captured after step 0 and
         # replayed (tests/python/rl/replay_backend.py), the ring small enough to be reused
         "graphs": dict(trainer=dict(pp=1, ep=1, fsdp=2), sender=dict(direct_min_bytes=1, graphs=True),
                        replay=True, steps=3),
         # the same with the shards offloaded: every piece copied, strided ones (column
         # slices for tensor parallelism) through host buffers refilled before each replay
         "graphs-offload": dict(trainer=dict(pp=1, ep=1, fsdp=2), sender=dict(direct_min_bytes=1, graphs=True),
                                replay="offload", steps=3),
         # the writes as stores into the inference memory mapped into the trainers'
         # process (ranks as threads over the fake NIC), only immediates through the engine;
         # default layout (rows sent between trainers), then replayed as graphs
         "mapped": dict(provider="fake", threads=True, sender=dict(mapped=True)),
         "mapped-graphs": dict(provider="fake", threads=True, trainer=dict(pp=1, ep=1, fsdp=2),
                               sender=dict(direct_min_bytes=1, graphs=True, mapped=True), replay=True, steps=3)}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_two_trainers_two_inference_bit_exact(tmp_path, mode):
    out, procs = run_ranks(dict(CASE, trace_dir=str(tmp_path), **MODES[mode]))
    inf = sorted((r for r in out if r[0] == "inference"), key=lambda r: r[1])
    tr = sorted((r for r in out if r[0] == "trainer"), key=lambda r: r[1])
    assert [r[2] for r in tr] == ["ok", "ok"], tr
    assert len({r[4][0] for r in tr} | {r[4] for r in inf}) == 1  # one schedule everywhere
    direct_jobs = tr[0][4][2]  # jobs that one rank of a larger sub-mesh writes from its own rows
    assert direct_jobs > 0 if mode == "direct" else True, direct_jobs
    assert direct_jobs == 0 if mode == "gather" else True, direct_jobs
    if mode != "direct":
        assert any(st["gather"] > 0 for r in tr for _, st, *_ in r[3])
    for r in inf:
        report = r[3]
        assert [x[0] for x in report] == list(range(MODES[mode].get("steps", CASE["steps"])))
        for step, status, bad, names, stale in report:
            assert status == "ok" and bad == [] and not stale, (r[1], step, bad)
        names = report[0][3]
        assert any("qkv_proj.weight_scale_inv" in n for n in names)  # fused and quantised
        assert any("w13_weight" in n for n in names) and any("gate_up_proj" in n for n in names)
    # mapped where asked, and nowhere else (tcp cannot map: the writes go through the engine)
    assert all(r[4][4] == mode.startswith("mapped") for r in tr), [r[4] for r in tr]
    if mode.startswith("mapped"):  # jobs converted straight into a destination, others copied there
        assert all(r[4][6] > 0 for r in tr), [r[4] for r in tr]
        assert any(r[4][7] > 0 for r in tr), [r[4] for r in tr]
    if mode == "graphs-offload":  # strided pieces went through host buffers
        assert all(r[4][3] > 0 for r in tr), [r[4] for r in tr]
    for r in tr:
        replays = mode.startswith("graphs") or mode == "mapped-graphs"
        assert [x[7] for x in r[3]] == ([False, True, True] if replays else [False] * len(r[3]))
        for wall, stages, peak, jobs, writes, nev, submits, replayed in r[3]:
            if mode in ("direct", "graphs", "graphs-offload", "mapped-graphs"):  # nothing sent to another trainer
                assert stages["send"] == 0, stages
            assert 0 < peak <= CASE["watermark"]
            assert jobs > 0 and writes >= jobs and nev > 0
            assert 0 < submits <= jobs
            if mode != "gather":  # runs of norms that receive no rows: one prepared scatter each
                assert submits < jobs, (submits, jobs)
    assert all(p.exitcode == 0 for p in procs)
    # Each trainer's stages went into its engine's trace, beside the engine's own spans
    # of the scatters they posted: one span per stage event and one per step.
    import json

    for r in tr:
        with open(tmp_path / f"trainer{r[1]}.json") as f:
            events = json.load(f)["traceEvents"]
        tracks = {ev["args"]["name"] for ev in events if ev.get("ph") == "M" and ev["name"] == "thread_name"}
        assert {"rl step", "rl post", "rl write"} <= tracks, tracks
        spans = [ev for ev in events if ev.get("ph") == "X"]
        names = {f"step {k}" for k in range(len(r[3]))}
        steps = [ev for ev in spans if ev["name"] in names]
        assert len(steps) == len(r[3])
        # (a stage that took no time at all is written as an instant event)
        stage_events = [ev for ev in events if ev.get("ph") in ("X", "i") and ev["name"].startswith("step ")
                        and ev["name"] not in names]
        assert len(stage_events) == sum(x[5] for x in r[3])
        assert [ev for ev in spans if ev["name"] == "prepared"]  # the prepared scatters


def test_watermark_below_a_job_is_a_typed_error_on_every_rank():
    out, procs = run_ranks(dict(CASE, watermark=64 << 10, steps=1))
    for r in out:
        assert r[2] == "setup_error" and r[3] == "InvalidArgument" and "watermark" in r[4], r


def test_trainer_dying_mid_step_is_a_typed_error_and_marks_weights_stale():
    case = dict(CASE, model="tiny-deepseek-v3", steps=2, timeout=20.0, die=(1, 1, 2), watermark=2 << 20)
    t0 = time.monotonic()
    out, procs = run_ranks(case, wait=90)
    tr = [r for r in out if r[0] == "trainer"]
    inf = sorted((r for r in out if r[0] == "inference"), key=lambda r: r[1])
    assert len(tr) == 1 and tr[0][1] == 0
    assert tr[0][2] == "error" and tr[0][3] == "Unavailable" and "rank 1 left" in tr[0][4], tr
    assert tr[0][5] < case["timeout"]  # typed error well within the step's deadline
    for r in inf:
        (_, st0, bad0, _, _), last = r[3][0], r[3][-1]
        assert st0 == "ok" and bad0 == []  # step 0 arrived whole
        assert last[0] == 1 and last[1] == "error" and last[2] == "Aborted", last  # told by trainer 0
        assert last[3] is True  # stale: step 1 began and did not finish
        assert last[4] < case["timeout"]
    assert time.monotonic() - t0 < case["timeout"] + 60
    assert procs[1].exitcode == 17


def test_a_job_is_converted_in_one_pass_only_where_no_block_spans_two_parts():
    from ferry.rl import model as M
    from ferry.rl import schedule as S
    from ferry.rl.meta import InferenceMeta, TrainerMeta
    from ferry.rl.pipeline import _one_pass

    def jobs(cfg):
        tl, il = M.TrainerLayout(fsdp=2), M.InferenceLayout(ep=2, tp=2)
        blocks = M.trainer_blocks(cfg, tl)
        tm = [TrainerMeta(r, 1, tuple(b for b in blocks if r in b.mesh)) for r in range(2)]
        im = [InferenceMeta(r, tuple(M.inference_recipes(cfg, il, r))) for r in range(il.world)]
        return S.build(tm, im, 4 << 20, direct_min_bytes=1).jobs

    w13 = [j for j in jobs(M.TINY_QWEN3) if j.recipe.endswith("w13_weight")]
    assert w13 and all(_one_pass(j) for j in w13)  # gate and up of each expert, 128 rows each
    ragged = [j for j in jobs(M.TINY_DSV3) if len(j.parts) > 1 and any(p.rows % 128 for p, _ in j.parts[:-1])]
    assert ragged and not any(_one_pass(j) for j in ragged)  # MLA's 576-row kv_a part

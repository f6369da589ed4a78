"""Rank processes of the pipeline test: 2 trainers and 2 inference ranks of a small
transformer-shaped model, weights as NumPy arrays (bf16 / fp8 through ml_dtypes)."""

from __future__ import annotations

import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/python: conftest
sys.path.insert(0, os.path.dirname(__file__))


def logical_weights(cfg, step: int) -> dict:
    """The full model of training step `step` (every rank derives it from a seed)."""
    import ml_dtypes

    from ferry.rl.model import logical_params

    rng = np.random.default_rng(1000 + step)
    out = {}
    for name, (shape, dt, _, _) in logical_params(cfg).items():
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.05)
        out[name] = a.astype(ml_dtypes.bfloat16 if dt == "bfloat16" else np.float32)
    return out


def reference(cfg, recipes, full) -> dict:
    """Each inference tensor converted directly from the full weights."""
    from ferry.rl.meta import rows_cols
    from ferry.rl.quant import np_dtype, quantize_np

    out = {}
    for r in recipes:
        pieces = []
        for p in r.parts:
            w = full[p.param]
            w2 = w.reshape(rows_cols(w.shape))
            pieces.append(w2[p.r0:p.r1, p.c0:p.c1])
        if r.quantised:
            qs = [quantize_np(x) for x in pieces]
            out[r.name] = np.concatenate([q for q, _ in qs]).reshape(r.shape)
            out[r.scale] = np.concatenate([s for _, s in qs]).reshape(r.scale_shape)
        else:
            out[r.name] = np.concatenate(pieces).astype(np_dtype(r.dtype)).reshape(r.shape)
    return out


def main(role: str, idx: int, world_rank: int, conn, results, case: dict) -> None:
    try:
        import ferry
        from conftest import engine_for
        from ferry.rl import model as M
        from ferry.rl.pipeline import WeightSender
        from ferry.rl.receiver import WeightReceiver
        from ferry.rl.quant import np_dtype
        from hub import PipeExchange

        cfg = M.MODELS[case["model"]]
        tl = M.TrainerLayout(**case["trainer"])
        il = M.InferenceLayout(**case["inference"])
        T, I = tl.world, il.world
        ex = PipeExchange(world_rank, T + I, conn)
        kw = {}
        if case.get("trace_dir") and role == "trainer":
            kw["trace"] = os.path.join(case["trace_dir"], f"trainer{idx}.json")
        if case["provider"] == "fake":  # ranks as threads of one process (run_ranks, "threads")
            eng = ferry.TransferEngine("fake", nics=["fake"], default_timeout=case["timeout"], **kw)
        else:
            eng = engine_for(case["provider"], default_timeout=case["timeout"], **kw)
        steps = case["steps"]
        if role == "trainer":
            blocks = [b for b in M.trainer_blocks(cfg, tl) if idx in b.mesh]
            die = case.get("die")

            def after_post(step, jid, n=[0]):
                if die and die[0] == idx and step == die[1]:
                    n[0] += 1
                    if n[0] >= die[2]:
                        os._exit(17)  # a trainer dies mid-step

            backend = None
            if case.get("replay"):  # capture and replay, as CUDA graphs do, on host memory
                from replay_backend import ReplayBackend

                backend = ReplayBackend(offload=case["replay"] == "offload")
            snd = WeightSender(eng, ex, rank=idx, blocks=blocks, trainer_ranks=range(T),
                               inference_ranks=range(T, T + I), watermark=case["watermark"],
                               after_post=after_post, backend=backend, **case.get("sender", {}))
            try:
                sched = snd.setup(case["timeout"])
            except ferry.FerryError as err:
                results.put(("trainer", idx, "setup_error", type(err).__name__, str(err)))
                return
            stats = []
            shards: dict = {}
            for step in range(steps):
                full = logical_weights(cfg, step)
                if not case.get("replay"):  # fresh shard arrays every step; else written in place
                    shards = {}
                for b in blocks:
                    from ferry.rl.meta import rows_cols

                    a, e = b.shard_rows(idx)
                    w2 = full[b.name].reshape(rows_cols(full[b.name].shape))
                    new = w2[b.row0 + a:b.row0 + e]
                    if (b.name, b.row0) in shards:
                        shards[(b.name, b.row0)][...] = new
                    else:
                        shards[(b.name, b.row0)] = np.ascontiguousarray(new)
                try:
                    ex.barrier(range(T + I), case["timeout"])  # the inference ranks are ready
                    t0 = time.monotonic()
                    stats.append(snd.step(step, shards, case["timeout"]))
                except ferry.FerryError as err:
                    results.put(("trainer", idx, "error", type(err).__name__, str(err), time.monotonic() - t0))
                    return
            snd.issue_conversions(shards)  # what gpu_bench times alone: must run after any step
            direct = sum(len(j.holders) == 1 and len(j.mesh) > 1 for j in sched.jobs)
            results.put(("trainer", idx, "ok", [(s.wall_s, s.stages, s.peak_temp_bytes, s.jobs, s.writes,
                                                 len(s.events), s.submits, s.replayed) for s in stats],
                         (sched.digest(), len(sched.jobs), direct, getattr(backend, "staged", 0),
                          snd.mapping is not None, snd.map_error, len(snd._homes),
                          sum(len(c[0]) for c in snd._copies.values()))))
        else:
            recipes = M.inference_recipes(cfg, il, idx)
            tensors = {n: np.zeros(shape, dtype=np_dtype(dt)) for n, shape, dt in M.tensor_specs(recipes)}
            rcv = WeightReceiver(eng, ex, rank=idx, tensors=tensors, recipes=recipes)
            try:
                sched = rcv.setup(case["timeout"])
            except ferry.FerryError as err:
                results.put(("inference", idx, "setup_error", type(err).__name__, str(err)))
                return
            report = []
            for step in range(steps):
                try:
                    # ready for the update (in a real system: generation paused, the
                    # controller tells the trainers; here a barrier over all ranks)
                    ex.barrier(range(T + I), case["timeout"])
                    t0 = time.monotonic()
                    rcv.wait_step(step, case["timeout"])
                except ferry.FerryError as err:
                    report.append((step, "error", type(err).__name__, rcv.stale, time.monotonic() - t0))
                    break
                ref = reference(cfg, recipes, logical_weights(cfg, step))
                bad = [n for n in tensors if not np.array_equal(tensors[n].view(np.uint8), ref[n].view(np.uint8))]
                report.append((step, "ok", bad, sorted(tensors), rcv.stale))
            results.put(("inference", idx, "ok", report, sched.digest()))
        eng.stop()
    except BaseException:  # report, never hang the parent
        results.put((role, idx, "crash", traceback.format_exc()))

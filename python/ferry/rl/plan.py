"""python -m ferry.rl.plan: the real schedule for a public model on a trainer and an
inference cluster, and the step time a cluster model predicts for it.

    python -m ferry.rl.plan                              # Kimi-K2, DeepSeek-V3, Qwen3-235B
    python -m ferry.rl.plan --model Kimi-K2 --measure-posting
    python -m ferry.rl.plan --calibration calib.json --json out.json

The cluster model (assumptions, each a named number below; --calibration overrides):
every MeshGroup runs as a pipeline whose stages overlap, so its time is the busiest
resource of the busiest rank plus the pipeline's fill and drain plus one barrier:

  gather   (full_tensor, restricted to the rows a job needs): rows from ranks of the
           owner's node over NVLink, from other nodes over the NIC (ingress)
  prepare  bf16 bytes quantised / measured quantisation rate (GPU)
  write    trainer NIC egress: written bytes (+ rows sent to other nodes' owners)
  ingress  the busiest inference GPU's NIC: bytes it receives in the group
  post     CPU: prepared submits x measured cost + work requests x measured cost
  fill     first job's gather + prepare on the critical rank; drain: its last write
  barrier  gloo barrier over the trainers (Ethernet), once per MeshGroup
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

from . import model as M
from . import schedule as S
from .meta import InferenceMeta, TrainerMeta

# Named calibration numbers. "measured" ones come from this repository's runs
# (docs/RL.md names the run); the rest are stated assumptions.
CALIBRATION = {
    "nic_gbps": 400.0,  # per GPU, trainer and inference (seed: 400 Gbps ConnectX-7 / 2x200 EFA)
    "nic_efficiency": 0.92,  # achievable fraction of line rate for >= 16 MiB writes (seed Table 2)
    "nvlink_GBps": 360.0,  # per-GPU NVLink gather bandwidth inside a node (H100/H200 NV18, busbw)
    "gpus_per_node": 8,
    "quant_GBps": 1400.0,  # bf16 bytes/s through quant_triton (one launch per part), measured on one H200: 1.38-1.51 TB/s (docs/RL.md)
    "submit_us": 10.0,  # CPU per prepared scatter submit (Python + C++), measured: --measure-posting
    "wr_us": 0.5,  # CPU per work request posted by the worker, measured: --measure-posting
    "barrier_ms": 5.0,  # gloo barrier over 256 ranks on the Ethernet control network
}

SEED_TABLE5 = {"total_ms": 1200.0, "full_tensor_ms": 518.0, "sync_ms": 357.0,
               "transfer_outside_overlap_ms": 42.0, "wrs": 1144, "post_ms": 26.0}


@dataclass
class Layouts:
    trainer: M.TrainerLayout
    inference: M.InferenceLayout


DEFAULT = Layouts(M.TrainerLayout(pp=2, ep=8, fsdp=16), M.InferenceLayout(instances=4, ep=32, tp=8))


def metas(cfg: M.ModelConfig, lay: Layouts, nics: int = 1):
    blocks = M.trainer_blocks(cfg, lay.trainer)
    by_rank = defaultdict(list)
    for b in blocks:
        for r in b.mesh:
            by_rank[r].append(b)
    tm = [TrainerMeta(r, nics, tuple(by_rank[r])) for r in range(lay.trainer.world)]
    im = [InferenceMeta(r, tuple(M.inference_recipes(cfg, lay.inference, r))) for r in range(lay.inference.world)]
    return tm, im


def gather_bytes(s: S.Schedule, gpn: int):
    """Per rank: bytes received from its own node / other nodes for jobs it owns, and
    bytes it sends to owners on other nodes."""
    intra, inter_in, inter_out = defaultdict(int), defaultdict(int), defaultdict(int)
    for j in s.jobs:
        for p, b in j.parts:
            for k in b.mesh:
                if k == j.owner:
                    continue
                a, e = b.held(k, p)
                if a >= e:
                    continue
                n = (e - a) * p.cols * (b.row_bytes // b.cols)
                if k // gpn == j.owner // gpn:
                    intra[(j.group, j.owner)] += n
                else:
                    inter_in[(j.group, j.owner)] += n
                    inter_out[(j.group, k)] += n
    return intra, inter_in, inter_out


def predict(s: S.Schedule, cal: dict) -> dict:
    nic = cal["nic_gbps"] / 8 * 1e9 * cal["nic_efficiency"]
    nvl = cal["nvlink_GBps"] * 1e9
    q = cal["quant_GBps"] * 1e9
    gpn = int(cal["gpus_per_node"])
    intra, inter_in, inter_out = gather_bytes(s, gpn)
    groups = []
    for g in s.groups:
        jobs = [j for j in s.jobs if j.group == g]
        per = defaultdict(lambda: defaultdict(float))
        first = {}
        for j in jobs:
            r = per[j.owner]
            r["write_B"] += j.sent_bytes
            r["quant_B"] += j.src_bytes if j.scale_bytes else 0
            r["jobs"] += 1
            r["wrs"] += len(j.writes)
        for (gg, k), n in inter_out.items():
            if gg == g:
                per[k]["egress_extra_B"] += n
        # each sub-mesh's first job per owner: the pipeline's fill
        for (gg, mesh), ids in s.order.items():
            if gg != g:
                continue
            for jid in ids:
                first.setdefault(s.jobs[jid].owner, s.jobs[jid])
        rows = []
        for r, d in per.items():
            t_gather = max(intra[(g, r)] / nvl, inter_in[(g, r)] / nic)
            t_prep = d["quant_B"] / q
            t_write = (d["write_B"] + d["egress_extra_B"]) / nic
            t_post = (d["jobs"] * cal["submit_us"] + d["wrs"] * cal["wr_us"]) * 1e-6
            rows.append((max(t_gather, t_prep, t_write, t_post), r, t_gather, t_prep, t_write, t_post, d))
        crit = max(rows)
        _, rk, t_gather, t_prep, t_write, t_post, d = crit
        ingress = defaultdict(int)
        for j in jobs:
            for w in j.writes:
                ingress[w.rank] += w.length
        t_in = max(ingress.values()) / nic
        f = first.get(rk)
        fill = drain = 0.0
        if f is not None:
            fill = (f.src_bytes / nvl) + (f.src_bytes / q if f.scale_bytes else 0)
            drain = max(w.length for w in f.writes) / nic
        body = max(t_gather, t_prep, t_write, t_post, t_in)
        total = body + fill + drain + cal["barrier_ms"] * 1e-3
        groups.append(dict(group=g, critical_rank=rk, gather_ms=t_gather * 1e3, prepare_ms=t_prep * 1e3,
                           write_ms=t_write * 1e3, ingress_ms=t_in * 1e3, post_ms=t_post * 1e3,
                           fill_ms=fill * 1e3, drain_ms=drain * 1e3, barrier_ms=cal["barrier_ms"],
                           total_ms=total * 1e3, wrs=int(d["wrs"]), jobs=int(d["jobs"]),
                           bound=["gather", "prepare", "write", "post", "ingress"][
                               [t_gather, t_prep, t_write, t_post, t_in].index(body)]))
    recv = max(s.received_bytes(i) for i in range(s.inference))
    wrs = max(s.writes_of(r) for r in range(s.trainers))
    posts = max(len(s.owned(r)) for r in range(s.trainers))
    sent = [s.sent_bytes(r) for r in range(s.trainers)]
    return dict(groups=groups, total_ms=sum(g["total_ms"] for g in groups),
                floor_ms=recv / (cal["nic_gbps"] / 8 * 1e9) * 1e3, recv_per_gpu_GB=recv / 1e9,
                max_wrs_per_rank=wrs, max_submits_per_rank=posts,
                post_ms=max((len(s.owned(r)) * cal["submit_us"] + s.writes_of(r) * cal["wr_us"]) * 1e-3
                            for r in range(s.trainers)),
                sent_max_GB=max(sent) / 1e9, sent_mean_GB=sum(sent) / len(sent) / 1e9, jobs=len(s.jobs))


def _posting_peer(provider, nics, size, conn) -> None:
    import numpy as np

    import ferry

    with ferry.TransferEngine(provider, nics=list(nics), default_timeout=60) as b:
        dst = np.zeros(size, dtype=np.uint8)
        _, d = b.register(dst)
        c = b.imm_counter(99)
        conn.send(d.bytes())
        while True:
            n = conn.recv()
            if n is None:
                return
            c.wait(n, 120)
            conn.send(True)


def _threads(p: dict) -> str:
    t = p.get("thread_cpu_ms") or {}
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1])) or "n/a"


def _thread_cpu_ns() -> dict:
    """{thread id: (name, ns on a CPU)} of this process, from /proc (schedstat: every
    thread, the engine's C++ ones included, to the nanosecond); empty where absent."""
    out = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            name = "submitting thread" if tid == str(os.getpid()) else f"thread {tid}"
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[tid] = (name, int(f.read().split()[0]))
            except OSError:
                pass
    except OSError:
        pass
    return out


class _LocalPeer:
    """The receiving engine in this process (the in-process fake NIC: the engine's own
    cost, the provider's zero; the receiver's counting is in the figure)."""

    def __init__(self, provider, nics, size):
        import numpy as np

        import ferry

        self.engine = ferry.TransferEngine(provider, nics=list(nics), default_timeout=60)
        self.dst = np.zeros(size, dtype=np.uint8)
        _, self.desc = self.engine.register(self.dst)
        self.counter = self.engine.imm_counter(99)

    def arrived(self, n: int) -> None:
        self.counter.wait(n, 60)
        self.counter.try_consume(n)

    def close(self) -> None:
        self.engine.stop()


class _ProcessPeer:
    """The receiving engine in a second process: the sending process's CPU is the
    sender's alone; while the writes land this thread blocks on the pipe (a trainer
    prepares its next job meanwhile; it does not poll the engine)."""

    def __init__(self, provider, nics, size):
        import multiprocessing as mp

        import ferry

        ctx = mp.get_context("spawn")
        self.here, there = ctx.Pipe()
        self.proc = ctx.Process(target=_posting_peer, args=(provider, tuple(nics), size, there), daemon=True)
        self.proc.start()
        if not self.here.poll(120):
            raise ferry.Timeout("posting peer did not start")
        self.desc = ferry.MrDesc.from_bytes(self.here.recv())

    def arrived(self, n: int) -> None:
        import ferry

        self.here.send(n)
        if not self.here.poll(120):
            raise ferry.Timeout("posting peer did not count the writes")
        self.here.recv()

    def close(self) -> None:
        try:
            self.here.send(None)
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def measure_posting(s: S.Schedule, provider: str = "tcp;ofi_rxm", nics=("lo",), cap: int = 4096,
                    repeats: int = 5) -> dict:
    """Post, for real, the prepared scatters of the rank with the most work requests in
    `s` through an engine to a receiving engine: every job one submit, every write one
    target, lengths capped at `cap` bytes (the real bytes would not fit this machine).
    Provider "fake" (nics ("fake",)): the receiver in this process, so the figure is the
    engine's own cost, both sides; any other: the receiver in a second process, and the
    figure adds the provider's (over tcp, its socket copies: per byte on this CPU,
    where an RDMA NIC's DMA costs the host none). Returns, per pass, CPU time of the
    submitting thread while it submits and of the whole process, by thread."""
    import numpy as np

    import ferry

    rank = max(range(s.trainers), key=lambda r: s.writes_of(r))
    jobs = sorted(s.owned(rank), key=lambda j: j.id)
    nwr = sum(len(j.writes) for j in jobs)
    size = max(cap * nwr, 1 << 20)
    peer = (_LocalPeer if provider == "fake" else _ProcessPeer)(provider, nics, size)
    a = None
    try:
        a = ferry.TransferEngine(provider, nics=list(nics), default_timeout=60)
        src = np.zeros(cap * 64, dtype=np.uint8)
        hs, _ = a.register(src)
        route = ferry.GroupRoute.shard_peers()
        prepared, k = [], 0
        for j in jobs:
            dsts = []
            for w in j.writes:
                dsts.append(ferry.ScatterDst(min(cap, w.length), (k % 64) * cap, peer.desc, k * cap))
                k += 1
            prepared.append(a.prepare_scatter(hs, dsts, route=route))
        per = []
        for _ in range(repeats):
            done = ferry.TransferCounter()
            t0 = _thread_cpu_ns()
            c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
            for p in prepared:
                a.submit(p, imm=99, counter=done)
            c1, w1 = time.thread_time(), time.perf_counter()
            peer.arrived(nwr)
            done.wait(len(prepared), 60)
            p1, w2 = time.process_time(), time.perf_counter()
            t1 = _thread_cpu_ns()
            by_thread: dict = {}
            for tid, (name, ns) in t1.items():
                d_ms = (ns - t0.get(tid, (name, 0))[1]) / 1e6
                if d_ms > 0.01:
                    by_thread[name] = round(by_thread.get(name, 0.0) + d_ms, 3)
            per.append(dict(submit_thread_cpu_ms=(c1 - c0) * 1e3, submit_wall_ms=(w1 - w0) * 1e3,
                            process_cpu_ms=(p1 - p0) * 1e3, complete_wall_ms=(w2 - w0) * 1e3,
                            thread_cpu_ms=by_thread))
        best = min(per, key=lambda x: x["process_cpu_ms"])
        med = sorted(x["process_cpu_ms"] for x in per)[len(per) // 2]
        return dict(rank=rank, submits=len(prepared), wrs=nwr, cap_bytes=cap, provider=provider,
                    passes=per, best=best, median_process_cpu_ms=med,
                    submit_us=best["submit_thread_cpu_ms"] * 1e3 / max(1, len(prepared)),
                    wr_us=max(0.0, best["process_cpu_ms"] - best["submit_thread_cpu_ms"]) * 1e3 / max(1, nwr))
    finally:
        if a is not None:
            a.stop()
        peer.close()


def measure_quant_numpy(rows: int = 2048, cols: int = 7168) -> float:
    """bf16 input bytes per second of quantize_np on this CPU (for the record; the
    planner uses the GPU rate)."""
    import ml_dtypes
    import numpy as np

    from .quant import quantize_np

    w = (np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    quantize_np(w[:256])
    t0 = time.perf_counter()
    quantize_np(w)
    return w.nbytes / (time.perf_counter() - t0)


def _fmt(name: str, p: dict, seed: bool) -> str:
    out = [f"{name}: {p['jobs']} jobs; per trainer: sent max {p['sent_max_GB']:.2f} GB "
           f"(mean {p['sent_mean_GB']:.2f}), {p['max_submits_per_rank']} submits, {p['max_wrs_per_rank']} work requests; "
           f"per inference GPU {p['recv_per_gpu_GB']:.2f} GB",
           f"  {'group':8} {'bound':8} {'gather':>8} {'prepare':>8} {'write':>8} {'ingress':>8} {'post':>6} "
           f"{'fill':>6} {'drain':>6} {'barrier':>7} {'total':>8}  (ms)"]
    for g in p["groups"]:
        out.append(f"  {g['group']:8} {g['bound']:8} {g['gather_ms']:8.1f} {g['prepare_ms']:8.1f} {g['write_ms']:8.1f} "
                   f"{g['ingress_ms']:8.1f} {g['post_ms']:6.1f} {g['fill_ms']:6.1f} {g['drain_ms']:6.1f} "
                   f"{g['barrier_ms']:7.1f} {g['total_ms']:8.1f}")
    out.append(f"  predicted step {p['total_ms']:.0f} ms; floor (bytes per inference GPU / NIC) {p['floor_ms']:.0f} ms; "
               f"posting {p['post_ms']:.1f} ms CPU on the busiest rank")
    if seed:
        t = SEED_TABLE5
        crit_gather = sum(g["gather_ms"] for g in p["groups"])
        sync = sum(g["barrier_ms"] for g in p["groups"])
        outside = sum(g["fill_ms"] + g["drain_ms"] for g in p["groups"])
        out.append(f"  seed Table 5 | here:  total {t['total_ms']:.0f} | {p['total_ms']:.0f} ms;  full_tensor "
                   f"{t['full_tensor_ms']:.0f} | {crit_gather:.0f} ms;  sync {t['sync_ms']:.0f} | {sync:.0f} ms;  "
                   f"transfer outside overlap {t['transfer_outside_overlap_ms']:.0f} | {outside:.0f} ms (fill+drain);  "
                   f"{t['wrs']} WRs in {t['post_ms']:.0f} ms | {p['max_wrs_per_rank']} WRs in {p['post_ms']:.1f} ms")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ferry.rl.plan", description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", choices=["Kimi-K2", "DeepSeek-V3", "Qwen3-235B-A22B"])
    ap.add_argument("--watermark-gb", type=float, default=4.0)
    ap.add_argument("--calibration", help="JSON file overriding CALIBRATION entries")
    ap.add_argument("--measure-posting", action="store_true",
                    help="post the busiest rank's work requests through the engine here and use the cost")
    ap.add_argument("--provider", default="tcp;ofi_rxm")
    ap.add_argument("--json", help="write the plan and the measurements here")
    a = ap.parse_args(argv)
    cal = dict(CALIBRATION)
    if a.calibration:
        with open(a.calibration) as f:
            cal.update(json.load(f))
    models = a.model or ["Kimi-K2", "DeepSeek-V3", "Qwen3-235B-A22B"]
    lay = DEFAULT
    print(f"trainers: {lay.trainer.world} (PP {lay.trainer.pp}, EP {lay.trainer.ep}, FSDP {lay.trainer.fsdp}; bf16)  "
          f"inference: {lay.inference.world} ({lay.inference.instances} x EP {lay.inference.ep}, dense TP "
          f"{lay.inference.tp}; fp8 e4m3 128x128)")
    report = {"calibration": cal, "layout": str(lay), "models": {}}
    try:
        report["quant_numpy_GBps_here"] = measure_quant_numpy() / 1e9
    except ImportError:
        pass
    for name in models:
        cfg = M.MODELS[name]
        t0 = time.perf_counter()
        tm, im = metas(cfg, lay)
        s = S.build(tm, im, int(a.watermark_gb * (1 << 30)))
        S.check(s, im)
        t_build = time.perf_counter() - t0
        entry = {"schedule_s": t_build}
        if a.measure_posting:
            # the engine alone (in-process fake NIC, 64-byte writes: per-request cost), then
            # the provider named (4 KiB writes: its own per-byte cost added)
            engine = measure_posting(s, "fake", ("fake",), cap=64)
            m = measure_posting(s, a.provider)
            entry["posting"], entry["posting_engine"] = m, engine
            cal_m = dict(cal, submit_us=engine["submit_us"], wr_us=engine["wr_us"])
            for x, what in ((engine, "the engine alone (fake NIC, receiver in this process)"),
                            (m, "the sending process")):
                print(f"{name}: posted rank {x['rank']}'s {x['submits']} prepared scatters ({x['wrs']} work "
                      f"requests of <= {x['cap_bytes']} B) over {x['provider']}: {what} {x['best']['process_cpu_ms']:.2f} "
                      f"ms CPU (median {x['median_process_cpu_ms']:.2f}; by thread: {_threads(x['best'])}), "
                      f"submitting {x['best']['submit_thread_cpu_ms']:.2f} ms of it, all complete after "
                      f"{x['best']['complete_wall_ms']:.1f} ms")
        else:
            cal_m = cal
        p = predict(s, cal_m)
        entry["prediction"] = p
        report["models"][name] = entry
        print(_fmt(name, p, seed=name == "Kimi-K2"))
        print(f"  (schedule built and checked in {t_build:.1f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

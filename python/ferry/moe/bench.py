"""python -m ferry.moe.bench: dispatch/combine latency, ranks sharing one GPU
(or spread over --gpus GPUs).

Each rank is a spawned process on cuda:(rank % gpus). Per iteration (routes re-randomised
from a pool of pre-generated index sets on the device), CUDA events time:
dispatch send, dispatch recv, combine send, combine recv as separate halves
with a host synchronisation and a barrier of all ranks between them (a layer's
worth of idle GPU, as between the halves of a micro-batched model), and
dispatch / combine back to back ("both"), where a rank's recv kernel also
waits for the other processes' send kernels to get the GPU. Rank 0 reports p50/p99 over
every rank's samples, bytes and GB/s, beside the baseline measured in the
same run: the same dispatch and combine of the combined batch (world x
tokens) in one process with plain PyTorch gather/scatter (argsort,
index_select, weighted index_add), the memory-bound floor of the GPU. The
proxy's own latencies (GPU signal -> first post, routes in -> second post)
come from the C++ proxy. With one GPU per rank (--gpus >= --world), NCCL
all_to_all_single of the same payloads runs in the same job as the second
baseline (nccl_dispatch, nccl_combine and the ratios against them). Results as
JSON on stdout (and --output).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time


def _stats(v: list) -> dict:
    v = sorted(v)
    if not v:
        return {}
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]  # noqa: E731
    return {"n": len(v), "p50": q(0.5), "p99": q(0.99), "min": v[0], "mean": sum(v) / len(v)}


def _nccl_baseline(a, rank: int, dev, hs: int, in_t, out_t) -> dict:
    """NCCL all_to_all_single of the same payloads (one GPU per rank only: NCCL
    refuses two ranks on one device). Dispatch: every rank sends tokens * k rows
    of hidden elements (plus the fp32 block scales), an equal share to each rank;
    combine: the same rows back in out_dtype. Timed with CUDA events, as above."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(backend="nccl")
    in_size = torch.tensor([], dtype=in_t).element_size()
    out_size = torch.tensor([], dtype=out_t).element_size()
    rows = a.tokens * a.k
    share = -(-rows // a.world)  # rows per destination, rounded up
    d_row, c_row = a.hidden * in_size + hs * 4, a.hidden * out_size
    send_d = torch.empty(share * a.world * d_row, dtype=torch.uint8, device=dev)
    recv_d = torch.empty_like(send_d)
    send_c = torch.empty(share * a.world * c_row, dtype=torch.uint8, device=dev)
    recv_c = torch.empty_like(send_c)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    out = {"dispatch": [], "combine": []}
    for it in range(a.warmup + a.iters):
        dist.barrier(group=group)
        ev[0].record()
        dist.all_to_all_single(recv_d, send_d, group=group)
        ev[1].record()
        dist.all_to_all_single(recv_c, send_c, group=group)
        ev[2].record()
        ev[2].synchronize()
        if it >= a.warmup:
            out["dispatch"].append(ev[0].elapsed_time(ev[1]) * 1000)
            out["combine"].append(ev[1].elapsed_time(ev[2]) * 1000)
    dist.destroy_process_group(group)
    return out


def _worker(rank: int, a, init: str, q) -> None:
    import torch
    import torch.distributed as dist

    import ferry.moe as moe

    os.environ.setdefault("FERRY_LOG", "warn")
    gpu = rank % a.gpus
    torch.cuda.set_device(gpu)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=a.world)
    dev = torch.device("cuda", gpu)
    try:
        E, K, H, T = a.experts, a.k, a.hidden, a.tokens
        node = a.world if a.mode == "nvlink" else 1
        hs = a.hidden_scale if a.in_dtype == "float8_e4m3fn" else 0
        a2a = moe.AllToAll(max_num_tokens=T, num_experts=E, experts_per_token=K, hidden=H,
                           hidden_scale=hs or None, in_dtype=a.in_dtype, out_dtype=a.out_dtype,
                           expert_padding=a.padding, max_private_tokens=a.private, node_size=node,
                           provider=a.provider, deadline=30.0)
        L = E // a.world
        rows = a2a.out_rows
        in_t, out_t = getattr(torch, a.in_dtype), getattr(torch, a.out_dtype)
        x = torch.randn(T, H, device=dev).to(in_t)
        xs = torch.rand(T, max(hs, 1), device=dev) + 0.5
        pool = [torch.rand(T, E, device=dev).topk(K, dim=1).indices.to(torch.int32) for _ in range(64)]
        w = torch.rand(T, K, device=dev)
        w /= w.sum(1, keepdim=True)
        num = torch.zeros(L, dtype=torch.int32, device=dev)
        ox = torch.empty(rows, H, dtype=in_t, device=dev)
        osc = torch.empty(rows, max(hs, 1), device=dev)
        y = torch.randn(rows, H, device=dev).to(out_t)
        out = torch.empty(T, H, dtype=out_t, device=dev)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        samples = {k: [] for k in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv",
                                   "dispatch_both", "combine_both")}
        sc = xs if hs else None
        osc_ = osc if hs else None
        for it in range(a.warmup + a.iters):
            idx = pool[it % len(pool)]
            rec = it >= a.warmup
            if it % 2 == 0:
                # Split halves with a "layer" between them: every rank finishes a
                # half (and the gloo barrier passes) before anyone starts the
                # next, so each half is timed without waiting for another
                # process's time slice on the shared GPU.
                halves = (
                    lambda: a2a.dispatch(num, ox, osc_, x, sc, idx, w, do_recv=False),
                    lambda: a2a.dispatch(num, ox, osc_, x, sc, idx, w, do_send=False),
                    lambda: a2a.combine(out, idx, w, y, do_recv=False),
                    lambda: a2a.combine(out, idx, w, y, do_send=False),
                )
                names = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
                for name, half in zip(names, halves):
                    ev[0].record()
                    half()
                    ev[1].record()
                    ev[1].synchronize()
                    dist.barrier()
                    if rec:
                        samples[name].append(ev[0].elapsed_time(ev[1]) * 1000)
            else:  # back to back
                ev[0].record()
                a2a.dispatch(num, ox, osc_, x, sc, idx, w)
                ev[1].record()
                a2a.combine(out, idx, w, y)
                ev[2].record()
                ev[2].synchronize()
                if rec:
                    samples["dispatch_both"].append(ev[0].elapsed_time(ev[1]) * 1000)
                    samples["combine_both"].append(ev[1].elapsed_time(ev[2]) * 1000)
        a2a.check()
        lat = a2a.proxy_latency()
        res = {"rank": rank, "samples": samples,
               "proxy_signal_to_first_post_us": [v / 1000 for v in lat[0][-a.iters:]],
               "proxy_routes_to_second_post_us": [v / 1000 for v in lat[1][-a.iters:]]}
        if a.gpus >= a.world:
            res["nccl"] = _nccl_baseline(a, rank, dev, hs, in_t, out_t)
        # The baseline, rank 0 alone while the others wait: one process, the
        # combined batch of every rank, plain PyTorch.
        dist.barrier()
        if rank == 0:
            from ferry.moe.reference import torch_floor

            X = torch.randn(T * a.world, H, device=dev).to(in_t)
            XS = torch.rand(T * a.world, max(hs, 1), device=dev)
            W = torch.rand(T * a.world, K, device=dev)
            pool2 = [torch.rand(T * a.world, E, device=dev).topk(K, dim=1).indices for _ in range(16)]
            fd, fc = [], []
            for it in range(a.warmup + a.iters):
                I = pool2[it % len(pool2)]
                ev[0].record()
                flat = I.flatten()
                order = torch.argsort(flat, stable=True)
                rows_ = X.index_select(0, order // K)
                if hs:
                    XS.index_select(0, order // K)
                torch.bincount(flat, minlength=E)
                ev[1].record()
                acc = torch.zeros(T * a.world, H, device=dev)
                acc.index_add_(0, order // K, rows_.to(out_t).float() * W.flatten()[order].unsqueeze(1))
                acc.to(out_t)
                ev[2].record()
                ev[2].synchronize()
                if it >= a.warmup:
                    fd.append(ev[0].elapsed_time(ev[1]) * 1000)
                    fc.append(ev[1].elapsed_time(ev[2]) * 1000)
            res["floor"] = {"dispatch": fd, "combine": fc}
            del torch_floor
        dist.barrier()
        a2a.destroy()
        q.put(res)
    except Exception:
        import traceback

        q.put({"rank": rank, "error": traceback.format_exc()})
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--gpus", type=int, default=1,
                   help="GPUs to spread the ranks over (rank r on cuda:r %% gpus); with one GPU "
                        "per rank the NCCL all_to_all_single baseline runs in the same job")
    p.add_argument("--mode", choices=["nvlink", "proxy"], default="nvlink",
                   help="nvlink: one node of all ranks (CUDA IPC); proxy: one node per rank (engine + host proxy)")
    p.add_argument("--provider", default="shm")
    p.add_argument("--tokens", type=int, default=128, help="per rank (decode 128, prefill 4096)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--hidden-scale", type=int, default=56)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--padding", type=int, default=16)
    p.add_argument("--private", type=int, default=None)
    p.add_argument("--in-dtype", default="float8_e4m3fn")
    p.add_argument("--out-dtype", default="bfloat16")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--output", default=None)
    a = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tempfile.mktemp(prefix='ferry-moe-bench-')}"
    procs = [ctx.Process(target=_worker, args=(r, a, init, q)) for r in range(a.world)]
    t0 = time.time()
    for pr in procs:
        pr.start()
    res = [q.get(timeout=1200) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
    errs = [r["error"] for r in res if "error" in r]
    if errs:
        print("\n".join(errs), file=sys.stderr)
        return 1
    in_size = {"float32": 4, "bfloat16": 2, "float8_e4m3fn": 1}[a.in_dtype]
    out_size = {"float32": 4, "bfloat16": 2}[a.out_dtype]
    hs = a.hidden_scale if a.in_dtype == "float8_e4m3fn" else 0
    dbytes = a.tokens * a.k * (a.hidden * in_size + hs * 4)
    cbytes = a.tokens * a.k * a.hidden * out_size
    report = {"config": vars(a), "seconds": round(time.time() - t0, 1)}
    for key in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv", "dispatch_both", "combine_both"):
        allv = [v for r in res for v in r["samples"][key]]
        report[key] = _stats(allv)
    for key, b in (("dispatch_both", dbytes), ("combine_both", cbytes)):
        if report[key]:
            report[key]["bytes_per_rank"] = b
            report[key]["GBps_at_p50"] = b / (report[key]["p50"] * 1e-6) / 1e9
    floor = next(r["floor"] for r in res if "floor" in r)
    report["floor_dispatch"] = _stats(floor["dispatch"])
    report["floor_combine"] = _stats(floor["combine"])
    report["ratio_dispatch_p50_vs_floor"] = report["dispatch_both"]["p50"] / report["floor_dispatch"]["p50"]
    report["ratio_combine_p50_vs_floor"] = report["combine_both"]["p50"] / report["floor_combine"]["p50"]
    nccl = [r["nccl"] for r in res if "nccl" in r]
    if nccl:
        for key in ("dispatch", "combine"):
            report[f"nccl_{key}"] = _stats([v for n in nccl for v in n[key]])
            report[f"ratio_{key}_p50_vs_nccl"] = report[f"{key}_both"]["p50"] / report[f"nccl_{key}"]["p50"]
    report["proxy_signal_to_first_post_us"] = _stats([v for r in res for v in r["proxy_signal_to_first_post_us"]])
    report["proxy_routes_to_second_post_us"] = _stats([v for r in res for v in r["proxy_routes_to_second_post_us"]])
    text = json.dumps(report, indent=1)
    print(text)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

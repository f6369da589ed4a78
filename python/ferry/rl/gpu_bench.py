"""python -m ferry.rl.gpu_bench: the weight transfer on one GPU machine, for real.

2 trainer processes (a Qwen3-style MoE of ~1.5 B parameters, every tensor Shard(0)
over the two trainers as FSDP2 lays it out, the shards in pinned host memory as
FSDP2's CPU offload keeps them, or with --resident in GPU memory) and 2 inference
processes (TP2 / EP2, fp8 e4m3 with 128x128 block scales) on the same GPU (or on the
GPUs --gpus names), connected by torch.distributed (gloo) for the control traffic and
by ferry's nvlink provider (CUDA IPC) for the weights. --gather schedules every job onto
one owner (the seed's full_tensor way) instead of direct writes.

Measured in one run: the step time and its stages (Chrome trace), every inference
tensor compared byte for byte with a direct conversion of the step's full weights,
the peak temporary memory against the watermark, the device-to-device copy ceiling
of the same destination bytes, a rank-0 gather + broadcast of the same weights over
torch.distributed (gloo; with --baselines gloo,nccl and a GPU per rank also NCCL from
GPU memory), and the quantisation rate. Writes JSON and the trace to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import sys
import time
import traceback
import zlib

from . import model as M

GPU_MODEL = M.ModelConfig("qwen3-style-1.5b-moe", "qwen3_moe", layers=16, hidden=2048, vocab=32768, heads=16,
                          kv_heads=4, head_dim=128, experts=16, top_k=4, moe_inter=768, inter=6144,
                          first_dense=1)
# --fsdp2: a dense Qwen3 of transformers (~0.2 B parameters), every layer fully_shard-ed
FSDP_MODEL = M.ModelConfig("qwen3-dense-0.2b", "qwen3_moe", layers=8, hidden=1024, vocab=32768, heads=16,
                           kv_heads=8, head_dim=64, experts=0, top_k=0, moe_inter=0, inter=3072, first_dense=8)
TL = M.TrainerLayout(pp=1, ep=1, fsdp=2, offloaded=True)
IL = M.InferenceLayout(instances=1, ep=2, tp=2)


def gen(torch, name, shape, dtype, step, device):
    g = torch.Generator(device=device)
    g.manual_seed(step * 1_000_003 + zlib.crc32(name.encode()))
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32) * 0.05
    return x.to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)


def reference(torch, cfg, recipes, step, device):
    """name -> expected tensor, converted straight from the full weights."""
    from .meta import rows_cols
    from .quant import quantize_torch

    params = M.logical_params(cfg)
    cache = {}

    def full(n):
        if n not in cache:
            shape, dt, _, _ = params[n]
            cache[n] = gen(torch, n, shape, dt, step, device).reshape(rows_cols(shape))
        return cache[n]

    for r in recipes:
        pieces = [full(p.param)[p.r0:p.r1, p.c0:p.c1] for p in r.parts]
        if r.quantised:  # fp8 compared (and concatenated) as bytes
            qs = [quantize_torch(x) for x in pieces]
            yield r.name, torch.cat([q.view(torch.uint8) for q, _ in qs])
            yield r.scale, torch.cat([s for _, s in qs]).reshape(r.scale_shape)
        else:
            yield r.name, torch.cat(pieces).reshape(r.shape)
        if len(cache) > 8:
            cache.clear()


def worker(rank: int, port: int, args, out_dir: str) -> None:
    result = {"rank": rank, "mode": dict(resident=args.resident, gather=args.gather, fsdp2=args.fsdp2,
                                         graphs=args.graphs, writes=args.writes)}
    try:
        import torch
        import torch.distributed as dist

        import ferry

        from .exchange import TorchExchange
        from .meta import rows_cols
        from .backends import TorchBackend
        from .pipeline import WeightSender, chrome_trace
        from .receiver import WeightReceiver

        dev = torch.device(f"cuda:{args.gpu_of[rank]}")
        torch.cuda.set_device(dev)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4,
                                timeout=datetime.timedelta(seconds=120))
        T = TL.world
        ex = TorchExchange(None, barrier_sets=[list(range(T)), list(range(4))])
        # The baseline's groups, per backend: (every rank, rank 0 + the inference ranks).
        groups = {"gloo": (None, dist.new_group([0, 2, 3], backend="gloo"))}
        cfg = FSDP_MODEL if args.fsdp2 else GPU_MODEL
        trainer_group = dist.new_group(list(range(T)), backend="gloo") if args.fsdp2 else None
        if "nccl" in args.baselines:  # one rank per GPU (main checks)
            groups["nccl"] = (dist.new_group(list(range(4)), backend="nccl"),
                              dist.new_group([0, 2, 3], backend="nccl"))
        eng = ferry.TransferEngine("nvlink", groups=[ferry.Group(str(dev))], default_timeout=120)
        be = TorchBackend(str(dev))
        steps = args.steps
        if rank < T:
            if args.fsdp2:
                from . import fsdp as F
                module, result["fsdp2"] = fsdp2_module(torch, cfg, trainer_group, offload=not args.resident)
                order = {n: i for i, n in enumerate(M.logical_params(cfg))}  # the baseline's order
                blocks = sorted(F.blocks(module, rank), key=lambda b: order.get(b.name, len(order)))
                module_shards = F.shards(module)
                result["fsdp2"]["shards_are_module_memory"] = all(
                    module_shards[(F.hf_name(n), 0)].data_ptr() == p.to_local().data_ptr()
                    for n, p in module.named_parameters())
                missing = set(M.logical_params(cfg)) ^ {b.name for b in blocks}
                if missing:
                    raise ValueError(f"module parameters and the model's logical ones differ: {sorted(missing)[:8]}")
            else:
                tl = dataclasses.replace(TL, offloaded=not args.resident)
                blocks = [b for b in M.trainer_blocks(cfg, tl) if rank in b.mesh]
            snd = WeightSender(eng, ex, rank=rank, blocks=blocks, trainer_ranks=range(T),
                               inference_ranks=range(T, 4), watermark=args.watermark_mb << 20, backend=be,
                               direct=not args.gather, gpu_timing=not os.environ.get("FERRY_RL_NO_GPU_TIMING"),
                               graphs=args.graphs, mapped={"auto": None, "engine": False, "mapped": True}[args.writes])
            t0 = time.perf_counter()
            sched = snd.setup(120)
            result["setup_s"] = time.perf_counter() - t0
            result["mapped"], result["map_error"] = snd.mapping is not None, snd.map_error
            result["jobs_owned"] = len(sched.owned(rank))
            result["writes_owned"] = sched.writes_of(rank)
            stats = []
            result["graphs"] = []  # per step: whether it replayed graphs
            # the shards stay where they are between steps, as a trainer's parameters do:
            # each step's weights are written into them (the optimiser's update)
            shards = module_shards if args.fsdp2 else {}
            for step in range(steps):
                for b in blocks:
                    a, e = b.shard_rows(rank)
                    w = gen(torch, b.name, b.shape, b.dtype, step, dev).reshape(rows_cols(b.shape))
                    key = (b.name, b.row0)
                    if key in shards:
                        with torch.no_grad():
                            shards[key].copy_(w[a:e])
                    else:
                        shards[key] = w[a:e].clone() if args.resident else w[a:e].cpu().pin_memory()
                    del w
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                ex.barrier(range(4), 120)  # inference ranks are waiting for this step
                prof = None
                if os.environ.get("FERRY_RL_PROFILE") and rank == 0 and step == steps - 1:
                    import cProfile  # where the last step's Python time goes (inflated by the profiler)
                    prof = cProfile.Profile()
                    prof.enable()
                st = snd.step(step, shards, 120)
                result["graphs"].append(dict(replayed=st.replayed, error=snd.graph_error))
                if prof is not None:
                    import io
                    import pstats
                    prof.disable()
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(45)
                    with open(os.path.join(out_dir, "profile-rank0.txt"), "w") as f:
                        f.write(buf.getvalue())
                st_extra = torch.cuda.max_memory_allocated() - base
                stats.append(st)
                result.setdefault("steps", []).append(dict(wall_s=st.wall_s, stages=st.stages, gpu=st.gpu,
                                                           peak_ring_bytes=st.peak_temp_bytes,
                                                           peak_cuda_above_base_bytes=st_extra,
                                                           bytes_written=st.bytes_written, writes=st.writes,
                                                           jobs=st.jobs, submits=st.submits))
                if step == steps - 1 and not args.resident:
                    # Stage 1's floor, same run: both trainers copy their offloaded shards
                    # to the GPU at once (they share the host link), nothing else.
                    big = max(t.numel() * t.element_size() for t in shards.values())
                    slab = torch.empty(big, dtype=torch.uint8, device=dev)
                    passes = []
                    for _ in range(3):  # the best of three, both trainers starting together each time
                        ex.barrier(range(T), 120)
                        t0 = time.perf_counter()
                        for t in shards.values():
                            n = t.numel() * t.element_size()
                            slab[:n].copy_(t.reshape(-1).view(torch.uint8), non_blocking=True)
                        torch.cuda.synchronize()
                        passes.append(time.perf_counter() - t0)
                    result["h2d_s"] = min(passes)
                    result["h2d_bytes"] = sum(t.numel() * t.element_size() for t in shards.values())
                    ex.barrier(range(T), 120)
                    del slab
            # The conversion alone (fusion and quantisation of this rank's jobs, as the
            # step reads them), both trainers at once as in a step, best of three; as one
            # CUDA graph (its device time, not the ~150 launches from Python), else eager.
            snd.issue_conversions(shards)
            run_conv, result["convert_alone_how"] = (lambda: snd.issue_conversions(shards)), "eager"
            try:
                conv_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(conv_graph):
                    snd.issue_conversions(shards)
                run_conv, result["convert_alone_how"] = conv_graph.replay, "graph"
            except RuntimeError as e:
                result["convert_alone_graph_error"] = f"{type(e).__name__}: {e}"
            passes = []
            for _ in range(4):  # the first warms up
                ex.barrier(range(T), 120)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                run_conv()
                torch.cuda.synchronize()
                passes.append(time.perf_counter() - t0)
            result["convert_alone_s"] = min(passes[1:])
            chrome_trace(stats[-1:], os.path.join(out_dir, f"rl-trace-rank{rank}.json"))
            result["watermark_bytes"] = args.watermark_mb << 20
            result["sent_bytes"] = sched.sent_bytes(rank)
            ex.barrier(range(4), 300)
            # Copy ceiling: device-to-device copies of every destination's bytes (rank 0
            # only), from this GPU to the first inference rank's (the same one on one GPU).
            if rank == 0:
                sizes = [w.length for j in sched.jobs for w in j.writes]
                total = sum(sizes)
                big = max(sizes)
                src = torch.empty(big, dtype=torch.uint8, device=dev)
                dst = torch.empty(big, dtype=torch.uint8, device=f"cuda:{args.gpu_of[T]}")

                def copies():
                    for n in sizes:
                        dst[:n].copy_(src[:n])

                def best(run, passes=6) -> float:  # the first pass warms up; the best of the rest
                    ts = []
                    for _ in range(passes):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        run()
                        torch.cuda.synchronize(dev)
                        torch.cuda.synchronize(dst.device)
                        ts.append(time.perf_counter() - t0)
                    return min(ts[1:])

                t_copy = best(copies)
                result["copy_ceiling"] = dict(bytes=total, copies=len(sizes), s=t_copy, GBps=total / t_copy / 1e9,
                                              src=str(dev), dst=str(dst.device), passes="best of 5 after one warm-up")
                # The same copies as one CUDA graph: their device time without one launch
                # each from Python (the stricter ceiling).
                try:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        copies()
                    t_graph = best(g.replay)
                    result["copy_ceiling_graph"] = dict(bytes=total, copies=len(sizes), s=t_graph,
                                                        GBps=total / t_graph / 1e9)
                    del g
                except RuntimeError as e:
                    result["copy_ceiling_graph"] = dict(error=f"{type(e).__name__}: {e}")
                del src, dst
                # quantisation rates on this GPU: the reference, and the kernel the pipeline uses
                from . import quant_triton
                from .quant import quantize_torch
                w = torch.randn(4096, 7168, device=dev).to(torch.bfloat16)

                def rate(fn) -> float:  # bf16 input bytes per second, warm, 10 calls
                    fn()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(10):
                        fn()
                    torch.cuda.synchronize()
                    return w.numel() * 2 * 10 / (time.perf_counter() - t0) / 1e9

                result["quant_GBps"] = rate(lambda: quantize_torch(w))
                if quant_triton.available(w):
                    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=dev)
                    sc = torch.empty((w.shape[0] // 128, w.shape[1] // 128), dtype=torch.float32, device=dev)
                    result["quant_triton_GBps"] = rate(lambda: quant_triton.quantize_into(w, q, sc))
            ex.barrier(range(4), 300)
            # Baselines: rank-0 gather + broadcast of the same weights (torch.distributed):
            # gloo from host memory; NCCL from GPU memory (the shards' H2D copy included).
            shards = {}
            for b in blocks:  # a fresh step of weights, in pinned host memory as before
                a, e = b.shard_rows(rank)
                w = gen(torch, b.name, b.shape, b.dtype, steps, dev).reshape(rows_cols(b.shape))
                shards[b.name] = w[a:e].cpu().pin_memory()
            torch.cuda.synchronize()
            for backend in args.baselines:
                world, bcast = groups[backend]
                on_gpu = backend == "nccl"
                dist.barrier()
                t0 = time.perf_counter()
                for b in blocks:
                    mine = shards[b.name].to(dev, non_blocking=True) if on_gpu else shards[b.name]
                    if rank == 0:
                        parts = [mine]
                        for k in range(1, T):
                            ka, ke = b.shard_rows(k)
                            buf = torch.empty((ke - ka, b.cols), dtype=mine.dtype, device=mine.device)
                            dist.recv(buf.view(torch.uint8), k, group=world)
                            parts.append(buf)
                        full = torch.cat(parts).contiguous()
                        dist.broadcast(full.view(torch.uint8), 0, group=bcast)
                    else:
                        dist.send(mine.contiguous().view(torch.uint8), 0, group=world)
                torch.cuda.synchronize()
                dist.barrier()
                result[_baseline_key(backend)] = time.perf_counter() - t0
        else:
            i = rank - T
            recipes = M.inference_recipes(cfg, IL, i)
            dts = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn}
            tensors = {n: torch.zeros(shape, dtype=dts[dt], device=dev) for n, shape, dt in M.tensor_specs(recipes)}
            result["inference_bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
            rcv = WeightReceiver(eng, ex, rank=i, tensors=tensors, recipes=recipes, backend=be)
            rcv.setup(120)
            checks = []
            for step in range(steps):
                ex.barrier(range(4), 120)
                t0 = time.perf_counter()
                rcv.wait_step(step, 120)
                t_arr = time.perf_counter() - t0
                bad, n = [], 0
                for name, ref in reference(torch, cfg, recipes, step, dev):
                    n += 1
                    got = tensors[name]
                    if not torch.equal(got.reshape(-1).view(torch.uint8), ref.contiguous().reshape(-1).view(torch.uint8)):
                        bad.append(name)
                checks.append(dict(step=step, arrived_s=t_arr, tensors=n, mismatched=bad[:10], n_bad=len(bad)))
            result["checks"] = checks
            # cross-check: the NumPy path gives the same bits as torch on this GPU
            try:
                import ml_dtypes  # noqa: F401
                import numpy as np

                from .quant import quantize_np, quantize_torch
                w = gen(torch, "x", (640, 1152), "bfloat16", 0, dev)
                qt, st_ = quantize_torch(w)
                qn, sn = quantize_np(w.float().cpu().numpy().astype(ml_dtypes.bfloat16))
                result["numpy_vs_cuda_bit_exact"] = bool(np.array_equal(qt.view(torch.uint8).cpu().numpy(), qn.view(np.uint8))
                                                          and np.array_equal(st_.cpu().numpy(), sn))
            except ImportError as e:
                result["numpy_vs_cuda_bit_exact"] = f"skipped: {e}"
            ex.barrier(range(4), 300)
            ex.barrier(range(4), 300)
            params = M.logical_params(cfg)
            from .quant import quantize_torch
            for backend in args.baselines:
                _, bcast = groups[backend]
                on_gpu = backend == "nccl"
                dist.barrier()
                t0 = time.perf_counter()
                got = {}
                for name, (shape, dt, _, _) in params.items():
                    r_, c_ = rows_cols(shape)
                    buf = torch.empty((r_, c_), dtype=torch.bfloat16 if dt == "bfloat16" else torch.float32,
                                      device=dev if on_gpu else "cpu")
                    dist.broadcast(buf.view(torch.uint8), 0, group=bcast)
                    got[name] = buf if on_gpu else buf.to(dev, non_blocking=True)
                for r in recipes:  # convert as the inference side would after a broadcast
                    pieces = [got[p.param][p.r0:p.r1, p.c0:p.c1] for p in r.parts]
                    if r.quantised:
                        qs = [quantize_torch(x) for x in pieces]
                        tensors[r.name].view(-1).view(torch.uint8).copy_(
                            torch.cat([q.view(torch.uint8) for q, _ in qs]).reshape(-1))
                        tensors[r.scale].copy_(torch.cat([s for _, s in qs]).reshape(r.scale_shape))
                    else:
                        tensors[r.name].copy_(torch.cat(pieces).reshape(r.shape))
                torch.cuda.synchronize()
                dist.barrier()
                result[_baseline_key(backend)] = time.perf_counter() - t0
        eng.stop()
        dist.destroy_process_group()
    except BaseException:
        result["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rl-rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    # After a failure the engine and the process group may still hold threads that
    # the interpreter's exit would wait for; the result is on disk, so leave now.
    sys.stdout.flush()
    os._exit(0)


def fsdp2_module(torch, cfg, group, offload: bool):
    """transformers' Qwen3ForCausalLM of `cfg` in bf16, each decoder layer and then the
    root fully_shard-ed (FSDP2) over the trainers' gloo group on a CUDA mesh, its shards
    in pinned host memory under CPUOffloadPolicy when `offload`. Returns it and a record
    of what ran."""
    import transformers
    from torch.distributed.device_mesh import DeviceMesh

    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    hf = transformers.Qwen3Config(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.inter,
                                  num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                                  num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                                  tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(hf).to(torch.bfloat16)
    mesh = DeviceMesh.from_group(group, "cuda")
    policy = CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    n = sum(p.numel() for p in model.parameters())
    return model, dict(model=type(model).__name__, transformers=transformers.__version__, torch=torch.__version__,
                       parameters=n, offload=offload, fully_shard=f"{fully_shard.__module__}")


def _baseline_key(backend: str) -> str:
    return "baseline_s" if backend == "gloo" else f"baseline_{backend}_s"


def parse_gpus(text: str, ranks: int = 4) -> list:
    """--gpus: one CUDA device per rank (trainers first), or one for every rank."""
    gpus = [int(x) for x in text.split(",")]
    if len(gpus) == 1:
        gpus = gpus * ranks
    if len(gpus) != ranks or min(gpus) < 0:
        raise ValueError(f"--gpus {text!r}: {ranks} devices (trainers, then inference ranks) or one")
    return gpus


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ferry.rl.gpu_bench")
    ap.add_argument("--out", default=".")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--watermark-mb", type=int, default=512)
    ap.add_argument("--deadline", type=float, default=200.0, help="seconds for the whole run")
    ap.add_argument("--gpus", default="0", help="CUDA device per rank: trainer 0, 1, inference 0, 1 "
                    "(e.g. 0,0,1,1), or one for all")
    ap.add_argument("--resident", action="store_true", help="trainer shards in GPU memory (no CPU offload)")
    ap.add_argument("--gather", action="store_true", help="every job gathered on one owner (the seed's "
                    "full_tensor way) instead of direct writes of each rank's own rows")
    ap.add_argument("--graphs", action="store_true", help="from the second step, replay the first step's device "
                    "work as CUDA graphs (WeightSender(graphs=True))")
    ap.add_argument("--writes", choices=("auto", "engine", "mapped"), default="auto",
                    help="the trainers' writes: one-sided through the engine, or stores into the inference "
                    "weights mapped into the trainer (WeightSender(mapped=...); auto: where they map)")
    ap.add_argument("--fsdp2", action="store_true", help="trainer shards of a transformers Qwen3 (dense) that "
                    "fully_shard (FSDP2) sharded over the trainers, CPU offload unless --resident")
    ap.add_argument("--baselines", default="gloo", help="rank-0 gather + broadcast over: gloo, nccl "
                    "(needs a GPU per rank), or gloo,nccl")
    a = ap.parse_args(argv)
    a.gpu_of = parse_gpus(a.gpus)
    a.baselines = [b for b in a.baselines.split(",") if b]
    if any(b not in ("gloo", "nccl") for b in a.baselines):
        ap.error(f"--baselines {','.join(a.baselines)}: gloo and nccl only")
    if "nccl" in a.baselines and len(set(a.gpu_of)) != len(a.gpu_of):
        ap.error("--baselines nccl needs one GPU per rank (NCCL refuses two ranks on one device)")
    import multiprocessing as mp

    os.makedirs(a.out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, port, a, a.out)) for r in range(4)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + a.deadline
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    res = []
    for r in range(4):
        try:
            with open(os.path.join(a.out, f"rl-rank{r}.json")) as f:
                res.append(json.load(f))
        except OSError:
            res.append({"rank": r, "error": "no result"})
    summary = summarise(res)
    with open(os.path.join(a.out, "rl-gpu-summary.json"), "w") as f:
        json.dump(dict(summary=summary, ranks=res), f, indent=1, default=str)
    print(json.dumps(summary, indent=1, default=str))
    return 0 if all("error" not in r for r in res) else 1


def summarise(res):
    s = {"mode": next((r["mode"] for r in res if "mode" in r), None),
         "mapped": [r.get("mapped") for r in res if "mapped" in r],
         "map_error": next((r["map_error"] for r in res if r.get("map_error")), None)}
    errs = {r["rank"]: r["error"][-1500:] for r in res if "error" in r}
    if errs:
        s["errors"] = errs
    tr = [r for r in res if "steps" in r]
    if tr:
        n = min(len(r["steps"]) for r in tr)
        walls = [max(r["steps"][k]["wall_s"] for r in tr) for k in range(n)]
        s["step_s"] = walls
        best = min(range(n), key=lambda k: walls[k])
        s["best_step"] = best
        s["stages_best_step"] = {r["rank"]: r["steps"][best]["stages"] for r in tr}
        s["peak_ring_bytes"] = max(r["steps"][best]["peak_ring_bytes"] for r in tr)
        s["peak_cuda_above_base_bytes"] = max(r["steps"][best]["peak_cuda_above_base_bytes"] for r in tr)
        s["watermark_bytes"] = tr[0].get("watermark_bytes")
        s["bytes_written"] = sum(r["steps"][best]["bytes_written"] for r in tr)
        s["jobs_submits"] = {r["rank"]: (r["steps"][best]["jobs"], r["steps"][best].get("submits")) for r in tr}
        prep = max(r["steps"][best]["stages"]["prepare"] for r in tr)
        s["step_minus_prepare_s"] = walls[best] - prep
        # device time of fusion and quantisation (markers around each job's conversion),
        # the part of the step the copy-ceiling target leaves out
        gpu = {r["rank"]: r["steps"][best].get("gpu") or {} for r in tr}
        s["gpu_best_step"] = gpu
        conv = max((g.get("convert", 0.0) for g in gpu.values()), default=0.0)
        s["step_minus_convert_s"] = walls[best] - conv
        cc = next((r["copy_ceiling"] for r in tr if "copy_ceiling" in r), None)
        if cc:
            s["copy_ceiling"] = cc
            s["ceiling_over_step"] = cc["s"] / walls[best]
            s["ceiling_over_step_minus_prepare"] = cc["s"] / max(1e-9, walls[best] - prep)
            s["ceiling_over_step_minus_convert"] = cc["s"] / max(1e-9, walls[best] - conv)
            alone = max((r.get("convert_alone_s", 0.0) for r in tr), default=0.0)
            s["convert_alone_s"] = alone
            s["convert_alone_how"] = next((r.get("convert_alone_how") for r in tr), None)
            s["ceiling_over_step_minus_convert_alone"] = cc["s"] / max(1e-9, walls[best] - alone)
            cg = next((r["copy_ceiling_graph"] for r in tr if "copy_ceiling_graph" in r), None)
            if cg and "s" in cg:
                s["copy_ceiling_graph"] = cg
                s["graph_ceiling_over_step"] = cg["s"] / walls[best]
                s["graph_ceiling_over_step_minus_convert"] = cg["s"] / max(1e-9, walls[best] - conv)
                s["graph_ceiling_over_step_minus_convert_alone"] = cg["s"] / max(1e-9, walls[best] - alone)
            h2d = max((r.get("h2d_s", 0) for r in tr), default=0)
            if h2d:  # offloaded: the shards cross the host link before anything else
                s["h2d_floor_s"] = h2d
                s["h2d_floor_GBps"] = sum(r.get("h2d_bytes", 0) for r in tr) / h2d / 1e9
                s["floor_s"] = max(h2d, cc["s"])
                s["floor_over_step_minus_prepare"] = s["floor_s"] / max(1e-9, walls[best] - prep)
                s["floor_over_step_minus_convert"] = s["floor_s"] / max(1e-9, walls[best] - conv)
        s["quant_GBps"] = next((r["quant_GBps"] for r in tr if "quant_GBps" in r), None)
        s["quant_triton_GBps"] = next((r["quant_triton_GBps"] for r in tr if "quant_triton_GBps" in r), None)
        base = max((r.get("baseline_s", 0) for r in res), default=0)
        s["baseline_gather_broadcast_s"] = base
        if base:
            s["speedup_vs_baseline"] = base / walls[best]
        nccl = max((r.get("baseline_nccl_s", 0) for r in res), default=0)
        if nccl:
            s["baseline_nccl_gather_broadcast_s"] = nccl
            s["speedup_vs_nccl_baseline"] = nccl / walls[best]
    if any(r.get("mode", {}).get("graphs") for r in tr):
        s["graphs"] = {r["rank"]: r.get("graphs") for r in tr}
    f2 = next((r["fsdp2"] for r in res if "fsdp2" in r), None)
    if f2:
        s["fsdp2"] = f2
    inf = [r for r in res if "checks" in r]
    if inf:
        s["bit_exact"] = all(c["n_bad"] == 0 for r in inf for c in r["checks"])
        s["checks"] = {r["rank"]: r["checks"] for r in inf}
        s["numpy_vs_cuda_bit_exact"] = [r.get("numpy_vs_cuda_bit_exact") for r in inf]
    return s


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the MoE GPU tests (spawned; all ranks share cuda:0). Runs every
configuration it is given, each as its own AllToAll (own immediates), and
reports (name, errors) per configuration through the queue."""

from __future__ import annotations

import os
import time
import zlib
import traceback

from ferry.moe.reference import (
    Shape,
    check_dispatch,
    expected_combine,
    expert_outputs,
    make_inputs,
)


def _alloc(torch, shape: Shape, a2a, dev):
    L = shape.local_experts
    rows = a2a.out_rows
    num = torch.zeros(L, dtype=torch.int32, device=dev)
    out_x = torch.zeros(rows, shape.hidden, dtype=getattr(torch, shape.in_dtype), device=dev)
    out_s = torch.zeros(rows, max(shape.hidden_scale, 1), dtype=torch.float32, device=dev)
    return num, out_x, (out_s if shape.hidden_scale else None)


def _to_dev(torch, shape, inp, dev, T):
    """Inputs padded to T rows in static device tensors."""
    x = torch.zeros(T, shape.hidden, dtype=getattr(torch, shape.in_dtype), device=dev)
    idx = torch.zeros(T, shape.k, dtype=torch.int32, device=dev)
    w = torch.zeros(T, shape.k, dtype=torch.float32, device=dev)
    s = torch.ones(T, max(shape.hidden_scale, 1), dtype=torch.float32, device=dev)
    n = inp["n"]
    x[:n] = inp["x"].to(dev)
    idx[:n] = inp["idx"].to(dev)
    w[:n] = inp["w"].to(dev)
    if shape.hidden_scale:
        s[:n] = inp["x_scale"].to(dev)
    return x, idx, w, s


def run_config(torch, dist, name, shape: Shape, mode: str, iters: int, graph_replays: int, provider: str):
    import ferry.moe as moe

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    node = world if mode == "nvlink" else 1
    a2a = moe.AllToAll(
        max_num_tokens=shape.max_tokens, num_experts=shape.num_experts, experts_per_token=shape.k,
        hidden=shape.hidden, hidden_scale=shape.hidden_scale or None, in_dtype=shape.in_dtype,
        out_dtype=shape.out_dtype, expert_padding=shape.padding, max_private_tokens=shape.private,
        node_size=node, provider=provider, deadline=20.0,
    )
    errs = []
    try:
        num, out_x, out_s = _alloc(torch, shape, a2a, dev)
        T = shape.max_tokens
        seed = zlib.crc32(name.encode()) % 10_000

        def one(it, x, idx, w, s, out, replay=None):
            inputs = [make_inputs(shape, seed, r, it) for r in range(world)]
            mine = inputs[rank]
            e = check_dispatch(shape, inputs, rank, num, out_x, out_s)
            ref = expected_combine(shape, mine)
            got = out[: mine["n"]].cpu()
            tol = dict(rtol=1e-5, atol=1e-5) if shape.out_dtype == "float32" else dict(rtol=2e-2, atol=2e-2)
            try:
                torch.testing.assert_close(got.float(), ref.float(), **tol)
            except AssertionError as ex:
                e.append(f"combine: {str(ex)[:300]}")
            return [f"iter {it}{'' if replay is None else f' replay {replay}'}: {m}" for m in e]

        # Eager iterations, fresh routes each time.
        for it in range(iters):
            mine = make_inputs(shape, seed, rank, it)
            x, idx, w, s = _to_dev(torch, shape, mine, dev, T)
            n = mine["n"]
            a2a.dispatch(num, out_x, out_s, x[:n], s[:n] if shape.hidden_scale else None, idx[:n], w[:n])
            y = expert_outputs(shape, rank, num, out_x, out_s)
            out = torch.full((max(n, 1), shape.hidden), 7.0, dtype=getattr(torch, shape.out_dtype), device=dev)
            a2a.combine(out[:n], idx[:n], w[:n], y)
            torch.cuda.synchronize()
            a2a.check()
            errs += one(it, x, idx, w, s, out)
            if errs:
                break
        # Determinism: the same inputs twice give the same bits.
        if not errs and iters:
            outs = []
            for _ in range(2):
                mine = make_inputs(shape, seed, rank, 0)
                x, idx, w, s = _to_dev(torch, shape, mine, dev, T)
                n = mine["n"]
                a2a.dispatch(num, out_x, out_s, x[:n], s[:n] if shape.hidden_scale else None, idx[:n], w[:n])
                y = expert_outputs(shape, rank, num, out_x, out_s)
                out = torch.zeros(max(n, 1), shape.hidden, dtype=getattr(torch, shape.out_dtype), device=dev)
                a2a.combine(out[:n], idx[:n], w[:n], y)
                torch.cuda.synchronize()
                outs.append(out.clone())
            if not torch.equal(outs[0], outs[1]):
                errs.append("combine is not deterministic")
        if not errs and graph_replays:
            errs += run_graph(torch, a2a, shape, seed, rank, world, dev, num, out_x, out_s, graph_replays, one)
        a2a.check()
    except Exception:
        errs.append(traceback.format_exc()[-1500:])
    finally:
        try:
            a2a.destroy()
        except Exception:
            errs.append("destroy: " + traceback.format_exc()[-500:])
    return errs


def run_graph(torch, a2a, shape, seed, rank, world, dev, num, out_x, out_s, replays, one):
    """dispatch -> experts -> combine captured once, replayed with new routes:
    new inputs are copied into the static tensors, the token count goes
    through bound_m, every replay is checked."""
    T = shape.max_tokens
    x = torch.zeros(T, shape.hidden, dtype=getattr(torch, shape.in_dtype), device=dev)
    idx = torch.zeros(T, shape.k, dtype=torch.int32, device=dev)
    w = torch.zeros(T, shape.k, dtype=torch.float32, device=dev)
    s = torch.ones(T, max(shape.hidden_scale, 1), dtype=torch.float32, device=dev)
    bound = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.zeros(T, shape.hidden, dtype=getattr(torch, shape.out_dtype), device=dev)
    y = torch.zeros(out_x.shape[0], shape.hidden, dtype=getattr(torch, shape.out_dtype), device=dev)

    def body():
        a2a.dispatch(num, out_x, out_s, x, s if shape.hidden_scale else None, idx, w, bound_m=bound)
        # The experts, on the graph's stream: y = x * (global expert + 1), block by block.
        y.copy_(expert_y_static(torch, shape, rank, num, out_x, out_s, y))
        a2a.combine(out, idx, w, y, bound_m=bound)

    def load(it):
        mine = make_inputs(shape, seed, rank, it)
        n = mine["n"]
        x.zero_()
        idx.zero_()
        w.zero_()
        x[:n] = mine["x"].to(dev)
        idx[:n] = mine["idx"].to(dev)
        w[:n] = mine["w"].to(dev)
        if shape.hidden_scale:
            s[:n] = mine["x_scale"].to(dev)
        bound.fill_(n)

    load(10_000)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up (one real iteration, also allocates nothing new later)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    # Capture does not run the kernels: the iteration count is unchanged.
    errs = []
    for r in range(replays):
        it = 10_001 + r
        load(it)
        g.replay()
        torch.cuda.synchronize()
        a2a.check()
        errs += one(it, x, idx, w, s, out, replay=r)
        if errs:
            break
    return errs


def expert_y_static(torch, shape, rank, num, out_x, out_s, y):
    """expert_fn without host syncs: each row's expert from the padded block
    offsets computed on the device."""
    L = shape.local_experts
    pad = shape.padding
    padded = (num + pad - 1) // pad * pad
    starts = torch.cumsum(padded, 0) - padded
    rows = torch.arange(out_x.shape[0], device=out_x.device)
    block = torch.searchsorted(starts + padded, rows, right=True).clamp_max(L - 1)
    xf = out_x.float()
    if shape.hidden_scale:
        b = (shape.hidden + shape.hidden_scale - 1) // shape.hidden_scale
        xf = xf * out_s.repeat_interleave(b, dim=1)[:, : shape.hidden]
    e = (block + rank * L).float()
    return (xf * (e + 1).unsqueeze(1)).to(y.dtype)


def main(rank: int, world: int, init: str, configs: list, mode: str, iters: int, replays: int, provider: str, q) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("FERRY_LOG", "warn")
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for name, shape in configs:
            t0 = time.time()
            errs = run_config(torch, dist, name, shape, mode, iters, replays if name.endswith("graph") else 0, provider)
            print(f"[moe] EP={world} {mode} rank {rank} {name}: {'ok' if not errs else errs[:2]} "
                  f"({time.time() - t0:.1f} s)", flush=True)
            q.put((rank, name, errs))
    except Exception:
        q.put((rank, "fatal", [traceback.format_exc()[-2000:]]))
    finally:
        dist.destroy_process_group()

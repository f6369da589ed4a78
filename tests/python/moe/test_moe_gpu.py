"""ferry.moe on one GPU shared by several processes (CUDA IPC works between
processes of one GPU). EP=2 and EP=4, each as one NVLink node (payloads over
IPC-mapped buffers) and as one node per rank (the host proxy and the engine,
shm, buffers in pinned host memory); fp32, bf16, fp8 e4m3 + fp32 block scales,
padding 16, a tiny private round (overflow path), 1 token, 0 tokens, 256
experts / top-8 / hidden 7168; a CUDA graph replayed with new routes, every
replay checked. Checked against ferry.moe.reference (plain PyTorch on the
inputs every rank rebuilds): expert token counts exact, every routed row in
its expert's block (bytes, scales included), combine equal to the reference
and bit-identical when repeated. Skipped without torch or CUDA.

FERRY_MOE_REPLAYS sets the graph replays (default 20; scripts/gpu_moe.sh full: 1000 at EP=4),
FERRY_MOE_REPLAYS_EP<n> those of one world size.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

sys.path.insert(0, os.path.dirname(__file__))

from ferry.moe.reference import Shape  # noqa: E402

REPLAYS = int(os.environ.get("FERRY_MOE_REPLAYS", "20"))
ITERS = int(os.environ.get("FERRY_MOE_ITERS", "3"))


def configs(world: int) -> list:
    E = 8 * world
    c = [
        ("fp32", Shape(world, 64, E, 2, 256, in_dtype="float32", out_dtype="float32")),
        ("bf16-pad16", Shape(world, 64, E, 4, 512, padding=16)),
        ("fp8-scales", Shape(world, 64, E, 4, 512, hidden_scale=4, in_dtype="float8_e4m3fn")),
        ("tiny-private", Shape(world, 96, E, 4, 256, private=2)),
        ("one-token", Shape(world, 16, E, 2, 128, tokens=1)),
        ("zero-tokens", Shape(world, 16, E, 2, 128, tokens=0)),
        ("ds-256x8x7168", Shape(world, 128, 256, 8, 7168, hidden_scale=56, in_dtype="float8_e4m3fn",
                                out_dtype="bfloat16", padding=16)),
        ("bf16-graph", Shape(world, 64, E, 4, 256, padding=16)),
    ]
    return c


def run_world(world: int, mode: str) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tempfile.mktemp(prefix='ferry-moe-')}"
    from moe_worker import main

    cfgs = configs(world)
    replays = int(os.environ.get(f"FERRY_MOE_REPLAYS_EP{world}", REPLAYS))
    procs = [
        ctx.Process(target=main, args=(r, world, init, cfgs, mode, ITERS, replays, "shm", q))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict = {}
    want = world * len(cfgs)
    got = 0
    try:
        while got < want:
            rank, name, errs = q.get(timeout=int(os.environ.get("FERRY_MOE_WAIT", "150")))
            results.setdefault(name, []).extend(f"rank {rank}: {e}" for e in errs)
            got += 1
            if name == "fatal":
                break
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode", ["nvlink", "proxy"])
def test_dispatch_combine_against_reference(world, mode):
    results = run_world(world, mode)
    assert "fatal" not in results, results.get("fatal")
    bad = {k: v for k, v in results.items() if v}
    print(f"EP={world} {mode}: {len(results)} configurations, {len(bad)} failed")
    assert not bad, bad
    assert set(results) == {n for n, _ in configs(world)}

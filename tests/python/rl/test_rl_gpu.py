"""The weight transfer on a GPU (PyTorch CUDA, nvlink provider): python -m ferry.rl.gpu_bench
with fewer steps; every inference tensor must be bit-exact. Skipped without torch or a GPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_bench_bit_exact_and_under_the_watermark(tmp_path):
    pytest.importorskip("ml_dtypes")
    from ferry.rl import gpu_bench

    rc = gpu_bench.main(["--out", str(tmp_path), "--steps", "2", "--deadline", "180"])
    s = json.loads((tmp_path / "rl-gpu-summary.json").read_text())["summary"]
    assert rc == 0, s.get("errors")
    assert s["bit_exact"] is True
    assert s["peak_ring_bytes"] <= s["watermark_bytes"]
    assert s["numpy_vs_cuda_bit_exact"] == [True, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_bench_fsdp2_module_offloaded_bit_exact(tmp_path):
    """Trainer shards from transformers' Qwen3 fully_shard-ed (FSDP2) over gloo with CPU
    offload: the blocks come from its DTensors, the writes from its pinned shards."""
    pytest.importorskip("ml_dtypes")
    pytest.importorskip("transformers")
    from ferry.rl import gpu_bench

    rc = gpu_bench.main(["--out", str(tmp_path), "--steps", "2", "--deadline", "180", "--fsdp2"])
    s = json.loads((tmp_path / "rl-gpu-summary.json").read_text())["summary"]
    assert rc == 0, s.get("errors")
    assert s["bit_exact"] is True
    assert s["fsdp2"]["offload"] is True and s["fsdp2"]["parameters"] > 100_000_000
    assert s["fsdp2"]["shards_are_module_memory"] is True
    assert s["peak_ring_bytes"] <= s["watermark_bytes"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("writes", ["engine", "mapped"])
def test_gpu_bench_graph_replays_bit_exact(tmp_path, writes):
    """Resident shards written in place: steps after the first replay CUDA graphs; the
    writes through the engine, or as stores into the mapped inference weights."""
    pytest.importorskip("ml_dtypes")
    from ferry.rl import gpu_bench

    rc = gpu_bench.main(["--out", str(tmp_path), "--steps", "3", "--deadline", "180", "--resident", "--graphs",
                         "--writes", writes])
    s = json.loads((tmp_path / "rl-gpu-summary.json").read_text())["summary"]
    assert rc == 0, s.get("errors")
    assert s["bit_exact"] is True
    assert s["mapped"] == [writes == "mapped"] * 2, (s["mapped"], s["map_error"])
    for rank, steps in s["graphs"].items():
        assert [g["replayed"] for g in steps] == [False, True, True], (rank, steps)

"""The GPU bench's placement options, checked before any process starts (no GPU needed)."""

import pytest

from ferry.rl import gpu_bench


def test_gpus_name_one_device_per_rank_or_one_for_all():
    assert gpu_bench.parse_gpus("0") == [0, 0, 0, 0]
    assert gpu_bench.parse_gpus("0,0,1,1") == [0, 0, 1, 1]
    assert gpu_bench.parse_gpus("3,2,1,0") == [3, 2, 1, 0]
    for bad in ("0,1", "0,1,2,3,4", "-1"):
        with pytest.raises(ValueError):
            gpu_bench.parse_gpus(bad)


@pytest.mark.parametrize("argv", [
    ["--gpus", "0,0,1,1", "--baselines", "nccl"],  # two ranks on one GPU: NCCL refuses
    ["--gpus", "0", "--baselines", "gloo,nccl"],
    ["--baselines", "mpi"],
    ["--gpus", "0,1"],
])
def test_placements_that_cannot_run_are_refused_before_starting(argv, capsys):
    with pytest.raises((SystemExit, ValueError)):
        gpu_bench.main(argv)


def test_summary_takes_the_offloaded_floor_from_the_host_copy_of_the_same_run():
    stages = {k: 0.0 for k in ("send", "wait_memory", "gather", "h2d", "prepare", "post", "write", "barrier")}
    step = lambda wall, prep: dict(wall_s=wall, stages=dict(stages, prepare=prep), peak_ring_bytes=1,  # noqa: E731
                                   peak_cuda_above_base_bytes=0, bytes_written=10, writes=1, jobs=1)
    tr = [{"rank": r, "mode": {"resident": False, "gather": False}, "steps": [step(0.5, 0.1), step(0.2, 0.05)],
           "h2d_s": 0.06 + 0.01 * r, "h2d_bytes": 7 << 30} for r in range(2)]
    tr[0]["copy_ceiling"] = {"s": 0.01, "bytes": 1, "copies": 1, "GBps": 1, "src": "x", "dst": "y"}
    s = gpu_bench.summarise(tr)
    assert s["best_step"] == 1 and s["step_minus_prepare_s"] == pytest.approx(0.15)
    assert s["floor_s"] == pytest.approx(0.07)  # the slower trainer's host copy, above the device copies
    assert s["floor_over_step_minus_prepare"] == pytest.approx(0.07 / 0.15)
    assert s["ceiling_over_step_minus_prepare"] == pytest.approx(0.01 / 0.15)
    assert s["mode"] == {"resident": False, "gather": False}
    del tr[0]["h2d_s"], tr[1]["h2d_s"]  # resident: no host copy, no floor above the ceiling
    assert "floor_s" not in gpu_bench.summarise(tr)

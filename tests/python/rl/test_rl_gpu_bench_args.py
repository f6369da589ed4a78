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

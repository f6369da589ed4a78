"""The planner's posting measurement: every work request of the busiest rank posted and
counted, on the in-process fake NIC and over tcp to a second process."""

from __future__ import annotations

import pytest

from ferry.rl import model as M
from ferry.rl import plan as P
from ferry.rl import schedule as S

pytest.importorskip("ml_dtypes")


@pytest.fixture(scope="module")
def schedule():
    lay = P.Layouts(M.TrainerLayout(fsdp=2), M.InferenceLayout(ep=2, tp=2))
    tm, im = P.metas(M.TINY_QWEN3, lay)
    return S.build(tm, im, 4 << 20)


@pytest.mark.parametrize("provider,nics,cap", [("fake", ("fake",), 64), ("tcp;ofi_rxm", ("lo",), 4096)])
def test_measure_posting_posts_every_write(schedule, provider, nics, cap):
    m = P.measure_posting(schedule, provider, nics, cap=cap, repeats=2)
    r = m["rank"]
    assert m["wrs"] == schedule.writes_of(r) == max(schedule.writes_of(k) for k in range(schedule.trainers))
    assert m["submits"] == len(schedule.owned(r))
    assert len(m["passes"]) == 2
    b = m["best"]
    assert b["process_cpu_ms"] > 0 and b["complete_wall_ms"] >= b["submit_wall_ms"] > 0
    assert m["wr_us"] >= 0 and m["submit_us"] >= 0

"""StepStats and the Chrome trace they become (no engine needed)."""

from __future__ import annotations

import json

from ferry.rl.pipeline import StepStats, chrome_trace


def test_chrome_trace_has_one_row_per_stage_and_complete_events(tmp_path):
    st = StepStats(rank=3, step=7)
    st.add("gather", "layers.0.q", 1.0, 1.5, base=1.0)
    st.add("prepare", "layers.0.q", 1.5, 1.75, base=1.0)
    st.add("write", "layers.0.q", 1.75, 2.0, base=1.0)
    path = tmp_path / "t.json"
    doc = chrome_trace([st], str(path))
    assert json.loads(path.read_text()) == doc
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["cat"], e["ts"], e["dur"]) for e in spans] == [("gather", 0.0, 500000.0), ("prepare", 500000.0, 250000.0),
                                                              ("write", 750000.0, 250000.0)]
    assert all(e["pid"] == 3 for e in spans) and len({e["tid"] for e in spans}) == 3
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"gather", "prepare", "write", "barrier"} <= names
    assert st.stages["gather"] == 0.5 and st.stages["write"] == 0.25

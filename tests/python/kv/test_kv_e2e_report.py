"""The e2e breakdown (ferry.kv.e2e_report) on a trace written the way the engine writes
one: per-hop times must come out of the spans exactly."""

import json

import pytest

from ferry.kv import e2e_report

LAYERS = 3
CTX = 68104
LAYER_BYTES = 4 * 16384


def _span(ts_ns, dur_ns, nbytes, name="prepared"):
    return {"name": name, "cat": "transfer", "ph": "X", "ts": ts_ns / 1e3, "dur": dur_ns / 1e3,
            "pid": 1, "tid": 1000, "args": {"transfer": 1, "bytes": nbytes, "writes": 1,
                                            "status": "OK"}}


def _request(t0):
    """Layer l's K and V submitted at t0 + 100 us * l, taking 20 and 30 us; the
    context 5 us after the last layer, taking 2 us."""
    ev = []
    for layer in range(LAYERS):
        at = t0 + 100_000 * layer
        ev += [_span(at, 20_000, LAYER_BYTES), _span(at + 1_000, 29_000 + 10_000 * layer, LAYER_BYTES)]
    last = t0 + 100_000 * (LAYERS - 1)
    ev.append(_span(last + 5_000, 2_000, CTX))
    return ev


def _write(tmp_path, events):
    p = tmp_path / "prefill.json"
    # Other events the engine writes next to transfer spans must be ignored.
    extra = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1000, "args": {"name": "w"}},
             _span(50, 10, LAYER_BYTES, name="posted"),
             {"name": "imm 7", "cat": "imm", "ph": "i", "s": "t", "ts": 1.0, "pid": 1, "tid": 1}]
    p.write_text(json.dumps({"traceEvents": extra + events}))
    return str(p)


def test_breakdown_of_each_request_from_its_window(tmp_path):
    a, b = 10_000_000, 20_000_000
    spans = e2e_report.prepared_spans(_write(tmp_path, _request(b) + _request(a)))
    assert len(spans) == 2 * (2 * LAYERS + 1)
    assert spans == sorted(spans)
    last = b + 100_000 * (LAYERS - 1)
    imms = e2e_report.imm_instants(_write(tmp_path, [
        {"name": "imm 9", "cat": "imm", "ph": "i", "s": "t", "ts": (last + t) / 1e3, "pid": 2,
         "tid": 1099, "args": {"count": 1}} for t in (70_000, 40_000, 9_000)]))
    assert imms == [1_000, last + 9_000, last + 40_000, last + 70_000]  # 1 us: _write's own
    out = e2e_report.request_breakdown(spans, (b - 1_000, b + 1_000_000), CTX, LAYERS,
                                       released_ns=last + 60_000, decoder_imms=imms)
    assert out["writes"] == 2 * LAYERS + 1
    assert out["last_layer_post_us"] == pytest.approx(201.0)
    # the last layer: K at +0 for 20 us, V at +1 us for 29 + 20 us: ends at +50 us
    assert out["last_layer_us"] == pytest.approx(50.0)
    assert out["layer_us"] == pytest.approx(40.0)  # layers of 30, 40, 50 us
    assert out["layer_min_us"] == pytest.approx(30.0)
    assert out["layer_max_us"] == pytest.approx(50.0)
    assert out["context_post_after_last_layer_us"] == pytest.approx(5.0)
    assert out["context_us"] == pytest.approx(2.0)
    # from the context's post (+5 us): to the wait returning, to the last immediate counted
    # before it (+40 us; the one at +70 us belongs to a later request)
    assert out["exposed_us"] == pytest.approx(55.0)
    assert out["exposed_engine_us"] == pytest.approx(35.0)
    assert out["release_after_context_done_us"] == pytest.approx(53.0)
    assert "wait_saw_count_after_us" not in out
    # the waiter saw the count at +45 us: 5 us after the worker counted, 15 before returning
    seen = e2e_report.request_breakdown(spans, (b - 1_000, b + 1_000_000), CTX, LAYERS,
                                        released_ns=last + 60_000, decoder_imms=imms,
                                        seen_ns=last + 45_000, pages_released_ns=last + 52_000)
    assert seen["wait_saw_count_after_us"] == pytest.approx(5.0)
    assert seen["release_after_seen_us"] == pytest.approx(15.0)
    assert seen["bookkeeping_us"] == pytest.approx(7.0)
    first = e2e_report.request_breakdown(spans, (a, a + 1_000_000), CTX, LAYERS)
    assert "exposed_us" not in first and "exposed_engine_us" not in first and first["writes"] == 2 * LAYERS + 1


def test_a_window_without_the_whole_request_is_an_error(tmp_path):
    spans = e2e_report.prepared_spans(_write(tmp_path, _request(10_000_000)))
    with pytest.raises(ValueError, match="expected 6 layer writes"):
        e2e_report.request_breakdown(spans, (10_000_000 + 150_000, 10_000_000 + 10**6), CTX,
                                     LAYERS)
    with pytest.raises(ValueError, match="context"):
        e2e_report.request_breakdown([s for s in spans if s[2] != CTX], (0, 10**9), CTX, LAYERS)


def test_median_is_the_upper_middle():
    assert e2e_report.median([3, 1, 2]) == 2
    assert e2e_report.median([4, 1, 3, 2]) == 3

"""Observability from Python: engine.stats(), the Prometheus endpoint scraped with a
real HTTP client while traffic to a peer process runs, the trace file, and
python -m ferry.top (docs/OBSERVABILITY.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import ferry
from conftest import engine_for

PAGE = 4096


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value}, parsed by prometheus_client when it is
    installed (which also checks the format), else line by line."""
    out = {}
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            pairs = [p.split("=", 1) for p in labels.rstrip("}").split('",') if p]
            out[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(parsed: dict, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in parsed.items() if n == name and want <= set(ls))


def test_stats_dict_has_the_documented_keys(pair):
    a, b = pair
    src = np.arange(PAGE * 8, dtype=np.uint8)
    h, _ = a.register(src)
    dst = np.zeros(PAGE * 8, dtype=np.uint8)
    _, ddesc = b.register(dst)
    c = b.imm_counter(4)
    # From a thread of its own: a thread's first submission is always timed
    # (latency_sample_every counts per thread).
    th = threading.Thread(
        target=lambda: a.submit_paged_writes(
            PAGE, h, list(range(8)), PAGE, 0, ddesc, list(range(8)), PAGE, 0, imm=4
        ).result(20)
    )
    th.start()
    th.join()
    # A thread's first wait is always timed, too.
    waiter = threading.Thread(target=lambda: c.wait(8, 20))
    waiter.start()
    waiter.join()
    s = a.stats()
    assert s["enabled"] is True
    for key in ("transfers", "bytes_posted", "bytes_completed", "writes_posted", "writes_completed",
                "imms_received", "backpressure", "workers", "nics", "peers", "top_imms", "imms_other",
                "counter_wait", "callback_delay", "watcher_poll_lag", "callback_queue_depth",
                "callback_failures", "dropped_plain_imms", "trace_events_dropped", "wake"):
        assert key in s, key
    # Process-wide wake-up counts: the submissions above were posted by their
    # threads or by the worker, and either way counted somewhere.
    assert set(s["wake"]) == {"blocks", "woken_by_submission", "woken_by_completion",
                              "woken_by_timer", "naps", "notifies", "inline_posts",
                              "inline_replies", "helped_polls", "callback_blocks",
                              "reply_windows", "reply_hits", "asides", "asleep"}
    assert all(v >= 0 for v in s["wake"].values())
    assert s["transfers"] == {"ok": 1, "failed": {}}
    assert s["bytes_posted"] == s["bytes_completed"] == 8 * PAGE
    assert s["writes_posted"] == s["writes_completed"] == 8
    (peer,) = s["peers"]
    assert peer["bytes_ok"] == 8 * PAGE and peer["transfers_ok"] == 1
    w = s["workers"][0]
    assert w["transfer_latency"]["count"] == 1 and w["transfer_latency"]["p50_s"] > 0
    assert w["registrations"] == 2  # the source and the send pool
    r = b.stats()
    assert r["imms_received"] == 8 and r["top_imms"][0] == (4, 8)
    assert r["counter_wait"]["count"] == 1
    assert a.metrics_address is None and a.tracing is False
    a.stop()
    last = a.stats()  # the figures as stop() left them
    assert last["transfers"] == {"ok": 1, "failed": {}}
    assert last["bytes_completed"] == 8 * PAGE


def test_injected_failures_are_counted_by_code(kind, monkeypatch):
    monkeypatch.setenv("FERRY_FAULT_INJECTION", "seed=11,fail=0.3")
    with engine_for(kind) as e:
        buf = np.zeros(PAGE, dtype=np.uint8)
        h, d = e.register(buf)
        seen: dict = {}
        for t in [e.submit_write(h, 0, 512, d, 0, imm=3) for _ in range(30)]:
            ex = t.exception(20)
            name = "OK" if ex is None else type(ex).__name__
            seen[name] = seen.get(name, 0) + 1
        s = e.stats()
        assert s["transfers"]["ok"] == seen.get("OK", 0)
        failed = sum(s["transfers"]["failed"].values())
        assert failed == 30 - seen.get("OK", 0) and failed > 0
        assert s["transfers"]["failed"].get("UNAVAILABLE", 0) == seen.get("Unavailable", 0)


def test_metrics_scraped_while_writing_to_a_peer_process(remote, tmp_path):
    kind, _, peer = remote
    trace = str(tmp_path / "run.json")
    e = engine_for(kind, metrics="127.0.0.1:0", trace=trace)
    try:
        assert e.metrics_address and e.metrics_address.startswith("127.0.0.1:")
        pages = 32
        src = np.arange(PAGE * pages, dtype=np.uint8)
        h, _ = e.register(src)
        peer.call("clear")
        peer.call("count", 17)
        rounds = 12
        done = threading.Event()
        errors: list = []

        def traffic():
            try:
                for _ in range(rounds):
                    with e.trace("round", track="test"):
                        e.submit_paged_writes(PAGE, h, list(range(pages)), PAGE, 0, peer.desc,
                                              list(range(pages)), PAGE, 0, imm=17).result(20)
            except Exception as ex:  # reported below
                errors.append(ex)
            finally:
                done.set()

        th = threading.Thread(target=traffic)
        th.start()
        last = 0.0
        scrapes = 0
        while not done.is_set() or scrapes < 2:
            now = total(samples(scrape(e.metrics_address)), "ferry_bytes_written_total")
            assert now >= last
            last = now
            scrapes += 1
        th.join()
        assert not errors, errors
        peer.call("wait", 17, pages * rounds, 20, 0, 16)
        moved = rounds * pages * PAGE
        parsed = samples(scrape(e.metrics_address))
        assert total(parsed, "ferry_bytes_written_total") == moved
        assert total(parsed, "ferry_bytes_posted_total") == moved
        assert total(parsed, "ferry_writes_posted_total") == rounds * pages
        assert total(parsed, "ferry_transfers_total", outcome="ok") == rounds
        assert total(parsed, "ferry_transfer_latency_seconds_count") == rounds
        # The peer writes back: immediates counted by value on this side.
        mine = np.zeros(64, dtype=np.uint8)
        _, mdesc = e.register(mine)
        c = e.imm_counter(99)
        peer.call("write", mdesc, b"x" * 64, 0, 99)
        c.wait(1, 20)
        parsed = samples(scrape(e.metrics_address))
        assert total(parsed, "ferry_imm_value_received_total", imm="99") == 1
        # Process-wide wake-up counts, one sample per event.
        events = {dict(ls)["event"] for (n, ls) in parsed if n == "ferry_wake_events_total"}
        assert events == {"block", "woken_by_submission", "woken_by_completion",
                          "woken_by_timer", "nap", "notify", "inline_post", "inline_reply",
                          "helped_poll", "callback_block", "reply_window", "reply_hit", "aside"}
        assert ("ferry_workers_asleep", frozenset()) in parsed
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{e.metrics_address}/other", timeout=10)
        # python -m ferry.top through the same endpoint.
        out = subprocess.run([sys.executable, "-m", "ferry.top", "--once", e.metrics_address],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "transfers" in out.stdout and str(rounds) in out.stdout
    finally:
        e.stop()
    with open(trace) as f:
        t = json.load(f)
    events = t["traceEvents"]
    spans = [ev for ev in events if ev.get("ph") == "X" and ev.get("name") == "paged_writes"]
    assert len(spans) == rounds
    assert all(ev["args"]["bytes"] == pages * PAGE and ev["args"]["status"] == "OK" for ev in spans)
    assert len([ev for ev in events if ev.get("name") == "round" and ev.get("ph") == "X"]) == rounds
    names = {ev["args"]["name"] for ev in events if ev.get("ph") == "M" and ev["name"] == "thread_name"}
    assert "test" in names and any(n.startswith("worker 0 NIC 0") for n in names)
    assert [ev for ev in events if ev.get("cat") == "imm" and ev["name"] == "imm 99"]


def test_trace_png_renders_a_trace(tmp_path):
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.json"
    with engine_for("shm", trace=str(trace)) as e:
        buf = np.zeros(PAGE, dtype=np.uint8)
        h, d = e.register(buf)
        for _ in range(3):
            e.submit_write(h, 0, 256, d, 0, imm=1).result(20)
        e.trace_span("step", ferry.trace_clock_ns() - 1000, ferry.trace_clock_ns(), "user")
    png = tmp_path / "t.png"
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "trace_png.py")
    out = subprocess.run([sys.executable, script, str(trace), str(png)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_sample_every_times_one_submission_in_n(kind):
    # Each engine's submissions come from a thread of their own: the count of
    # submissions before the next timed one is per thread.
    for every, timed in ((1, 20), (8, 3)):
        a = engine_for(kind, latency_sample_every=every)
        b = engine_for(kind)
        try:
            src = np.arange(PAGE, dtype=np.uint8)
            h, _ = a.register(src)
            _, ddesc = b.register(np.zeros(PAGE, dtype=np.uint8))

            def writes():
                for _ in range(20):
                    a.submit_write(h, 0, PAGE, ddesc, 0).result(20)

            th = threading.Thread(target=writes)
            th.start()
            th.join()
            s = a.stats()
            assert s["transfers"] == {"ok": 20, "failed": {}}
            w = s["workers"][0]
            assert w["transfer_latency"]["count"] == timed and w["queue_delay"]["count"] == timed
        finally:
            a.stop()
            b.stop()
    with pytest.raises(ferry.InvalidArgument):
        engine_for(kind, latency_sample_every=0)

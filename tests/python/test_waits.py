"""Blocking waits: they end with Cancelled when the engine stops, answer signals, and never
abort the interpreter at exit (daemon threads still waiting when it finalises: in
ImmCounter.wait, TransferCounter.wait and Transfer.result)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import engine_for

HERE = os.path.dirname(os.path.abspath(__file__))


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def test_stop_ends_imm_counter_waits_with_cancelled(kind):
    e = engine_for(kind)
    base = ferry._ferry._blocked_waits()
    counters = [e.imm_counter(31), e.imm_counter(32), e.imm_counter(33)]
    timeouts = [None, 60, 3600.0]
    out: dict = {}

    def waiter(i):
        try:
            counters[i].wait(1, timeout=timeouts[i])
            out[i] = "returned"
        except BaseException as ex:  # noqa: BLE001 - the test inspects it
            out[i] = ex

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    _wait_for(lambda: ferry._ferry._blocked_waits() == base + 3, 20, "three threads inside wait()")
    t0 = time.monotonic()
    e.stop()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a waiter stayed blocked after stop()"
    assert time.monotonic() - t0 < 10
    for i in range(3):
        assert isinstance(out[i], ferry.Cancelled), out[i]
        assert out[i].code == "CANCELLED"
    # a wait that starts after stop() ends at once, with Cancelled too
    t0 = time.monotonic()
    with pytest.raises(ferry.Cancelled):
        counters[0].wait(1, timeout=None)
    assert time.monotonic() - t0 < 5


def test_spinning_wait_takes_arrivals_times_out_and_ends_at_stop(kind):
    a, b = engine_for(kind), engine_for(kind)
    try:
        _, d = b.register(np.zeros(16, np.uint8))
        c = b.imm_counter(35)
        for _ in range(3):
            a.submit_imm(35, d)
        c.wait(3, timeout=20, spin=True)
        assert c.value == 0
        t0 = time.monotonic()
        with pytest.raises(ferry.Timeout):
            c.wait(1, timeout=0.05, spin=True)
        assert time.monotonic() - t0 >= 0.05
        out: dict = {}

        def waiter():
            try:
                c.wait(1, timeout=60, spin=True)
                out["r"] = "returned"
            except BaseException as ex:  # noqa: BLE001 - the test inspects it
                out["r"] = ex

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        b.stop()
        t.join(10)
        assert not t.is_alive(), "a spinning waiter stayed after stop()"
        assert isinstance(out["r"], ferry.Cancelled), out["r"]
    finally:
        a.stop()
        b.stop()


def test_stop_keeps_arrivals_that_are_already_there(kind):
    a, b = engine_for(kind), engine_for(kind)
    try:
        _, d = b.register(np.zeros(16, np.uint8))
        c = b.imm_counter(34)
        a.submit_imm(34, d).result(20)
        _wait_for(lambda: c.value == 1, 20, "the immediate")
        b.stop()
        c.wait(1, timeout=0)  # consumed, although the engine is stopped
        with pytest.raises(ferry.Cancelled):
            c.wait(1, timeout=0)
    finally:
        a.stop()
        b.stop()


def test_remove_imm_count_ends_waits_with_cancelled(kind):
    # the C++ counter reports kCancelled itself here (the engine is still running)
    e = engine_for(kind)
    try:
        base = ferry._ferry._blocked_waits()
        c = e.imm_counter(36)
        out: list = []

        def waiter():
            try:
                c.wait(1, timeout=None)
                out.append("returned")
            except BaseException as ex:  # noqa: BLE001 - the test inspects it
                out.append(ex)

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        _wait_for(lambda: ferry._ferry._blocked_waits() == base + 1, 20, "the thread inside wait()")
        e.remove_imm_count(36)
        t.join(10)
        assert not t.is_alive(), "the waiter stayed blocked after remove_imm_count"
        assert isinstance(out[0], ferry.Cancelled), out
        assert not e.stopped
    finally:
        e.stop()


def test_cancelled_from_the_engine_is_the_cancelled_class():
    e = ferry._ferry.make_error("CANCELLED", "stopped")
    assert type(e) is ferry.Cancelled and e.code == "CANCELLED"


def test_infinite_wait_answers_signals(kind):
    # A signal handler that raises ends an ImmCounter.wait(timeout=None) on the main
    # thread: the wait is a loop of bounded waits that checks for signals between them.
    class Interrupted(Exception):
        pass

    def on_alarm(signum, frame):
        raise Interrupted()

    a, b = engine_for(kind), engine_for(kind)
    _, d = b.register(np.zeros(16, np.uint8))
    c = b.imm_counter(35)
    # If the signal were never noticed, this thread ends the wait (and the test fails).
    rescue = threading.Timer(15, lambda: a.submit_imm(35, d))
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        rescue.start()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Interrupted):
            c.wait(1, timeout=None)
        assert time.monotonic() - t0 < 10
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        rescue.cancel()
        a.stop()
        b.stop()


_EXIT_SCRIPT = r"""
import sys, threading
sys.path.insert(0, {here!r})
import ferry
from conftest import engine_for

e = engine_for({kind!r})
counters = [e.imm_counter(i) for i in range(1, 6)]
tc = ferry.TransferCounter()

def finite_waits(c, timeout):
    # re-enters finite waits: with short ones it is often on its way back to the GIL
    while True:
        try:
            c.wait(1, timeout=timeout)
        except ferry.Timeout:
            pass

threads = [
    threading.Thread(target=counters[0].wait, args=(1, None), daemon=True),
    threading.Thread(target=counters[1].wait, args=(1, 30), daemon=True),
    threading.Thread(target=finite_waits, args=(counters[2], 0.15), daemon=True),
    threading.Thread(target=tc.wait, args=(1, None), daemon=True),
    threading.Thread(target=ferry.Transfer().result, args=(None,), daemon=True),  # never resolved
    threading.Thread(target=finite_waits, args=(counters[3], 0.001), daemon=True),
    threading.Thread(target=finite_waits, args=(counters[4], 0.001), daemon=True),
]
for t in threads:
    t.start()
import time
deadline = time.monotonic() + 30
while ferry._ferry._blocked_waits() < 4:
    if time.monotonic() > deadline:
        print("waiters never blocked", flush=True)
        sys.exit(3)
    time.sleep(0.005)
print("ready", flush=True)
{ending}
"""


@pytest.mark.parametrize("ending", ["", "e.stop()", "raise SystemExit(0)"])
def test_exit_with_daemon_threads_in_waits(kind, ending):
    # Before the fix: "terminate called without an active exception" and SIGABRT, every run.
    code = _EXIT_SCRIPT.format(here=HERE, kind=kind, ending=ending)
    env = dict(os.environ, FERRY_LOG="warn")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(10)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out, err in results:
        assert out.strip() == "ready", (rc, out, err)
        assert rc == 0, (rc, err)
        assert "terminate" not in err and "Fatal" not in err, err
        assert "leaked" not in err, err

"""Behaviour inside one process: bad input, errors, timeouts, lifetime, callbacks."""

from __future__ import annotations

import array
import gc
import logging
import os
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import ferry
from conftest import engine_for

# ---------------------------------------------------------------------------- errors


def test_exception_hierarchy():
    assert issubclass(ferry.InvalidArgument, ferry.FerryError) and issubclass(ferry.InvalidArgument, ValueError)
    assert issubclass(ferry.OutOfRange, IndexError)
    assert issubclass(ferry.NotFound, KeyError)
    assert issubclass(ferry.Timeout, TimeoutError) and ferry.DeadlineExceeded is ferry.Timeout
    assert issubclass(ferry.Unavailable, ConnectionError)
    assert issubclass(ferry.FailedPrecondition, ferry.FerryError)
    e = ferry._ferry.make_error("NOT_FOUND", "nothing here")
    assert type(e) is ferry.NotFound and e.code == "NOT_FOUND" and str(e) == "nothing here"
    e = ferry._ferry.make_error("ALREADY_EXISTS", "imm 5 is counted")
    assert type(e) is ferry.AlreadyExists and e.code == "ALREADY_EXISTS"
    assert issubclass(ferry.InvalidArgumentType, ferry.InvalidArgument)
    assert issubclass(ferry.InvalidArgumentType, TypeError)
    assert ferry.InvalidArgumentType.code == "INVALID_ARGUMENT"


def test_submodules_are_attributes_of_the_package():
    # docs/PYTHON.md uses ferry.aio after a plain `import ferry`; asyncio loads only then
    code = """if True:
        import sys, ferry
        assert "asyncio" not in sys.modules, "import ferry loaded asyncio"
        assert "aio" in dir(ferry) and "info" in dir(ferry)
        assert callable(ferry.aio.wait_imm) and callable(ferry.aio.expect_imm)
        assert ferry.aio is sys.modules["ferry.aio"] and "asyncio" in sys.modules
        assert callable(ferry.info.collect)
        try:
            ferry.no_such_thing
        except AttributeError as e:
            assert "no_such_thing" in str(e)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_aio_through_the_package_attribute(pair):
    import asyncio

    a, b = pair
    _, d = b.register(np.zeros(16, np.uint8))
    c = b.imm_counter(44)

    async def main():
        fut = ferry.aio.expect_imm(b, 45, count=2)
        await a.submit_imm(44, d)
        await ferry.aio.wait_imm(c, 1, timeout=20)
        await a.submit_imm(45, d)
        await a.submit_imm(45, d)
        await asyncio.wait_for(fut, 20)
        return c.value

    assert asyncio.run(main()) == 0


def test_bad_descriptor_bytes():
    with pytest.raises(ferry.InvalidArgument) as ei:
        ferry.MrDesc.from_bytes(b"\x01junk")
    assert ei.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ferry.InvalidArgument):
        ferry.NetAddr.from_hex("zz")
    with pytest.raises(ferry.InvalidArgument):
        ferry.NetAddr.from_bytes(12)  # not bytes-like


def test_bad_engine_config():
    with pytest.raises(ferry.InvalidArgument):
        ferry.TransferEngine("shm", nics=["shm"], poll_mode="sometimes")
    with pytest.raises(ferry.FerryError):
        ferry.TransferEngine("no-such-provider", nics=["lo"])
    with pytest.raises(ferry.InvalidArgument):
        ferry.TransferEngine("shm", groups=[ferry.Group("gpu7")])


def test_busy_step_aside_reaches_the_engine():
    # The worker's start-up line names its poll mode; a fresh process, since the C++ log
    # level is fixed at its first message. A ping-pong with waits on both counters runs
    # either way, with the same counts.
    code = """if True:
        import numpy as np, ferry
        for flag in (True, False):
            a = ferry.TransferEngine("shm", nics=["shm"], poll_mode="busy", busy_step_aside=flag)
            b = ferry.TransferEngine("shm", nics=["shm"], poll_mode="busy", busy_step_aside=flag)
            with a, b:
                _, da = a.register(np.zeros(16, np.uint8))
                _, db = b.register(np.zeros(16, np.uint8))
                ping, pong = b.imm_counter(1), a.imm_counter(2)
                for _ in range(50):
                    a.submit_imm(1, db)
                    ping.wait(1, 20)
                    b.submit_imm(2, da)
                    pong.wait(1, 20)
                assert ping.value == 0 and pong.value == 0
        try:
            ferry.TransferEngine("shm", nics=["shm"], poll_mode="busy", busy_step_aside=1)
        except ferry.InvalidArgumentType:
            print("ok")
    """
    env = dict(os.environ, FERRY_LOG="info")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert r.stderr.count("poll mode busy, stepping aside for spinning waiters") == 2, r.stderr
    assert r.stderr.count("poll mode busy") == 4, r.stderr


def test_spin_yield_reaches_the_engine():
    # An adaptive worker whose idle polls do not yield steps aside for spinning waiters,
    # and its start-up line says so; "auto" yields where fewer than 8 CPUs are ours. A
    # ping-pong runs in every mode with the same counts.
    code = """if True:
        import numpy as np, ferry
        for mode in ("no_yield", "yield", "auto"):
            a = ferry.TransferEngine("shm", nics=["shm"], spin_yield=mode)
            b = ferry.TransferEngine("shm", nics=["shm"], spin_yield=mode)
            with a, b:
                _, da = a.register(np.zeros(16, np.uint8))
                _, db = b.register(np.zeros(16, np.uint8))
                ping, pong = b.imm_counter(1), a.imm_counter(2)
                for _ in range(50):
                    a.submit_imm(1, db)
                    ping.wait(1, 20)
                    b.submit_imm(2, da)
                    pong.wait(1, 20)
                assert ping.value == 0 and pong.value == 0
        try:
            ferry.TransferEngine("shm", nics=["shm"], spin_yield="sometimes")
        except ferry.InvalidArgument:
            print("ok")
    """
    env = dict(os.environ, FERRY_LOG="info")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    auto_steps = len(os.sched_getaffinity(0)) >= 8
    assert r.stderr.count("poll mode adaptive, stepping aside for spinning waiters") == (
        4 if auto_steps else 2
    ), r.stderr
    assert r.stderr.count("poll mode adaptive") == 6, r.stderr


def test_verbs_gid_index_reaches_the_engine():
    # No verbs NIC here: the engine's warning that another provider ignores the index is
    # what shows the value arrived in EngineConfig::verbs_gid_index. A fresh process,
    # because the C++ log level is fixed at its first message.
    code = """if True:
        import numpy as np, ferry
        for index in (3, np.int32(7), -1):
            with ferry.TransferEngine("shm", nics=["shm"], verbs_gid_index=index) as e:
                assert e.provider == "shm"
        print("ok")
    """
    env = dict(os.environ, FERRY_LOG="warn")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert "EngineConfig::verbs_gid_index 3 ignored: provider is 'shm'" in r.stderr, r.stderr
    assert "EngineConfig::verbs_gid_index 7 ignored: provider is 'shm'" in r.stderr, r.stderr
    assert r.stderr.count("verbs_gid_index") == 2, r.stderr  # -1: nothing to ignore


@pytest.mark.parametrize("provider", ["shm", None])  # None: "auto", refused before probing
def test_verbs_gid_index_below_minus_one_is_refused_by_the_engine(provider):
    with pytest.raises(ferry.InvalidArgument) as ei:
        ferry.TransferEngine(provider, nics=["shm"], verbs_gid_index=-2)
    assert ei.value.code == "INVALID_ARGUMENT"
    assert str(ei.value) == "EngineConfig: verbs_gid_index -2 (-1 = automatic, else a GID table index)"


@pytest.mark.parametrize("bad", ["3", 1.0, True, None, 2**31, -(2**31) - 1])
def test_verbs_gid_index_that_is_no_c_int_is_invalid_argument(bad):
    with pytest.raises(ferry.InvalidArgument, match="verbs_gid_index"):
        ferry.TransferEngine("shm", nics=["shm"], verbs_gid_index=bad)


# ---------------------------------------------------------------------------- registration


def test_register_kinds(pair):
    a, _ = pair
    for obj in (np.zeros(100, np.float32), bytearray(64), array.array("i", range(10)),
                np.zeros((8, 8), np.int16)[2:4], memoryview(bytearray(16))):
        h, d = a.register(obj)
        assert h.obj is obj and h.registered and h.device == "cpu"
        assert d.length == h.length == memoryview(obj).nbytes
        assert d.device == "cpu" and h.desc == d
        a.unregister(h)
        assert not h.registered


def test_register_rejects_bad_buffers(pair):
    a, _ = pair
    with pytest.raises(ferry.InvalidArgument, match="contiguous"):
        a.register(np.zeros((16, 16))[:, ::2])
    ro = np.zeros(64)
    ro.flags.writeable = False
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        a.register(ro)
    with pytest.raises(ferry.InvalidArgument, match="read-only"):
        a.register(b"immutable bytes")
    h, _ = a.register(ro, writable=False)  # fine as a source
    assert not h.writable
    with pytest.raises(ferry.InvalidArgument, match="DLPack"):
        a.register(object())
    with pytest.raises(ferry.InvalidArgument, match="zero length"):
        a.register(np.zeros(0))


def test_registration_keeps_object_alive(pair):
    a, _ = pair
    buf = np.zeros(1024, np.uint8)
    ref = weakref.ref(buf)
    h, _ = a.register(buf)
    del buf, h
    gc.collect()
    assert ref() is not None, "a registered object must stay alive until unregister/stop"
    a.stop()
    gc.collect()
    assert ref() is None


def test_unregistered_and_foreign_handles(pair):
    a, b = pair
    src = np.ones(4096, np.uint8)
    h, _ = a.register(src)
    dst = np.zeros(4096, np.uint8)
    _, d = b.register(dst)
    a.unregister(h)
    with pytest.raises(ferry.NotFound, match="unregistered"):
        a.submit_write(h, 0, 16, d, 0)
    with pytest.raises(ferry.NotFound):
        a.unregister(h)
    with pytest.raises(TypeError):
        a.submit_write(src, 0, 16, d, 0)  # an array is not a handle: register it first
    hb, _ = b.register(np.zeros(16, np.uint8))
    with pytest.raises(ferry.NotFound):  # a handle of another engine
        a.submit_write(hb, 0, 16, d, 0)


def test_write_bounds_and_arguments(pair):
    a, b = pair
    h, _ = a.register(np.zeros(4096, np.uint8))
    _, d = b.register(np.zeros(1024, np.uint8))
    with pytest.raises(ferry.OutOfRange):
        a.submit_write(h, 0, 2048, d, 0)
    with pytest.raises(ferry.OutOfRange):
        a.submit_write(h, 4000, 200, d, 0)
    with pytest.raises(ferry.InvalidArgument, match="imm"):
        a.submit_write(h, 0, 16, d, 0, imm=2**32)
    with pytest.raises(ferry.InvalidArgument, match="negative"):
        a.submit_write(h, -1, 16, d, 0)
    with pytest.raises(ferry.InvalidArgument, match="pinned NIC"):
        a.submit_write(h, 0, 16, d, 0, route=ferry.WriteRoute.pinned(3))
    with pytest.raises(ferry.InvalidArgument):
        a.submit_send(b.main_address, "a str is not bytes")
    with pytest.raises(ferry.InvalidArgument, match="send buffer"):
        a.submit_send(b.main_address, bytes(1 << 20))


# ---------------------------------------------------------------------------- page lists


@pytest.mark.parametrize(
    "pages, match",
    [
        (np.zeros(4, np.float32), "dtype must be int32, uint32, int64 or uint64 \\(got float32\\)"),
        (np.zeros(4, np.int16), "dtype must be int32, uint32, int64 or uint64 \\(got int16\\)"),
        (np.zeros((2, 2), np.int32), "1-D"),
        (np.arange(8, dtype=np.int32)[::2], "contiguous"),
        (np.array([1, -1, 2], np.int32), "index -1 at position 1 is outside"),
        (np.array([1, -1], np.int64), "index -1 at position 1 is outside"),
        ([0, -5], "index -5 at position 1 is outside"),
        (["a"], "source pages\\[0\\] must be an int, got str"),
        ("0123", "source pages must be a 1-D int32, uint32, int64 or uint64 array"),
    ],
)
def test_bad_page_lists(pair, pages, match):
    a, b = pair
    h, _ = a.register(np.zeros(1 << 16, np.uint8))
    _, d = b.register(np.zeros(1 << 16, np.uint8))
    with pytest.raises(ferry.InvalidArgument, match=match):
        a.submit_paged_writes(64, h, pages, 64, 0, d, [0, 1, 2, 3][: len(pages)], 64, 0)


def test_page_list_mismatch_and_range(pair):
    a, b = pair
    h, _ = a.register(np.zeros(1 << 12, np.uint8))
    _, d = b.register(np.zeros(1 << 12, np.uint8))
    with pytest.raises(ferry.InvalidArgument, match="pages"):
        a.submit_paged_writes(64, h, [0, 1], 64, 0, d, [0], 64, 0)
    with pytest.raises(ferry.OutOfRange):
        a.submit_paged_writes(64, h, np.array([64], np.uint32), 64, 0, d, [0], 64, 0)


def test_paged_writes_read_only_page_arrays(pair):
    a, b = pair
    src = np.arange(4096, dtype=np.uint8)
    h, _ = a.register(src, writable=True)
    dst = np.zeros(4096, np.uint8)
    _, d = b.register(dst)
    idx = np.array([3, 0, 1], np.uint32)
    idx.flags.writeable = False
    c = b.imm_counter(9)
    a.submit_paged_writes(16, h, idx, 16, 0, d, np.array([0, 1, 2], np.int64), 16, 0, imm=9).result(20)
    c.wait(3, 20)
    assert dst[:16].tolist() == src[48:64].tolist() and dst[16:32].tolist() == src[:16].tolist()


# ---------------------------------------------------------------------------- timeouts and waits


def test_imm_counter_timeout(pair):
    a, _ = pair
    c = a.imm_counter(77)
    t0 = time.monotonic()
    with pytest.raises(ferry.Timeout) as ei:
        c.wait(1, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 5
    assert isinstance(ei.value, TimeoutError) and ei.value.code == "DEADLINE_EXCEEDED"
    assert c.value == 0 and not c.try_consume(1)
    with pytest.raises(ferry.Timeout):
        c.wait(1, timeout=0)
    with pytest.raises(ferry.InvalidArgument):
        c.wait(1, timeout=-1)


def test_wait_releases_the_gil(pair):
    a, b = pair
    c = b.imm_counter(5)
    _, d = b.register(np.zeros(16, np.uint8))
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    th = threading.Thread(target=spin)
    th.start()
    try:
        with pytest.raises(ferry.Timeout):
            c.wait(1, timeout=0.3)
    finally:
        stop.set()
        th.join()
    assert len(ticks) > 20  # the other thread ran while we waited
    a.submit_imm(5, d).result(20)
    c.wait(1, timeout=20)


def test_transfer_counter_timeout(pair):
    a, _ = pair
    cnt = ferry.TransferCounter()
    with pytest.raises(ferry.Timeout):
        cnt.wait(1, timeout=0.1)


def test_transfer_future_semantics(pair):
    a, b = pair
    h, _ = a.register(np.ones(64, np.uint8))
    _, d = b.register(np.zeros(64, np.uint8))
    t = a.submit_write(h, 0, 64, d, 0)
    assert not t.cancel()
    seen = []
    t.add_done_callback(lambda f: seen.append(f))
    assert t.result(20) is None and t.exception(0) is None and t.done()
    assert seen == [t] and t.id > 0


def test_failed_transfer_reports_through_future_and_on_done(kind):
    # a peer that went away: the write fails (or times out) asynchronously
    a = engine_for(kind, default_timeout=2)
    b = engine_for(kind)
    h, _ = a.register(np.ones(64, np.uint8))
    _, d = b.register(np.zeros(64, np.uint8))
    b.stop()
    errs = []
    got = threading.Event()
    t = a.submit_write(h, 0, 64, d, 0, on_done=lambda e: (errs.append(e), got.set()))
    with pytest.raises(ferry.FerryError) as ei:
        t.result(30)
    assert got.wait(10) and errs[0] is not None and type(errs[0]) is type(ei.value)
    assert isinstance(t.exception(), ferry.FerryError)
    a.stop()


# ---------------------------------------------------------------------------- immediates


def test_one_immediate_is_counted_one_way(pair):
    # The refusal is the C++ engine's (ImmTable: kAlreadyExists); the binding maps it.
    a, b = pair
    _, d = b.register(np.zeros(16, np.uint8))
    fired = threading.Event()
    c = b.imm_counter(21)
    with pytest.raises(ferry.AlreadyExists) as ei:
        b.expect_imm_count(21, 1, lambda: None)
    assert ei.value.code == "ALREADY_EXISTS"
    b.expect_imm_count(22, 1, fired.set)
    with pytest.raises(ferry.AlreadyExists):
        b.imm_counter(22)
    # the first mapping of each immediate is still the one counting
    a.submit_imm(21, d).result(20)
    c.wait(1, timeout=20)
    a.submit_imm(22, d).result(20)
    assert fired.wait(20)
    # the same way twice is fine: one shared counter, a replaced expectation
    assert b.imm_counter(21).imm == 21
    b.expect_imm_count(22, 1, fired.set)
    # removing the mapping allows the other way
    b.remove_imm_count(21)
    b.expect_imm_count(21, 1, lambda: None)
    b.remove_imm_count(22)
    assert b.imm_counter(22).value == 0


# ---------------------------------------------------------------------------- callbacks and lifetime


def test_callback_errors_do_not_stop_the_engine(pair, caplog):
    a, b = pair
    _, d = b.register(np.zeros(16, np.uint8))
    seen = []

    def bad(imm):
        seen.append(imm)
        raise ValueError(f"bad callback {imm}")

    b.on_imm(bad)
    with caplog.at_level(logging.ERROR, logger="ferry"):
        for i in range(3):
            a.submit_imm(100 + i, d).result(20)
        deadline = time.monotonic() + 20
        while b.callback_errors < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert b.callback_errors == 3 and seen == [100, 101, 102]
    msgs = [r.getMessage() for r in caplog.records if r.name == "ferry"]
    assert len(msgs) == 3 and all("on_imm callback" in m for m in msgs)
    assert all("bad callback" in str(r.exc_info[1]) for r in caplog.records if r.name == "ferry")


def test_stopped_engines_leave_no_python_thread_state(kind):
    # Each engine's callback thread gets a Python thread state on its first callback;
    # stopping the engine must delete it, or a service that opens engines leaks.
    def one_engine_with_a_callback():
        a, b = engine_for(kind), engine_for(kind)
        _, d = b.register(np.zeros(16, np.uint8))
        got = threading.Event()
        b.on_imm(lambda imm: got.set())
        a.submit_imm(7, d, on_done=lambda err: None).result(20)
        assert got.wait(20)
        a.stop()
        b.stop()

    one_engine_with_a_callback()  # first use may set up lasting state
    before = ferry._ferry._thread_states()
    for _ in range(5):
        one_engine_with_a_callback()
    assert ferry._ferry._thread_states() == before


def test_stop_and_wait_inside_a_callback_are_refused(pair):
    a, b = pair
    h, _ = a.register(np.ones(64, np.uint8))
    _, d = b.register(np.zeros(64, np.uint8))
    out = {}
    done = threading.Event()

    def cb(err):
        try:
            a.stop()
        except ferry.FailedPrecondition as ex:
            out["stop"] = ex
        t2 = a.submit_write(h, 0, 8, d, 0)
        try:
            t2.result(1)
        except ferry.FailedPrecondition as ex:
            out["wait"] = ex
        except Exception as ex:  # pragma: no cover
            out["wait"] = ex
        done.set()

    a.submit_write(h, 0, 8, d, 0, on_done=cb)
    assert done.wait(20)
    assert isinstance(out["stop"], ferry.FailedPrecondition)
    assert isinstance(out["wait"], ferry.FailedPrecondition) or out.get("wait") is None


def test_recv_view_must_not_escape(pair, caplog):
    a, b = pair
    kept = []
    got = threading.Event()

    def on_recv(m):
        kept.append(m)  # wrong: the view dies with the callback
        got.set()

    b.submit_recvs(256, 4, on_recv)
    a.submit_send(b.main_address, b"hello").result(20)
    assert got.wait(20)
    time.sleep(0.05)
    with pytest.raises(ValueError):  # released: "operation forbidden on released memoryview"
        bytes(kept[0])


def test_stopped_engine(kind):
    e = engine_for(kind)
    addr = e.main_address
    with e:
        pass
    assert e.stopped
    e.stop()  # idempotent
    assert e.main_address == addr  # identity is still readable
    with pytest.raises(ferry.FailedPrecondition):
        e.register(np.zeros(8))
    with pytest.raises(ferry.FailedPrecondition):
        e.imm_counter(1)


def test_outstanding_transfers_end_on_stop(pair):
    a, b = pair
    h, _ = a.register(np.ones(1 << 20, np.uint8))
    _, d = b.register(np.zeros(1 << 20, np.uint8))
    ts = [a.submit_write(h, 0, 1 << 20, d, 0) for _ in range(16)]
    a.stop()
    for t in ts:
        assert t.done()
        assert t.exception(0) is None or isinstance(t.exception(0), ferry.Cancelled)


def test_engine_dropped_without_stop_exits_cleanly(kind):
    # callbacks referring to their engine form a cycle through C++; the atexit hook stops it
    code = f"""
import sys; sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).parent))})
import numpy as np, ferry
from conftest import engine_for
e = engine_for({kind!r})
e.on_imm(lambda imm: e.provider)
e.register(np.zeros(64))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert "leaked" not in r.stderr


def test_info_command():
    r = subprocess.run([sys.executable, "-m", "ferry.info"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"ferry {ferry.__version__}" in r.stdout
    assert "tcp;ofi_rxm" in r.stdout and "shm" in r.stdout and "CUDA" in r.stdout
    info = ferry.info.collect(("shm",)) if hasattr(ferry, "info") else None
    import ferry.info as fi

    info = fi.collect(("shm",))
    assert info["providers"][0]["domains"], info


def test_info_lists_what_the_engine_opens():
    import ferry.info as fi

    info = fi.collect(("tcp;ofi_rxm", "shm", "no-such-provider"))
    by = {p["provider"]: p for p in info["providers"]}
    tcp = [d["name"] for d in by["tcp;ofi_rxm"]["domains"]]
    assert "lo" in tcp
    assert [d["name"] for d in by["shm"]["domains"]] == ["shm"]
    assert not by["no-such-provider"]["domains"]
    assert "fi_getinfo" in by["no-such-provider"]["error"]
    # Every listed NIC opens as an engine NIC.
    for name in tcp:
        with ferry.TransferEngine("tcp;ofi_rxm", nics=[name]) as e:
            assert e.main_address is not None


def test_version_single_source():
    import pathlib
    import re

    header = pathlib.Path(__file__).parents[2] / "include" / "ferry" / "version.h"
    if header.exists():
        m = re.search(r'kVersion\s*=\s*"([^"]+)"', header.read_text())
        assert m and m.group(1) == ferry.__version__
    try:
        from importlib.metadata import version

        assert version("ferry") == ferry.__version__
    except Exception:
        pass  # not installed through pip (plain CMake build on PYTHONPATH)


def _gpu_present() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_gpu_signalling_without_a_gpu_is_a_typed_error():
    if _gpu_present():
        pytest.skip("a GPU is present: tests/python/test_gpu.py covers this")
    with engine_for("shm") as e:
        with pytest.raises(ferry.FerryError):
            e.alloc_uvm_watcher(lambda old, new: True)
        with pytest.raises(ferry.FerryError):
            e.imm_counter_gpu(5, 1)


# ------------------------------------------------------------------ admission


def test_admission_arguments_are_checked(kind):
    with pytest.raises(ferry.InvalidArgument, match="queue_full"):
        engine_for(kind, queue_full="drop")
    with pytest.raises(ferry.InvalidArgument, match="max_requests_in_flight"):
        engine_for(kind, max_requests_in_flight=0)
    with pytest.raises(ferry.InvalidArgumentType, match="max_requests_in_flight"):
        engine_for(kind, max_requests_in_flight=1.5)


def test_refusing_engine_raises_resource_exhausted_when_full(kind):
    # One request in flight at a time: a burst of immediates finds the group full long
    # before the first completes (a round trip through the provider), and each refusal
    # is immediate. Every accepted request still completes and is counted exactly once.
    a = engine_for(kind, max_requests_in_flight=1, queue_full="refuse")
    b = engine_for(kind)
    try:
        _, d = b.register(np.zeros(64, np.uint8))
        arrivals = b.imm_counter(9)
        counter = ferry.TransferCounter()
        accepted = refused = 0
        for _ in range(200):
            try:
                a.submit_imm(9, d, counter=counter)
                accepted += 1
            except ferry.ResourceExhausted as e:
                assert "in flight" in str(e) or "full" in str(e), str(e)
                refused += 1
        assert refused > 0 and accepted > 0
        counter.wait(accepted, timeout=20)
        assert counter.done == accepted and counter.errors == 0
        arrivals.wait(accepted, timeout=20)
    finally:
        a.stop()
        b.stop()


def test_read_only_descriptor_says_so(pair):
    # Memory the process cannot write (PROT_READ) is exported as read-only: the
    # descriptor says so, survives serialisation, and peers' writes are refused.
    import mmap

    a, b = pair
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
    ro = np.frombuffer(m, np.uint8)
    _, d = a.register(ro, writable=False)
    _, w = a.register(np.zeros(64, np.uint8))
    assert d.writable is False and w.writable is True
    assert ferry.MrDesc.from_bytes(d.bytes()).writable is False
    h, _ = b.register(np.ones(64, np.uint8))
    with pytest.raises(ferry.FailedPrecondition):
        b.submit_write(h, 0, 16, d, 0)
    a.stop()
    del ro
    m.close()

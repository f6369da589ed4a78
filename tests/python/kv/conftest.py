"""Fixtures of the ferry.kv tests: a prefill instance in a second process (kvsim.py) and
decode ranks in this one, over the providers of tests/python/conftest.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import ferry  # noqa: E402
import kvsim  # noqa: E402
from ferry.kv import KvReceiver  # noqa: E402


def _parent_providers() -> dict:
    """PROVIDERS of tests/python/conftest.py (pytest loaded it first; both files are
    named conftest, so it is found by path rather than imported by name)."""
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "conftest.py")
    for m in list(sys.modules.values()):
        if getattr(m, "__file__", None) == path and hasattr(m, "PROVIDERS"):
            return m.PROVIDERS
    spec = importlib.util.spec_from_file_location("_ferry_tests_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PROVIDERS


PROVIDERS = _parent_providers()

# libinfinipath (loaded with libfabric) replaces the SIGSEGV handler with its own
# backtrace printer unless told not to: the prefill processes inherit this, so that a
# crash reaches their faulthandler (PrefillPeer reports what it wrote).
os.environ.setdefault("IPATH_NO_BACKTRACE", "1")

SENTINEL = 0xAB


class PrefillPeer:
    """`tp` prefill ranks in a second process (spawn).

    Every answer is awaited in short slices that check the process is alive: a child
    that died fails the call at once with its exit code, one that does not answer in
    time is asked for the Python stacks of all its threads (faulthandler on SIGUSR1)
    and killed; either way the failure carries what the child's faulthandler wrote."""

    def __init__(self, kind: str, tp: int, num_pages: int = 256, lay_kw=None, env=None,
                 use_watcher: bool = False, coalesce: bool = True):
        provider, nics = PROVIDERS[kind]
        ctx = mp.get_context("spawn")
        self.cmd, self.res = ctx.Queue(), ctx.Queue()
        fd, self.stacks = tempfile.mkstemp(prefix="kvsim-stacks-", suffix=".txt")
        os.close(fd)
        self.proc = ctx.Process(target=kvsim.main, daemon=True, args=(
            provider, nics, tp, num_pages, lay_kw or {}, env or {}, self.cmd, self.res,
            use_watcher, coalesce, self.stacks))
        self.proc.start()
        status, value = self._answer("its start-up", 120)
        assert status == "hello", value
        self.addrs = value

    def call(self, *cmd, timeout: float = 60):
        self.cmd.put(cmd)
        status, value = self._answer(repr(cmd), timeout)
        assert status == "ok", value
        return value

    def _answer(self, what: str, timeout: float):
        end = time.monotonic() + timeout
        while True:
            try:
                return self.res.get(timeout=max(0.0, min(0.25, end - time.monotonic())))
            except queue.Empty:
                pass
            if not self.proc.is_alive():
                self.proc.join(5)
                try:  # an answer it wrote just before it exited (e.g. to "stop")
                    return self.res.get(timeout=1)
                except queue.Empty:
                    pass
                pytest.fail(f"the prefill process died during {what} with exit code "
                            f"{self.proc.exitcode}\n{self._child_report()}", pytrace=False)
            if time.monotonic() >= end:
                stacks = self._dump_stacks()
                self.proc.kill()
                self.proc.join(10)
                pytest.fail(f"the prefill process did not answer {what} within {timeout} s "
                            f"(alive, killed now)\n{stacks}", pytrace=False)

    def _child_report(self) -> str:
        try:
            with open(self.stacks, errors="replace") as f:
                text = f.read()
        except OSError as e:
            return f"(no faulthandler output: {e})"
        return text or "(its faulthandler wrote nothing)"

    def _dump_stacks(self) -> str:
        """Asks the live child for every thread's Python stack, waits (bounded) for the
        dump to stop growing, returns it."""
        before = os.path.getsize(self.stacks) if os.path.exists(self.stacks) else 0
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except OSError as e:
            return f"(could not signal the child: {e})"
        end, size = time.monotonic() + 5, before
        while time.monotonic() < end:
            time.sleep(0.1)  # polling the file's size, bounded by `end`
            now = os.path.getsize(self.stacks)
            if now > before and now == size:
                break
            size = now
        return self._child_report()

    def wait_dead(self, timeout: float = 30) -> int:
        self.proc.join(timeout)
        assert not self.proc.is_alive()
        return self.proc.exitcode

    def close(self):
        if self.proc.is_alive():
            try:
                self.call("stop", timeout=30)
            except (Exception, pytest.fail.Exception):  # noqa: BLE001
                pass
            self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        try:
            os.unlink(self.stacks)
        except OSError:
            pass


class DecodeRank:
    def __init__(self, kind: str, tp: int, rank: int, num_pages: int, lay_kw=None, env=None):
        provider, nics = PROVIDERS[kind]
        old = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            self.e = ferry.TransferEngine(provider, nics=nics, default_timeout=10)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.lay = kvsim.layout(tp, rank, num_pages, **(lay_kw or {}))
        self.buf = np.full(sum(self.lay.region_bytes()), SENTINEL, dtype=np.uint8)
        self.slots = 64
        self.ctx = np.zeros(self.slots * 128, dtype=np.uint8)
        self.rx = KvReceiver(self.e, self.lay, [self.buf], context=self.ctx,
                             context_slot_bytes=128)
        self.free = list(range(num_pages))
        self.free_slots = list(range(self.slots))
        self.lock = threading.Lock()
        self.links = []

    def connect(self, addrs):
        self.links = [self.rx.connect(a, timeout=30) for a in addrs]

    def alloc(self, n: int, rng=None) -> np.ndarray:
        with self.lock:
            if len(self.free) < n or not self.free_slots:
                return None
            if rng is not None:
                rng.shuffle(self.free)
            got, self.free = self.free[:n], self.free[n:]
        return np.array(got, dtype=np.uint32)

    def give_back(self, pages) -> None:
        with self.lock:
            self.free += [int(p) for p in pages]

    def view(self):
        return kvsim.cache_view(self.lay, self.buf)

    def check(self, seed: int, pages, ntok: int, ctx_slot=None, ctx_len: int = 0) -> None:
        """Every page of the request and the context, byte for byte."""
        v = self.view()
        for layer in range(self.lay.num_layers):
            for kind in (0, 1):
                want = kvsim.page_image(self.lay, seed, len(pages), layer, kind)
                got = v[layer, kind, np.asarray(pages, dtype=np.int64)]
                bad = np.flatnonzero((got != want).any(axis=1))
                assert bad.size == 0, f"req {seed} layer {layer} kind {kind} pages {bad[:8]}"
        if ctx_len:
            got = bytes(self.ctx[ctx_slot * 128:ctx_slot * 128 + ctx_len])
            assert got == kvsim.context_bytes(seed, ctx_len), f"req {seed}: context differs"

    def untouched(self, pages, layers=None) -> bool:
        v = self.view()
        ls = range(self.lay.num_layers) if layers is None else layers
        p = np.asarray(pages, dtype=np.int64)
        return all((v[l, k, p].view(np.uint8) == SENTINEL).all() for l in ls for k in (0, 1))

    def reset(self, pages) -> None:
        v = self.view()
        v[:, :, np.asarray(pages, dtype=np.int64)] = SENTINEL * 0x0101

    def stop(self):
        self.e.stop()


@pytest.fixture
def make_peer():
    peers = []

    def make(*a, **kw):
        p = PrefillPeer(*a, **kw)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()


@pytest.fixture
def make_decode():
    ranks = []

    def make(kind, tp, num_pages=256, lay_kw=None, env=None):
        rs = [DecodeRank(kind, tp, r, num_pages, lay_kw, env) for r in range(tp)]
        ranks.extend(rs)
        return rs

    yield make
    for r in ranks:
        r.stop()

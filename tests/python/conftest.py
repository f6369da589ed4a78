"""Fixtures for the ferry Python tests: providers, in-process engine pairs and a peer process.

The peer is a second Python process (multiprocessing, 'spawn' context) running
tests/python/peer.py; descriptors and addresses travel to and from it pickled.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import ferry  # noqa: E402
import peer as peer_mod  # noqa: E402

PROVIDERS = {
    "tcp": ("tcp;ofi_rxm", ["lo"]),
    "shm": ("shm", ["shm"]),
}


def engine_for(kind: str, **kw) -> ferry.TransferEngine:
    provider, nics = PROVIDERS[kind]
    kw.setdefault("default_timeout", 20)
    return ferry.TransferEngine(provider, nics=nics, **kw)


@pytest.fixture(params=sorted(PROVIDERS))
def kind(request) -> str:
    return request.param


@pytest.fixture
def pair(kind):
    """Two engines of one process (fast; for local behaviour and errors)."""
    a = engine_for(kind)
    b = engine_for(kind)
    yield a, b
    a.stop()
    b.stop()


class Peer:
    """A second process with its own engine (see peer.py for the commands)."""

    def __init__(self, kind: str):
        ctx = mp.get_context("spawn")
        self.cmd = ctx.Queue()
        self.res = ctx.Queue()
        self.proc = ctx.Process(target=peer_mod.main, args=(kind, self.cmd, self.res), daemon=True)
        self.proc.start()
        hello = self.res.get(timeout=60)
        assert hello[0] == "hello", hello
        _, self.addr, self.desc, self.size = hello

    def call(self, *cmd, timeout: float = 30):
        self.cmd.put(cmd)
        status, value = self.res.get(timeout=timeout)
        if status == "error":
            raise AssertionError(f"peer failed on {cmd[0]}: {value}")
        if status == "raise":
            raise value
        return value

    def close(self):
        try:
            self.cmd.put(("stop",))
            self.proc.join(timeout=30)
        finally:
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


@pytest.fixture(scope="module", params=sorted(PROVIDERS))
def remote(request):
    """(kind, local engine, peer process) shared by the tests of one module."""
    k = request.param
    p = Peer(k)
    e = engine_for(k)
    yield k, e, p
    e.stop()
    p.close()

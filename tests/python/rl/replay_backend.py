"""A NumPy backend that captures and replays, as CUDA graphs do: what the pipeline's
graph path (segments, their waits, posts as markers pass) does can then run in CI over
tcp with host memory. Test-only."""

from __future__ import annotations

import contextlib

import numpy as np

from ferry.rl.backends import NumpyBackend


class ReplayBackend(NumpyBackend):
    def __init__(self, offload: bool = False):
        # offload: as a GPU whose trainer shards stay in host memory: nothing is read in
        # place, every piece is copied into staging, strided ones through host buffers
        self.offload = offload
        self._into = None  # the op list being captured, or None
        self.replays = 0
        self.staged = 0  # host buffers handed out for captures

    def can_capture(self) -> bool:
        return True

    def capture(self):
        ops: list = []

        @contextlib.contextmanager
        def ctx():
            self._into = ops
            try:
                yield
            finally:
                self._into = None

        return ops, ctx()

    def marker_in_graph(self):
        return None  # replayed host work is done when replay() returns

    def replay(self, ops) -> None:
        self.replays += 1
        for fn, args in ops:
            fn(*args)

    def _do(self, fn, *args) -> None:
        if self._into is not None:
            self._into.append((fn, args))
        else:
            fn(*args)

    def reads_in_place(self, src) -> bool:
        return not self.offload

    def staging(self, src):
        # As a CUDA graph with host memory that is not pinned: a strided piece is read
        # from a buffer of its own, which the pipeline must refill before every replay.
        if not self.offload or src.flags["C_CONTIGUOUS"]:
            return None
        self.staged += 1
        return np.empty_like(src, order="C")

    def copy_many(self, dsts, srcs) -> None:
        self._do(super().copy_many, list(dsts), list(srcs))

    def copy(self, dst, src) -> None:
        self._do(super().copy, dst, src)

    def quantize(self, src, q, s) -> None:
        self._do(super().quantize, src, q, s)

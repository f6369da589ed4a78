"""A NumPy backend that captures and replays, as CUDA graphs do: what the pipeline's
graph path (segments, their waits, posts as markers pass) does can then run in CI over
tcp with host memory. Test-only."""

from __future__ import annotations

import contextlib

from ferry.rl.backends import NumpyBackend


class ReplayBackend(NumpyBackend):
    def __init__(self):
        self._into = None  # the op list being captured, or None
        self.replays = 0

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

    def copy_many(self, dsts, srcs) -> None:
        self._do(super().copy_many, list(dsts), list(srcs))

    def copy(self, dst, src) -> None:
        self._do(super().copy, dst, src)

    def quantize(self, src, q, s) -> None:
        self._do(super().quantize, src, q, s)

"""The inference side of the weight transfer: a rank's live tensors registered once, the
trainers' one-sided writes landing there with no action from this side, and the step's
immediates counted to learn when an update is complete (docs/RL.md)."""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import ferry

from . import schedule as S
from .backends import NumpyBackend
from .meta import InferenceMeta, InferenceTensor, Recipe
from .pipeline import _gather_meta
from .steps import IMM_ABORT, IMM_DATA, STEP_SLOTS
from .quant import dtype_name

__all__ = ["WeightReceiver"]


class WeightReceiver:
    """The inference side of one rank: its live tensors (by name) registered once; the
    writes land there with no action from this side. `wait_step` counts immediates."""

    def __init__(self, engine: ferry.TransferEngine, exchange, *, rank: int, tensors: dict,
                 recipes: Sequence[Recipe], backend: Any = None, controller: int = 0):
        self.engine, self.ex, self.rank = engine, exchange, rank
        self.backend = backend or NumpyBackend()
        self.tensors = tensors
        self.recipes = list(recipes)
        self.controller = controller
        self.step: Optional[int] = None  # last step fully arrived
        self.stale = False  # True once an update began and did not complete
        self._handles, metas = [], []
        for name, arr in tensors.items():
            h, d = engine.register(self.backend.byte_view(arr))
            self._handles.append(h)
            dt = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float32": "float32"}[dtype_name(arr.dtype)]
            metas.append(InferenceTensor(name, tuple(arr.shape), dt, d.bytes(), 0))
        self.meta = InferenceMeta(rank, tuple(self.recipes), tuple(metas))

    def setup(self, timeout: float = 60.0) -> S.Schedule:
        _, self.schedule = _gather_meta(self.ex, "inference", self.meta, self.controller, timeout)
        self.expected = self.schedule.imm_expected[self.rank]
        self._data = [self.engine.imm_counter(IMM_DATA + i) for i in range(STEP_SLOTS)]
        self._abort = [self.engine.imm_counter(IMM_ABORT + i) for i in range(STEP_SLOTS)]
        return self.schedule

    def wait_step(self, step: int, timeout: float = 60.0) -> None:
        """Returns once every write of `step` landed (the weights are step `step`'s).
        Raises ferry.Aborted when a trainer reported the step failed, ferry.Timeout at
        the deadline; either way `stale` is set: some weights may be of the new step."""
        slot = step % STEP_SLOTS
        data, abort = self._data[slot], self._abort[slot]
        deadline = time.monotonic() + timeout
        while True:
            if abort.try_consume(1):
                self._reset(slot)
                self.stale = True
                raise ferry.Aborted(f"step {step}: a trainer aborted the update; weights are stale")
            left = deadline - time.monotonic()
            if left <= 0:
                self.stale = self.stale or data.value > 0
                raise ferry.Timeout(f"step {step}: {data.value} of {self.expected} writes arrived by the deadline")
            try:
                data.wait(self.expected, min(0.05, left))
                break
            except ferry.Timeout:
                continue
        self.step, self.stale = step, False

    def _reset(self, slot: int) -> None:
        c = self._data[slot]
        c.try_consume(c.value)
        a = self._abort[slot]
        while a.try_consume(1):
            pass

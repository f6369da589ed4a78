"""Posting a request's prepared writes step by step (docs/KV.md, "Posting").

A KvSender owns one ``_ferry.StepSubmits`` (C++, ferry/step_submits.h): a step counter,
host-driven or a UVM watcher word that a CUDA graph bumps once per layer. Each
(request, decode rank) pair is a job bound to counter values base+1.. ; the engine posts
its prepared transfers as the counter passes them, with no Python per step. A reaper
thread takes finished jobs (every step posted or the job cancelled, and every posted
write ended) from ``wait_finished`` and hands them to the sender.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from typing import Callable, Optional

from .. import _ferry
from .._errors import BY_CODE, FerryError

__all__ = ["StepClock", "StepPoster"]

_live_clocks: "weakref.WeakSet[StepClock]" = weakref.WeakSet()


@atexit.register
def _close_clocks() -> None:
    # Registered after ferry's own hook, so it runs first: reapers end while their
    # engines still run, and no thread is left inside wait_finished at exit.
    for c in list(_live_clocks):
        c.close()


class StepClock:
    """The counter a prefill rank's forward passes advance (one value per layer, and one
    for the context), and the thread that reaps finished jobs."""

    def __init__(self, engine, watcher: bool = False) -> None:
        self._engine = engine
        self._s = _ferry.StepSubmits(engine._e, watcher)
        self._tokens = itertools.count(1)
        self._posters: dict = {}
        self._lock = threading.Lock()
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="ferry-kv-reaper", daemon=True)
        self._reaper.start()
        _live_clocks.add(self)

    @property
    def word(self) -> int:
        """Device address of the watcher word (0 for a host-driven clock)."""
        return self._s.word

    @property
    def value(self) -> int:
        return self._s.value

    @property
    def live_jobs(self) -> int:
        return self._s.live_jobs

    def advance(self, value: int) -> None:
        self._s.advance(value)

    def host_counter(self):
        """A host-driven counter of one job whose finished jobs this clock's reaper takes
        (jobs driven from the host progress independently of each other)."""
        return _ferry.StepSubmits(self._engine._e, False, self._s)

    def add(self, poster: "StepPoster", base: int, steps: list, imm: int, counter=None):
        token = next(self._tokens)
        with self._lock:
            self._posters[token] = poster
        try:
            return (counter or self._s).add(base, steps, imm, token)
        except BaseException:
            with self._lock:
                self._posters.pop(token, None)
            raise

    def _reap(self) -> None:
        drain = 40  # after close: up to 2 s for the last jobs' writes to end
        while True:
            closed = self._closed
            if closed:
                drain -= 1
                if drain < 0:
                    return
            for token, code, msg in self._s.wait_finished(0.05 if closed else 0.2):
                with self._lock:
                    p = self._posters.pop(token, None)
                if p is not None:
                    err = None if not code else BY_CODE.get(code, FerryError)(msg)
                    p._finished(err)
            if closed:
                with self._lock:
                    if not self._posters:
                        return

    def close(self) -> None:
        """Cancel every job still bound (each finishes once its posted writes ended) and
        stop the reaper once it handed them over."""
        if self._closed:
            return
        self._s.close()
        self._closed = True
        if threading.current_thread() is not self._reaper:
            self._reaper.join(5.0)


class StepPoster:
    """One (request, decode rank) job: its steps' prepared transfers and immediate."""

    def __init__(self, clock: StepClock, base: Optional[int], steps: list, imm: int,
                 on_finished: Callable[[], None]) -> None:
        # base None: driven from the host by advance(); else bound to the clock's values.
        self.clock, self.base, self.imm = clock, base, imm
        self._on_finished = on_finished
        self._imms_per_step = [sum(k for _, k in s) for s in steps]
        self.num_steps = len(steps)
        self.error: Optional[BaseException] = None
        self.finished = False
        self._counter = clock.host_counter() if base is None else None
        self._job = clock.add(self, base or 0, [[p for p, _ in s] for s in steps], imm,
                              self._counter)

    def advance(self, step: int) -> None:
        if self._counter is None:
            raise RuntimeError("a job bound to the watcher word advances with it")
        self._counter.advance(step)

    def cancel(self) -> int:
        return self._job.cancel()

    def _finished(self, err) -> None:
        self.error = err
        self.finished = True
        if self._counter is not None:
            self._counter.close()
        self._on_finished()

    @property
    def steps_posted(self) -> int:
        return self._job.steps_posted

    @property
    def writes_posted(self) -> int:
        return self._job.transfers_posted

    @property
    def failed(self) -> int:
        return self._job.transfers_failed

    @property
    def imms_posted(self) -> int:
        return sum(self._imms_per_step[:self.steps_posted])

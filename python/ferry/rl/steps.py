"""A trainer's step as the pipeline runs it: what it reports (StepStats, chrome_trace),
the immediates that count it, and the bookkeeping of its units in flight (_StepRun),
shared by the eager and the replayed path of ferry.rl.pipeline.WeightSender."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import ferry

__all__ = ["IMM_DATA", "IMM_ABORT", "STEP_SLOTS", "StepStats", "chrome_trace", "data_imm", "abort_imm"]

IMM_DATA = 0x524C0000  # + step % 8
IMM_ABORT = 0x524C0010  # + step % 8
STEP_SLOTS = 8


def data_imm(step: int) -> int:
    return IMM_DATA + step % STEP_SLOTS


def abort_imm(step: int) -> int:
    return IMM_ABORT + step % STEP_SLOTS


@dataclass
class StepStats:
    """One trainer rank's step: wall time, per-stage busy time, the timeline."""

    rank: int
    step: int
    wall_s: float = 0.0
    stages: dict = field(default_factory=lambda: {k: 0.0 for k in
                                                  ("send", "wait_memory", "gather", "h2d", "prepare", "post", "write", "barrier")})
    events: list = field(default_factory=list)  # (stage, label, t0, t1) in seconds since step start
    gpu: dict = field(default_factory=lambda: {"h2d": 0.0, "gather": 0.0, "convert": 0.0})  # device seconds
    peak_temp_bytes: int = 0
    bytes_written: int = 0
    writes: int = 0
    jobs: int = 0
    submits: int = 0  # prepared scatters posted (a unit of small jobs is one; mapped: one per MeshGroup)
    replayed: bool = False  # the device work was a replay of captured graphs

    def add(self, stage: str, label: str, t0: float, t1: float, base: float) -> None:
        self.stages[stage] += t1 - t0
        self.events.append((stage, label, t0 - base, t1 - base))


def chrome_trace(stats: Sequence[StepStats], path: Optional[str] = None) -> dict:
    """Chrome trace (chrome://tracing, Perfetto): one process per rank, one row per stage."""
    rows = {k: i for i, k in enumerate(("send", "wait_memory", "gather", "h2d", "prepare", "post", "write", "barrier"))}
    ev = []
    for st in stats:
        ev.append({"name": "process_name", "ph": "M", "pid": st.rank, "args": {"name": f"trainer {st.rank} step {st.step}"}})
        for k, i in rows.items():
            ev.append({"name": "thread_name", "ph": "M", "pid": st.rank, "tid": i, "args": {"name": k}})
        for stage, label, t0, t1 in st.events:
            ev.append({"name": label, "cat": stage, "ph": "X", "pid": st.rank, "tid": rows[stage],
                       "ts": round(t0 * 1e6, 3), "dur": round(max(t1 - t0, 0) * 1e6, 3)})
    doc = {"traceEvents": ev, "displayTimeUnit": "ms"}
    if path:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc


class _StepRun:
    """One step's bookkeeping, the eager and the replayed path alike: the units in
    flight and the ring bytes they hold, the posts, the stage times."""

    def __init__(self, sender: Any, step: int, timeout: float):  # a WeightSender
        self.sender, self.step = sender, step
        self.st = StepStats(sender.rank, step)
        self.base = time.perf_counter()
        self.base_ns = time.monotonic_ns()
        self.deadline = time.monotonic() + timeout
        self.inflight: dict[Any, tuple[Any, str, float]] = {}  # unit head (or group) -> (transfer, label, posted at)
        self.done_at: dict[Any, float] = {}
        self.held: set = set()  # units whose ring memory is taken
        self.deferred: list = []  # mapped: the group's units, posted together at its end
        self.live = 0
        self.prep_end = 0.0
        self.timed: list = []

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def add(self, stage: str, label: str, t0: float, t1: float) -> None:
        self.st.add(stage, label, t0, t1, self.base)

    def hold(self, head: int) -> None:
        self.held.add(head)
        self.live += self.sender._footprint[head]
        self.st.peak_temp_bytes = max(self.st.peak_temp_bytes, self.live)

    def release(self, head: int) -> None:
        """The unit's ring memory is free again. Without waiting for anything where the
        writes are stores (mapped): every access to the ring is then work on the step's
        stream, which runs the later unit's after the earlier one's."""
        if head in self.held:
            self.held.discard(head)
            self.live -= self.sender._footprint[head]

    def finish(self, head: int) -> None:
        """Wait for a posted unit's writes (nothing when it is not in flight)."""
        if head not in self.inflight:
            return
        tr, label, t_post = self.inflight.pop(head)
        try:
            tr.result(timeout=self.left())
        except TimeoutError as e:
            raise ferry.Timeout(f"step {self.step}: writes of {label} not complete by the deadline") from e
        self.add("write", label, t_post, self.done_at.get(head, time.perf_counter()))
        self.release(head)

    def post(self, head: int, label: str, t_ready: float, mark) -> None:
        """Post a unit's prepared scatter once its marker passed (stage `prepare` up to
        then, from when it could start and the previous unit's was done)."""
        snd = self.sender
        if snd.mapping is not None:  # the immediates go out with the group's (end_group)
            self.deferred.append((head, label, t_ready, mark))
            return
        t4 = self._ready(label, t_ready, mark)
        self._submit(snd._prepared[head], head, label, t4, [head])

    def _ready(self, label: str, t_ready: float, mark) -> float:
        """Wait for the marker (the device work before it done); stage `prepare` from when
        the work could start and the previous post was done. Returns the time."""
        be = self.sender.backend
        if mark is None:
            be.sync()
        else:
            be.wait(mark)
        t4 = time.perf_counter()
        self.add("prepare", label, max(t_ready, self.prep_end), t4)
        self.prep_end = t4
        return t4

    def _submit(self, prepared, key, label: str, t4: float, heads) -> None:
        snd, st = self.sender, self.st
        tr = snd.engine.submit(prepared, imm=data_imm(self.step))
        tr.add_done_callback(lambda _f, h=key: self.done_at.__setitem__(h, time.perf_counter()))
        t5 = time.perf_counter()
        self.add("post", label, t4, t5)
        self.inflight[key] = (tr, label, t5)
        st.submits += 1
        for head in heads:
            for j in snd._units[head]:
                st.jobs += 1
                st.writes += len(j.writes)
                st.bytes_written += j.sent_bytes
                if snd.after_post:
                    snd.after_post(self.step, j.id)

    def _post_group(self, group: str) -> None:
        """Mapped: once the group's last unit's marker passed (all its stores are done: one
        stream), every immediate of the group in one prepared scatter."""
        heads = [d[0] for d in self.deferred]
        t_ready, mark = self.deferred[0][2], self.deferred[-1][3]
        self.deferred = []
        t4 = self._ready(group, t_ready, mark)
        snd = self.sender
        self._submit(snd._group_prepared[group], ("group", group), f"{group} ({len(heads)} units)", t4, heads)

    def end_group(self, group: str) -> None:
        """Every write of the MeshGroup done, then the trainers' barrier."""
        if self.deferred:
            self._post_group(group)
        for h in list(self.inflight):
            self.finish(h)
        for h in list(self.held):  # mapped: the stream is past every unit of the group
            self.release(h)
        t0 = time.perf_counter()
        snd = self.sender
        snd.ex.flush(self.left())
        snd.ex.barrier(snd.trainer_ranks, self.left())
        self.add("barrier", group, t0, time.perf_counter())

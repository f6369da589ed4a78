"""The per-step pipeline (seed Figure 5) on the trainer side and the inference side.

Trainer rank, for each MeshGroup in order, for each job of its sub-mesh in the
schedule's order: a rank that holds rows of a gathered job's parameters sends them to
the job's owner (a direct job's owner holds every row itself; stage 1, H2D where the
shards are offloaded, happens on the owner); the owner waits until the ring memory the
job reuses is free (the watermark), gathers the rows into its registered staging memory (stage 2,
``full_tensor`` restricted to the rows this job needs), fuses and quantises into the
destination layout, and posts one prepared scatter: every write of the job, weights
and scales, to every inference rank that takes them, with the step's immediate
(stage 3). Writes run while the next jobs are prepared. When the group's writes are
complete, the trainers meet in a barrier (stage 4) and the next MeshGroup starts.
Small bf16 jobs in a row run as one unit; a unit is posted once the next one is issued,
after a marker of its own device work. With ``graphs=True`` the device work of a step is
captured after the first and replayed while the shards stay in place.

The inference rank's side (registers its weights once, counts the step's immediates) is
``ferry.rl.receiver.WeightReceiver``.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Sequence

import ferry

from . import schedule as S
from .meta import TrainerBlock, TrainerMeta
from .backends import NumpyBackend, TorchBackend
from .mapped import Mapping
from .steps import StepStats, _StepRun, abort_imm, chrome_trace, data_imm
from .quant import ITEMSIZE, scale_shape

__all__ = ["NumpyBackend", "TorchBackend", "StepStats", "WeightSender", "chrome_trace", "data_imm", "abort_imm"]

# Consecutive bf16 jobs of one owner that are written as they are (norms, router
# weights: a few KiB each) run as one unit: one copy launch, one marker, one prepared
# scatter. Each job's host work (~0.1 ms on a GPU) otherwise outweighs its bytes.
UNIT_JOB_MAX_BYTES = 1 << 20
UNIT_MAX_JOBS = 16
_ROUTE = ferry.GroupRoute.shard_peers()


def _tag(step: int, jid: int, part: int) -> int:
    if jid >= 1 << 16 or part >= 64:
        raise ValueError(f"job {jid} part {part}: outside the tag space")
    return ((step & 0x1F) << 22) | (jid << 6) | part


def _gather_meta(exchange, kind: str, meta, controller: int, timeout: float, build: Optional[Callable] = None):
    metas = exchange.all_gather((kind, meta), timeout)
    sched = None
    if exchange.rank == controller:
        trainers = [m for k, m in metas if k == "trainer"]
        infs = [m for k, m in metas if k == "inference"]
        try:
            sched = build(trainers, infs)
        except (ValueError, AssertionError) as e:  # every rank learns why, not only the controller
            sched = f"{type(e).__name__}: {e}"
    sched = exchange.all_gather(sched, timeout)[controller]
    if isinstance(sched, str):
        raise ferry.InvalidArgument(f"no schedule: {sched}")
    return metas, sched


def _route_imm(length: int, nics: int) -> int:
    return ferry.ImmPlan.scatter_target(length, _ROUTE, nics)


class WeightSender:
    """The trainer side of one rank. `blocks` are this rank's DTensor blocks (meta);
    `trainer_ranks` / `inference_ranks` map schedule ranks to exchange ranks."""

    def __init__(self, engine: ferry.TransferEngine, exchange, *, rank: int, blocks: Sequence[TrainerBlock],
                 trainer_ranks: Sequence[int], inference_ranks: Sequence[int], watermark: int,
                 backend: Any = None, controller: int = 0,
                 after_post: Optional[Callable[[int, int], None]] = None, direct: bool = True,
                 direct_min_bytes: int = S.DIRECT_MIN_BYTES, gpu_timing: bool = False, graphs: bool = False,
                 mapped: Optional[bool] = None):
        self.engine, self.ex, self.rank = engine, exchange, rank
        # direct writes (schedule.build); the controller's choice holds
        self.direct, self.direct_min_bytes = direct, direct_min_bytes
        self.blocks = list(blocks)
        self.trainer_ranks, self.inference_ranks = list(trainer_ranks), list(inference_ranks)
        self.watermark = watermark
        self.backend = backend or NumpyBackend()
        self.controller = controller
        self.after_post = after_post
        self.gpu_timing = gpu_timing  # device time of each stage, from markers (StepStats.gpu)
        # graphs: after the first step, replay its device work as CUDA graphs while the shards
        # stay where they are (a trainer's parameters do), where no step exchanges rows
        self.graphs = graphs
        # mapped: copy into the inference weights mapped into this process, immediates
        # through the engine (ferry.rl.mapped); None: where every destination maps
        self.mapped = mapped
        self.mapping: Optional[Mapping] = None
        self.map_error: Optional[str] = None  # why the writes are not stores
        self._graphs = self._graph_key = None
        self.graph_error: Optional[str] = None  # why capturing failed (the steps stay eager)
        self.schedule: Optional[S.Schedule] = None

    def setup(self, timeout: float = 60.0) -> S.Schedule:
        """Publish metadata, get the schedule, register staging memory once and prepare
        every write this rank will post (all collective with the other ranks)."""
        meta = TrainerMeta(self.rank, self.engine.nics_per_group, tuple(self.blocks))

        def build(trainers, infs):
            s = S.build(trainers, infs, self.watermark, route_imm=_route_imm, direct=self.direct,
                        direct_min_bytes=self.direct_min_bytes)
            S.check(s, infs)
            return s

        metas, self.schedule = _gather_meta(self.ex, "trainer", meta, self.controller, timeout, build)
        infs = {m.rank: m for k, m in metas if k == "inference"}
        where = {(r, t.name): (ferry.MrDesc.from_bytes(t.desc), t.offset) for r, m in infs.items() for t in m.tensors}
        self._any_desc = {r: ferry.MrDesc.from_bytes(m.tensors[0].desc) for r, m in infs.items()}
        self.pool = self.backend.pool(self.watermark)
        self._h, _ = self.engine.register(self.pool)
        self._mine = {(b.name, b.row0): b for b in self.blocks}
        self._plans: dict = {}
        self._units, self._head = self._make_units()
        self._unit_facts()
        self._prepared = {}
        self._copies = {}  # unit head -> (mapped destinations, ring sources): mapped only
        if self.mapped is not False:
            self.mapping, self.map_error = Mapping.open(self.engine, self.backend, where)
            if self.mapping is None and self.mapped:
                raise ferry.FailedPrecondition(f"mapped=True but the destinations do not map: {self.map_error}")
        nics = self.engine.nics_per_group
        owned = self.schedule.owned(self.rank)
        self._homes = {}  # job id -> its output's homes in the mapped destinations
        self._scratch_views = None  # issue_conversions': the ring only
        if self.mapping is not None:
            for j in owned:
                h = self.mapping.homes(j, where)
                if h:
                    self._homes[j.id] = h
        # every view of the ring (or of a home) a job uses, made once: per step only the shards' change
        self._views = {}
        for j in owned:
            try:
                self._views[j.id] = self._ring_views(j)
            except (RuntimeError, ValueError, TypeError):  # a home this backend cannot view in that dtype
                self._homes.pop(j.id, None)
                self._views[j.id] = self._ring_views(j)
        pool_bytes = self.backend.view(self.pool, 0, (self.watermark,), "uint8") if self.mapping else None
        self._group_prepared = {}  # mapped: MeshGroup -> every immediate of its units, one scatter
        if self.mapping is not None:
            for group, ids in self.schedule.rank_sequence(self.rank):
                imms = []
                for jid in ids:
                    if self._head.get(jid) == jid:
                        unit = self._units[jid]
                        self._copies[jid] = self.mapping.unit_copies(unit, where, pool_bytes, self._homes)
                        imms += Mapping.imm_dsts(unit, where, lambda n: _route_imm(n, nics))
                if imms:
                    self._group_prepared[group] = self.engine.prepare_scatter(self._h, imms, route=_ROUTE)
        for head, unit in self._units.items() if self.mapping is None else ():
            dsts = []
            for j in unit:
                for w in j.writes:
                    desc, off = where[(w.rank, w.tensor)]
                    dsts.append(ferry.ScatterDst(w.length, j.pool_offset + j.out_offset + w.src, desc,
                                                 off + w.dst_offset))
            self._prepared[head] = self.engine.prepare_scatter(self._h, dsts, route=_ROUTE)
        jobs = self.schedule.jobs
        seq = [jobs[jid] for _, ids in self.schedule.rank_sequence(self.rank) for jid in ids]
        self._graphable = self.backend.can_capture() and all(
            not self._plan(j)[1] if j.owner == self.rank else not self._plan(j)[0] for j in seq)
        self._shard_keys = sorted({p[1] for j in seq for p in self._plan(j)[0]})
        self._segments = self._make_segments()
        return self.schedule

    def _make_segments(self):
        """[(MeshGroup, unit heads, heads whose writes must be done first)]: each MeshGroup's
        units in order, cut before every unit that reuses ring memory."""
        segs: list = []
        for group, ids in self.schedule.rank_sequence(self.rank):
            cur: list = []
            for jid in ids:
                if self._head.get(jid) != jid:
                    continue
                # mapped: stream order frees the ring (see _StepRun.release)
                waits = set(self._reuse_of[jid]) if self.mapping is None else set()
                if waits or not cur:
                    cur = []
                    segs.append((group, cur, waits))
                cur.append(jid)
        return segs

    def _unit_facts(self) -> None:
        """Per unit, what every step asks again: its ring bytes and the heads of the units
        whose ring memory it reuses (a step's bookkeeping over a hundred units otherwise
        costs ~0.4 ms of Python)."""
        self._footprint = {h: sum(j.footprint for j in unit) for h, unit in self._units.items()}
        self._reuse_of = {h: tuple({self._head.get(w, w) for u in unit for w in u.wait_for})
                          for h, unit in self._units.items()}

    def _make_units(self):
        """{head job id: the jobs run as one unit}, {job id: its unit's head}: every owned
        job alone, except runs of small jobs written as they are (UNIT_JOB_MAX_BYTES)
        that receive no rows, none reusing another's ring memory, consecutive in this
        rank's sequence but for jobs it has nothing to do for (another rank's direct
        jobs). A unit runs at its first job, so later members move ahead of those jobs;
        with no exchange on either side, no other rank can tell."""
        jobs, me = self.schedule.jobs, self.rank
        units: dict = {}
        run: list = []

        def close() -> None:
            if run:
                units[run[0].id] = list(run)
                run.clear()

        for _, ids in self.schedule.rank_sequence(me):
            for jid in ids:
                j = jobs[jid]
                if j.owner != me and not self._plan(j)[0]:
                    continue  # nothing to send: no part of this rank's sequence
                small = (j.owner == me and j.passthrough and j.footprint <= UNIT_JOB_MAX_BYTES
                         and not self._plan(j)[1])
                if small and run and len(run) < UNIT_MAX_JOBS and not set(j.wait_for) & {r.id for r in run}:
                    run.append(j)
                    continue
                close()
                if small:
                    run.append(j)
                elif j.owner == me:
                    units[jid] = [j]
            close()
        return units, {j.id: head for head, unit in units.items() for j in unit}

    def _ring_views(self, j: S.Job, homes: bool = True):
        """(the parts where they are gathered, back to back; per part its rows of the
        output and of the scales; the whole input, output and scales when the job
        converts in one pass, else None)."""
        be = self.backend
        homes = self._homes.get(j.id, ()) if homes else ()

        def at(off: int, shape, dtype: str):  # `off` from the ring's start; in a home if one holds it
            rel, n = off - j.pool_offset - j.out_offset, math.prod(shape) * ITEMSIZE[dtype]
            for s, m, mem, _ in homes:
                if s <= rel and rel + n <= s + m:
                    return be.view(mem, rel - s, shape, dtype)
            return be.view(self.pool, off, shape, dtype)

        parts, off = [], j.pool_offset
        for p, b in j.parts:
            parts.append(at(off, (p.rows, p.cols), b.dtype))
            off += p.rows * p.cols * ITEMSIZE[b.dtype]
        if j.passthrough:
            return parts, [], None
        cols = j.parts[0][0].cols
        rows = sum(p.rows for p, _ in j.parts)
        out = at(j.pool_offset + j.out_offset, (rows, cols), j.dtype)
        sv = None
        if j.scale_bytes:
            scols = scale_shape(1, cols)[1]
            sv = at(j.pool_offset + j.out_offset + S._align(j.weight_bytes),
                    (j.scale_bytes // (4 * scols), scols), "float32")
        per_part, r, sr = [], 0, 0
        for p, _ in j.parts:
            n = scale_shape(p.rows, p.cols)[0] if sv is not None else 0
            per_part.append((out[r:r + p.rows], sv[sr:sr + n] if sv is not None else None))
            r, sr = r + p.rows, sr + n
        whole = None
        if _one_pass(j):  # the parts lie back to back and no block spans two
            whole = (be.view(self.pool, j.pool_offset, (rows, cols), j.parts[0][1].dtype), out, sv)
        return parts, per_part, whole

    def _pieces(self, j: S.Job, shards):
        """(part index, rows [a, b) of the part this rank holds, 2-D view of them); for a
        rank other than the owner only the rows the owner lacks (replicated blocks)."""
        rows = self.backend.rows
        for pi, key, n, cols, la, le, c0, c1, a, e in self._plan(j)[0]:
            yield pi, a, e, rows(shards[key], n, cols)[la:le, c0:c1]

    def _plan(self, j: S.Job):
        """Which rows of which shard each part takes from this rank, and (owner) which rows
        it receives from which rank: worked out once per job, the same every step."""
        plan = self._plans.get(j.id)
        if plan is not None:
            return plan
        mine, recv = [], []
        for pi, (p, b) in enumerate(j.parts):
            if (b.name, b.row0) in self._mine:
                sa, sb = b.shard_rows(self.rank)
                a, e = b.held(self.rank, p)
                if a < e and not (j.owner != self.rank and b.holds(j.owner, a, e)):
                    mine.append((pi, (b.name, b.row0), sb - sa, b.cols, a - sa, e - sa, p.c0, p.c1,
                                 a + b.row0 - p.r0, e + b.row0 - p.r0))
            if j.owner != self.rank:
                continue
            for k in b.mesh:
                if k == self.rank:
                    continue
                a, e = b.held(k, p)
                if a < e and not b.holds(self.rank, a, e):
                    recv.append((pi, k, a + b.row0 - p.r0, e + b.row0 - p.r0))
        plan = self._plans[j.id] = (mine, recv)
        return plan

    def step(self, step: int, shards: dict, timeout: float = 60.0) -> StepStats:
        """Send this step's weights. `shards[(name, row0)]` is this rank's local shard of
        each block (DTensor.to_local()). Raises a ferry error (Unavailable, Timeout, ...)
        after telling the inference ranks that step `step` is aborted."""
        try:
            return self._step(step, shards, timeout)
        except ferry.FerryError:
            self.abort(step)
            raise

    def abort(self, step: int, timeout: float = 5.0) -> None:
        """Best effort: every inference rank learns that `step` will not complete."""
        ts = []
        for d in self._any_desc.values():
            try:
                ts.append(self.engine.submit_imm(abort_imm(step), d))
            except ferry.FerryError:
                pass
        for t in ts:
            try:
                t.result(timeout)
            except ferry.FerryError:
                pass

    def _step(self, step: int, shards: dict, timeout: float) -> StepStats:
        if self._graphs is not None and self._graph_key == self._shard_key(shards):
            return self._replay(step, timeout)
        st = self._eager(step, shards, timeout)
        if self.graphs and self._graphable and self.graph_error is None:
            try:
                self._capture(shards)
            except (RuntimeError, TypeError, AttributeError) as e:  # this torch cannot: stay eager
                self._graphs, self.graph_error = None, f"{type(e).__name__}: {e}"
                self.backend.begin()
        return st

    def _eager(self, step: int, shards: dict, timeout: float) -> StepStats:
        s, be, me = self.schedule, self.backend, self.rank
        be.begin()
        run = _StepRun(self, step, timeout)
        st = run.st
        # The unit converted last, posted once the next one is issued: the device works on
        # the next unit while this thread waits for the last one's marker (one ahead).
        pending: list = []  # [(head, label, t_converted_from, marker)]
        marks: list = []  # (crossed, m0, m1, m2): device time of each stage after the step
        units, head_of = self._units, self._head

        for group, ids in s.rank_sequence(me):
            for jid in ids:
                j = s.jobs[jid]
                if j.owner != me:
                    t0, sent = time.perf_counter(), False
                    for pi, _, _, piece in self._pieces(j, shards):
                        self.ex.send(self.trainer_ranks[j.owner], _tag(step, jid, pi), piece)
                        sent = True
                    if sent:
                        run.add("send", j.recipe, t0, time.perf_counter())
                    continue
                if head_of[jid] != jid:
                    continue  # run with its unit, at the unit's first job
                unit = units[jid]
                label = _label(unit)
                t0 = time.perf_counter()
                for w in (w for u in unit for w in u.wait_for):
                    h = head_of.get(w, w)
                    if self.mapping is not None:  # nothing but our stream touches the ring
                        run.release(h)
                        continue
                    if pending and pending[0][0] == h:
                        run.post(*pending.pop())
                    run.finish(h)
                run.hold(jid)
                t1 = time.perf_counter()
                run.add("wait_memory", label, t0, t1)
                m0 = be.record(timing=True) if self.gpu_timing else None
                views = self._unit_in_place(unit, shards)
                crossed, t3 = False, t1
                if views is None:
                    crossed, t3 = self._gather(unit, label, shards, step, st, t1, run.base, run.left)
                m1 = be.record(timing=True) if self.gpu_timing else None
                self._convert_unit(unit, views)
                mark = be.record(timing=self.gpu_timing)
                if self.gpu_timing:
                    marks.append((crossed, m0, m1, mark))
                if pending:
                    run.post(*pending.pop())
                pending.append((jid, label, t3, mark))
            if pending:
                run.post(*pending.pop())
            run.end_group(group)
        st.wall_s = time.perf_counter() - run.base
        for crossed, m0, m1, m2 in marks:  # every marker is complete: the writes were posted after them
            st.gpu["h2d" if crossed else "gather"] += be.elapsed(m0, m1)
            st.gpu["convert"] += be.elapsed(m1, m2)
        self._trace(st, run.base_ns)
        return st

    # --- CUDA graphs: a step's device work captured once, replayed every step ------------

    def issue_conversions(self, shards) -> None:
        """Issue the step's fusion and quantisation alone, reading what a step would read
        (shards in place, else the ring), no copies and no writes: for measuring how much
        of a step is conversion (the part the copy-ceiling comparison leaves out). Outputs
        go to the ring even where a step converts into a home: the inference weights are
        live, and the ring's inputs are whatever later jobs left there."""
        if self._scratch_views is None:
            self._scratch_views = {jid: self._ring_views(self.schedule.jobs[jid], homes=False) for jid in self._views}
        for unit in self._units.values():
            self._convert_unit(unit, self._unit_in_place(unit, shards), scratch=True)

    def _shard_key(self, shards) -> tuple:
        """Where every shard the plans read lies: a graph replays only onto these."""
        addr = self.backend.address
        return tuple(addr(shards[k]) for k in self._shard_keys)

    def _capture(self, shards) -> None:
        """Capture the device work of every segment (units up to the next one that reuses
        ring memory, within a MeshGroup) as a graph with a marker after each unit. Run
        after an eager step, whose launches compiled every kernel; the engine is idle."""
        be, graphs = self.backend, []
        for group, heads, waits in self._segments:
            g, ctx = be.capture()
            staged: list = []  # (host buffer the graph copies from, the shard piece that fills it)
            with ctx:
                be.begin()
                marks = []
                for h in heads:
                    self._issue(self._units[h], shards, staged)
                    marks.append(be.marker_in_graph())
            graphs.append((group, heads, waits, g, marks, staged))
        be.begin()
        self._graphs, self._graph_key = graphs, self._shard_key(shards)

    def _replay(self, step: int, timeout: float) -> StepStats:
        """A step as graph replays: per segment, wait for the writes of the units whose
        ring memory it reuses, launch it (one call), post each unit as its marker passes."""
        be = self.backend
        be.begin()
        run = _StepRun(self, step, timeout)
        st = run.st
        st.replayed = True
        graphs = self._graphs
        for i, (group, heads, waits, g, marks, staged) in enumerate(graphs):
            t0 = time.perf_counter()
            for h in waits:
                run.finish(h)
            for h in heads:
                if self.mapping is not None:
                    for r in self._reuse_of[h]:
                        run.release(r)
                run.hold(h)
            t1 = time.perf_counter()
            run.add("wait_memory", _label(self._units[heads[0]]), t0, t1)
            if staged:  # offloaded pieces the graph cannot copy from where they lie: on the CPU now
                for buf, src in staged:
                    be.fill(buf, src)
                t0, t1 = t1, time.perf_counter()
                run.add("h2d", f"graph {i} host staging ({len(staged)} pieces)", t0, t1)
            ev0 = be.record(timing=True) if self.gpu_timing else None
            be.replay(g)
            ev1 = be.record(timing=True) if self.gpu_timing else None
            t2 = time.perf_counter()
            run.add("gather", f"graph {i} ({len(heads)} units)", t1, t2)
            for h, m in zip(heads, marks):
                run.post(h, _label(self._units[h]), t2, m)
            if ev0 is not None:
                run.timed.append((ev0, ev1))
            if i + 1 == len(graphs) or graphs[i + 1][0] != group:
                run.end_group(group)
        st.wall_s = time.perf_counter() - run.base
        for e0, e1 in run.timed:  # the replays' device time: copies and conversion together
            st.gpu["graph"] = st.gpu.get("graph", 0.0) + be.elapsed(e0, e1)
        self._trace(st, run.base_ns)
        return st

    def _issue(self, unit, shards, staged: list) -> None:
        """A unit's device work alone (no waits, no exchange): what a graph captures. Host
        pieces a capture cannot copy from (strided, or not pinned) go through host buffers
        made here, listed in `staged` to be refilled before each replay."""
        views = self._unit_in_place(unit, shards)
        if views is None:
            self._copy_own(unit, shards, staged)
        self._convert_unit(unit, views)

    def _unit_in_place(self, unit, shards):
        """The parts of a unit's job where they lie in the shards when it converts from
        there (a unit of one job, see _in_place); None where they go into the ring first."""
        return self._in_place(unit[0], shards) if len(unit) == 1 else None

    def _convert_unit(self, unit, views, scratch: bool = False) -> None:
        """Fusion and quantisation of the unit's job from `views` (its parts in place) or,
        with None, from the ring where they were gathered; a unit of several jobs is all
        passthrough (written as it lies in the ring). Mapped: then the copies of its
        writes into the inference ranks' memory. `scratch`: into the ring only, no copies
        (issue_conversions)."""
        j = unit[0]
        table = self._scratch_views if scratch else self._views
        if not j.passthrough:
            if views is None:
                self._convert(j, table[j.id][0], table[j.id], back_to_back=True)
            else:
                self._convert(j, views, table[j.id], back_to_back=False)
        stores = None if scratch else self._copies.get(j.id)
        if stores is not None and stores[0]:
            self.backend.copy_many(*stores)

    def _in_place(self, j: S.Job, shards):
        """The job's parts where they lie in this rank's shards, when conversion can read
        them there (a direct job: this rank holds every row; shards the device reads);
        None where they must be gathered into the ring first, for a job whose rows are
        its output, and for parts that convert in one pass once gathered (one copy and
        one pass cost fewer launches than a pass per part)."""
        if j.passthrough or (len(j.parts) > 1 and _one_pass(j)):  # one copy + one pass: fewer launches
            return None
        views: list = [None] * len(j.parts)
        for pi, a, e, piece in self._pieces(j, shards):
            if a != 0 or e != j.parts[pi][0].rows or views[pi] is not None or not self.backend.reads_in_place(piece):
                return None
            views[pi] = piece
        return views if all(v is not None for v in views) else None

    def _copy_own(self, unit, shards, staged: Optional[list] = None) -> list:
        """This rank's own rows of the unit's jobs into their ring memory, one copy call;
        returns the pieces copied. While capturing (`staged` a list), a piece the backend
        cannot copy inside a graph is first copied on the CPU into a host buffer of its
        own, which the graph then reads."""
        be = self.backend
        dsts, srcs = [], []
        for j in unit:
            views = self._views[j.id][0]
            for pi, a, e, piece in self._pieces(j, shards):
                if staged is not None:
                    buf = be.staging(piece)
                    if buf is not None:
                        be.fill(buf, piece)
                        staged.append((buf, piece))
                        piece = buf
                dsts.append(views[pi][a:e])
                srcs.append(piece)
        be.copy_many(dsts, srcs)
        return srcs

    def _gather(self, unit, label: str, shards, step: int, st: StepStats, t1: float, base: float, left):
        """The unit's rows into its jobs' ring memory: this rank's own (one copy call for
        the unit; stage 1 when they are offloaded), then the other ranks' (gathered
        jobs). Returns whether any copy crossed from the host, and the time it ended."""
        be = self.backend
        crossed = any(be.crosses(x) for x in self._copy_own(unit, shards))
        if crossed:  # this rank's own offloaded rows: stage 1 (issued; its device time from the markers)
            th = time.perf_counter()
            st.add("h2d", label, t1, th, base)
            t1 = th
        uploads = []
        for j in unit:
            views = self._views[j.id][0]
            for pi, k, a, e in self._plan(j)[1]:
                dst = views[pi][a:e]
                host = be.recv_buffer(dst)
                self.ex.recv(self.trainer_ranks[k], _tag(step, j.id, pi), host, left())
                uploads.append((host, dst))
        t2 = time.perf_counter()
        if uploads or not crossed:
            st.add("gather", label, t1, t2, base)
        for host, dst in uploads:
            be.upload(host, dst)
        t3 = time.perf_counter()
        if uploads:
            st.add("h2d", label, t2, t3, base)
        return crossed, t3

    def _convert(self, j: S.Job, views, ring_views, back_to_back: bool = True) -> None:
        """Fusion and quantisation of the parts (`views`; gathered into the ring back to
        back, or read in place) into the job's output (`ring_views`: _ring_views' triple)."""
        _, per_part, whole = ring_views
        items = [whole] if back_to_back and whole is not None else [(v, o, sc) for v, (o, sc) in zip(views, per_part)]
        for src, out, scales in items:
            if scales is not None:
                self.backend.quantize(src, out, scales)
            else:
                self.backend.copy(out, src)

    def _trace(self, st: StepStats, base_ns: int) -> None:
        """The step's stages into the engine's own trace (FERRY_TRACE / trace=), one track
        per stage beside the engine's worker and NIC tracks; after the step, so tracing
        costs the step nothing."""
        if not getattr(self.engine, "tracing", False):
            return
        for stage, label, t0, t1 in st.events:
            self.engine.trace_span(f"step {st.step} {label}", base_ns + int(t0 * 1e9),
                                   base_ns + int(max(t1, t0) * 1e9), f"rl {stage}")
        self.engine.trace_span(f"step {st.step}", base_ns, base_ns + int(st.wall_s * 1e9), "rl step")


def _label(unit) -> str:
    return unit[0].recipe if len(unit) == 1 else f"{unit[0].recipe} +{len(unit) - 1}"


def _one_pass(j: S.Job) -> bool:
    """Whether a job's parts can be converted as one tensor: they are gathered back to
    back in one dtype, and every part but the last is whole 128-row blocks, so the
    blocks (and scale rows) of the whole are those of the parts (an expert's gate and
    up projections; not a 576-row MLA projection followed by another)."""
    return (len(j.parts) > 1 and len({b.dtype for _, b in j.parts}) == 1
            and all(p.rows % 128 == 0 for p, _ in j.parts[:-1]))

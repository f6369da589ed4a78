"""The static transfer schedule: computed once by the controller from both sides'
metadata, broadcast, then replayed every step.

* A recipe (one inference tensor) is cut where its parts cross from one trainer
  sub-mesh to another; each piece is a *job*: the rows it needs from trainer blocks,
  the bytes it produces (weights, then fp8 scales) and every inference rank that takes
  exactly those bytes at exactly that place (replicas of a TP slice, of an EP slice,
  of a whole instance), so it is materialised and quantised once and written N times.
* Direct writes (the default): where the trainer's shards meet inside a recipe part
  without cutting a 128-row scale block, the part is also cut there, so each piece
  is held whole by one rank, which becomes its owner: it fuses, quantises and writes
  its own rows and nothing is gathered. Where a cut would split a scale block (a
  quantised part whose shard boundary is not 128-aligned), or would multiply the
  writes of small pieces (DIRECT_MIN_BYTES, DIRECT_FREE_WRS), the piece is gathered by
  one owner from the ranks holding its rows, as the seed's ``full_tensor()`` does.
* The owner of a job is one of the ranks that may own it (its holders: the one rank
  holding a direct piece, every rank of the sub-mesh for a gathered one), chosen
  longest-job-first onto the holder whose NICs carry the fewest bytes so far.
* Every rank of a sub-mesh walks the sub-mesh's jobs in one order (the owners' lists
  interleaved, so all NICs start at once); MeshGroups one after another.
* Each owner's temporary memory is a ring of `watermark` bytes; a job's place in it is
  fixed here, and so is the earlier job it must wait for, so the writes are prepared
  once (source offsets never change) and the watermark holds by construction.
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .meta import InferenceMeta, Part, Recipe, TrainerBlock, TrainerMeta, rows_cols
from .model import GROUP_ORDER
from .quant import ITEMSIZE, scale_shape

ALIGN = 256
DIRECT_MIN_BYTES = 256 << 10  # a piece smaller than this is gathered rather than cut (_by_shard)...
DIRECT_FREE_WRS = 16  # ...unless the cut adds at most this many work requests


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Write:
    """One one-sided write: `length` bytes from the job's output at `src` to byte
    `dst_offset` of tensor `tensor` on inference rank `rank`."""

    rank: int
    tensor: str
    dst_offset: int
    src: int
    length: int


@dataclass
class Job:
    id: int
    group: str
    mesh: tuple[int, ...]
    recipe: str  # destination tensor name
    dtype: str  # output dtype
    parts: tuple[tuple[Part, TrainerBlock], ...]
    src_bytes: int  # trainer dtype bytes materialised
    weight_bytes: int
    scale_bytes: int
    writes: list[Write] = field(default_factory=list)
    holders: tuple[int, ...] = ()  # ranks that may own it (hold every row, or gather them)
    owner: int = -1
    pool_offset: int = -1
    wait_for: tuple[int, ...] = ()  # jobs (same owner) whose memory this one reuses

    @property
    def passthrough(self) -> bool:
        """Not quantised and in the trainer's dtype: the gathered rows are the output."""
        return self.scale_bytes == 0 and all(b.dtype == self.dtype for _, b in self.parts)

    @property
    def out_offset(self) -> int:
        """Where the output starts, from the job's place in the ring."""
        return 0 if self.passthrough else _align(self.src_bytes)

    @property
    def out_bytes(self) -> int:
        return _align(self.weight_bytes) + self.scale_bytes

    @property
    def footprint(self) -> int:
        return _align(self.src_bytes) if self.passthrough else _align(self.src_bytes) + _align(self.out_bytes)

    @property
    def sent_bytes(self) -> int:
        return sum(w.length for w in self.writes)


@dataclass
class Schedule:
    jobs: list[Job]
    order: dict[tuple[str, tuple[int, ...]], list[int]]  # (group, mesh) -> job ids
    groups: list[str]
    watermark: int
    trainers: int
    inference: int
    imm_expected: dict[int, int]  # inference rank -> immediates one step brings
    trainer_nics: dict[int, int]

    def rank_sequence(self, rank: int) -> list[tuple[str, list[int]]]:
        """(group, job ids of the sub-mesh of `rank` in that group) in MeshGroup order."""
        out = []
        for g in self.groups:
            ids: list[int] = []
            for (gg, mesh), seq in self.order.items():
                if gg == g and rank in mesh:
                    ids = seq
            out.append((g, ids))
        return out

    def owned(self, rank: int) -> list[Job]:
        return [j for j in self.jobs if j.owner == rank]

    def sent_bytes(self, rank: int, group: Optional[str] = None) -> int:
        return sum(j.sent_bytes for j in self.jobs if j.owner == rank and (group is None or j.group == group))

    def received_bytes(self, inf_rank: int) -> int:
        return sum(w.length for j in self.jobs for w in j.writes if w.rank == inf_rank)

    def writes_of(self, rank: int) -> int:
        return sum(len(j.writes) for j in self.jobs if j.owner == rank)

    def digest(self) -> str:
        return hashlib.sha256(pickle.dumps(
            [(j.id, j.owner, j.pool_offset, j.wait_for, j.recipe, [(w.rank, w.dst_offset, w.src, w.length) for w in j.writes])
             for j in self.jobs] + sorted(self.order.items()))).hexdigest()


def _block_index(trainers: Iterable[TrainerMeta]) -> dict[str, list[TrainerBlock]]:
    seen: dict[tuple[str, int], TrainerBlock] = {}
    for t in trainers:
        for b in t.blocks:
            k = (b.name, b.row0)
            if k in seen and seen[k] != b:
                raise ValueError(f"trainer ranks disagree on block {k}: {seen[k]} vs {b}")
            seen[k] = b
    idx: dict[str, list[TrainerBlock]] = defaultdict(list)
    for (name, _), b in sorted(seen.items()):
        idx[name].append(b)
    return idx


def _split(part: Part, blocks: list[TrainerBlock]) -> list[tuple[Part, TrainerBlock]]:
    out, r = [], part.r0
    for b in blocks:
        a, e = b.row0, b.row0 + b.rows
        if e <= r or a >= part.r1:
            continue
        if a > r:
            break
        hi = min(e, part.r1)
        out.append((Part(part.param, r, hi, part.c0, part.c1), b))
        r = hi
        if r == part.r1:
            return out
    raise ValueError(f"no trainer block holds rows [{r}, {part.r1}) of {part.param}")


def _by_shard(p: Part, b: TrainerBlock, r0: int, quantised: bool, min_bytes: int,
              replicas: int) -> list[tuple[Part, tuple[int, ...]]]:
    """`p` (rows of block `b`) cut where the block's shards meet: (piece, the rank holding
    it). Uncut, with the whole mesh as holders, when the block is replicated, when a cut
    would split a 128-row scale block (counted from `r0`, where the recipe part starts),
    or when the pieces would be under `min_bytes` on average and the cut would add more
    than DIRECT_FREE_WRS work requests: every piece is written to each of the `replicas`
    taking it, so cutting a norm vector 128 ways for 128 replicas adds 16 000 work
    requests to save a gather of a few kilobytes, while cutting it 2 ways for 2 adds 2."""
    if b.placements == ("Replicate()",) or len(b.mesh) == 1:
        return [(p, b.mesh)]
    span = -(-b.shape[0] // len(b.mesh)) * (b.rows // b.shape[0])  # rows per shard
    out = []
    for i in range((p.r0 - b.row0) // span, (p.r1 - 1 - b.row0) // span + 1):
        a, e = max(b.row0 + i * span, p.r0), min(b.row0 + (i + 1) * span, p.r1)
        out.append((Part(p.param, a, e, p.c0, p.c1), (b.mesh[i],)))
    if quantised and any((q.r0 - r0) % 128 for q, _ in out):
        return [(p, b.mesh)]
    extra = (len(out) - 1) * replicas * (2 if quantised else 1)
    if extra > DIRECT_FREE_WRS and p.rows * p.cols * ITEMSIZE[b.dtype] < min_bytes * len(out):
        return [(p, b.mesh)]
    return out


def _pieces(rec: Recipe, idx: dict[str, list[TrainerBlock]], direct_min: Optional[int], replicas: int = 1):
    """Cut a recipe into runs of parts with the same holders (one sub-mesh, or, cut by
    shard unless `direct_min` is None, one rank of it): (parts, holders, weight row0,
    scale row0)."""
    parts: list[tuple[Part, TrainerBlock, tuple[int, ...]]] = []
    for p in rec.parts:
        if p.param not in idx:
            raise ValueError(f"recipe {rec.name}: no trainer parameter {p.param}")
        sp = _split(p, idx[p.param])
        if rec.quantised and len(sp) > 1 and any((q.r0 - p.r0) % 128 for q, _ in sp):
            raise ValueError(f"recipe {rec.name}: a trainer block boundary cuts a 128-row scale block of {p.param}")
        for q, b in sp:
            cuts = [(q, b.mesh)] if direct_min is None else _by_shard(q, b, p.r0, rec.quantised, direct_min, replicas)
            parts.extend((c, b, h) for c, h in cuts)
    runs, row, srow = [], 0, 0
    cur: list[tuple[Part, TrainerBlock]] = []
    start = (0, 0)
    holders: tuple[int, ...] = ()
    for p, b, h in parts:
        if cur and (cur[-1][1].group, cur[-1][1].mesh, holders) != (b.group, b.mesh, h):
            runs.append((cur, holders, start))
            cur, start = [], (row, srow)
        cur.append((p, b))
        holders = h
        row += p.rows
        if rec.quantised:
            srow += scale_shape(p.rows, p.cols)[0]
    runs.append((cur, holders, start))
    return runs


def build(trainers: list[TrainerMeta], inference: list[InferenceMeta], watermark: int,
          route_imm=None, direct: bool = True, direct_min_bytes: int = DIRECT_MIN_BYTES) -> Schedule:
    """The schedule for these ranks. `route_imm(length, nics)` counts the immediates a
    write brings its target (ferry.ImmPlan with the route used); default 1. `direct`:
    each rank writes the rows it holds where the scale blocks allow and its pieces
    average `direct_min_bytes` (module doc); False gathers every piece on one owner of
    its sub-mesh."""
    trainers = sorted(trainers, key=lambda t: t.rank)
    inference = sorted(inference, key=lambda m: m.rank)
    idx = _block_index(trainers)
    nics = {t.rank: max(1, t.nics) for t in trainers}
    byjob: dict[tuple, Job] = {}
    cut: dict[Recipe, list] = {}  # replicas of a TP / EP slice share one recipe
    replicas = Counter(rec for inf in inference for rec in inf.recipes)
    for inf in inference:
        for rec in inf.recipes:
            cols = rows_cols(rec.shape)[1]
            isz = ITEMSIZE[rec.dtype]
            scols = scale_shape(1, cols)[1]
            if rec not in cut:
                cut[rec] = [(parts, holders, row0, srow0, sum(p.rows for p, _ in parts),
                             sum(scale_shape(p.rows, p.cols)[0] for p, _ in parts) if rec.quantised else 0,
                             tuple(p for p, _ in parts), sum(p.rows * p.cols * ITEMSIZE[b.dtype] for p, b in parts))
                            for parts, holders, (row0, srow0) in
                            _pieces(rec, idx, direct_min_bytes if direct else None, replicas[rec])]
            for parts, holders, row0, srow0, rows, srows, pkey, src_bytes in cut[rec]:
                key = (rec.name, rec.dtype, row0, pkey)
                j = byjob.get(key)
                if j is None:
                    b0 = parts[0][1]
                    j = Job(len(byjob), b0.group, b0.mesh, rec.name, rec.dtype, tuple(parts), src_bytes,
                            rows * cols * isz, srows * scols * 4, holders=holders)
                    byjob[key] = j
                j.writes.append(Write(inf.rank, rec.name, row0 * cols * isz, 0, j.weight_bytes))
                if rec.quantised:
                    j.writes.append(Write(inf.rank, rec.scale, srow0 * scols * 4, _align(j.weight_bytes), j.scale_bytes))
    jobs = _split_wide(list(byjob.values()))
    groups = [g for g in GROUP_ORDER if any(j.group == g for j in jobs)]
    groups += sorted({j.group for j in jobs} - set(groups))
    # Owners: longest job first onto the least loaded rank (bytes per NIC) of the mesh.
    bymesh: dict[tuple[str, tuple[int, ...]], list[Job]] = defaultdict(list)
    for j in jobs:
        bymesh[(j.group, j.mesh)].append(j)
    order: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for key in sorted(bymesh):
        mj = bymesh[key]
        load = {r: 0 for r in key[1]}
        for j in sorted(mj, key=lambda j: (-j.sent_bytes, j.id)):
            j.owner = min(j.holders, key=lambda r: (load[r] / nics[r], r))
            load[j.owner] += j.sent_bytes
            # spread the inference NICs: each job starts at another target
            j.writes.sort(key=lambda w: ((w.rank - j.id) % max(1, len(inference)), w.tensor))
        per_owner = {r: sorted((j for j in mj if j.owner == r), key=lambda j: j.id) for r in key[1]}
        seq, i = [], 0
        while len(seq) < len(mj):
            for r in key[1]:
                if i < len(per_owner[r]):
                    seq.append(per_owner[r][i].id)
            i += 1
        order[key] = seq
    # Ring placement per owner, in the order the owner meets its jobs.
    for r in nics:
        head, live = 0, []  # live: (offset, end, job id) in allocation order
        for g in groups:
            for (gg, mesh), seq in sorted(order.items()):
                if gg != g or r not in mesh:
                    continue
                for jid in seq:
                    j = jobs[jid]
                    if j.owner != r:
                        continue
                    need = j.footprint
                    if need > watermark:
                        raise ValueError(f"job {j.recipe} needs {need} bytes of temporary memory, "
                                         f"more than the watermark {watermark}")
                    if head + need > watermark:
                        head = 0
                    end = head + need
                    j.wait_for = tuple(o for off, e, o in live if off < end and head < e)
                    live = [x for x in live if not (x[0] < end and head < x[1])] + [(head, end, jid)]
                    j.pool_offset = head
                    head = end
    imm: dict[int, int] = defaultdict(int)
    for j in jobs:
        for w in j.writes:
            imm[w.rank] += route_imm(w.length, nics[j.owner]) if route_imm else 1
    return Schedule(jobs, order, groups, watermark, len(trainers), len(inference),
                    {m.rank: imm.get(m.rank, 0) for m in inference}, nics)


def _split_wide(jobs: list[Job]) -> list[Job]:
    """A job whose writes alone exceed a fair share of its mesh's bytes (an embedding
    replicated 16 times) is split by destination among several owners: each owner
    materialises it again, which costs trainer-side gather bytes but keeps NICs even."""
    total: dict[tuple, int] = defaultdict(int)
    for j in jobs:
        total[(j.group, j.mesh)] += j.sent_bytes
    out: list[Job] = []
    for j in jobs:
        share = total[(j.group, j.mesh)] / len(j.mesh)
        ranks = sorted({w.rank for w in j.writes})
        k = min(len(ranks), len(j.holders), int(-(-j.sent_bytes // max(1, int(share)))))
        if k <= 1:
            j.id = len(out)
            out.append(j)
            continue
        for c in range(k):
            mine = set(ranks[c::k])
            n = Job(len(out), j.group, j.mesh, j.recipe, j.dtype, j.parts, j.src_bytes,
                    j.weight_bytes, j.scale_bytes, [w for w in j.writes if w.rank in mine], holders=j.holders)
            out.append(n)
    return out


def check(s: Schedule, inference: list[InferenceMeta]) -> None:
    """Raises AssertionError unless every destination byte is written exactly once,
    every write stays inside its tensor, and owners belong to their job's sub-mesh."""
    sizes = {}
    for m in inference:
        for r in m.recipes:
            sizes[(m.rank, r.name)] = r.nbytes if hasattr(r, "nbytes") else _recipe_bytes(r)
            if r.quantised:
                sizes[(m.rank, r.scale)] = _prod(r.scale_shape) * 4
    spans: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for j in s.jobs:
        assert j.owner in j.mesh, f"job {j.id} owner {j.owner} outside its mesh {j.mesh}"
        assert j.owner in j.holders, f"job {j.id} owner {j.owner} not among its holders {j.holders}"
        assert 0 <= j.pool_offset and j.pool_offset + j.footprint <= s.watermark
        for w in j.writes:
            spans[(w.rank, w.tensor)].append((w.dst_offset, w.dst_offset + w.length))
    assert set(spans) == set(sizes), f"tensors without writes: {sorted(set(sizes) - set(spans))[:5]}"
    for k, lst in spans.items():
        lst.sort()
        pos = 0
        for a, b in lst:
            assert a == pos, f"{k}: gap or overlap at byte {pos} (next write starts at {a})"
            pos = b
        assert pos == sizes[k], f"{k}: writes end at {pos}, tensor has {sizes[k]} bytes"


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _recipe_bytes(r: Recipe) -> int:
    return _prod(r.shape) * ITEMSIZE[r.dtype]

"""Writes as stores: where the engine can map every inference rank's weight memory into
the trainer's process (``TransferEngine.map_remote``: ranks on one node over the nvlink
provider), the trainer's own stream puts the bytes there, inside the captured CUDA
graphs, and only the immediates go through the engine: one zero-length write per write
replaced, posted once the unit's marker passed, so the inference side counts exactly
what it counts for real writes. Where a job's output lies in one destination (a
"home": every view of the output the job's device work writes falls inside one write's
range), that work writes it there directly, no ring memory and no copy; the other
writes of the same bytes (replicas) are copied from it. Elsewhere the output goes into
the ring as usual and each write becomes a copy."""

from __future__ import annotations

from typing import Any, Optional

import ferry

from .quant import ITEMSIZE
from .schedule import _align


class Mapping:
    """Every inference tensor's memory as a byte view on the trainer's device."""

    def __init__(self, views: dict, regions: list):
        self.views = views  # (inference rank, tensor) -> byte view of the whole region
        self.regions = regions  # the MappedRegions: held so the mappings stay open

    @staticmethod
    def open(engine: ferry.TransferEngine, backend: Any, where: dict) -> tuple[Optional["Mapping"], Optional[str]]:
        """(the mapping, None), or (None, why not) when the backend cannot view mapped
        memory or the transport cannot map some destination (tcp, shm, efa, verbs)."""
        dev = getattr(backend, "map_device", None)
        if dev is None:
            return None, f"{type(backend).__name__} cannot view mapped memory"
        views, regions = {}, []
        try:
            for key, (desc, _) in where.items():
                r = engine.map_remote(desc, 0, desc.length, dev)
                regions.append(r)
                views[key] = backend.mapped(r)
        except (ferry.FerryError, ValueError) as e:  # a transport that cannot map; another device
            return None, f"{type(e).__name__}: {e}"
        return Mapping(views, regions), None

    def dest(self, w, where: dict):
        """The bytes write `w` targets, as a view of this process."""
        _, off = where[(w.rank, w.tensor)]
        a = off + w.dst_offset
        return self.views[(w.rank, w.tensor)][a:a + w.length]

    def homes(self, j, where: dict) -> list:
        """[(start, length, byte view, the write it is)]: the job's output ranges kept in
        their first destination; [] where some view of the output its device work writes
        (the gathered parts of a job written as it is; the weights, the scales of one
        converted) would not fall inside one of them, or two writes overlap in part."""
        homes: list = []
        for w in j.writes:
            if any(s == w.src and n == w.length for s, n, _, _ in homes):
                continue  # a replica: copied from the home
            if any(s < w.src + w.length and w.src < s + n for s, n, _, _ in homes):
                return []
            homes.append((w.src, w.length, self.dest(w, where), w))
        if j.passthrough:
            spans, off = [], 0
            for p, b in j.parts:
                n = p.rows * p.cols * ITEMSIZE[b.dtype]
                spans.append((off, n))
                off += n
        else:
            spans = [(0, j.weight_bytes)] + ([(_align(j.weight_bytes), j.scale_bytes)] if j.scale_bytes else [])
        for a, n in spans:
            if not any(s <= a and a + n <= s + m for s, m, _, _ in homes):
                return []
        return homes

    def unit_copies(self, unit, where: dict, pool_bytes, homes: dict):
        """(destination byte views, source byte views): every write of the unit's jobs
        that its device work does not already put in place, from the ring or from the
        job's home."""
        dsts, srcs = [], []
        for j in unit:
            base = j.pool_offset + j.out_offset
            mine = homes.get(j.id, ())
            for w in j.writes:
                if any(hw is w for _, _, _, hw in mine):
                    continue  # written there by the job's own device work
                src = next((v[w.src - s:w.src - s + w.length] for s, n, v, _ in mine
                            if s <= w.src and w.src + w.length <= s + n), None)
                if src is None:
                    src = pool_bytes[base + w.src:base + w.src + w.length]
                dsts.append(self.dest(w, where))
                srcs.append(src)
        return dsts, srcs

    @staticmethod
    def imm_dsts(unit, where: dict, route_imm) -> list:
        """Zero-length scatter targets: as many immediates to each rank as the unit's
        writes would have carried."""
        if route_imm(0) != 1:
            raise ferry.Internal("a zero-length scatter target must carry one immediate")
        out = []
        for j in unit:
            for w in j.writes:
                desc, _ = where[(w.rank, w.tensor)]
                out.extend([ferry.ScatterDst(0, 0, desc, 0)] * route_imm(w.length))
        return out

"""Writes as stores: where the engine can map every inference rank's weight memory into
the trainer's process (``TransferEngine.map_remote``: ranks on one node over the nvlink
provider), a unit's bytes are copied from the ring straight into the mapped weights by
the trainer's own stream, inside the captured CUDA graphs, and only the immediates go
through the engine: one zero-length write per write replaced, posted once the unit's
marker passed, so the inference side counts exactly what it counts for real writes.
That saves the engine a copy launch and a completion event per write; the bytes moved
are the same."""

from __future__ import annotations

from typing import Any, Optional

import ferry


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
        except ferry.FerryError as e:
            return None, f"{type(e).__name__}: {e}"
        return Mapping(views, regions), None

    def unit_copies(self, unit, where: dict, pool_bytes):
        """(destination byte views, ring byte views): every write of the unit's jobs."""
        dsts, srcs = [], []
        for j in unit:
            base = j.pool_offset + j.out_offset
            for w in j.writes:
                _, off = where[(w.rank, w.tensor)]
                a = off + w.dst_offset
                dsts.append(self.views[(w.rank, w.tensor)][a:a + w.length])
                srcs.append(pool_bytes[base + w.src:base + w.src + w.length])
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

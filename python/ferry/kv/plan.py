"""The writes of one request from one prefill rank to one decode rank (docs/KV.md, "Plan").

Steps are numbered as the prefiller's watcher word counts them: step ``c * L + l + 1`` is
layer ``l`` of chunk ``c`` (its K and V writes), the last step the context. Within a chunk,
a run of pages consecutive on both sides is one single write when whole pages move
between packed layouts; the remaining pages go into one paged write per (layer, K/V,
piece). The decoder's immediate count is the sum of ``imms`` over every write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import _ferry
from .layout import KvLayout, piece_geometry

__all__ = ["Write", "LinkPlan", "plan_link", "page_runs"]


@dataclass
class Write:
    """One engine write. `single`: (src_region, src_offset, length, dst_region, dst_offset);
    else a paged write of `length`-byte pages at src/dst offset + page * stride."""

    single: bool
    src_region: int
    src_offset: int
    length: int
    dst_region: int
    dst_offset: int
    src_pages: Optional[np.ndarray] = None
    dst_pages: Optional[np.ndarray] = None
    src_stride: int = 0
    dst_stride: int = 0
    imms: int = 1
    context: bool = False

    @property
    def pages(self) -> int:
        return 1 if self.single else len(self.src_pages)


@dataclass
class LinkPlan:
    steps: list  # list[list[Write]]; the last holds the context write
    imms: int  # immediates the decoder counts
    pages: int  # page pieces moved (per K/V, layer and head piece)
    writes: int  # engine writes (single + paged, the context included)


def page_runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int]]:
    """[(start, length)] of maximal runs where both src and dst page ids step by one."""
    n = len(src)
    if n == 0:
        return []
    brk = np.flatnonzero((np.diff(src.astype(np.int64)) != 1) | (np.diff(dst.astype(np.int64)) != 1))
    starts = np.concatenate(([0], brk + 1))
    ends = np.concatenate((brk + 1, [n]))
    return list(zip(starts.tolist(), (ends - starts).tolist()))


def plan_link(
    src: KvLayout,
    dst: KvLayout,
    head_lo: int,
    head_hi: int,
    src_pages: np.ndarray,
    dst_pages: list,
    num_tokens: int,
    chunk_pages: int,
    context_len: int,
    context_src: tuple,
    context_dst: tuple,
    nics: int,
    coalesce: bool = True,
    route=None,
) -> LinkPlan:
    """Plan the writes of heads [head_lo, head_hi) of one request.

    src_pages: the prefiller's page ids (one list for every layer: its own cache);
    dst_pages: the decoder's, one list per layer group of `dst`. context_src/dst:
    (region, offset) of the context bytes; context_len 0 sends none.
    """
    route = route if route is not None else _ferry.WriteRoute.split()
    n = dst.pages_for(num_tokens)
    pieces, plen, whole = piece_geometry(src, dst, head_lo, head_hi)
    packed = whole and src.page_stride == src.page_bytes and dst.page_stride == dst.page_bytes
    L = src.num_layers
    chunks = max(1, -(-n // chunk_pages))
    steps: list = []
    imms = pages = writes = 0
    sp_all = np.ascontiguousarray(src_pages[:n], dtype=np.uint32)
    for c in range(chunks):
        lo, hi = c * chunk_pages, min(n, (c + 1) * chunk_pages)
        sp = sp_all[lo:hi]
        per_group: dict = {}  # the page runs of a chunk are the same for every layer of a group
        for layer in range(L):
            g = dst.group_of(layer)
            if g not in per_group:
                dp_g = np.ascontiguousarray(dst_pages[g][lo:hi], dtype=np.uint32)
                runs = page_runs(sp, dp_g) if packed and coalesce else []
                ones = np.asarray([a for a, n in runs if n == 1], dtype=np.int64)
                per_group[g] = (dp_g, [(a, n) for a, n in runs if n > 1], ones,
                                sp[ones] if len(ones) else None, dp_g[ones] if len(ones) else None)
            dp, long_runs, ones, sp1, dp1 = per_group[g]
            step: list = []
            for kind in (0, 1):
                sreg = (src.k_regions, src.v_regions)[kind][layer]
                soff = (src.k_offsets, src.v_offsets)[kind][layer]
                dreg = (dst.k_regions, dst.v_regions)[kind][layer]
                doff = (dst.k_offsets, dst.v_offsets)[kind][layer]
                if packed and coalesce:
                    for start, length in long_runs:
                        nbytes = length * src.page_bytes
                        k = _ferry.ImmPlan.single_write(nbytes, route, nics)
                        step.append(Write(True, sreg, soff + int(sp[start]) * src.page_stride,
                                          nbytes, dreg, doff + int(dp[start]) * dst.page_stride,
                                          imms=k))
                        imms += k
                        pages += length
                    if len(ones):
                        step.append(Write(False, sreg, soff, plen, dreg, doff, sp1, dp1,
                                          src.page_stride, dst.page_stride, imms=len(ones)))
                        imms += len(ones)
                        pages += len(ones)
                else:
                    for ps, pd in pieces:
                        step.append(Write(False, sreg, soff + ps, plen, dreg, doff + pd, sp, dp,
                                          src.page_stride, dst.page_stride, imms=len(sp)))
                        imms += len(sp)
                        pages += len(sp)
            writes += len(step)
            steps.append(step)
    last: list = []
    if context_len:
        k = _ferry.ImmPlan.single_write(context_len, route, nics)
        last.append(Write(True, context_src[0], context_src[1], context_len, context_dst[0],
                          context_dst[1], imms=k, context=True))
        imms += k
        writes += 1
    steps.append(last)
    return LinkPlan(steps, imms, pages, writes)

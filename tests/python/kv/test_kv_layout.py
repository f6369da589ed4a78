"""KvLayout, the handshake blob, head ownership across TP degrees, and the write plan."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from ferry.kv import KvLayout, LayoutMismatch, head_sources, heads_of, page_runs, plan_link
from ferry.kv import wire

GEOM = dict(model="m", num_layers=3, num_kv_heads=8, head_dim=16, dtype="bfloat16",
            tokens_per_page=16, num_pages=64)


def test_blob_round_trips_and_hash_covers_compat_fields_only():
    a = KvLayout(tp_rank=1, tp_size=2, **GEOM)
    b = KvLayout.from_blob(a.to_blob())
    assert b == a and b.compat_hash == a.compat_hash
    # TP, page count and placement may differ between peers: same hash.
    assert KvLayout(**dict(GEOM, num_pages=7)).compat_hash == a.compat_hash
    for field, value in [("head_dim", 32), ("dtype", "float16"), ("num_layers", 4),
                         ("tokens_per_page", 32), ("model", "other"), ("page_order", "NHD")]:
        c = KvLayout(**dict(GEOM, **{field: value}))
        assert c.compat_hash != a.compat_hash
        with pytest.raises(LayoutMismatch, match=field):
            a.check_compatible(c)


def test_malformed_or_tampered_blobs_are_typed_errors():
    blob = KvLayout(**GEOM).to_blob()
    with pytest.raises(ferry.InvalidArgument, match="malformed"):
        KvLayout.from_blob(b"{not json")
    with pytest.raises(ferry.InvalidArgument, match="malformed"):
        KvLayout.from_blob(blob.replace(b'"v":1', b'"v":9'))
    with pytest.raises(LayoutMismatch, match="hash"):
        KvLayout.from_blob(blob.replace(b'"head_dim":16', b'"head_dim":32'))
    with pytest.raises(ferry.InvalidArgument):
        KvLayout(**dict(GEOM, num_kv_heads=6), tp_size=4)


@pytest.mark.parametrize("heads,tp,want", [
    (8, 1, [(0, 8)]), (8, 2, [(0, 4), (4, 8)]), (8, 8, [(h, h + 1) for h in range(8)]),
    (2, 8, [(0, 1)] * 4 + [(1, 2)] * 4),
])
def test_heads_of(heads, tp, want):
    assert [heads_of(heads, tp, r) for r in range(tp)] == want


@pytest.mark.parametrize("p,d", [(a, b) for a in (1, 2, 4, 8) for b in (1, 2, 4, 8)])
def test_head_sources_cover_every_decode_head_once(p, d):
    src = KvLayout(**GEOM, tp_size=p)
    for r in range(d):
        dst = KvLayout(**GEOM, tp_size=d, tp_rank=r)
        srcs = head_sources(src, dst)
        covered = [h for _, lo, hi in srcs for h in range(lo, hi)]
        assert covered == list(range(*dst.heads))
        for rank, lo, hi in srcs:
            slo, shi = heads_of(8, p, rank)
            assert slo <= lo and hi <= shi


def test_replicated_heads_spread_over_prefill_ranks():
    g = dict(GEOM, num_kv_heads=2)
    src = KvLayout(**g, tp_size=8)
    used = {head_sources(src, KvLayout(**g, tp_size=8, tp_rank=r))[0][0] for r in range(8)}
    assert len(used) == 8


def test_page_runs():
    src = np.array([4, 5, 6, 9, 10, 3], np.uint32)
    dst = np.array([0, 1, 2, 3, 4, 5], np.uint32)
    assert page_runs(src, dst) == [(0, 3), (3, 2), (5, 1)]


def _plan(src, dst, sp, dp, ntok, chunk_pages, coalesce=True, ctx=0):
    srcs = head_sources(src, dst)
    (_, lo, hi), = [s for s in srcs if s[0] == src.tp_rank]
    return plan_link(src, dst, lo, hi, np.asarray(sp, np.uint32), [np.asarray(dp, np.uint32)],
                     ntok, chunk_pages, ctx, ("ctx", 0), ("ctx", 0), nics=1, coalesce=coalesce)


def test_contiguous_runs_coalesce_into_single_writes():
    lay = KvLayout(**GEOM)
    n = 10
    plan = _plan(lay, lay, range(20, 30), range(0, 10), n * 16, n, ctx=64)
    # Per layer: K and V one write each, plus the context: 3 * 2 + 1.
    assert plan.writes == 3 * 2 + 1
    assert plan.imms == 3 * 2 + 1
    assert plan.pages == 3 * 2 * n
    # Uncoalesced: one paged write per layer and kind, one immediate per page.
    plain = _plan(lay, lay, range(20, 30), range(0, 10), n * 16, n, coalesce=False, ctx=64)
    assert plain.writes == 3 * 2 + 1 and plain.imms == 3 * 2 * n + 1
    # Chunks split runs at chunk boundaries: 3 chunks of 4, 4, 2 pages.
    chunked = _plan(lay, lay, range(20, 30), range(0, 10), n * 16, 4)
    assert len(chunked.steps) == 3 * 3 + 1 and chunked.writes == 3 * 3 * 2


def test_fragmented_pages_go_into_one_paged_write():
    lay = KvLayout(**GEOM)
    sp, dp = [1, 5, 9, 13], [0, 1, 2, 3]
    plan = _plan(lay, lay, sp, dp, 64, 4)
    singles = [w for s in plan.steps for w in s if w.single]
    assert not singles and plan.writes == 3 * 2 and plan.imms == 3 * 2 * 4


def test_heterogeneous_tp_writes_head_slices():
    src = KvLayout(**GEOM, tp_size=1)
    dst = KvLayout(**GEOM, tp_size=2, tp_rank=1)
    plan = _plan(src, dst, range(4), range(4), 64, 4)
    w = plan.steps[0][0]
    # HND: heads 4..7 of a page of 8 heads: one piece of half the page, at half its offset.
    assert not w.single and w.length == src.page_bytes // 2 == dst.page_bytes
    assert w.src_offset == src.k_offsets[0] + src.page_bytes // 2 and w.dst_offset == 0
    nhd = dict(GEOM, page_order="NHD")
    src, dst = KvLayout(**nhd, tp_size=1), KvLayout(**nhd, tp_size=2, tp_rank=1)
    plan = _plan(src, dst, range(4), range(4), 64, 4)
    assert len(plan.steps[0]) == 2 * 16  # one piece per token, K and V


def test_wire_rejects_truncated_and_foreign_messages():
    r = wire.Request(7, 99, 1000, 40, 3, 1, 8, [np.arange(3, dtype=np.uint32)])
    m = wire.encode(wire.Msg.REQUEST, 5, r)
    kind, session, body = wire.decode(m)
    assert (kind, session, body.req_id, list(body.pages[0])) == (wire.Msg.REQUEST, 5, 7, [0, 1, 2])
    for bad in (m[:10], m[:-2], b"XXXX" + m[4:], m + b"\0"):
        with pytest.raises(wire.Malformed):
            wire.decode(bad)

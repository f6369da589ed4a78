"""KV pages and context from a prefill process to decode ranks, verified byte for byte:
both providers, reordered completions, chunked prefill, TP 1->2, 2->1, 4->2, 2->4, NHD
pages, coalescing counted, and incompatible layouts refused at the handshake."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
import kvsim
from ferry.kv import LayoutMismatch

FAULTS = {"FERRY_FAULT_INJECTION": "seed=11,reorder=0.5,delay_us=300"}


def run_requests(ranks, peer_ranks, first_id, count, ntok, chunk_tokens=None, rng=None,
                 contiguous=False):
    """Issue `count` requests on every decode rank at once; verify each; free pages."""
    reqs = []
    for i in range(count):
        rid = first_id + i
        n = ranks[0].lay.pages_for(ntok)
        per_rank = []
        for r in ranks:
            pages = r.alloc(n, None if contiguous else rng)
            slot = r.free_slots.pop()
            req = r.rx.request(rid, pages, ntok, r.links, ctx_slot=slot, ctx_len=kvsim.CTX_BYTES,
                               chunk_tokens=chunk_tokens, deadline=30)
            per_rank.append((r, req, pages, slot))
        reqs.append((rid, per_rank))
    for rid, per_rank in reqs:
        for r, req, pages, slot in per_rank:
            req.wait(30)
            assert req.released and req.state == "done"
            r.check(rid, pages, ntok, slot, kvsim.CTX_BYTES)
            r.give_back(pages)
            r.free_slots.append(slot)
    for r in ranks:
        assert r.rx.stats()["live"] == 0


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_pages_and_context_arrive_byte_for_byte(kind, make_peer, make_decode):
    peer = make_peer(kind, 1)
    (d,) = make_decode(kind, 1)
    d.connect(peer.addrs)
    rng = np.random.default_rng(1)
    run_requests([d], 1, 100, 6, 77, rng=rng)
    run_requests([d], 1, 200, 1, 8, rng=rng)  # one page
    run_requests([d], 1, 300, 1, 512, rng=rng)  # 64 pages


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_reordered_completions_and_chunked_prefill(kind, make_peer, make_decode):
    # The fault injector holds back and shuffles completions on both sides: layers and
    # chunks arrive in any order; completion is still exact.
    peer = make_peer(kind, 1, env=FAULTS)
    (d,) = make_decode(kind, 1, env=FAULTS)
    d.connect(peer.addrs)
    rng = np.random.default_rng(2)
    run_requests([d], 1, 400, 4, 100, chunk_tokens=24, rng=rng)
    run_requests([d], 1, 500, 2, 130, chunk_tokens=8, rng=rng)


@pytest.mark.parametrize("p,d,kind", [(1, 2, "tcp"), (2, 1, "shm"), (4, 2, "tcp"),
                                      (2, 4, "shm")])
def test_heterogeneous_tensor_parallelism(p, d, kind, make_peer, make_decode):
    peer = make_peer(kind, p)
    ranks = make_decode(kind, d)
    for r in ranks:
        r.connect(peer.addrs)
    run_requests(ranks, p, 600, 3, 45, chunk_tokens=16, rng=np.random.default_rng(3))


def test_nhd_pages_across_tp_degrees(make_peer, make_decode):
    kw = {"page_order": "NHD"}
    peer = make_peer("shm", 2, lay_kw=kw)
    ranks = make_decode("shm", 1, lay_kw=kw)
    ranks[0].connect(peer.addrs)
    run_requests(ranks, 2, 700, 2, 30, rng=np.random.default_rng(4))


@pytest.mark.parametrize("coalesce", [True, False])
def test_contiguous_page_runs_are_coalesced_into_single_writes(coalesce, make_peer, make_decode):
    peer = make_peer("tcp", 1, num_pages=64, coalesce=coalesce)
    (d,) = make_decode("tcp", 1, num_pages=64)
    d.connect(peer.addrs)
    # Both sides hold the request in one run of 10 pages: one write per layer and K/V.
    peer.call("mode", 800, {"contiguous": True})
    ntok = 10 * 8
    run_requests([d], 1, 800, 1, ntok, contiguous=True)
    (result, stats), = peer.call("result", 800, 30)
    assert result == "ok"
    layers = kvsim.GEOM["num_layers"]
    assert stats["writes"] == layers * 2 + 1  # + the context
    assert stats["imms"] == (layers * 2 + 1 if coalesce else layers * 2 * 10 + 1)


def test_incompatible_layouts_are_refused_at_the_handshake(make_peer, make_decode):
    peer = make_peer("shm", 1)
    (d,) = make_decode("shm", 1, lay_kw={"head_dim": 32})
    with pytest.raises(LayoutMismatch, match="head_dim"):
        d.connect(peer.addrs)
    (d2,) = make_decode("shm", 1, lay_kw={"dtype": "bfloat16"})
    with pytest.raises(LayoutMismatch, match="dtype"):
        d2.connect(peer.addrs)


def test_requests_are_spans_in_the_decoders_trace(tmp_path, make_peer, make_decode):
    import json

    trace = tmp_path / "decode.json"
    peer = make_peer("shm", 1)
    (d,) = make_decode("shm", 1, env={"FERRY_TRACE": str(trace)})
    d.connect(peer.addrs)
    run_requests([d], 1, 500, 3, 77, rng=np.random.default_rng(5))
    d.stop()
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    spans = sorted(ev["name"] for ev in events if ev.get("ph") == "X" and ev["name"].startswith("request "))
    assert spans == ["request 500 done", "request 501 done", "request 502 done"]
    tracks = {ev["args"]["name"] for ev in events if ev.get("ph") == "M" and ev["name"] == "thread_name"}
    assert "kv decode" in tracks

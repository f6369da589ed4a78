"""Request lifecycle: aborts before, during and after the transfer from both sides with
the acknowledgement rule (no byte of an aborted request lands after its pages were
released), refusals of duplicate and stale requests, peer death on either side as a
typed error within the deadline, and 1000 requests with random aborts and deaths leaving
nothing behind."""

from __future__ import annotations

import time

import numpy as np
import pytest

import ferry
import kvsim
from ferry.kv import PeerDead, RequestAborted, RequestRefused, wire
from ferry.kv.wire import Msg

L = kvsim.GEOM["num_layers"]
NTOK = 40  # 5 pages


def setup(kind, make_peer, make_decode, **kw):
    peer = make_peer(kind, 1, **kw)
    (d,) = make_decode(kind, 1)
    d.connect(peer.addrs)
    return peer, d


def start(d, rid, ntok=NTOK, deadline=20.0, chunk_tokens=None):
    pages = d.alloc(d.lay.pages_for(ntok))
    slot = d.free_slots.pop()
    req = d.rx.request(rid, pages, ntok, d.links, ctx_slot=slot, ctx_len=kvsim.CTX_BYTES,
                       deadline=deadline, chunk_tokens=chunk_tokens)
    return req, pages, slot


def wait_arrivals(req, n, timeout=20):
    end = time.monotonic() + timeout
    while req.counter.value < n:
        assert time.monotonic() < end, f"only {req.counter.value} of {n} immediates"
        time.sleep(0.001)


def wait_held(peer, rid, timeout=20):
    # Not the sender's pending count: a request is pending before the application's
    # wait_request() takes it, and an abort in between drops it before the application
    # ever sees it (then nothing is left to refuse).
    assert peer.call("held", rid, timeout), "the request never reached the prefill application"


def wait_refusal(peer, name, n=1, timeout=20):
    end = time.monotonic() + timeout
    while peer.call("stats")[0]["refusals"].get(name, 0) < n:
        assert time.monotonic() < end, f"no {name} refusal"


def snapshot(d, pages):
    return d.view()[:, :, np.asarray(pages, dtype=np.int64)].copy()


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_decoder_aborts_before_during_and_after(kind, make_peer, make_decode):
    peer, d = setup(kind, make_peer, make_decode)
    # Before: the prefiller holds the request unaccepted; the abort is acknowledged with
    # zero writes, and the prefiller's later accept is refused (the id is dead).
    peer.call("mode", 1, {"hold_accept": True})
    req, pages, _ = start(d, 1)
    wait_held(peer, 1)  # the prefill application holds it, unaccepted
    req.abort(timeout=10)
    assert req.released and isinstance(req.error, RequestAborted)
    peer.call("release", 1)
    (res, _), = peer.call("result", 1, 30)
    assert res == "RequestRefused"
    assert d.untouched(pages)

    # During: the prefiller posted the first two layers and waits; after the abort's
    # acknowledgement nothing else lands, even once the prefiller is let go.
    peer.call("mode", 2, {"hold": 2})
    req, pages, _ = start(d, 2)
    wait_arrivals(req, 2 * 2)  # two layers of K and V (5 contiguous pages: >= 1 write each)
    req.abort(timeout=10)
    assert req.released
    before = snapshot(d, pages)
    peer.call("release", 2)
    (res, stats), = peer.call("result", 2, 30)
    assert res == "RequestAborted"
    assert stats["imms"] == req.counter.value  # the acknowledged count is what arrived
    assert (snapshot(d, pages) == before).all(), "a write landed after the abort's ack"
    assert d.untouched(pages, layers=range(2, L))
    d.reset(pages)

    # After: completion first (waited for spinning); the abort is a no-op and the pages
    # stay as received.
    req, pages, slot = start(d, 3)
    req.wait(20, spin=True)
    req.abort(timeout=10)
    assert req.state == "done"
    d.check(3, pages, NTOK, slot, kvsim.CTX_BYTES)
    assert d.rx.stats()["live"] == 0


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_prefiller_aborts_and_refusals(kind, make_peer, make_decode):
    peer, d = setup(kind, make_peer, make_decode)
    peer.call("mode", 10, {"reject": True})  # before: a typed refusal
    req, pages, _ = start(d, 10)
    with pytest.raises(RequestRefused) as e:
        req.wait(20)
    assert e.value.reason == "REJECTED" and req.released and d.untouched(pages)

    peer.call("mode", 11, {"abort": 3})  # during: two layers posted, then the abort
    req, pages, _ = start(d, 11)
    with pytest.raises(RequestAborted):
        req.wait(20)
    assert req.released
    assert d.untouched(pages, layers=range(2, L))
    (res, stats), = peer.call("result", 11, 30)
    assert res == "RequestAborted" and stats["imms"] == req.counter.value

    # Duplicate and stale: the same id again while live, and after it finished.
    peer.call("mode", 12, {"hold": 1})
    req, pages, slot = start(d, 12)
    link = d.links[0]
    dup = wire.Request(12, req.imm, 5000, NTOK, 5, slot, 0, [np.asarray(pages, np.uint32)])
    d.rx._send(link, Msg.REQUEST, dup)
    wait_refusal(peer, "DUPLICATE")  # refused while the original is live
    peer.call("release", 12)
    req.wait(20)  # the duplicate was refused; the original completes
    d.check(12, pages, NTOK, slot, kvsim.CTX_BYTES)
    (res, _), = peer.call("result", 12, 30)
    assert res == "ok"
    stale = peer.call("stats")[0]["refusals"].get("STALE", 0)
    d.rx._send(link, Msg.REQUEST, dup)  # stale: finished already
    wait_refusal(peer, "STALE", stale + 1)
    d.check(12, pages, NTOK, slot, kvsim.CTX_BYTES)
    # The same id through request() after the first completed: the receiver lets it out
    # (the first one's deferred bookkeeping is done first) and the prefiller refuses it.
    again, _, _ = start(d, 12)
    with pytest.raises(RequestRefused):
        again.wait(20)
    wait_refusal(peer, "STALE", stale + 2)
    (st,) = peer.call("stats")
    assert st["jobs"] == 0 and st["pending"] == 0


@pytest.mark.parametrize("kind", ["tcp", "shm"])
def test_prefiller_death_is_a_typed_error_within_the_deadline(kind, make_peer, make_decode):
    peer, d = setup(kind, make_peer, make_decode)
    peer.call("mode", 20, {"die": 2})
    t0 = time.monotonic()
    req, pages, _ = start(d, 20, deadline=3.0)
    with pytest.raises((PeerDead, ferry.Timeout)) as e:
        req.wait()
    # The deadline plus slack for a busy machine: CPU starvation delays the waiter
    # (5.8-8.2 s with three CPU hogs on the 2-core VM when tcp saw the death only at the
    # deadline; now PeerDead after 0.95-1.9 s on tcp, 0.5 s on shm, when it is idle).
    assert time.monotonic() - t0 < 3.0 + 3.0
    assert peer.wait_dead() == 3
    req.wait_released(10)  # a dead process writes nothing more
    assert req.released
    assert d.rx.stats()["live"] == 0
    print("prefiller death seen as", type(e.value).__name__, "after",
          round(time.monotonic() - t0, 2), "s")


def test_decoder_death_ends_the_prefillers_job(make_peer, make_decode):
    peer, d = setup("tcp", make_peer, make_decode)
    peer.call("mode", 30, {"hold": 1})
    req, _, _ = start(d, 30)
    wait_arrivals(req, 2)
    d.stop()  # the decode rank goes away mid-transfer
    peer.call("release", 30)
    (res, stats), = peer.call("result", 30, 60)
    assert res in ("PeerDead", "Cancelled", "Aborted", "Unavailable", "Timeout"), res
    (st,) = peer.call("stats")
    assert st["jobs"] == 0 and st["ctx_slots_free"] == 64


def test_many_requests_with_random_aborts_and_deaths(make_peer, make_decode):
    """1000 requests in waves; random decoder aborts (any time), prefiller aborts and two
    prefiller deaths (a fresh prefill process takes over). Survivors verified byte for
    byte; no page, immediate, slot or job leaks on either side."""
    kind = "shm"
    rng = np.random.default_rng(7)
    (d,) = make_decode(kind, 1, num_pages=512)
    peer = make_peer(kind, 1, num_pages=512)
    d.connect(peer.addrs)
    total, wave, rid = 1000, 25, 10_000
    deaths_at = {10_300, 10_700}
    ok = aborted = failed = 0
    t0 = time.monotonic()
    while rid < 10_000 + total:
        live = []
        die_here = any(rid <= x < rid + wave for x in deaths_at)
        for i in range(wave):
            r = rid + i
            u = rng.random()
            if die_here and i == wave // 2:
                peer.call("mode", r, {"die": 2})
            elif u < 0.05:
                step = int(rng.integers(1, L + 1))
                # No command to a process whose dying request went out: it exits at
                # that request's step 2, maybe before it answers.
                if not (die_here and i > wave // 2):
                    peer.call("mode", r, {"abort": step})
            ntok = int(rng.integers(1, 60))
            live.append((r,) + start(d, r, ntok=ntok, deadline=10.0) + (ntok, u))
        for r, req, pages, slot, ntok, u in live:
            if 0.05 <= u < 0.15:
                req.abort(timeout=15)
        for r, req, pages, slot, ntok, u in live:
            try:
                req.wait(15) if req.state not in ("aborting", "aborted") else None
                if req.state == "done":
                    d.check(r, pages, ntok, slot, kvsim.CTX_BYTES)
                    ok += 1
                else:
                    aborted += 1
            except (RequestAborted, RequestRefused):
                aborted += 1
            except (PeerDead, ferry.Timeout) as e:
                failed += 1
                print("failed", r, type(e).__name__)
            req.wait_released(15)
            assert req.released
            d.reset(pages)
            d.give_back(pages)
            d.free_slots.append(slot)
        rid += wave
        if die_here:
            peer.wait_dead()
            peer = make_peer(kind, 1, num_pages=512)
            d.links = [d.rx.connect(a, timeout=30) for a in peer.addrs]
    elapsed = time.monotonic() - t0
    st = d.rx.stats()
    assert st["live"] == 0 and st["imms_free"] == 4096
    assert len(d.free) == 512 and len(d.free_slots) == d.slots
    # The prefill application frees a request's pages on its own thread after the
    # job ended, which can be after the decoder saw the request released: poll.
    until = time.monotonic() + 10
    while True:
        (pst,) = peer.call("stats")
        if pst["free_pages"] == 512 or time.monotonic() > until:
            break
        time.sleep(0.01)
    assert pst["jobs"] == 0 and pst["pending"] == 0 and pst["ctx_slots_free"] == 64
    assert pst["free_pages"] == 512
    assert ok > 0.7 * total and failed >= 2
    print(f"{total} requests in {elapsed:.1f} s: {ok} ok, {aborted} aborted, {failed} failed")

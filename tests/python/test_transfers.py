"""Every operation between two Python processes, verified byte for byte with NumPy."""

from __future__ import annotations

import asyncio
import pickle
import threading

import numpy as np
import pytest

import ferry
import ferry.aio

rng = np.random.default_rng(1234)


def random_bytes(n: int) -> np.ndarray:
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def test_descriptors_cross_processes(remote):
    kind, e, peer = remote
    assert isinstance(peer.addr, ferry.NetAddr)
    assert isinstance(peer.desc, ferry.MrDesc)
    assert peer.desc.length == peer.size
    assert peer.desc.addresses == [peer.addr]
    assert peer.addr != e.main_address
    # every serialisation round-trips to an equal, equally hashed value
    for v in (peer.addr, peer.desc):
        cls = type(v)
        for back in (cls.from_bytes(v.bytes()), cls.from_hex(v.hex()), pickle.loads(pickle.dumps(v))):
            assert back == v and hash(back) == hash(v)
    assert len({peer.addr, ferry.NetAddr.from_bytes(peer.addr.bytes())}) == 1


def test_single_write_with_imm(remote):
    kind, e, peer = remote
    data = random_bytes(300_000)
    h, _ = e.register(data)
    peer.call("clear")
    peer.call("count", 11)
    t = e.submit_write(h, 1000, 200_000, peer.desc, 5000, imm=11)
    assert t.result(20) is None and t.done() and t.exception() is None
    got = peer.call("wait", 11, 1, 20, 5000, 200_000)
    np.testing.assert_array_equal(np.frombuffer(got, np.uint8), data[1000:201_000])
    # nothing written around the target range
    assert peer.call("dump", 4000, 1000) == bytes(1000)
    assert peer.call("dump", 205_000, 1000) == bytes(1000)
    e.unregister(h)
    peer.call("clear")


@pytest.mark.parametrize("route", [ferry.WriteRoute.pinned(0), ferry.WriteRoute.round_robin(),
                                   ferry.WriteRoute.split(1, 4096)])
def test_write_routes(remote, route):
    kind, e, peer = remote
    data = random_bytes(64 << 10)
    h, _ = e.register(data)
    n_imm = ferry.ImmPlan.single_write(len(data), route, e.nics_per_group)
    peer.call("count", 12)
    e.submit_write(h, 0, len(data), peer.desc, 0, imm=12, route=route).result(20)
    got = peer.call("wait", 12, n_imm, 20, 0, len(data))
    assert got == data.tobytes()
    e.unregister(h)


@pytest.mark.parametrize("dtypes", [(np.int32, np.uint32), (np.int64, np.int32), (np.uint64, np.uint64),
                                    ("list", "list")])
def test_paged_writes(remote, dtypes):
    kind, e, peer = remote
    page, pages = 96, 512
    src = random_bytes(page * pages * 2)
    h, _ = e.register(src)
    src_idx = rng.permutation(pages * 2)[:pages]
    dst_idx = rng.permutation(pages)
    conv = [(lambda a: a.tolist()) if d == "list" else (lambda a, d=d: a.astype(d)) for d in dtypes]
    peer.call("clear")
    peer.call("count", 13)
    stride, src_off, dst_off = page + 0, 0, 64
    t = e.submit_paged_writes(page, h, conv[0](src_idx), stride, src_off, peer.desc,
                              conv[1](dst_idx), page, dst_off, imm=13)
    t.result(20)
    got = np.frombuffer(peer.call("wait", 13, pages, 20, 0, dst_off + page * pages), np.uint8)
    expect = np.zeros(dst_off + page * pages, np.uint8)
    for s, d in zip(src_idx, dst_idx):
        expect[dst_off + d * page : dst_off + (d + 1) * page] = src[s * page : (s + 1) * page]
    np.testing.assert_array_equal(got, expect)
    e.unregister(h)
    peer.call("clear")


def test_send_and_recv(remote):
    kind, e, peer = remote
    # parent -> peer
    msgs = [bytes(random_bytes(n)) for n in (1, 100, 4096)] + [b""]
    for m in msgs:
        e.submit_send(peer.addr, m).result(20)
    assert sorted(peer.call("recv", len(msgs), 20)) == sorted(msgs)
    # peer -> parent, through a Python receive callback
    got, ev = [], threading.Event()

    def on_recv(m: memoryview):
        assert isinstance(m, memoryview) and m.readonly
        got.append(bytes(m))
        if len(got) == 3:
            ev.set()

    e.submit_recvs(1024, 8, on_recv)
    payloads = [b"alpha", bytes(range(256)), np.arange(100, dtype=np.uint32).tobytes()]
    for p in payloads:
        peer.call("send", e.main_address, p)
    assert ev.wait(20)
    assert sorted(got) == sorted(payloads)


def test_recv_queue_by_polling(pair):
    # Its own receiver: an engine's receive pools share its NIC's incoming messages,
    # so the module's shared engine (which has a callback pool) would take some.
    a, e = pair
    q = e.recv_queue(512, 2)
    assert isinstance(q, ferry.RecvQueue)
    assert (q.buffer_len, q.buffer_count) == (512, 2)
    assert q.try_get() is None
    with pytest.raises(ferry.Timeout):
        q.get(timeout=0.05)
    # More messages than buffers: each buffer goes back as its copy is taken.
    payloads = [bytes(random_bytes(n)) for n in (1, 7, 300, 512, 64, 2)]
    got = []
    for i, p in enumerate(payloads):
        a.submit_send(e.main_address, p).result(20)
        got.append(q.get(timeout=20) if i % 2 == 0 else q.get(timeout=20, spin=True))
    assert got == payloads
    # Sent before anyone waits: all four arrive, two held by the NIC's buffers until
    # the first two are taken.
    for p in payloads[:4]:
        a.submit_send(e.main_address, p)
    got = []
    for _ in range(20_000):
        m = q.try_get()
        if m is not None:
            got.append(m)
            if len(got) == 4:
                break
    while len(got) < 4:
        got.append(q.get(timeout=20))
    assert sorted(got) == sorted(payloads[:4])


def test_recv_queue_after_stop_raises_cancelled(pair):
    a, e = pair
    q = e.recv_queue(64, 1)
    e.stop()
    with pytest.raises(ferry.Cancelled):
        q.get(timeout=5)
    assert q.try_get() is None


def test_imm_counter_and_expect(remote):
    kind, e, peer = remote
    buf = np.zeros(4096, np.uint8)
    h, desc = e.register(buf)
    c = e.imm_counter(21)
    fired = threading.Event()
    e.expect_imm_count(22, 2, fired.set)
    plain = []
    e.on_imm(plain.append)
    for _ in range(3):
        peer.call("imm", desc, 21)
    peer.call("imm", desc, 22)
    peer.call("imm", desc, 22)
    peer.call("imm", desc, 23)  # nobody counts it: on_imm
    c.wait(3, timeout=20)
    assert c.value == 0 and not c.try_consume(1)
    assert fired.wait(20)
    for _ in range(200):
        if plain:
            break
        threading.Event().wait(0.05)
    assert plain == [23]
    # the peer writes into this process: data visible once the immediate counted
    data = bytes(random_bytes(3000))
    c24 = e.imm_counter(24)
    peer.call("write", desc, data, 100, 24)
    c24.wait(1, timeout=20)
    assert buf[100:3100].tobytes() == data
    e.unregister(h)


def test_scatter_and_barrier(remote):
    kind, e, peer = remote
    src = random_bytes(8192)
    h, _ = e.register(src)
    group = e.add_peer_group([peer.desc])
    assert e.add_peer_group([[peer.addr]]) == group  # idempotent, by addresses too
    dsts = [ferry.ScatterDst(1000, 0, peer.desc, 0), (500, 4000, peer.desc, 2000)]
    peer.call("clear")
    peer.call("count", 31)
    # with a peer group: one target per peer of the group, in order
    e.submit_scatter(h, dsts[:1], imm=31, group=group).result(20)
    # without one: any targets
    e.submit_scatter(h, dsts[1:], imm=31, route=ferry.GroupRoute.shard_bytes()).result(20)
    got = np.frombuffer(peer.call("wait", 31, 2, 20, 0, 2500), np.uint8)
    np.testing.assert_array_equal(got[:1000], src[:1000])
    np.testing.assert_array_equal(got[2000:2500], src[4000:4500])
    assert not got[1000:2000].any()
    peer.call("count", 32)
    e.submit_barrier(32, [peer.desc], group=group).result(20)
    peer.call("wait", 32, 1, 20, 0, 0)
    e.submit_barrier(32, [peer.desc], route=ferry.GroupRoute.pinned(0)).result(20)
    peer.call("wait", 32, 1, 20, 0, 0)
    e.unregister(h)
    peer.call("clear")


def test_on_done_and_counter(remote):
    kind, e, peer = remote
    data = random_bytes(4096)
    h, _ = e.register(data)
    results, ev = [], threading.Event()

    def on_done(err):
        results.append((err, threading.current_thread() is not threading.main_thread()))
        ev.set()

    t = e.submit_write(h, 0, 4096, peer.desc, 0, on_done=on_done)
    assert ev.wait(20)
    assert results == [(None, True)]
    t.result(1)
    # bulk: no Python on the completion path
    cnt = ferry.TransferCounter()
    peer.call("count", 41)
    for i in range(64):
        assert e.submit_write(h, 0, 64, peer.desc, i * 64, imm=41, counter=cnt) is None
    cnt.wait(64, timeout=20)
    assert cnt.done == 64 and cnt.errors == 0
    peer.call("wait", 41, 64, 20, 0, 0)
    e.unregister(h)


def test_asyncio(remote):
    kind, e, peer = remote
    data = random_bytes(10_000)
    h, desc = e.register(data)

    async def run():
        peer.call("count", 51)
        await e.submit_write(h, 0, 5000, peer.desc, 0, imm=51)
        await asyncio.wrap_future(e.submit_write(h, 5000, 5000, peer.desc, 5000, imm=51))
        await asyncio.gather(*(e.submit_send(peer.addr, b"x%d" % i) for i in range(4)))
        # immediates from the peer, awaited
        mine = np.zeros(16, np.uint8)
        mh, mdesc = e.register(mine)
        c = e.imm_counter(52)
        fut = ferry.aio.expect_imm(e, 53, count=2)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, peer.call, "imm", mdesc, 52)
        await ferry.aio.wait_imm(c, 1, timeout=20)
        for _ in range(2):
            await loop.run_in_executor(None, peer.call, "imm", mdesc, 53)
        await asyncio.wait_for(fut, 20)
        with pytest.raises(ferry.Timeout):
            await ferry.aio.wait_imm(c, 1, timeout=0.1)
        e.unregister(mh)

    asyncio.run(run())
    assert peer.call("wait", 51, 2, 20, 0, 10_000) == data.tobytes()
    assert sorted(peer.call("recv", 4, 20)) == sorted(b"x%d" % i for i in range(4))
    e.unregister(h)
    peer.call("clear")


def test_callback_exception_is_logged_and_counted(remote, caplog):
    kind, e, peer = remote
    data = random_bytes(64)
    h, _ = e.register(data)
    before = e.callback_errors

    def bad(err):
        raise RuntimeError("boom from on_done")

    with caplog.at_level("ERROR", logger="ferry"):
        e.submit_write(h, 0, 64, peer.desc, 0, on_done=bad).result(20)
        # the engine keeps working
        for _ in range(100):
            if e.callback_errors > before:
                break
            threading.Event().wait(0.05)
        e.submit_write(h, 0, 64, peer.desc, 0).result(20)
    assert e.callback_errors == before + 1
    assert any("boom from on_done" in (r.exc_text or "") or "boom" in str(r.exc_info) for r in caplog.records)
    e.unregister(h)

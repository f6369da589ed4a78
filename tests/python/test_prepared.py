"""Prepared transfers: TransferEngine.prepare_single_write / prepare_paged_writes /
prepare_scatter validate a shape once, submit(prepared, imm) posts it many times.

Over the providers of conftest.py (tcp;ofi_rxm on lo, shm): repeated submits land the
same bytes with each submit's own immediate; an unregistered source fails with
FailedPrecondition; bad prepare arguments raise what the submit_* of the same name raises.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import numpy as np
import pytest

import ferry
from conftest import engine_for

rng = np.random.default_rng(4321)


def random_bytes(n: int) -> np.ndarray:
    return rng.integers(0, 256, size=n, dtype=np.uint8)


# ---------------------------------------------------------------------------- repeated submits


def test_repeated_paged_writes_land_every_page_with_their_own_immediate(pair):
    a, b = pair
    page, pages = 4096, 128
    src = random_bytes(page * pages)
    dst = np.zeros(page * pages * 2, np.uint8)
    h, _ = a.register(src)
    _, d = b.register(dst)
    src_idx = np.arange(pages - 1, -1, -1, dtype=np.int64)  # reversed
    dst_idx = (2 * np.arange(pages) + 1).astype(np.uint32)  # odd pages only
    p = a.prepare_paged_writes(page, h, src_idx, page, 0, d, dst_idx, page, 0)
    assert isinstance(p, ferry.PreparedTransfer) and p.kind == "paged_writes"
    assert "paged_writes" in repr(p) and f"{pages} pages" in repr(p)
    counters = {imm: b.imm_counter(imm) for imm in range(100, 105)}
    for imm, c in counters.items():
        dst[:] = 0
        t = a.submit(p, imm)
        assert isinstance(t, ferry.Transfer) and t.id > 0
        assert t.result(20) is None
        c.wait(ferry.ImmPlan.paged_writes(pages), 20)
        assert c.value == 0, "one immediate per page, no more"
        for others in counters.values():
            assert others.value == 0, "each submit carries its own immediate only"
        got = dst.reshape(pages * 2, page)
        want = src.reshape(pages, page)
        np.testing.assert_array_equal(got[dst_idx], want[src_idx])
        assert not got[0::2].any(), "even pages are no targets"


def test_prepared_paged_writes_to_another_process(remote):
    kind, e, peer = remote
    page, pages = 96, 256
    src = random_bytes(page * pages)
    h, _ = e.register(src)
    src_idx = rng.permutation(pages)
    dst_idx = rng.permutation(pages)
    p = e.prepare_paged_writes(page, h, src_idx, page, 0, peer.desc, dst_idx.tolist(), page, 64)
    del src_idx  # copied when prepared
    for imm in (21, 22, 23):
        peer.call("clear")
        peer.call("count", imm)
        e.submit(p, imm=imm).result(20)
        got = peer.call("wait", imm, pages, 20, 64, page * pages)
        assert len(got) == page * pages
    e.unregister(h)


def test_single_write_and_scatter_repeat(pair):
    a, b = pair
    src = random_bytes(1 << 20)
    dst = np.zeros(1 << 20, np.uint8)
    h, _ = a.register(src)
    _, d = b.register(dst)
    single = a.prepare_single_write(h, 4096, 1 << 19, d, 8192)
    scatter = a.prepare_scatter(h, [(1000, 0, d, 700_000), ferry.ScatterDst(3000, 5000, d, 900_000)])
    assert (single.kind, scatter.kind) == ("single_write", "scatter")
    assert "2 targets" in repr(scatter)
    c6, c7 = b.imm_counter(6), b.imm_counter(7)
    route = ferry.GroupRoute.shard_peers()
    n_single = ferry.ImmPlan.single_write(1 << 19, ferry.WriteRoute.split(), a.nics_per_group)
    n_scatter = ferry.ImmPlan.scatter_target(1000, route, a.nics_per_group) + ferry.ImmPlan.scatter_target(
        3000, route, a.nics_per_group)
    for rnd in range(3):
        dst[:] = 0
        t1 = a.submit(single, imm=6 if rnd else None)  # the first without an immediate
        t2 = a.submit(scatter, 7)
        t1.result(20)
        t2.result(20)
        c7.wait(n_scatter, 20)
        if rnd:
            c6.wait(n_single, 20)
        assert c6.value == 0 and c7.value == 0
        want = src[4096:4096 + (1 << 19)].tobytes()
        if not rnd:
            # No immediate: nothing says when the bytes are visible at the
            # target (a local completion is not remote visibility), so poll
            # until they are, within a deadline.
            deadline = time.monotonic() + 20
            while dst[8192:8192 + (1 << 19)].tobytes() != want and time.monotonic() < deadline:
                time.sleep(0.001)
        assert dst[8192:8192 + (1 << 19)].tobytes() == want
        assert dst[700_000:701_000].tobytes() == src[0:1000].tobytes()
        assert dst[900_000:903_000].tobytes() == src[5000:8000].tobytes()
        assert not dst[:8192].any()


def test_prepared_single_write_with_a_route(pair):
    a, b = pair
    src = random_bytes(64 << 10)
    dst = np.zeros(64 << 10, np.uint8)
    h, _ = a.register(src)
    _, d = b.register(dst)
    route = ferry.WriteRoute.round_robin()
    p = a.prepare_single_write(h, 0, len(src), d, 0, route=route)
    c = b.imm_counter(8)
    a.submit(p, 8).result(20)
    c.wait(ferry.ImmPlan.single_write(len(src), route, a.nics_per_group), 20)
    assert dst.tobytes() == src.tobytes()


def test_submit_completion_conventions(pair):
    a, b = pair
    h, _ = a.register(random_bytes(4096))
    _, d = b.register(np.zeros(4096, np.uint8))
    p = a.prepare_single_write(h, 0, 64, d, 0)
    c = b.imm_counter(30)
    # on_done(None) with the Transfer
    seen = []
    t = a.submit(p, 30, on_done=seen.append)
    t.result(20)
    c.wait(1, 20)
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:  # on_done runs after the future resolves
        time.sleep(0.01)
    assert seen == [None]
    # counter=: no Transfer, counted in C++
    counter = ferry.TransferCounter()
    for _ in range(10):
        assert a.submit(p, 30, counter=counter) is None
    counter.wait(10, 20)
    assert counter.errors == 0
    c.wait(10, 20)
    with pytest.raises(ferry.InvalidArgument, match="counter= cannot be combined"):
        a.submit(p, 30, on_done=print, counter=counter)

    # awaitable, as every Transfer
    async def main():
        await a.submit(p, 30)
        await ferry.aio.wait_imm(c, 1, timeout=20)

    asyncio.run(main())


# ---------------------------------------------------------------------------- typed failures


def test_an_unregistered_source_fails_with_failed_precondition(pair):
    a, b = pair
    h, _ = a.register(random_bytes(4096))
    _, d = b.register(np.zeros(4096, np.uint8))
    prepared = [
        a.prepare_single_write(h, 0, 64, d, 0),
        a.prepare_paged_writes(64, h, [0, 1], 64, 0, d, [2, 3], 64, 0),
        a.prepare_scatter(h, [(64, 0, d, 0)]),
    ]
    a.submit(prepared[0], 1).result(20)
    a.unregister(h)
    for p in prepared:
        with pytest.raises(ferry.FailedPrecondition, match="unregistered") as ei:
            a.submit(p, 1)
        assert ei.value.code == "FAILED_PRECONDITION" and isinstance(ei.value, RuntimeError)
        with pytest.raises(ferry.FailedPrecondition):
            a.submit(p, None, counter=ferry.TransferCounter())
    # preparing from an unregistered handle is what submitting from one is
    with pytest.raises(ferry.NotFound, match="unregistered"):
        a.prepare_single_write(h, 0, 64, d, 0)
    with pytest.raises(ferry.NotFound, match="unregistered"):
        a.prepare_paged_writes(64, h, [0], 64, 0, d, [0], 64, 0)
    with pytest.raises(ferry.NotFound, match="unregistered"):
        a.prepare_scatter(h, [(64, 0, d, 0)])


def test_a_prepared_transfer_keeps_its_source_object_alive(pair):
    a, b = pair
    buf = random_bytes(4096)
    ref = weakref.ref(buf)
    h, _ = a.register(buf)
    _, d = b.register(np.zeros(4096, np.uint8))
    p = a.prepare_single_write(h, 0, 64, d, 0)
    a.unregister(h)
    del buf, h
    gc.collect()
    assert ref() is not None, "the region may stay registered while a prepared transfer holds it"
    del p
    gc.collect()
    assert ref() is None


def test_a_prepared_transfer_of_another_engine_is_refused(pair):
    a, b = pair
    h, _ = a.register(random_bytes(4096))
    _, d = b.register(np.zeros(4096, np.uint8))
    p = a.prepare_single_write(h, 0, 64, d, 0)
    with pytest.raises(ferry.InvalidArgument, match="another TransferEngine"):
        b.submit(p, 1)


def test_prepared_transfers_and_stopped_engines(kind):
    a, b = engine_for(kind), engine_for(kind)
    try:
        h, _ = a.register(random_bytes(4096))
        _, d = b.register(np.zeros(4096, np.uint8))
        p = a.prepare_single_write(h, 0, 64, d, 0)
        a.stop()
        with pytest.raises(ferry.FailedPrecondition, match="stopped"):
            a.submit(p, 1)
        with pytest.raises(ferry.FailedPrecondition, match="stopped"):
            a.prepare_single_write(h, 0, 64, d, 0)
        # stop released the shape: it is empty now, for any engine
        with pytest.raises(ferry.InvalidArgument, match="empty PreparedTransfer"):
            b.submit(p, 1)
        del p
        gc.collect()
    finally:
        a.stop()
        b.stop()


def test_prepared_transfer_is_not_constructible():
    with pytest.raises(TypeError):
        ferry.PreparedTransfer()
    assert "PreparedTransfer" in ferry.__all__


# ---------------------------------------------------------------------------- bad arguments


def test_prepare_bounds_are_checked_when_prepared(pair):
    a, b = pair
    h, _ = a.register(np.zeros(4096, np.uint8))
    _, d = b.register(np.zeros(4096, np.uint8))
    with pytest.raises(ferry.OutOfRange):
        a.prepare_single_write(h, 0, 4097, d, 0)
    with pytest.raises(ferry.OutOfRange):
        a.prepare_single_write(h, 4000, 200, d, 0)
    with pytest.raises(ferry.OutOfRange):
        a.prepare_single_write(h, 0, 64, d, 4090)
    with pytest.raises(ferry.OutOfRange):  # source page 4 of 1 KiB is past 4 KiB
        a.prepare_paged_writes(1024, h, [0, 4], 1024, 0, d, [0, 1], 1024, 0)
    with pytest.raises(ferry.OutOfRange):
        a.prepare_scatter(h, [(64, 4090, d, 0)])
    with pytest.raises(ferry.InvalidArgument, match="pinned NIC"):
        a.prepare_single_write(h, 0, 16, d, 0, route=ferry.WriteRoute.pinned(3))
    with pytest.raises(ferry.InvalidArgument, match="pinned NIC"):
        a.prepare_scatter(h, [(16, 0, d)], route=ferry.GroupRoute.pinned(3))
    with pytest.raises(ferry.InvalidArgument, match="pages"):  # 2 source pages, 1 destination
        a.prepare_paged_writes(64, h, [0, 1], 64, 0, d, [0], 64, 0)


@pytest.mark.parametrize(
    "pages, match",
    [
        (np.zeros(4, np.float32), "dtype must be int32, uint32, int64 or uint64 \\(got float32\\)"),
        (np.zeros((2, 2), np.int32), "1-D"),
        (np.arange(8, dtype=np.int32)[::2], "contiguous"),
        (np.array([1, -1, 2], np.int32), "index -1 at position 1 is outside"),
        ([0, -5], "index -5 at position 1 is outside"),
        (["a"], "source pages\\[0\\] must be an int, got str"),
    ],
)
def test_prepare_bad_page_lists(pair, pages, match):
    a, b = pair
    h, _ = a.register(np.zeros(1 << 16, np.uint8))
    _, d = b.register(np.zeros(1 << 16, np.uint8))
    with pytest.raises(ferry.InvalidArgument, match=match):
        a.prepare_paged_writes(64, h, pages, 64, 0, d, [0, 1, 2, 3][: len(pages)], 64, 0)


@pytest.fixture(scope="module")
def engines():
    a = engine_for("shm")
    b = engine_for("shm")
    h, _ = a.register(np.zeros(1 << 14, np.uint8))
    _, d = b.register(np.zeros(1 << 14, np.uint8))
    yield a, b, h, d
    a.stop()
    b.stop()


def test_prepare_offsets_out_of_range_and_negative(engines):
    a, _, h, d = engines
    with pytest.raises(ferry.OutOfRange, match="^dst_offset 9223372036854775808 is past the end"):
        a.prepare_single_write(h, 0, 16, d, 2**63)
    with pytest.raises(ferry.OutOfRange, match="^page_len 9223372036854775808 is past the end"):
        a.prepare_paged_writes(2**63, h, [0], 16, 0, d, [0], 16, 0)
    with pytest.raises(ferry.OutOfRange, match="is outside \\[0, 2\\*\\*32\\)"):
        a.prepare_paged_writes(16, h, [0], 16, 0, d, np.array([2**32], np.uint64), 16, 0)
    with pytest.raises(ferry.InvalidArgument, match="^src_offset must not be negative"):
        a.prepare_single_write(h, -1, 16, d, 0)
    with pytest.raises(ferry.InvalidArgument, match="^dst_stride must not be negative"):
        a.prepare_paged_writes(16, h, [0], 16, 0, d, [0], -16, 0)
    p = a.prepare_single_write(h, 0, 16, d, 0)
    with pytest.raises(ferry.InvalidArgument, match="imm"):
        a.submit(p, imm=2**32)
    with pytest.raises(ferry.InvalidArgument, match="imm"):
        a.submit(p, imm=-1)


def test_prepare_scatter_target_shapes(engines):
    a, _, h, d = engines
    with pytest.raises(ferry.InvalidArgument) as ei:
        a.prepare_scatter(h, [(16, 0)])
    assert str(ei.value) == ("scatter target 0: expected ScatterDst or a tuple "
                             "(length, src_offset, dst[, dst_offset]), got a tuple of 2 items")
    with pytest.raises(ferry.InvalidArgument, match="^scatter target 1: length must not be negative"):
        a.prepare_scatter(h, [(16, 0, d), (-16, 0, d)])
    with pytest.raises(ferry.OutOfRange, match="^scatter target 0: src_offset 9223372036854775808 is past"):
        a.prepare_scatter(h, [(16, 2**63, d)])


def test_prepare_wrong_types_name_the_argument(engines):
    a, _, h, d = engines
    p = a.prepare_single_write(h, 0, 16, d, 0)
    cases = [
        (lambda: a.prepare_single_write(np.zeros(4), 0, 16, d, 0),
         "src must be a ferry.MrHandle (from register()), got ndarray"),
        (lambda: a.prepare_single_write(h, "0", 16, d, 0), "src_offset must be an int, got str"),
        (lambda: a.prepare_single_write(h, 0, True, d, 0), "length must be an int, got bool"),
        (lambda: a.prepare_single_write(h, 0, 16, d.bytes(), 0),
         "dst must be a ferry.MrDesc (the peer's descriptor), got bytes"),
        (lambda: a.prepare_single_write(h, 0, 16, d, 0, route="split"),
         "route must be a ferry.WriteRoute or None, got str"),
        (lambda: a.prepare_paged_writes(16, h, [0], "16", 0, d, [0], 16, 0),
         "src_stride must be an int, got str"),
        (lambda: a.prepare_paged_writes(16.0, h, [0], 16, 0, d, [0], 16, 0),
         "page_len must be an int, got float"),
        (lambda: a.prepare_scatter(h, 5), "dsts must be an iterable of ScatterDst or a tuple "
                                          "(length, src_offset, dst[, dst_offset]), got int"),
        (lambda: a.prepare_scatter(h, [(16, 0, d)], group="g"), "group must be an int, got str"),
        (lambda: a.prepare_scatter(h, [(16, 0, d)], route=ferry.WriteRoute.split()),
         "route must be a ferry.GroupRoute or None, got WriteRoute"),
        (lambda: a.submit(h, 1), "prepared must be a ferry.PreparedTransfer (from prepare_*()), got MrHandle"),
        (lambda: a.submit(None), "prepared must be a ferry.PreparedTransfer (from prepare_*()), got NoneType"),
        (lambda: a.submit(p, "7"), "imm must be an int, got str"),
        (lambda: a.submit(p, 7, on_done=5), "on_done must be a callable or None, got int"),
        (lambda: a.submit(p, 7, counter=object()), "counter must be a ferry.TransferCounter or None, got object"),
    ]
    for call, message in cases:
        with pytest.raises(ferry.InvalidArgumentType) as ei:
            call()
        e = ei.value
        assert isinstance(e, ferry.InvalidArgument) and isinstance(e, TypeError)
        assert str(e) == message, str(e)
        assert "incompatible function arguments" not in str(e) and "_ferry" not in str(e)


def test_numpy_integers_are_accepted(engines):
    a, b, h, d = engines
    p = a.prepare_paged_writes(np.int32(16), h, np.array([1], np.int32), np.uint64(16), np.int64(0), d,
                               [np.int64(2)], np.int32(16), np.uint32(0))
    c = b.imm_counter(77)
    a.submit(p, np.uint32(77)).result(20)
    c.wait(1, 20)

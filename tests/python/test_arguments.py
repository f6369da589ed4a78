"""Argument checks of the public API: every bad argument raises a ferry error naming it.

Offsets and lengths of 2**63 or more raise OutOfRange, negative ones InvalidArgument; an
argument of the wrong type raises InvalidArgumentType (an InvalidArgument and a TypeError),
never nanobind's TypeError listing the extension's private signature.
"""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from conftest import engine_for


def _no_private_signature(exc: BaseException) -> None:
    text = str(exc)
    assert "incompatible function arguments" not in text, text
    assert "Engine." not in text and "_ferry" not in text, text


@pytest.fixture(scope="module")
def engines():
    a = engine_for("shm")
    b = engine_for("shm")
    src = np.arange(4096, dtype=np.uint32).view(np.uint8)  # 16 KiB of distinct words
    dst = np.zeros(1 << 14, np.uint8)
    h, _ = a.register(src)
    _, d = b.register(dst)
    yield a, b, h, d, src, dst
    a.stop()
    b.stop()


# ---------------------------------------------------------------------------- offsets, lengths


@pytest.mark.parametrize("value", [2**63, 2**64, 2**64 + 5, 10**30, np.uint64(2**63)])
@pytest.mark.parametrize("arg", ["src_offset", "length", "dst_offset"])
def test_huge_write_offsets_are_out_of_range(engines, arg, value):
    a, _, h, d, _, _ = engines
    kw = dict(src_offset=0, length=16, dst_offset=0)
    kw[arg] = value
    with pytest.raises(ferry.OutOfRange) as ei:
        a.submit_write(h, kw["src_offset"], kw["length"], d, kw["dst_offset"], imm=1)
    assert ei.value.code == "OUT_OF_RANGE" and isinstance(ei.value, IndexError)
    assert str(ei.value).startswith(f"{arg} {int(value)} is past the end"), str(ei.value)


@pytest.mark.parametrize("arg", ["page_len", "src_stride", "src_offset", "dst_stride", "dst_offset"])
def test_huge_paged_write_arguments_are_out_of_range(engines, arg):
    a, _, h, d, _, _ = engines
    kw = dict(page_len=16, src_stride=16, src_offset=0, dst_stride=16, dst_offset=0)
    kw[arg] = 2**63
    with pytest.raises(ferry.OutOfRange, match=f"^{arg} 9223372036854775808 is past the end"):
        a.submit_paged_writes(kw["page_len"], h, [0], kw["src_stride"], kw["src_offset"], d, [0],
                              kw["dst_stride"], kw["dst_offset"])


def test_huge_scatter_target_is_out_of_range(engines):
    _, _, _, d, _, _ = engines
    with pytest.raises(ferry.OutOfRange, match="^length 18446744073709551616 is past the end"):
        ferry.ScatterDst(2**64, 0, d)
    with pytest.raises(ferry.OutOfRange, match="^dst_offset 9223372036854775808 is past the end"):
        ferry.ScatterDst(16, 0, d, 2**63)


def test_negative_offsets_are_invalid_argument(engines):
    a, _, h, d, _, _ = engines
    for args, name in (((h, -1, 16, d, 0), "src_offset"), ((h, 0, -(2**70), d, 0), "length"),
                       ((h, 0, 16, d, -5), "dst_offset")):
        with pytest.raises(ferry.InvalidArgument, match=f"^{name} must not be negative") as ei:
            a.submit_write(*args)
        assert not isinstance(ei.value, ferry.OutOfRange)


def test_numpy_integers_are_accepted(engines):
    a, b, h, d, src, dst = engines
    c = b.imm_counter(61)
    a.submit_write(h, np.uint64(64), np.int32(32), d, np.int64(128), imm=np.uint32(61)).result(20)
    c.wait(np.int64(1), timeout=np.float32(20))
    assert dst[128:160].tobytes() == src[64:96].tobytes()


# ---------------------------------------------------------------------------- wrong types


def _wrong_type(call, message: str):
    with pytest.raises(ferry.InvalidArgumentType) as ei:
        call()
    e = ei.value
    assert isinstance(e, ferry.InvalidArgument) and isinstance(e, TypeError)
    assert e.code == "INVALID_ARGUMENT"
    assert str(e) == message, str(e)
    _no_private_signature(e)


def test_wrong_types_name_the_argument(engines):
    a, b, h, d, src, _ = engines
    cases = [
        (lambda: a.submit_write(src, 0, 16, d, 0),
         "src must be a ferry.MrHandle (from register()), got ndarray"),
        (lambda: a.submit_write(h, "0", 16, d, 0), "src_offset must be an int, got str"),
        (lambda: a.submit_write(h, 0, 1.5, d, 0), "length must be an int, got float"),
        (lambda: a.submit_write(h, 0, True, d, 0), "length must be an int, got bool"),
        (lambda: a.submit_write(h, 0, 16, d.bytes(), 0),
         "dst must be a ferry.MrDesc (the peer's descriptor), got bytes"),
        (lambda: a.submit_write(h, 0, 16, d, None), "dst_offset must be an int, got NoneType"),
        (lambda: a.submit_write(h, 0, 16, d, 0, imm="7"), "imm must be an int, got str"),
        (lambda: a.submit_write(h, 0, 16, d, 0, route="split"),
         "route must be a ferry.WriteRoute or None, got str"),
        (lambda: a.submit_write(h, 0, 16, d, 0, on_done=5), "on_done must be a callable or None, got int"),
        (lambda: a.submit_write(h, 0, 16, d, 0, counter=object()),
         "counter must be a ferry.TransferCounter or None, got object"),
        (lambda: a.submit_paged_writes(16, h, [0], "16", 0, d, [0], 16, 0),
         "src_stride must be an int, got str"),
        (lambda: a.submit_imm(1, "peer"), "dst must be a ferry.MrDesc (the peer's descriptor), got str"),
        (lambda: a.submit_send(d, b"x"), "addr must be a ferry.NetAddr (the peer's main_address), got MrDesc"),
        (lambda: a.submit_barrier(1, [d, 5]), "dsts[1] must be a ferry.MrDesc (the peer's descriptor), got int"),
        (lambda: a.submit_barrier(1, 5), "dsts must be an iterable of MrDesc, got int"),
        (lambda: a.submit_scatter(h, 5), "dsts must be an iterable of ScatterDst or a tuple "
                                         "(length, src_offset, dst[, dst_offset]), got int"),
        (lambda: a.submit_scatter(h, [(16, 0, d)], group="g"), "group must be an int, got str"),
        (lambda: a.add_peer_group([d, "x"]), "peers[1] must be a ferry.MrDesc like peers[0], got str"),
        (lambda: a.add_peer_group([[a.main_address, 3]]), "peers[0][1] must be a ferry.NetAddr, got int"),
        (lambda: a.submit_recvs(64, "4", print), "count must be an int, got str"),
        (lambda: a.submit_recvs(64, 4, None), "callback must be a callable, got NoneType"),
        (lambda: a.expect_imm_count(1, 1, "cb"), "callback must be a callable, got str"),
        (lambda: a.on_imm(3), "callback must be a callable, got int"),
        (lambda: a.imm_counter(1.0), "imm must be an int, got float"),
        (lambda: a.remove_imm_count(None), "imm must be an int, got NoneType"),
        (lambda: a.unregister(d), "handle must be a ferry.MrHandle (from register()), got MrDesc"),
        (lambda: a.register_memory("0x10", 16), "ptr must be an int, got str"),
        (lambda: a.register_memory(h.ptr, 16, device=0), 'device must be a device name ("cpu" or "cuda:N"), got int'),
        (lambda: a.group_addresses("0"), "group must be an int, got str"),
        (lambda: a.imm_counter(1).wait("1"), "n must be an int, got str"),
        (lambda: a.imm_counter(1).wait(1, timeout="soon"), "timeout must be a number of seconds or None, got str"),
        (lambda: a.imm_counter(1).try_consume(None), "n must be an int, got NoneType"),
        (lambda: ferry.TransferCounter().wait(1, timeout=[1]), "timeout must be a number of seconds or None, got list"),
        (lambda: ferry.WriteRoute.pinned("0"), "nic must be an int, got str"),
        (lambda: ferry.WriteRoute.split(max_shards=None), "max_shards must be an int, got NoneType"),
        (lambda: ferry.GroupRoute.pinned(0.0), "nic must be an int, got float"),
        (lambda: ferry.ScatterDst(16, 0, "d"), "dst must be a ferry.MrDesc (the peer's descriptor), got str"),
        (lambda: ferry.ImmPlan.single_write(16, ferry.GroupRoute.shard_peers(), 1),
         "route must be a ferry.WriteRoute, got GroupRoute"),
        (lambda: ferry.ImmPlan.paged_writes("3"), "pages must be an int, got str"),
        (lambda: ferry.MrDesc.from_hex(b"00"), "text must be a str, got bytes"),
        (lambda: a.submit_write(h, 0, 16, d, 0).result(timeout="1"),
         "timeout must be a number of seconds or None, got str"),
    ]
    for call, message in cases:
        _wrong_type(call, message)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(provider=3), "provider must be a str or None, got int"),
        (dict(nics=[b"shm"]), "nics[0] must be a NIC name (str), got bytes"),
        (dict(nics=5), "nics must be a list of NIC names (str), got int"),
        (dict(nics_per_group="1"), "nics_per_group must be an int, got str"),
        (dict(worker_cpu=1.5), "worker_cpu must be an int, got float"),
        (dict(callback_cpu="0"), "callback_cpu must be an int, got str"),
        (dict(default_timeout="10"), "default_timeout must be a number of seconds or None, got str"),
        (dict(send_buffer_size=None), "send_buffer_size must be an int, got NoneType"),
        (dict(groups=[ferry.Group("cpu", ["shm"]), "cpu"]), "groups[1] must be a ferry.Group, got str"),
        (dict(groups=[ferry.Group("cpu", ["shm"], worker_cpu="1")]), "groups[0].worker_cpu must be an int, got str"),
    ],
)
def test_engine_configuration_types(kw, message):
    kw.setdefault("provider", "shm")
    if "groups" not in kw:
        kw.setdefault("nics", ["shm"])
    _wrong_type(lambda: ferry.TransferEngine(**kw), message)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(nics_per_group=0), "nics_per_group must be positive (got 0)"),
        (dict(worker_cpu=-2), "worker_cpu must be in [-1, 2**31) (got -2)"),
        (dict(default_timeout=-1), "default_timeout must be a non-negative number of seconds or None (got -1)"),
        (dict(default_timeout=float("nan")), "default_timeout must be a non-negative number of seconds or None (got nan)"),
        (dict(send_buffer_count=-1), "send_buffer_count must not be negative (got -1)"),
    ],
)
def test_engine_configuration_values(kw, message):
    with pytest.raises(ferry.InvalidArgument) as ei:
        ferry.TransferEngine("shm", nics=["shm"], **kw)
    assert str(ei.value) == message
    assert not isinstance(ei.value, TypeError)


def test_value_errors_name_the_argument(engines):
    a, _, h, d, _, _ = engines
    c = a.imm_counter(62)
    for call, exc, message in [
        (lambda: c.wait(-1), ferry.InvalidArgument, "n must not be negative (got -1)"),
        (lambda: c.wait(2**63), ferry.InvalidArgument, "n must be in [0, 2**63) (got 9223372036854775808)"),
        (lambda: c.wait(1, timeout=-0.5), ferry.InvalidArgument,
         "timeout must be a non-negative number of seconds or None (got -0.5)"),
        (lambda: ferry.TransferCounter().wait(2**64), ferry.InvalidArgument,
         "n must be in [0, 2**63) (got 18446744073709551616)"),
        (lambda: a.submit_write(h, 0, 16, d, 0, imm=2**64), ferry.InvalidArgument,
         "imm must be in [0, 2**32) (got 18446744073709551616)"),
        (lambda: a.imm_counter(-3), ferry.InvalidArgument, "imm must not be negative (got -3)"),
        (lambda: ferry.WriteRoute.pinned(256), ferry.InvalidArgument, "nic must be in [0, 255] (got 256)"),
        (lambda: a.register_memory(2**64, 16), ferry.InvalidArgument,
         "ptr must be an address in [0, 2**64) (got 18446744073709551616)"),
        (lambda: a.group_addresses(2**63), ferry.InvalidArgument,
         "group must be in [0, 2**63) (got 9223372036854775808)"),
        (lambda: a.group_addresses(5), ferry.OutOfRange, "group 5 of 1"),
    ]:
        with pytest.raises(exc) as ei:
            call()
        assert str(ei.value) == message
        assert not isinstance(ei.value, ferry.InvalidArgumentType)


def test_long_timeouts_mean_no_deadline(engines):
    a, b, _, d, _, _ = engines
    c = b.imm_counter(63)
    for t in (float("inf"), 1e300, 10**400):  # no overflow of the deadline arithmetic
        a.submit_imm(63, d).result(timeout=t)
        c.wait(1, timeout=t)
    assert c.value == 0


# ---------------------------------------------------------------------------- page lists


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64, "list"])
def test_page_list_dtypes_write_the_right_bytes(engines, dtype):
    a, b, h, d, src, dst = engines
    dst[:] = 0
    page = 32
    src_idx = np.array([5, 0, 7, 2], np.int64)
    dst_idx = np.array([1, 3, 0, 2], np.int64)
    conv = (lambda x: x.tolist()) if dtype == "list" else (lambda x: x.astype(dtype))
    c = b.imm_counter(64)
    a.submit_paged_writes(page, h, conv(src_idx), page, 0, d, conv(dst_idx), page, 64, imm=64).result(20)
    c.wait(4, 20)
    for s, t in zip(src_idx, dst_idx):
        assert dst[64 + t * page:64 + (t + 1) * page].tobytes() == src[s * page:(s + 1) * page].tobytes()
    assert not dst[:64].any() and not dst[64 + 4 * page:].any()


@pytest.mark.parametrize(
    "pages, text",
    [
        (np.array([0, 2**32], np.uint64), "index 4294967296 at position 1"),
        (np.array([1, 2, 2**63 + 1], np.uint64), "index 9223372036854775809 at position 2"),
        (np.array([0, 2**32 + 7], np.int64), "index 4294967303 at position 1"),
        ([3, 2**32], "index 4294967296 at position 1"),
        ((0, 2**64), "index 18446744073709551616 at position 1"),
    ],
)
def test_page_indices_of_2_to_the_32_are_out_of_range(engines, pages, text):
    a, _, h, d, _, _ = engines
    n = len(pages)
    with pytest.raises(ferry.OutOfRange) as ei:
        a.submit_paged_writes(16, h, list(range(n)), 16, 0, d, pages, 16, 0)
    assert str(ei.value) == f"destination pages: {text} is outside [0, 2**32)"
    with pytest.raises(ferry.OutOfRange, match=f"^source pages: {text}"):
        a.submit_paged_writes(16, h, pages, 16, 0, d, list(range(n)), 16, 0)


def test_uint64_page_list_of_the_largest_index(engines):
    # 2**32 - 1 is a valid index: it passes the conversion and is then past the region
    a, _, h, d, _, _ = engines
    with pytest.raises(ferry.OutOfRange) as ei:
        a.submit_paged_writes(16, h, np.array([2**32 - 1], np.uint64), 16, 0, d, [0], 16, 0)
    assert "is outside [0, 2**32)" not in str(ei.value)


# ---------------------------------------------------------------------------- scatter targets


def test_scatter_target_shapes(engines):
    a, _, h, d, _, _ = engines
    with pytest.raises(ferry.InvalidArgument) as ei:
        a.submit_scatter(h, [(16, 0)])
    assert str(ei.value) == ("scatter target 0: expected ScatterDst or a tuple "
                             "(length, src_offset, dst[, dst_offset]), got a tuple of 2 items")
    with pytest.raises(ferry.InvalidArgument) as ei:
        a.submit_scatter(h, [ferry.ScatterDst(16, 0, d), [16, 0, d, 0, 1]])
    assert str(ei.value) == ("scatter target 1: expected ScatterDst or a tuple "
                             "(length, src_offset, dst[, dst_offset]), got a list of 5 items")
    with pytest.raises(ferry.InvalidArgumentType) as ei:
        a.submit_scatter(h, [(16, 0, d), d])
    assert str(ei.value) == ("scatter target 1: expected ScatterDst or a tuple "
                             "(length, src_offset, dst[, dst_offset]), got MrDesc")
    with pytest.raises(ferry.InvalidArgument, match="^scatter target 2: length must not be negative"):
        a.submit_scatter(h, [(16, 0, d), (16, 16, d, 16), (-16, 0, d)])
    with pytest.raises(ferry.OutOfRange, match="^scatter target 0: src_offset 9223372036854775808 is past"):
        a.submit_scatter(h, [(16, 2**63, d)])
    with pytest.raises(ferry.InvalidArgumentType, match="^scatter target 0: dst must be a ferry.MrDesc"):
        a.submit_scatter(h, [(16, 0, "peer")])


def test_scatter_tuples_write_the_right_bytes(engines):
    a, b, h, d, src, dst = engines
    dst[:] = 0
    c = b.imm_counter(65)
    plan = ferry.ImmPlan.scatter_target(64, ferry.GroupRoute.shard_peers(), a.nics_per_group)
    a.submit_scatter(h, [(64, 0, d, 0), (64, 256, d, 1024), ferry.ScatterDst(32, 512, d, 2048)],
                     imm=65).result(20)
    c.wait(2 * plan + ferry.ImmPlan.scatter_target(32, ferry.GroupRoute.shard_peers(), a.nics_per_group), 20)
    assert dst[0:64].tobytes() == src[0:64].tobytes()
    assert dst[1024:1088].tobytes() == src[256:320].tobytes()
    assert dst[2048:2080].tobytes() == src[512:544].tobytes()


def test_transfers_have_a_finite_default_deadline():
    import inspect

    default = inspect.signature(ferry.TransferEngine.__init__).parameters["default_timeout"].default
    assert default is not None and 0 < default < float("inf")

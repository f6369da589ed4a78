"""GPU buffers (torch CUDA tensors through DLPack). Skipped without torch or CUDA.

* nvlink (ferry's CUDA IPC domain, docs/NVLINK.md): CUDA tensor to CUDA tensor, from
  cuda:0 to the last GPU (cuda:1 on a pair, cuda:0 itself on one GPU), between two
  engines of this process and between this process and a second one (spawn); single
  writes on both the copy-engine (>= 4 MiB) and the gather-kernel path, paged writes with
  torch page lists, scatter, barrier and submit_imm; every byte of the target checked
  with torch, and the immediates counted exactly.
* libfabric providers (tcp, shm) with FI_HMEM: host tensor to CUDA tensor; reported as
  SKIPPED, with libfabric's reason, where the provider cannot register CUDA memory (the
  Debian libfabric 1.17 has no CUDA support).
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

import pytest

import ferry
from conftest import PROVIDERS

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]

MiB = 1 << 20


def cuda_engine(kind: str) -> ferry.TransferEngine:
    provider, nics = PROVIDERS[kind]
    try:
        return ferry.TransferEngine(
            provider,
            groups=[ferry.Group("cpu", nics), ferry.Group("cuda:0", nics)],
            default_timeout=20,
        )
    except (ferry.Unavailable, ferry.Unimplemented, ferry.NotFound, ferry.InvalidArgument) as e:
        pytest.skip(f"{provider} cannot serve CUDA memory here (no FI_HMEM?): {e}")


def nvlink_engine(dev: int) -> ferry.TransferEngine:
    """An engine of the "nvlink" domain with one group for cuda:dev (no NIC names)."""
    try:
        return ferry.TransferEngine(
            "nvlink", groups=[ferry.Group(f"cuda:{dev}")], default_timeout=20
        )
    except ferry.Unimplemented as e:  # a build without CUDA; anything else is a failure
        pytest.skip(f"nvlink domain not available: {e}")


def target_device() -> int:
    """cuda:1 when there are two GPUs (GPU0 -> GPU1 over NVLink), else cuda:0 itself."""
    return 1 if torch.cuda.device_count() > 1 else 0


def random_cuda(n: int, dev: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).to(f"cuda:{dev}")


def sync(*devs: int) -> None:
    for dev in set(devs):
        torch.cuda.synchronize(dev)


def test_describe_cuda_tensor():
    t = torch.arange(1024, dtype=torch.float32, device="cuda:0")
    ptr, nbytes, device, readonly, contiguous = ferry._ferry.describe_buffer(t)
    assert ptr == t.data_ptr() and nbytes == 4096 and device == "cuda:0"
    assert contiguous and not readonly
    _, _, _, _, contiguous = ferry._ferry.describe_buffer(t.view(32, 32).t())
    assert not contiguous


def test_cpu_tensor_pages_and_registration():
    e = ferry.TransferEngine(*PROVIDERS["shm"][:1], nics=PROVIDERS["shm"][1], default_timeout=20)
    with e:
        src = torch.arange(4096, dtype=torch.uint8)
        dst = torch.zeros(4096, dtype=torch.uint8)
        h, _ = e.register(src)
        b = ferry.TransferEngine("shm", nics=["shm"], default_timeout=20)
        with b:
            _, d = b.register(dst)
            c = b.imm_counter(3)
            e.submit_paged_writes(
                64, h, torch.tensor([2, 0], dtype=torch.int32), 64, 0, d,
                torch.tensor([0, 1], dtype=torch.int64), 64, 0, imm=3,
            ).result(20)
            c.wait(2, 20)
            assert torch.equal(dst[:64], src[128:192]) and torch.equal(dst[64:128], src[:64])
        with pytest.raises(ferry.InvalidArgument, match="host memory"):
            e.submit_paged_writes(64, h, torch.tensor([0], device="cuda:0", dtype=torch.int32), 64,
                                  0, d, [0], 64, 0)


@pytest.mark.parametrize("kind", sorted(PROVIDERS))
def test_write_host_to_cuda(kind):
    a = ferry.TransferEngine(PROVIDERS[kind][0], nics=PROVIDERS[kind][1], default_timeout=20)
    b = cuda_engine(kind)
    try:
        src = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8)
        dst = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda:0")
        h, _ = a.register(src)
        try:
            _, d = b.register(dst)
        except (ferry.Unavailable, ferry.Unimplemented, ferry.FailedPrecondition) as e:
            pytest.skip(f"cannot register CUDA memory with {kind}: {e}")
        assert d.device == "cuda:0"
        c = b.imm_counter(1)
        a.submit_write(h, 0, 1 << 16, d, 0, imm=1).result(20)
        c.wait(1, 20)
        assert torch.equal(dst.cpu(), src)
    finally:
        a.stop()
        b.stop()


# ---------------------------------------------------------------------------- nvlink


def assert_exact(counter: ferry.ImmCounter, n: int) -> None:
    """n arrivals of counter's immediate, and none more (after a grace period)."""
    counter.wait(n, 20)
    time.sleep(0.05)
    assert counter.value == 0, f"{counter.value} surplus immediates {counter.imm}"


def test_nvlink_registration_errors():
    dev = target_device()
    with nvlink_engine(dev) as e:
        with pytest.raises(ferry.InvalidArgument, match="GPU memory only"):
            e.register(torch.zeros(4096, dtype=torch.uint8))  # host memory is never a target
        if dev != 0:
            with pytest.raises(ferry.NotFound, match="no group serves device cuda:0"):
                e.register(torch.zeros(4096, dtype=torch.uint8, device="cuda:0"))
        h, d = e.register(torch.zeros(4096, dtype=torch.uint8, device=f"cuda:{dev}"))
        assert d.device == f"cuda:{dev}" and d.length == 4096
        e.unregister(h)


def test_nvlink_cuda_tensors_two_engines_one_process():
    """cuda:0 -> cuda:last between two engines of this process (pointers used directly)."""
    dst_dev = target_device()
    size = 16 * MiB
    a = nvlink_engine(0)
    b = nvlink_engine(dst_dev)
    try:
        src = random_cuda(size, 0, seed=1)
        dst = torch.zeros(size, dtype=torch.uint8, device=f"cuda:{dst_dev}")
        sync(0, dst_dev)  # torch's kernels run on its streams, ferry's copies on its own
        h, _ = a.register(src)
        _, d = b.register(dst)
        assert d.device == f"cuda:{dst_dev}" and d.length == size
        src_cpu = src.cpu()
        expect = torch.zeros(size, dtype=torch.uint8)

        def check(what: str) -> None:
            got = dst.cpu()
            bad = (got != expect).nonzero()
            assert bad.numel() == 0, f"{what}: {bad.numel()} bytes differ, first at {int(bad[0])}"

        def clear() -> None:
            dst.zero_()
            expect.zero_()
            sync(dst_dev)

        # one large write: the copy-engine path (>= 4 MiB), at odd offsets
        c = b.imm_counter(1)
        n = 12 * MiB + 333
        a.submit_write(h, 7, n, d, 11, imm=1).result(20)
        expect[11 : 11 + n] = src_cpu[7 : 7 + n]
        assert_exact(c, ferry.ImmPlan.single_write(n, ferry.WriteRoute.split(), a.nics_per_group))
        check("12 MiB write")

        # small unaligned writes: the gather-kernel path
        clear()
        c = b.imm_counter(2)
        writes = [(1, 0, 5), (12345, 3, 100_001), (65536, 4 * MiB + 1, 2 * MiB),
                  (32769, 9 * MiB, 15 * MiB - 1)]
        for ln, so, do in writes:
            a.submit_write(h, so, ln, d, do, imm=2).result(20)
            expect[do : do + ln] = src_cpu[so : so + ln]
        assert_exact(c, len(writes))
        check("small writes")

        # paged writes, page lists as torch CPU tensors (int32 source, int64 target)
        clear()
        c = b.imm_counter(3)
        page, stride, pages = 3000, 4096, 1024
        g = torch.Generator().manual_seed(3)
        src_idx = torch.randperm(2 * pages, generator=g)[:pages].to(torch.int32)
        dst_idx = torch.randperm(pages, generator=g).to(torch.int64)
        a.submit_paged_writes(page, h, src_idx, stride, 64, d, dst_idx, stride, 128,
                              imm=3).result(20)
        for s, t in zip(src_idx.tolist(), dst_idx.tolist()):
            so, do = 64 + s * stride, 128 + t * stride
            expect[do : do + page] = src_cpu[so : so + page]
        assert_exact(c, ferry.ImmPlan.paged_writes(pages))
        check("paged writes")

        # scatter (two slices), barrier and a bare immediate
        clear()
        c = b.imm_counter(4)
        slices = [ferry.ScatterDst(1000, 0, d, 0), (5 * MiB, 8192, d, 2 * MiB)]
        a.submit_scatter(h, slices, imm=4).result(20)
        expect[:1000] = src_cpu[:1000]
        expect[2 * MiB : 7 * MiB] = src_cpu[8192 : 8192 + 5 * MiB]
        assert_exact(c, 2)
        check("scatter")
        c = b.imm_counter(5)
        a.submit_barrier(5, [d]).result(20)
        a.submit_imm(5, d).result(20)
        assert_exact(c, 2)
    finally:
        a.stop()
        b.stop()


def test_nvlink_send_recv_two_engines_one_process():
    """Two-sided messages over the NVLink domain's message ring, every byte and in order."""
    import random
    import threading

    rnd = random.Random(5)
    msgs = [b"", bytes(64 << 10)] + [rnd.randbytes(rnd.randint(1, 64 << 10)) for _ in range(300)]
    a = nvlink_engine(0)
    b = nvlink_engine(target_device())
    try:
        got = []
        all_in = threading.Event()

        def on_msg(m: memoryview) -> None:
            got.append(bytes(m))
            if len(got) == len(msgs):
                all_in.set()

        b.submit_recvs(64 << 10, 8, on_msg)
        for m in msgs:
            a.submit_send(b.main_address, m).result(20)
        assert all_in.wait(20), f"{len(got)} of {len(msgs)} messages arrived"
        assert [len(m) for m in got] == [len(m) for m in msgs]
        assert got == msgs
    finally:
        a.stop()
        b.stop()
    # Longer than a slot of the ring: a typed error on the transfer, not a crash.
    big = ferry.TransferEngine(
        "nvlink", groups=[ferry.Group("cuda:0")], default_timeout=20, send_buffer_size=128 << 10
    )
    peer = nvlink_engine(target_device())
    try:
        with pytest.raises(ferry.InvalidArgument, match="at most 65536 bytes"):
            big.submit_send(peer.main_address, bytes(100_000)).result(20)
    finally:
        big.stop()
        peer.stop()


def _nvlink_target(dev: int, size: int, cmd_q, res_q) -> None:
    """The second process: owns a zeroed CUDA tensor of `size` bytes on cuda:dev.

    Commands: ("count", imm) | ("wait", imm, n) -> the whole tensor as bytes, after n
    arrivals and a check for surplus ones | ("clear",) | ("stop",).
    """
    try:
        import torch as t

        import ferry as f

        t.cuda.set_device(dev)
        e = f.TransferEngine("nvlink", groups=[f.Group(f"cuda:{dev}")], default_timeout=20)
        buf = t.zeros(size, dtype=t.uint8, device=f"cuda:{dev}")
        t.cuda.synchronize(dev)
        _, desc = e.register(buf)
        res_q.put(("hello", desc))
    except BaseException:
        res_q.put(("error", traceback.format_exc()))
        return
    counters = {}
    while True:
        cmd = cmd_q.get()
        try:
            if cmd[0] == "stop":
                e.stop()
                res_q.put(("ok", None))
                return
            if cmd[0] == "count":
                counters[cmd[1]] = e.imm_counter(cmd[1])
                res_q.put(("ok", None))
            elif cmd[0] == "wait":
                c = counters[cmd[1]]
                c.wait(cmd[2], 20)
                time.sleep(0.05)
                if c.value != 0:
                    raise AssertionError(f"{c.value} surplus immediates {cmd[1]}")
                res_q.put(("ok", buf.cpu().numpy().tobytes()))
            elif cmd[0] == "clear":
                buf.zero_()
                t.cuda.synchronize(dev)
                res_q.put(("ok", None))
        except BaseException:
            res_q.put(("error", traceback.format_exc()))


class GpuPeer:
    def __init__(self, dev: int, size: int):
        ctx = mp.get_context("spawn")
        self.cmd, self.res = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_nvlink_target, args=(dev, size, self.cmd, self.res),
                                daemon=True)
        self.proc.start()
        status, value = self.res.get(timeout=120)
        if status != "hello":
            self.close()
            raise AssertionError(f"GPU peer failed to start:\n{value}")
        self.desc = value

    def call(self, *cmd, timeout: float = 60):
        self.cmd.put(cmd)
        status, value = self.res.get(timeout=timeout)
        if status != "ok":
            raise AssertionError(f"GPU peer failed on {cmd[0]}:\n{value}")
        return value

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.cmd.put(("stop",))
            self.proc.join(timeout=30)
        finally:
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()


def test_nvlink_cuda_tensors_two_processes():
    """cuda:0 in this process -> cuda:last in a second process (CUDA IPC)."""
    dst_dev = target_device()
    size = 16 * MiB
    a = nvlink_engine(0)  # skips here when the build has no CUDA
    peer = None
    try:
        peer = GpuPeer(dst_dev, size)
        d = peer.desc
        assert isinstance(d, ferry.MrDesc) and d.device == f"cuda:{dst_dev}" and d.length == size
        src = random_cuda(size, 0, seed=2)
        sync(0)
        h, _ = a.register(src)
        src_cpu = src.cpu()

        def check(got: bytes, expect: torch.Tensor, what: str) -> None:
            g = torch.frombuffer(bytearray(got), dtype=torch.uint8)
            bad = (g != expect).nonzero()
            assert bad.numel() == 0, f"{what}: {bad.numel()} bytes differ, first at {int(bad[0])}"

        # the whole region in one write (copy engines) with one immediate
        peer.call("count", 21)
        a.submit_write(h, 0, size, d, 0, imm=21).result(20)
        check(peer.call("wait", 21, ferry.ImmPlan.single_write(size, ferry.WriteRoute.split(), 1)),
              src_cpu, "16 MiB write")

        # small writes (gather kernel) at odd offsets
        peer.call("clear")
        peer.call("count", 22)
        expect = torch.zeros(size, dtype=torch.uint8)
        writes = [(3, 1, 2), (4097, 10, 70_001), (300_000, 5 * MiB + 3, 8 * MiB + 5)]
        for ln, so, do in writes:
            a.submit_write(h, so, ln, d, do, imm=22).result(20)
            expect[do : do + ln] = src_cpu[so : so + ln]
        check(peer.call("wait", 22, len(writes)), expect, "small writes")

        # paged writes: 512 pages of 4 KiB in a random order
        peer.call("clear")
        peer.call("count", 23)
        expect.zero_()
        page, pages = 4096, 512
        g = torch.Generator().manual_seed(23)
        src_idx = torch.randperm(4 * pages, generator=g)[:pages].to(torch.int32)
        dst_idx = torch.randperm(4 * pages, generator=g)[:pages].to(torch.int64)
        a.submit_paged_writes(page, h, src_idx, page, 0, d, dst_idx, page, 0, imm=23).result(20)
        for s, t in zip(src_idx.tolist(), dst_idx.tolist()):
            expect[t * page : (t + 1) * page] = src_cpu[s * page : (s + 1) * page]
        check(peer.call("wait", 23, ferry.ImmPlan.paged_writes(pages)), expect, "paged writes")

        # the target process exits: writes to it fail as to a dead peer, within the
        # liveness period (100 ms), instead of "succeeding" into memory nobody reads
        peer.close()
        peer = None
        deadline = time.monotonic() + 10
        with pytest.raises(ferry.Unavailable, match="has exited|no longer exists"):
            while time.monotonic() < deadline:
                a.submit_write(h, 0, 4096, d, 0, imm=24).result(20)
        a.unregister(h)
    finally:
        a.stop()
        if peer is not None:
            peer.close()


def test_nvlink_map_remote_stores_from_torch_into_a_second_process():
    """map_remote: the peer's GPU memory (CUDA IPC) as a tensor of this process; torch's
    stores land there, an immediate says they are done."""
    dst_dev = target_device()
    size = 4 * MiB
    a = nvlink_engine(dst_dev)
    peer = None
    try:
        peer = GpuPeer(dst_dev, size)
        d = peer.desc
        m = a.map_remote(d, 1 * MiB, 2 * MiB, device=f"cuda:{dst_dev}")
        assert m.nbytes == 2 * MiB and m.device == f"cuda:{dst_dev}"
        view = torch.as_tensor(m, device=f"cuda:{dst_dev}")
        assert view.dtype == torch.uint8 and view.numel() == 2 * MiB
        src = random_cuda(2 * MiB, dst_dev, seed=5)
        view.copy_(src)
        sync(dst_dev)
        peer.call("count", 31)
        a.submit_imm(31, d).result(20)
        got = torch.frombuffer(bytearray(peer.call("wait", 31, 1)), dtype=torch.uint8)
        expect = torch.zeros(size, dtype=torch.uint8)
        expect[MiB:3 * MiB] = src.cpu()
        assert torch.equal(got, expect)
        with pytest.raises(ferry.OutOfRange):
            a.map_remote(d, 3 * MiB, 2 * MiB, device=f"cuda:{dst_dev}")
    finally:
        a.stop()
        if peer is not None:
            peer.close()

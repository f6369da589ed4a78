"""GPU buffers (torch CUDA tensors through DLPack). Skipped without torch or CUDA."""

from __future__ import annotations

import pytest

import ferry
from conftest import PROVIDERS

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


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

"""The one-launch quantisation kernel against the reference conversion, bit for bit, on
a GPU. Skipped without torch, CUDA or Triton."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu]
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("triton")

from ferry.rl import quant, quant_triton  # noqa: E402


def _check(w):
    q_ref, s_ref = quant.quantize_torch(w)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.full(quant.scale_shape(*w.shape), -1.0, dtype=torch.float32, device=w.device)
    quant_triton.quantize_into(w, q, s)
    torch.cuda.synchronize()
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("shape", [(128, 128), (384, 640), (300, 700), (1, 5), (129, 2048), (576, 7168)])
def test_random_bf16(shape):
    g = torch.Generator(device="cuda").manual_seed(hash(shape) & 0xFFFF)
    _check((torch.randn(shape, generator=g, device="cuda") * 0.05).to(torch.bfloat16))


def test_fp32_and_extremes():
    g = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn((256, 384), generator=g, device="cuda")
    w[:128, :128] = 0.0  # a zero block: scale 1, zeros
    w[128:, :128] *= 1e-30  # scales near fp32's subnormals
    w[:128, 128:256] *= 1e30
    w[200, 300] = -float(torch.finfo(torch.float32).max) / 4
    _check(w)
    _check(w.to(torch.bfloat16))


def test_strided_views_read_in_place():
    g = torch.Generator(device="cuda").manual_seed(5)
    big = (torch.randn((1024, 3000), generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    _check(big[256:640, 1000:2400])  # a shard's rows and a tensor-parallel column slice
    _check(big.t()[:384, :512])  # column-major


def test_rejects_outputs_that_do_not_fit():
    w = torch.zeros((256, 256), dtype=torch.bfloat16, device="cuda")
    q = torch.empty((256, 256), dtype=torch.float8_e4m3fn, device="cuda")
    with pytest.raises(ValueError):
        quant_triton.quantize_into(w, q, torch.empty((1, 2), device="cuda"))
    with pytest.raises(ValueError):
        quant_triton.quantize_into(w, q.t(), torch.empty((2, 2), device="cuda"))

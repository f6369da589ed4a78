"""fp8 e4m3 block quantisation: NumPy path against an independent round-to-nearest-even
table (what torch's float8_e4m3fn cast does) and, where torch exists, against torch."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

from ferry.rl import quant  # noqa: E402


def _e4m3_values() -> np.ndarray:
    """Every finite non-negative e4m3fn value by bit pattern 0..126 (0x7f is NaN)."""
    out = []
    for b in range(127):
        e, m = b >> 3, b & 7
        out.append((m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out)


def _rne_e4m3(x: np.ndarray) -> np.ndarray:
    """Independent reference: nearest e4m3fn value, ties to the even bit pattern."""
    vals = _e4m3_values()
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(vals, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a >= vals[126], 126, pick)
    bits = pick.astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return bits


def test_e4m3_cast_is_round_to_nearest_even():
    vals = _e4m3_values().astype(np.float32)
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)  # exact ties
    rng = np.random.default_rng(1)
    rand = (rng.standard_normal(200_000) * rng.choice([1e-3, 1e-1, 1, 30, 300], 200_000)).astype(np.float32)
    rand = np.clip(rand, -448, 448)
    for x in (vals, -vals, mids, -mids, rand):
        got = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        np.testing.assert_array_equal(got, _rne_e4m3(x))


@pytest.mark.parametrize("shape", [(256, 384), (130, 200), (128, 1), (1, 128), (576, 256)])
def test_block_quantisation_properties(shape):
    rng = np.random.default_rng(sum(shape))
    w = (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)
    w[: min(shape[0], 128), : min(shape[1], 128)] = 0  # an all-zero block: scale 1
    q, s = quant.quantize_np(w)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == shape
    assert s.dtype == np.float32 and s.shape == quant.scale_shape(*shape)
    assert s[0, 0] == 1.0
    x = w.astype(np.float32)
    err = np.abs(quant.dequantize_np(q, s) - x)
    rep = np.repeat(np.repeat(s, 128, 0), 128, 1)[: shape[0], : shape[1]]
    # e4m3 keeps 3 mantissa bits: relative error at most 2**-4 of the element, plus
    # the subnormal step (2**-9 of the scale) near zero
    assert np.all(err <= np.abs(x) * 2.0**-4 + rep * 2.0**-9)
    # the largest element of each non-zero block maps to +-448 exactly
    if np.any(x):
        assert np.nanmax(np.abs(q.astype(np.float32))) == 448.0


def test_numpy_matches_torch_bit_for_bit():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((384, 640)) * 0.05).astype(np.float32)
    tw = torch.from_numpy(w).to(torch.bfloat16)
    q_t, s_t = quant.quantize_torch(tw)
    q_n, s_n = quant.quantize_np(tw.float().numpy().astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(q_t.view(torch.uint8).numpy(), q_n.view(np.uint8))
    np.testing.assert_array_equal(s_t.numpy(), s_n)

"""fp8 e4m3 quantisation with 128x128 block scales, and the dtypes both sides name.

The conversion is defined once, in the order PyTorch evaluates it, so that the NumPy
path (CI, no torch) and the torch path (GPU) give the same bits:

    x      = w.float()                                  # bf16 -> fp32 is exact
    amax_b = max |x| over each 128x128 block            # exact
    s_b    = amax_b / 448  (fp32, IEEE division); 1 where amax_b == 0
    q      = (x / s_b).to(float8_e4m3fn)                # IEEE division, round to nearest even

The scale tensor holds s_b (DeepSeek-V3's ``weight_scale_inv``: w ~= q * s), one fp32
per block, shape (ceil(rows/128), ceil(cols/128)). |x / s_b| <= 448 up to one rounding
of the division, and 448 is e4m3fn's largest finite value, so no element overflows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BLOCK = 128
FP8_MAX = 448.0

# dtype names as metadata carries them (torch's spelling), and their sizes.
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}


def np_dtype(name: str) -> Any:
    """NumPy dtype for a metadata dtype name (bf16 and fp8 through ml_dtypes)."""
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype_name(dtype: Any) -> str:
    """The metadata name of a NumPy or torch dtype ("bfloat16", not "torch.bfloat16")."""
    return str(dtype).replace("torch.", "")


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return (-(-rows // BLOCK), -(-cols // BLOCK))


def quantize_np(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2-D array (any float dtype) -> (fp8 e4m3fn array, fp32 block scales)."""
    import ml_dtypes

    rows, cols = w.shape
    br, bc = scale_shape(rows, cols)
    x = np.zeros((br * BLOCK, bc * BLOCK), dtype=np.float32)
    x[:rows, :cols] = w.astype(np.float32)
    blocks = x.reshape(br, BLOCK, bc, BLOCK)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = (amax / np.float32(FP8_MAX)).astype(np.float32)
    scale[amax == 0] = np.float32(1.0)
    q = (blocks / scale[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn)
    return q.reshape(br * BLOCK, bc * BLOCK)[:rows, :cols].copy(), scale


def quantize_np_into(w: np.ndarray, q_out: np.ndarray, s_out: np.ndarray) -> None:
    """quantize_np writing into caller-owned (e.g. registered staging) memory."""
    q, s = quantize_np(w)
    q_out[...] = q
    s_out[...] = s


def quantize_torch(w: Any) -> tuple[Any, Any]:
    """The reference conversion in PyTorch (CPU or CUDA): same bits as quantize_np."""
    import torch

    rows, cols = w.shape
    br, bc = scale_shape(rows, cols)
    x = torch.zeros((br * BLOCK, bc * BLOCK), dtype=torch.float32, device=w.device)
    x[:rows, :cols] = w.float()
    blocks = x.view(br, BLOCK, bc, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    # A tensor divisor, not the Python number: CUDA turns division by a CPU scalar into
    # multiplication by its reciprocal (one bit off for some blocks); tensor / tensor is
    # IEEE division on CPU and CUDA alike, as NumPy's is.
    scale = amax / torch.full_like(amax, FP8_MAX)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q.view(br * BLOCK, bc * BLOCK)[:rows, :cols].contiguous(), scale


def dequantize_np(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    rows, cols = q.shape
    rep = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]
    return q.astype(np.float32) * rep

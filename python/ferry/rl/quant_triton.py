"""The fp8 block quantisation of quant.py in one kernel launch (Triton, CUDA).

`quantize_torch` costs about ten launches and two fp32 temporaries the size of the
input per call; on a GPU shared by several processes, with one call per job, the
launches are what the step waits for. This kernel runs one program per 128x128 block:
it loads the block (any strides: a shard's rows read where they live), takes the
exact amax, divides with IEEE round-to-nearest (`div_rn`, as the reference's tensor
division does) and converts to e4m3fn with round to nearest even, so its bytes are
the reference's (tests/python/rl/test_rl_quant_triton.py checks them bit for bit).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from .quant import BLOCK, FP8_MAX


@functools.lru_cache(maxsize=None)
def _kernel() -> Optional[Any]:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def quant_block(x_ptr, q_ptr, s_ptr, rows, cols, sx_r, sx_c, sq_r, ss_r, BLOCK: tl.constexpr,
                    FP8_MAX: tl.constexpr):
        br = tl.program_id(0)
        bc = tl.program_id(1)
        r = br * BLOCK + tl.arange(0, BLOCK)[:, None]
        c = bc * BLOCK + tl.arange(0, BLOCK)[None, :]
        m = (r < rows) & (c < cols)
        x = tl.load(x_ptr + r.to(tl.int64) * sx_r + c * sx_c, mask=m, other=0.0).to(tl.float32)
        amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        s = tl.math.div_rn(amax, tl.full((), FP8_MAX, tl.float32))
        s = tl.where(amax == 0.0, 1.0, s)
        q = tl.math.div_rn(x, tl.full((BLOCK, BLOCK), 1.0, tl.float32) * s)
        tl.store(q_ptr + r.to(tl.int64) * sq_r + c, q.to(tl.float8e4nv), mask=m)
        tl.store(s_ptr + br * ss_r + bc, s)

    return quant_block


def available(t: Any) -> bool:
    """Whether `t` (a torch tensor) can be quantised by the kernel: on CUDA, Triton there."""
    return getattr(t, "is_cuda", False) and _kernel() is not None


def quantize_into(w: Any, q: Any, s: Any) -> None:
    """Quantise the 2-D tensor `w` (bf16 / fp16 / fp32, any strides) into `q` (fp8
    e4m3fn, same shape, rows contiguous) and `s` (fp32 block scales, shape
    (ceil(rows/128), ceil(cols/128)), rows contiguous), on the current stream."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    if tuple(q.shape) != (rows, cols) or tuple(s.shape) != (br, bc) or q.stride(1) != 1 or s.stride(1) != 1:
        raise ValueError(f"quantize_into: q {tuple(q.shape)} / s {tuple(s.shape)} do not fit w {tuple(w.shape)}")
    if rows == 0 or cols == 0:
        return
    _kernel()[(br, bc)](w, q, s, rows, cols, w.stride(0), w.stride(1), q.stride(0), s.stride(0),
                        BLOCK=BLOCK, FP8_MAX=FP8_MAX, num_warps=8)

"""Plain PyTorch model of ferry.moe's dispatch and combine: deterministic
inputs (every rank can rebuild every other rank's without communication),
the expected outputs, a checker, and the in-process gather/scatter baseline
the benchmark reports beside the real thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Shape:
    world: int
    max_tokens: int
    num_experts: int
    k: int
    hidden: int
    hidden_scale: int = 0
    in_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    padding: int = 1
    private: Optional[int] = None
    tokens: Optional[int] = None  # fixed token count per rank (None: random 0..max)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.world


def _torch():
    import torch

    return torch


def make_inputs(shape: Shape, seed: int, rank: int, it: int) -> dict:
    """Inputs of `rank` at iteration `it`, on the CPU, the same on every rank."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed * 1_000_003 + it * 1009 + rank)
    n = shape.tokens if shape.tokens is not None else int(torch.randint(0, shape.max_tokens + 1, (1,), generator=g))
    scores = torch.rand(n, shape.num_experts, generator=g)
    if it % 7 == 3 and n:  # every token to the same experts
        scores[:, : shape.k] += 10
    idx = scores.topk(shape.k, dim=1).indices.to(torch.int32)
    w = torch.rand(n, shape.k, generator=g)
    w = w / w.sum(dim=1, keepdim=True).clamp_min(1e-6)
    x32 = torch.randn(n, shape.hidden, generator=g)
    x_scale = None
    if shape.hidden_scale:
        x_scale = torch.rand(n, shape.hidden_scale, generator=g) + 0.5
    x = x32.to(getattr(torch, shape.in_dtype))
    return {"n": n, "x": x, "x_scale": x_scale, "idx": idx, "w": w.float()}


def dequant(shape: Shape, x: Any, x_scale: Any) -> Any:
    xf = x.float()
    if shape.hidden_scale:
        block = (shape.hidden + shape.hidden_scale - 1) // shape.hidden_scale
        s = x_scale.float().repeat_interleave(block, dim=1)[:, : shape.hidden]
        xf = xf * s
    return xf


def expert_fn(shape: Shape, xf: Any, expert: Any) -> Any:
    """What the test's 'experts' compute: x * (global expert + 1), in out_dtype."""
    torch = _torch()
    return (xf * (expert.float() + 1).unsqueeze(-1)).to(getattr(torch, shape.out_dtype))


def row_bytes(x: Any, scale: Any) -> list:
    torch = _torch()
    a = x.contiguous().view(torch.uint8).cpu().numpy()
    if scale is None:
        return [a[i].tobytes() for i in range(a.shape[0])]
    s = scale.contiguous().float().view(torch.uint8).cpu().numpy()
    return [a[i].tobytes() + s[i].tobytes() for i in range(a.shape[0])]


def check_dispatch(shape: Shape, inputs: list, rank: int, num: Any, out_x: Any, out_scale: Any) -> list:
    """Errors (empty when right): counts exact, each expert block holds exactly
    the rows routed to that expert (as bytes, scales included)."""
    errs = []
    L = shape.local_experts
    num = num.cpu()
    off = 0
    for l in range(L):
        e = rank * L + l
        want = []
        for src in inputs:
            sel = (src["idx"] == e).any(dim=1).nonzero().flatten()
            if len(sel):
                want += row_bytes(src["x"][sel], src["x_scale"][sel] if shape.hidden_scale else None)
        if int(num[l]) != len(want):
            errs.append(f"expert {e}: {int(num[l])} tokens, expected {len(want)}")
            return errs
        got = row_bytes(out_x[off : off + len(want)], out_scale[off : off + len(want)] if shape.hidden_scale else None) if want else []
        if sorted(got) != sorted(want):
            errs.append(f"expert {e}: rows differ from the tokens routed to it")
        off += (len(want) + shape.padding - 1) // shape.padding * shape.padding
    return errs


def expert_outputs(shape: Shape, rank: int, num: Any, out_x: Any, out_scale: Any) -> Any:
    """expert_y for every row of the dispatch output (padding rows: zero)."""
    torch = _torch()
    L = shape.local_experts
    y = torch.zeros(out_x.shape[0], shape.hidden, dtype=getattr(torch, shape.out_dtype), device=out_x.device)
    counts = num.cpu().tolist()
    off = 0
    for l in range(L):
        c = counts[l]
        if c:
            xf = dequant(shape, out_x[off : off + c], out_scale[off : off + c] if shape.hidden_scale else None)
            e = torch.full((c,), rank * L + l, device=out_x.device)
            y[off : off + c] = expert_fn(shape, xf, e)
        off += (c + shape.padding - 1) // shape.padding * shape.padding
    return y


def expected_combine(shape: Shape, mine: dict) -> Any:
    """sum_k w[t, k] * expert(x[t], idx[t, k]) in fp32, k in order."""
    torch = _torch()
    xf = dequant(shape, mine["x"], mine["x_scale"])
    acc = torch.zeros(mine["n"], shape.hidden)
    for k in range(shape.k):
        acc += mine["w"][:, k : k + 1] * expert_fn(shape, xf, mine["idx"][:, k]).float()
    return acc.to(getattr(torch, shape.out_dtype))


def torch_floor(x: Any, idx: Any, w: Any, num_experts: int) -> tuple:
    """The same dispatch and combine in one process on the combined batch:
    sort (token, k) pairs by expert, gather the rows expert-major, scatter
    them back with a weighted index_add. Returns (dispatched rows, combined)."""
    torch = _torch()
    n, k = idx.shape
    flat = idx.flatten().long()
    order = torch.argsort(flat, stable=True)
    rows = x.index_select(0, order // k)
    counts = torch.bincount(flat, minlength=num_experts)
    out = torch.zeros(n, x.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, order // k, rows.float() * w.flatten()[order].unsqueeze(1))
    return rows, counts, out

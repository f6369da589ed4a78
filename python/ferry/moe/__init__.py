"""MoE dispatch and combine on the ferry TransferEngine (docs/MOE.md).

``AllToAll`` is built collectively from a torch.distributed process group: each
rank allocates its buffers, and descriptors, addresses and CUDA IPC handles
are exchanged over gloo point-to-point sends, every wait bounded by ``timeout``
(a rank that left raises ``ferry.Unavailable``, one that does not come
``ferry.Timeout``, each naming the rank). ``dispatch`` packs the tokens routed
to this rank's experts into expert-major blocks (padded to ``expert_padding``
rows, the layout grouped GEMM kernels take); ``combine`` returns the expert
outputs and sums them per token with the routing weights, in fp32 and in a
fixed order. Both split into a send and a receive half (``do_send`` /
``do_recv``) for micro-batching, and all four halves can be captured in a
CUDA graph and replayed with new routes (pass ``bound_m`` for a token count
that changes between replays).
"""

from __future__ import annotations

import itertools
import socket
from typing import Any, Optional

from .. import _ferry
from .._errors import FerryError

__all__ = ["AllToAll", "buffer_size_hint"]

_moe = _ferry._moe
_instances = itertools.count()

_DTYPES = {"float32": 4, "bfloat16": 2, "float8_e4m3fn": 1}


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise TypeError(f"ferry.moe: unsupported dtype {dtype} (float32, bfloat16, float8_e4m3fn)")
    return name


def _config(**kw: Any) -> Any:
    return _moe.config(**kw)


def buffer_size_hint(
    *,
    max_num_tokens: int,
    num_experts: int,
    experts_per_token: int,
    hidden: int,
    world_size: int,
    hidden_scale: Optional[int] = None,
    in_dtype: Any = "bfloat16",
    out_dtype: Any = "bfloat16",
    expert_padding: int = 1,
    max_private_tokens: Optional[int] = None,
    node_size: int = 1,
) -> dict:
    """Sizes an AllToAll of this shape allocates: ``out_rows`` (rows of
    ``out_expert_x`` / ``expert_y``), buffer strides, receive rows and bytes."""
    return _moe.buffer_size_hint(
        _config(
            max_num_tokens=max_num_tokens, num_experts=num_experts,
            experts_per_token=experts_per_token, hidden=hidden, hidden_scale=hidden_scale or 0,
            in_dtype=_dtype_name(in_dtype), out_dtype=_dtype_name(out_dtype),
            expert_padding=expert_padding, max_private_tokens=max_private_tokens or 0, rank=0,
            world_size=world_size, node_size=node_size, instance=0, device=0, host_buffers=False,
            deadline=10.0,
        )
    )


class AllToAll:
    """One MoE layer's dispatch/combine across the ranks of ``group``.

    ``node_size`` consecutive ranks share NVLink (CUDA IPC); the others are
    reached through the engine (``provider``, ``nics``) and the host proxy.
    ``host_buffers`` keeps the engine's buffers in pinned host memory, for
    providers that cannot register GPU memory (tcp, shm); default: on for
    those when there is more than one node.

    ``deadline`` bounds the proxy's waits inside an iteration; ``timeout`` (seconds)
    bounds each collective step of construction and ``destroy`` (gloo point-to-point
    sends on ``group``, or on a gloo group over its ranks when ``group`` is not gloo): a
    rank that left raises ``ferry.Unavailable``, one that does not come within it
    ``ferry.Timeout``, each naming the rank.
    """

    def __init__(
        self,
        *,
        max_num_tokens: int,
        num_experts: int,
        experts_per_token: int,
        hidden: int,
        hidden_scale: Optional[int] = None,
        in_dtype: Any = "bfloat16",
        out_dtype: Any = "bfloat16",
        expert_padding: int = 1,
        max_private_tokens: Optional[int] = None,
        node_size: Optional[int] = None,
        nics_per_gpu: int = 1,
        group: Any = None,
        device: Any = None,
        provider: str = "shm",
        nics: Optional[list] = None,
        host_buffers: Optional[bool] = None,
        deadline: float = 10.0,
        timeout: float = 60.0,
    ) -> None:
        import torch

        self._c = None
        rv = _Rendezvous(group, timeout)
        self._rv = rv
        rank, world = rv.rank, rv.world
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        hosts, instance = _agree(rv)
        if node_size is None:
            node_size = world if len(set(hosts)) == 1 else 1
        if host_buffers is None:
            host_buffers = node_size < world and provider.split(";")[0] in ("tcp", "shm", "fake")
        if nics is None:
            nics = {"shm": ["shm"], "tcp": ["lo"], "fake": ["fake"]}.get(provider.split(";")[0], [])
            nics = nics * nics_per_gpu
        self.in_dtype, self.out_dtype = _dtype_name(in_dtype), _dtype_name(out_dtype)
        self.hidden, self.hidden_scale = hidden, hidden_scale or 0
        self.experts_per_token, self.max_num_tokens = experts_per_token, max_num_tokens
        self.num_local_experts = num_experts // world
        self.rank, self.world_size, self.node_size = rank, world, node_size
        cfg = _config(
            max_num_tokens=max_num_tokens, num_experts=num_experts,
            experts_per_token=experts_per_token, hidden=hidden, hidden_scale=self.hidden_scale,
            in_dtype=self.in_dtype, out_dtype=self.out_dtype, expert_padding=expert_padding,
            max_private_tokens=max_private_tokens or 0, rank=rank, world_size=world,
            node_size=node_size, instance=instance, device=dev.index or 0,
            host_buffers=bool(host_buffers), deadline=float(deadline),
        )
        with torch.cuda.device(dev):
            c = _moe.AllToAll(provider, list(nics), cfg)
            try:
                c.connect(rv.all_gather(c.local_info(), "exchanging the engine descriptors"))
                self.sizes = c.sizes()
                rv.barrier("waiting for every rank to connect")
            except BaseException:
                c.destroy()  # now, not whenever the object is collected
                raise
        self._c = c
        self.out_rows = self.sizes["out_rows"]

    # --- the four halves ---------------------------------------------------------

    def dispatch(
        self,
        out_expert_num_tokens: Any,
        out_expert_x: Any,
        out_expert_x_scale: Any,
        x: Any,
        x_scale: Any,
        indices: Any,
        weights: Any,
        bound_m: Any = None,
        do_send: bool = True,
        do_recv: bool = True,
    ) -> None:
        """Routes ``x[t]`` to the experts ``indices[t, :]``. Outputs: per local
        expert its token count, and its rows in ``out_expert_x`` (and scales)."""
        import torch

        del weights  # applied by combine; part of the signature for symmetry
        if indices.dtype != torch.int32:
            indices = indices.to(torch.int32)
        self._check(x, self.in_dtype, "x", self.hidden)
        self._check(out_expert_x, self.in_dtype, "out_expert_x", self.hidden)
        if out_expert_x.shape[0] < self.out_rows:
            raise ValueError(f"out_expert_x has {out_expert_x.shape[0]} rows, needs {self.out_rows}")
        if self.hidden_scale:
            for t, n in ((x_scale, "x_scale"), (out_expert_x_scale, "out_expert_x_scale")):
                self._check(t, "float32", n, self.hidden_scale)
        if indices.dim() != 2 or indices.shape[1] != self.experts_per_token or indices.stride(1) != 1:
            raise ValueError("indices must be [num_tokens, experts_per_token] with unit inner stride")
        if out_expert_num_tokens.dtype != torch.int32:
            raise TypeError("out_expert_num_tokens must be int32")
        stream = torch.cuda.current_stream().cuda_stream
        self._c.dispatch(
            out_expert_num_tokens.data_ptr(), out_expert_x.data_ptr(),
            out_expert_x.stride(0) * out_expert_x.element_size(),
            out_expert_x_scale.data_ptr() if self.hidden_scale else 0,
            out_expert_x_scale.stride(0) if self.hidden_scale else 0,
            x.data_ptr(), x.stride(0) * x.element_size(),
            x_scale.data_ptr() if self.hidden_scale else 0,
            x_scale.stride(0) if self.hidden_scale else 0,
            indices.data_ptr(), indices.stride(0), int(x.shape[0]),
            bound_m.data_ptr() if bound_m is not None else 0, do_send, do_recv, stream,
        )

    def combine(
        self,
        out_tokens: Any,
        indices: Any,
        weights: Any,
        expert_y: Any,
        bound_m: Any = None,
        do_send: bool = True,
        do_recv: bool = True,
        accumulate: bool = False,
    ) -> None:
        """``out_tokens[t] = (out_tokens[t] if accumulate else 0) +
        sum_k weights[t, k] * expert_y[row of (t, k)]``, in fp32, k in order.
        ``indices`` and ``bound_m`` are the dispatch's (its layout is reused)."""
        import torch

        del indices, bound_m
        self._check(expert_y, self.out_dtype, "expert_y", self.hidden)
        self._check(out_tokens, self.out_dtype, "out_tokens", self.hidden)
        if weights.dtype != torch.float32 or weights.stride(1) != 1:
            raise TypeError("weights must be float32 [num_tokens, experts_per_token]")
        stream = torch.cuda.current_stream().cuda_stream
        self._c.combine(
            out_tokens.data_ptr(), out_tokens.stride(0) * out_tokens.element_size(),
            weights.data_ptr(), weights.stride(0), expert_y.data_ptr(),
            expert_y.stride(0) * expert_y.element_size(), accumulate, do_send, do_recv, stream,
        )

    # --- the rest ---------------------------------------------------------------------

    def check(self) -> None:
        """Raises the proxy's or the kernels' first failure (a ferry error)."""
        self._c.check()

    def proxy_latency(self) -> tuple:
        """(GPU signal -> routes posted, routes received -> overflow posted), ns."""
        return self._c.proxy_latency()

    def buffer_size_hint(self) -> dict:
        return dict(self.sizes)

    def destroy(self) -> None:
        """Collective: every rank, after its last combine has finished. If a rank is gone or
        does not come within ``timeout``, raises ``ferry.Unavailable`` / ``ferry.Timeout``
        naming it, having released this rank's own buffers and engine all the same."""
        import torch

        if self._c is None:
            return
        torch.cuda.synchronize()
        c, self._c = self._c, None
        try:
            self._rv.barrier("destroy: waiting for every rank to finish")
        finally:
            c.destroy()
        self._rv.barrier("destroy: waiting for every rank to release its buffers")

    def _check(self, t: Any, dtype: str, name: str, width: int) -> None:
        if t is None:
            raise ValueError(f"{name} is required")
        if _dtype_name(t.dtype) != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        if t.dim() != 2 or t.shape[1] != width or t.stride(1) != 1 or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA [rows, {width}] tensor with unit inner stride")


class _Rendezvous:
    """The collective steps of an AllToAll's life (the exchanges and the barrier of its
    construction, the barriers of destroy) over the ranks of `group`, each bounded by
    `timeout` seconds: gloo point-to-point sends (``ferry._torch_exchange``) on `group`
    itself when it is a gloo group, else on a gloo group over the same ranks, made by the
    first AllToAll over those ranks and kept for the later ones. A rank that left raises
    ``ferry.Unavailable``, one that does not come ``ferry.Timeout``, each naming the rank
    and the step. Either ends the AllToAll, and a group made here is dropped so that a
    later AllToAll makes a new one (after a Timeout gloo has closed this rank's
    connections of the group)."""

    def __init__(self, group: Any, timeout: float) -> None:
        import torch.distributed as dist

        from .._torch_exchange import TorchExchange, gloo_group

        if not timeout > 0:
            raise ValueError(f"ferry.moe: timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("ferry.moe: this process is not a rank of the group")
        self._group = self._call("making a gloo group over the ranks", lambda: gloo_group(group, self.timeout))
        self._ex = TorchExchange(self._group, barrier_sets=[range(self.world)])

    def all_gather(self, obj: Any, what: str) -> list:
        return self._call(what, lambda: self._ex.all_gather(obj, self.timeout))

    def barrier(self, what: str) -> None:
        self._call(what, lambda: self._ex.barrier(range(self.world), self.timeout))

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except FerryError as e:
            group = getattr(self, "_group", None)
            if group is not None:
                from .._torch_exchange import forget_gloo_group

                forget_gloo_group(group)
            raise type(e)(f"ferry.moe AllToAll, {what}: {e}") from e


def _agree(rv: _Rendezvous) -> tuple:
    """The first step of a construction: every rank's host name (for the default node
    size) and the instance of the immediates, the same on every rank: the largest of the
    ranks' next local counts (this process's counter then continues past it)."""
    mine = next(_instances)
    seen = rv.all_gather((socket.gethostname(), mine), "agreeing on the node size and the immediates")
    instance = max(i for _, i in seen)
    while mine < instance:
        mine = next(_instances)
    return [h for h, _ in seen], instance

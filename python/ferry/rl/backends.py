"""Where a trainer's staging memory lives and how the pipeline's device work is issued:
NumpyBackend (host memory; CI) and TorchBackend (a torch device, CUDA on the GPU machine).

A backend gives the ring its memory and views, copies pieces into it (one multi-tensor
call where it can), quantises (the Triton kernel on CUDA, else the reference), and marks
the work issued so far (CUDA events) so that the sender posts a job once its bytes are
ready without synchronising the device.
"""

from __future__ import annotations

import numpy as np

from . import quant_triton
from .quant import ITEMSIZE, np_dtype, quantize_np, quantize_torch


class NumpyBackend:
    """Host memory: staging and shards are NumPy arrays (bf16 / fp8 via ml_dtypes)."""

    map_device = "cpu"  # where mapped memory is viewed (ferry.rl.mapped)

    def pool(self, n: int):
        return np.zeros(n, dtype=np.uint8)

    def mapped(self, region):
        """A byte view of a peer's memory mapped into this process (host memory)."""
        a = np.asarray(region)
        if a.__array_interface__["data"][0] != region.ptr:
            raise ValueError("the mapped memory came back as a copy")
        return a

    def view(self, pool, off: int, shape, dtype: str):
        n = int(np.prod(shape)) * ITEMSIZE[dtype]
        return pool[off:off + n].view(np_dtype(dtype)).reshape(shape)

    def rows(self, shard, rows: int, cols: int):
        return shard.reshape(rows, cols)

    def recv_buffer(self, dst):
        return dst

    def upload(self, host, dst) -> None:
        if host is not dst:
            dst[...] = host

    def copy(self, dst, src) -> None:
        dst[...] = src

    def crosses(self, src) -> bool:
        """Whether copying `src` into the staging memory is a host-to-device copy."""
        return False

    def copy_many(self, dsts, srcs) -> None:
        for d, s in zip(dsts, srcs):
            self.copy(d, s)

    def quantize(self, src, q, s) -> None:
        qq, ss = quantize_np(src)
        q[...] = qq
        s[...] = ss

    def reads_in_place(self, src) -> bool:
        """Whether conversion may read `src` where it lies (no copy into staging first)."""
        return True

    def sync(self) -> None:
        pass

    def begin(self) -> None:
        pass

    def record(self, timing: bool = False):
        """A marker after the work issued so far (None: host work is done when issued)."""
        return None

    def address(self, arr) -> int:
        return arr.__array_interface__["data"][0]

    def can_capture(self) -> bool:
        """Whether device work can be captured once and replayed (CUDA graphs)."""
        return False

    def wait(self, ev) -> None:
        pass

    def elapsed(self, e0, e1) -> float:
        return 0.0

    def byte_view(self, arr):
        return arr.reshape(-1).view(np.uint8)

    def staging(self, src):
        """A host buffer shaped like `src` that a captured copy may read instead of `src`,
        or None where a capture copies `src` as it lies."""
        return None

    def fill(self, buf, src) -> None:
        """Copy `src` into its staging buffer on the CPU (before a capture or a replay)."""
        buf[...] = src


class TorchBackend:
    """Staging memory on `device` (a torch device); shards are torch tensors on the
    CPU (offloaded: gathered there, then copied to the device) or on the device."""

    def __init__(self, device: str = "cuda"):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self._stream = None  # begin(): the step's stream; None records on the current one
        self.dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32,
                       "float8_e4m3fn": torch.float8_e4m3fn, "float16": torch.float16, "uint8": torch.uint8}

    @property
    def map_device(self) -> str:
        if self.device.type != "cuda":
            return "cpu"
        i = self.device.index if self.device.index is not None else self.torch.cuda.current_device()
        return f"cuda:{i}"

    def mapped(self, region):
        """A byte view of a peer's memory mapped into this process (the view holds it).
        ValueError where it is not memory of this backend's device (a peer on another
        GPU: torch would hand back a copy, and the stores would land in it)."""
        if self.device.type == "cuda":
            t = self.torch.as_tensor(region, device=self.device)
        else:
            t = self.torch.from_numpy(np.asarray(region))
        if t.device != self.device or t.data_ptr() != region.ptr:
            raise ValueError(f"mapped memory on {t.device}, the staging memory on {self.device}")
        return t

    def pool(self, n: int):
        return self.torch.zeros(n, dtype=self.torch.uint8, device=self.device)

    def view(self, pool, off, shape, dtype):
        n = int(np.prod(shape)) * ITEMSIZE[dtype]
        return pool[off:off + n].view(self.dtypes[dtype]).view(tuple(shape))

    def rows(self, shard, rows, cols):
        return shard.reshape(rows, cols)

    def recv_buffer(self, dst):
        if dst.device.type == "cpu":
            return dst
        return self.torch.empty(dst.shape, dtype=dst.dtype, pin_memory=True)

    def upload(self, host, dst) -> None:
        if host is not dst:
            dst.copy_(host, non_blocking=True)

    def copy(self, dst, src) -> None:
        dst.copy_(src, non_blocking=True)

    def crosses(self, src) -> bool:
        return src.device.type == "cpu" and self.device.type != "cpu"

    def copy_many(self, dsts, srcs) -> None:
        # one multi-tensor launch for a job's pieces (16 per expert job) rather than one each
        if len(dsts) > 1 and hasattr(self.torch, "_foreach_copy_"):
            try:
                self.torch._foreach_copy_(dsts, srcs, non_blocking=True)
                return
            except (RuntimeError, TypeError):  # a mix it does not take: one by one
                pass
        for d, s in zip(dsts, srcs):
            self.copy(d, s)

    def quantize(self, src, q, s) -> None:
        if quant_triton.available(src):  # one launch, no temporaries
            quant_triton.quantize_into(src, q, s)
            return
        qq, ss = quantize_torch(src)
        q.copy_(qq)
        s.copy_(ss)

    def reads_in_place(self, src) -> bool:
        return src.device == self.device

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.current_stream(self.device).synchronize()

    def begin(self) -> None:
        """At a step's start: the stream it runs on (looked up once, not per marker)."""
        self._stream = self.torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

    def record(self, timing: bool = False):
        if self.device.type != "cuda":
            return None
        ev = self.torch.cuda.Event(enable_timing=timing)
        ev.record(self._stream)
        return ev

    def wait(self, ev) -> None:
        if ev is not None:
            ev.synchronize()

    def address(self, t) -> int:
        return t.data_ptr()

    def can_capture(self) -> bool:
        return self.device.type == "cuda"

    def capture(self):
        """(a graph, the context that captures into it). Thread-local capture: the
        engine's own threads may touch CUDA meanwhile."""
        g = self.torch.cuda.CUDAGraph()
        return g, self.torch.cuda.graph(g, capture_error_mode="thread_local")

    def marker_in_graph(self):
        """A marker recorded by the graph being captured, each time it replays."""
        ev = self.torch.cuda.Event(external=True)
        ev.record(self._stream)
        return ev

    def replay(self, g) -> None:
        g.replay()

    def elapsed(self, e0, e1) -> float:
        """GPU seconds between two markers (both complete)."""
        return 0.0 if e0 is None or e1 is None else e0.elapsed_time(e1) / 1e3

    def byte_view(self, t):
        return t.reshape(-1).view(self.torch.uint8)

    def staging(self, src):
        # A graph copies from the host only out of pinned memory; torch stages a strided
        # host view through unpinned memory, which a capture refuses.
        if src.device.type != "cpu" or self.device.type == "cpu" or (src.is_contiguous() and src.is_pinned()):
            return None
        return self.torch.empty(src.shape, dtype=src.dtype, pin_memory=True)

    def fill(self, buf, src) -> None:
        buf.copy_(src)

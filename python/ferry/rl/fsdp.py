"""A trainer's metadata and shards from a module that FSDP2 (`fully_shard`) sharded.

Each parameter of such a module is a DTensor: its global shape, dtype and placements,
the ranks of its device mesh, and its local shard (`to_local()`: in pinned host memory
under `CPUOffloadPolicy`, else on the GPU). `blocks` turns them into the TrainerBlocks
the schedule is built from and `shards` into the `shards` argument of
`WeightSender.step`, the module's own memory: nothing is copied, and an optimiser step
that updates the shards in place is what the next transfer sends.

Logical names: `name` maps a parameter's qualified name to the name the inference
side's recipes use (by default Hugging Face's "model." prefix is dropped:
"model.layers.0.self_attn.q_proj.weight" -> "layers.0.self_attn.q_proj.weight");
returning None leaves a parameter out. Only 1-D meshes with Shard(0) or Replicate()
are taken (FSDP2's own layout; HSDP and expert-parallel meshes need their sub-mesh
split into blocks first).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .meta import TrainerBlock, rows_cols
from .quant import dtype_name


def hf_name(fqn: str) -> Optional[str]:
    return fqn[len("model."):] if fqn.startswith("model.") else fqn


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    return DTensor


def _placements(fqn: str, p: Any) -> tuple[str, ...]:
    if p.device_mesh.ndim != 1 or len(p.placements) != 1:
        raise ValueError(f"{fqn}: a {p.device_mesh.ndim}-D mesh; blocks take 1-D FSDP meshes")
    pl = p.placements[0]
    if pl.is_replicate():
        return ("Replicate()",)
    if pl.is_shard() and pl.dim == 0:
        return ("Shard(0)",)
    raise ValueError(f"{fqn}: placement {pl}; blocks take Shard(0) or Replicate()")


def _params(module: Any, name: Callable[[str], Optional[str]]):
    DTensor = _dtensor_type()
    for fqn, p in module.named_parameters():
        logical = name(fqn)
        if logical is None:
            continue
        if not isinstance(p, DTensor):
            raise ValueError(f"{fqn}: not a DTensor (is the module fully_shard-ed?); map it to None to leave it out")
        yield fqn, logical, p


def blocks(module: Any, rank: int, *, group: str = "dense", name: Callable[[str], Optional[str]] = hf_name,
           rank_of: Callable[[int], int] = lambda r: r) -> list[TrainerBlock]:
    """This rank's TrainerBlocks, one per parameter, in the module's order. `rank_of`
    maps a mesh's (global) rank to its trainer rank in the schedule."""
    out = []
    for fqn, logical, p in _params(module, name):
        mesh = tuple(rank_of(int(r)) for r in p.device_mesh.mesh.flatten().tolist())
        local = p.to_local()
        b = TrainerBlock(logical, tuple(p.shape), dtype_name(p.dtype), 0, group, mesh,
                         _placements(fqn, p), offloaded=local.device.type == "cpu")
        if tuple(local.shape) != b.local_shape(rank):  # FSDP2 chunks dim 0 as shard_rows does
            raise ValueError(f"{fqn}: local shard {tuple(local.shape)}, expected {b.local_shape(rank)} "
                             f"of {tuple(p.shape)} on rank {rank} of {mesh}")
        out.append(b)
    return out


def shards(module: Any, *, name: Callable[[str], Optional[str]] = hf_name) -> dict:
    """{(logical name, 0): the local shard as 2-D rows} for WeightSender.step: views of
    the module's own shard memory (written in place, they update the module)."""
    out = {}
    for _, logical, p in _params(module, name):
        # detached: the same memory, without the autograd view that forbids writing it in place
        local = p.to_local().detach()
        out[(logical, 0)] = local.reshape(rows_cols(tuple(local.shape))) if local.dim() != 2 else local
    return out

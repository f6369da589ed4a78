"""Metadata both sides publish once: trainer DTensor blocks, inference tensors, recipes.

Every tensor is addressed through its 2-D view: all dimensions but the last folded
into rows (a stacked expert weight [E, out, in] has E*out rows). Row ranges of that
view are what FSDP's Shard(0) cuts (a chunk of dim 0 is a run of whole rows), what
expert parallelism cuts, and what fusion concatenates; column ranges are what a row
parallel layer (o_proj, down_proj) cuts on the inference side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .quant import ITEMSIZE, scale_shape


def rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:  # a vector is a column: FSDP's Shard(0) still cuts rows
        return shape[0], 1
    return math.prod(shape[:-1]), shape[-1]


@dataclass(frozen=True)
class TrainerBlock:
    """One DTensor as one trainer sub-mesh holds it (a whole parameter, or an expert
    parallel slice of one): global shape, dtype, placements on a 1-D FSDP mesh."""

    name: str  # logical parameter name
    shape: tuple[int, ...]  # global shape of this DTensor
    dtype: str
    row0: int  # first row of this block in the logical parameter's 2-D view
    group: str  # MeshGroup (sharding strategy) it belongs to
    mesh: tuple[int, ...]  # trainer ranks of the sub-mesh, in mesh order
    placements: tuple[str, ...] = ("Shard(0)",)
    offloaded: bool = False

    @property
    def rows(self) -> int:
        return rows_cols(self.shape)[0]

    @property
    def cols(self) -> int:
        return rows_cols(self.shape)[1]

    @property
    def row_bytes(self) -> int:
        return self.cols * ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def shard_rows(self, rank: int) -> tuple[int, int]:
        """Rows [a, b) of this block (2-D view) that `rank` holds: FSDP2's Shard(0),
        chunks of ceil(dim0 / n) along dim 0 (the last ones short or empty)."""
        if self.placements == ("Replicate()",):
            return 0, self.rows
        n = len(self.mesh)
        i = self.mesh.index(rank)
        per = self.rows // self.shape[0]
        chunk = -(-self.shape[0] // n)
        a = min(i * chunk, self.shape[0]) * per
        b = min((i + 1) * chunk, self.shape[0]) * per
        return a, b

    def held(self, rank: int, part: "Part") -> tuple[int, int]:
        """Rows [a, e) of this block (its own row numbers) that `rank` holds of `part`, a
        piece of this block's parameter; empty when a >= e."""
        sa, sb = self.shard_rows(rank)
        return max(sa, part.r0 - self.row0), min(sb, part.r1 - self.row0)

    def holds(self, rank: int, a: int, e: int) -> bool:
        """Whether `rank` holds rows [a, e) of this block whole."""
        sa, sb = self.shard_rows(rank)
        return sa <= a and e <= sb

    def local_shape(self, rank: int) -> tuple[int, ...]:
        a, b = self.shard_rows(rank)
        per = self.rows // self.shape[0]
        return ((b - a) // per,) + tuple(self.shape[1:])


@dataclass(frozen=True)
class Part:
    """Rows [r0, r1) and columns [c0, c1) of a logical parameter's 2-D view."""

    param: str
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def rows(self) -> int:
        return self.r1 - self.r0

    @property
    def cols(self) -> int:
        return self.c1 - self.c0


@dataclass(frozen=True)
class Recipe:
    """How one inference tensor is made: its parts concatenated along rows (fusion),
    each part cut from a trainer parameter (TP / EP slicing), optionally quantised to
    fp8 e4m3 part by part, the parts' block scales concatenated into `scale`."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    parts: tuple[Part, ...]
    scale: Optional[str] = None  # name of the fp32 scale tensor (fp8 only)
    scale_shape: Optional[tuple[int, ...]] = None

    @property
    def quantised(self) -> bool:
        return self.dtype == "float8_e4m3fn"

    def check(self) -> None:
        rows, cols = rows_cols(self.shape)
        if sum(p.rows for p in self.parts) != rows or any(p.cols != cols for p in self.parts):
            raise ValueError(f"recipe {self.name}: parts do not tile shape {self.shape}")
        if self.quantised:
            srows = sum(scale_shape(p.rows, p.cols)[0] for p in self.parts)
            want = (srows, scale_shape(1, cols)[1])
            if self.scale is None or rows_cols(self.scale_shape) != want:
                raise ValueError(f"recipe {self.name}: scale shape {self.scale_shape}, want {want} rows x cols")


@dataclass(frozen=True)
class InferenceTensor:
    """A live weight (or scale) tensor of one inference rank: where its bytes are."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    desc: bytes  # MrDesc.bytes() of the registered region holding it
    offset: int  # byte offset of the tensor inside that region

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class TrainerMeta:
    rank: int
    nics: int
    blocks: tuple[TrainerBlock, ...]  # every block whose sub-mesh holds this rank


@dataclass(frozen=True)
class InferenceMeta:
    rank: int  # inference rank (0..n-1)
    recipes: tuple[Recipe, ...]
    tensors: tuple[InferenceTensor, ...] = field(default=())

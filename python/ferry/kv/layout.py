"""How one tensor-parallel rank's paged KV cache sits in memory (docs/KV.md, "Layout").

A page holds ``tokens_per_page`` tokens of this rank's KV heads for one layer and one of
K or V. Its bytes are ordered either ``"HND"`` (heads, tokens, head dim: the head slice a
peer of another TP degree owns is one contiguous piece of the page) or ``"NHD"`` (tokens,
heads, head dim: the slice is one piece per token). Page ``p`` of layer ``l``'s K lives at
``k_offsets[l] + p * page_stride`` of region ``k_regions[l]`` (V likewise), so separate
tensors per layer, one tensor per layer holding K and V, and one cross-layer tensor are
all described the same way.

The handshake blob carries the whole layout; ``compat_hash`` covers what both sides must
agree on (model, layers, heads, head dim, dtype, page size in tokens, page order), not
what may differ (TP degree and rank, page count, strides, placement).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .errors import LayoutMismatch
from .._errors import InvalidArgument

__all__ = ["KvLayout", "DTYPE_BYTES", "heads_of", "head_sources"]

DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

_COMPAT_FIELDS = (
    "model",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "dtype",
    "tokens_per_page",
    "page_order",
)

_BLOB_VERSION = 1


def _hash(compat: dict) -> str:
    blob = json.dumps(compat, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def heads_of(num_kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """KV heads [lo, hi) that rank `tp_rank` of `tp_size` holds.

    With fewer heads than ranks (GQA at high TP) every head is replicated on
    tp_size / num_kv_heads consecutive ranks, as vLLM and SGLang place them.
    """
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size:
            raise InvalidArgument(f"{num_kv_heads} KV heads do not split over TP {tp_size}")
        n = num_kv_heads // tp_size
        return tp_rank * n, (tp_rank + 1) * n
    if tp_size % num_kv_heads:
        raise InvalidArgument(f"TP {tp_size} is not a multiple of {num_kv_heads} KV heads")
    h = tp_rank // (tp_size // num_kv_heads)
    return h, h + 1


def head_sources(src: "KvLayout", dst: "KvLayout") -> list[tuple[int, int, int]]:
    """Which source ranks supply `dst`'s heads: [(src_rank, head_lo, head_hi)], covering
    dst's heads once. With replicated heads the copy whose index matches dst's rank
    (modulo the replicas) is chosen, so that decode ranks spread over the prefill ranks."""
    src.check_compatible(dst)
    lo, hi = dst.heads
    out: list[tuple[int, int, int]] = []
    for h in range(lo, hi):
        owners = [r for r in range(src.tp_size) if heads_of(src.num_kv_heads, src.tp_size, r)[0] <= h
                  < heads_of(src.num_kv_heads, src.tp_size, r)[1]]
        r = owners[dst.tp_rank % len(owners)]
        if out and out[-1][0] == r and out[-1][2] == h:
            out[-1] = (r, out[-1][1], h + 1)
        else:
            out.append((r, h, h + 1))
    return out


@dataclass(frozen=True)
class KvLayout:
    """One rank's paged KV cache (see the module docstring).

    ``k_offsets``/``v_offsets``: byte offset of page 0 of each layer's K/V in its region
    (``k_regions``/``v_regions``: index into the buffers registered with the layout). Left
    empty, the default placement is one region ``[layers][K, V][pages][page_bytes]``.
    ``page_stride`` 0 means ``page_bytes``.
    """

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_page: int
    num_pages: int
    tp_rank: int = 0
    tp_size: int = 1
    page_order: str = "HND"
    page_stride: int = 0
    k_regions: tuple = ()
    k_offsets: tuple = ()
    v_regions: tuple = ()
    v_offsets: tuple = ()
    layer_groups: tuple = field(default=())  # ((first, last+1), ...): layers sharing page ids

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise InvalidArgument(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if self.page_order not in ("HND", "NHD"):
            raise InvalidArgument(f"page_order must be 'HND' or 'NHD', got {self.page_order!r}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "tokens_per_page", "num_pages",
                     "tp_size"):
            if int(getattr(self, name)) <= 0:
                raise InvalidArgument(f"{name} must be positive (got {getattr(self, name)})")
        if not 0 <= self.tp_rank < self.tp_size:
            raise InvalidArgument(f"tp_rank {self.tp_rank} is not in [0, {self.tp_size})")
        heads_of(self.num_kv_heads, self.tp_size, self.tp_rank)  # raises when it does not split
        set_ = object.__setattr__
        if self.page_stride == 0:
            set_(self, "page_stride", self.page_bytes)
        if self.page_stride < self.page_bytes:
            raise InvalidArgument(f"page_stride {self.page_stride} < page_bytes {self.page_bytes}")
        L = self.num_layers
        if not self.k_offsets:
            per_kind = self.num_pages * self.page_stride
            set_(self, "k_regions", (0,) * L)
            set_(self, "v_regions", (0,) * L)
            set_(self, "k_offsets", tuple(2 * l * per_kind for l in range(L)))
            set_(self, "v_offsets", tuple((2 * l + 1) * per_kind for l in range(L)))
        for name in ("k_regions", "k_offsets", "v_regions", "v_offsets"):
            v = tuple(int(x) for x in getattr(self, name))
            if len(v) != L:
                raise InvalidArgument(f"{name} has {len(v)} entries for {L} layers")
            set_(self, name, v)
        if not self.layer_groups:
            set_(self, "layer_groups", ((0, L),))
        groups = tuple((int(a), int(b)) for a, b in self.layer_groups)
        if groups[0][0] != 0 or groups[-1][1] != L or any(
            a >= b or (i and groups[i - 1][1] != a) for i, (a, b) in enumerate(groups)
        ):
            raise InvalidArgument(f"layer_groups {groups} must cover layers 0..{L} in order")
        set_(self, "layer_groups", groups)

    # ------------------------------------------------------------------ derived

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def heads(self) -> tuple[int, int]:
        """The KV heads [lo, hi) this rank holds."""
        return heads_of(self.num_kv_heads, self.tp_size, self.tp_rank)

    @property
    def heads_per_rank(self) -> int:
        lo, hi = self.heads
        return hi - lo

    @property
    def row_bytes(self) -> int:
        """One token of this rank's heads (NHD) / one head of one token (HND: head_dim)."""
        return self.heads_per_rank * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        return self.tokens_per_page * self.heads_per_rank * self.head_dim * self.itemsize

    @property
    def num_regions(self) -> int:
        return max(max(self.k_regions), max(self.v_regions)) + 1

    def region_bytes(self) -> list[int]:
        """Smallest size of each region that holds every page."""
        size = [0] * self.num_regions
        span = (self.num_pages - 1) * self.page_stride + self.page_bytes
        for regs, offs in ((self.k_regions, self.k_offsets), (self.v_regions, self.v_offsets)):
            for r, o in zip(regs, offs):
                size[r] = max(size[r], o + span)
        return size

    def group_of(self, layer: int) -> int:
        for g, (a, b) in enumerate(self.layer_groups):
            if a <= layer < b:
                return g
        raise InvalidArgument(f"layer {layer} is not in [0, {self.num_layers})")

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_page)

    # ------------------------------------------------------------------ handshake

    def compat_dict(self) -> dict:
        return {k: getattr(self, k) for k in _COMPAT_FIELDS} | {"layer_groups": self.layer_groups}

    @property
    def compat_hash(self) -> str:
        """16 hex digits over what peers must agree on."""
        return _hash(self.compat_dict())

    def to_blob(self) -> bytes:
        d = dataclasses.asdict(self)
        d["v"] = _BLOB_VERSION
        d["hash"] = self.compat_hash
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_blob(cls, blob: bytes) -> "KvLayout":
        try:
            d = json.loads(bytes(blob).decode())
            if not isinstance(d, dict):
                raise ValueError("not an object")
            version, h = d.pop("v", None), d.pop("hash", None)
            if version != _BLOB_VERSION:
                raise ValueError(f"blob version {version!r}, expected {_BLOB_VERSION}")
            names = {f.name for f in dataclasses.fields(cls)}
            if set(d) - names:
                raise ValueError(f"unknown fields {sorted(set(d) - names)}")
            for k in ("k_regions", "k_offsets", "v_regions", "v_offsets"):
                d[k] = tuple(d.get(k, ()))
            d["layer_groups"] = tuple(tuple(g) for g in d.get("layer_groups", ()))
            compat = {k: d[k] for k in _COMPAT_FIELDS} | {"layer_groups": d["layer_groups"]}
            if _hash(compat) != h:
                raise LayoutMismatch(f"KV layout blob hash {h!r} does not match its fields")
            layout = cls(**d)
        except LayoutMismatch:
            raise
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"malformed KV layout blob: {e}") from None
        return layout

    def check_compatible(self, peer: "KvLayout") -> None:
        """Raise LayoutMismatch naming every field on which `peer` differs."""
        if self.compat_hash == peer.compat_hash:
            return
        mine, theirs = self.compat_dict(), peer.compat_dict()
        diff = [f"{k}: {mine[k]!r} here, {theirs[k]!r} at the peer" for k in mine
                if mine[k] != theirs[k]]
        raise LayoutMismatch("incompatible KV layouts (" + "; ".join(diff) + ")")

    # ------------------------------------------------------------------ helpers

    @classmethod
    def for_ranks(cls, tp_size: int, **kw) -> list["KvLayout"]:
        """The layouts of every rank of one TP group (same arguments otherwise)."""
        return [cls(tp_rank=r, tp_size=tp_size, **kw) for r in range(tp_size)]

    def replace(self, **kw) -> "KvLayout":
        return dataclasses.replace(self, **kw)


def piece_geometry(src: KvLayout, dst: KvLayout, head_lo: int, head_hi: int
                   ) -> tuple[list[tuple[int, int]], int, bool]:
    """Where heads [head_lo, head_hi) sit in a page of `src` and of `dst`.

    Returns ([(src_offset, dst_offset)] within the page, piece length, whole_page): one
    piece for HND (or NHD carrying every head of both sides), else one per token.
    """
    isz, hd, tpp = src.itemsize, src.head_dim, src.tokens_per_page
    s0, d0 = src.heads[0], dst.heads[0]
    n = head_hi - head_lo
    whole = (n == src.heads_per_rank == dst.heads_per_rank)
    if src.page_order == "HND":
        length = n * tpp * hd * isz
        return [((head_lo - s0) * tpp * hd * isz, (head_lo - d0) * tpp * hd * isz)], length, whole
    if whole:
        return [(0, 0)], src.page_bytes, True
    length = n * hd * isz
    pieces = [(t * src.row_bytes + (head_lo - s0) * hd * isz,
               t * dst.row_bytes + (head_lo - d0) * hd * isz) for t in range(tpp)]
    return pieces, length, False


def check_regions(layout: KvLayout, sizes: Sequence[int], what: str = "region") -> None:
    need = layout.region_bytes()
    if len(sizes) != len(need):
        raise InvalidArgument(f"the layout has {len(need)} {what}(s), {len(sizes)} given")
    for i, (have, want) in enumerate(zip(sizes, need)):
        if have < want:
            raise InvalidArgument(f"{what} {i} holds {have} bytes, the layout needs {want}")


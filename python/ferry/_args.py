"""Arguments the Python layer checks itself (engine configuration, waits, scatter
targets); the extension checks those of every call it receives."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Iterable, Optional

from ._errors import FerryError, InvalidArgument, InvalidArgumentType
from ._ferry import ScatterDst


def _int_arg(value: Any, name: str, lo: int, hi: int, range_text: str) -> int:
    """An int (or anything with __index__, not bool) in [lo, hi], naming `name` otherwise."""
    if isinstance(value, bool):
        raise InvalidArgumentType(f"{name} must be an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgumentType(f"{name} must be an int, got {type(value).__name__}") from None
    if not lo <= v <= hi:
        if lo == 0 and v < 0:
            raise InvalidArgument(f"{name} must not be negative (got {v})")
        raise InvalidArgument(f"{name} must be in {range_text} (got {v})")
    return v


def _seconds_arg(value: Any, name: str) -> Optional[float]:
    """None or a non-negative number of seconds; more than 10**9 s (or inf) is None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentType(
            f"{name} must be a number of seconds or None, got {type(value).__name__}"
        )
    try:
        t = float(value)
    except OverflowError:  # an int beyond float: as good as forever (or negative)
        t = math.inf if value > 0 else -math.inf
    if math.isnan(t) or t < 0:
        raise InvalidArgument(
            f"{name} must be a non-negative number of seconds or None (got {value!r})"
        )
    return None if t > 1e9 else t


def _str_list_arg(value: Any, name: str) -> list:
    if isinstance(value, str):
        return [value]
    try:
        items = list(value)
    except TypeError:
        raise InvalidArgumentType(
            f"{name} must be a list of NIC names (str), got {type(value).__name__}"
        ) from None
    for i, n in enumerate(items):
        if not isinstance(n, str):
            raise InvalidArgumentType(f"{name}[{i}] must be a NIC name (str), got {type(n).__name__}")
    return items


_SCATTER_SHAPE = "ScatterDst or a tuple (length, src_offset, dst[, dst_offset])"


def _desc_list(dsts: Iterable[Any]) -> list:
    try:
        items = list(dsts)
    except TypeError:
        raise InvalidArgumentType(
            f"dsts must be an iterable of {_SCATTER_SHAPE}, got {type(dsts).__name__}"
        ) from None
    out = []
    for i, d in enumerate(items):
        if isinstance(d, ScatterDst):
            out.append(d)
        elif isinstance(d, (tuple, list)):
            if len(d) not in (3, 4):
                raise InvalidArgument(
                    f"scatter target {i}: expected {_SCATTER_SHAPE}, got a {type(d).__name__} "
                    f"of {len(d)} item{'' if len(d) == 1 else 's'}"
                )
            try:
                out.append(ScatterDst(*d))
            except FerryError as e:  # which field: "length must not be negative", ...
                raise type(e)(f"scatter target {i}: {e}") from None
        else:
            raise InvalidArgumentType(
                f"scatter target {i}: expected {_SCATTER_SHAPE}, got {type(d).__name__}"
            )
    return out


def _list_arg(value: Any, name: str, what: str) -> list:
    if isinstance(value, list):
        return value
    try:
        return list(value)
    except TypeError:
        raise InvalidArgumentType(
            f"{name} must be an iterable of {what}, got {type(value).__name__}"
        ) from None


def _gid_index(value: Any) -> int:
    # The range is the engine's to check (the same error as from C++); refused here
    # is only what cannot become a C int, as InvalidArgument rather than TypeError.
    try:
        index = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        index = None
    if index is None or not -(2**31) <= index < 2**31:
        raise InvalidArgument(f"verbs_gid_index {value!r} (-1 = automatic, else a GID table index)")
    return index

"""Typed errors of ferry.kv: each derives from the ferry error class of the same meaning."""

from __future__ import annotations

from .._errors import Aborted, FailedPrecondition, InvalidArgument, Timeout, Unavailable

__all__ = ["LayoutMismatch", "RequestRefused", "RequestAborted", "PeerDead", "TransferTimeout"]


class LayoutMismatch(InvalidArgument):
    """The peer's KV layout is incompatible (model, layers, heads, head dim, dtype, page size,
    page order or tensor parallelism); the message names every field that differs."""


class RequestRefused(FailedPrecondition):
    """The prefiller refused a request. ``reason`` is one of ``Refusal``'s names."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class RequestAborted(Aborted):
    """The request was aborted (by this side or the peer) before it completed."""


class PeerDead(Unavailable):
    """The peer process went away (its engine no longer answers)."""


class TransferTimeout(Timeout):
    """The request's deadline passed before every write arrived."""

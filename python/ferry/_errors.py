"""Exceptions raised by ferry: one class per ferry::Code, all deriving from FerryError.

Each class also derives from the closest built-in exception, so that generic
handlers work (``except TimeoutError`` catches :class:`Timeout`, ``except
ValueError`` catches :class:`InvalidArgument`, ...).
"""

from __future__ import annotations

__all__ = [
    "FerryError",
    "Cancelled",
    "InvalidArgument",
    "Timeout",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "ResourceExhausted",
    "FailedPrecondition",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "Aborted",
]


class FerryError(Exception):
    """Base class of every ferry error.

    ``code`` is the status code name (``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``,
    ...); ``str(e)`` is the engine's message (peer, NIC, library call).
    """

    code: str = "UNKNOWN"

    @property
    def message(self) -> str:
        """The error message (same as ``str(e)``)."""
        return str(self.args[0]) if self.args else ""


class Cancelled(FerryError):
    """The engine stopped before the operation finished."""

    code = "CANCELLED"


class InvalidArgument(FerryError, ValueError):
    """Malformed input: bad bytes, wrong dtype, non-contiguous array, bad routing."""

    code = "INVALID_ARGUMENT"


class Timeout(FerryError, TimeoutError):
    """An operation or a wait ran past its deadline (ferry code DEADLINE_EXCEEDED)."""

    code = "DEADLINE_EXCEEDED"


DeadlineExceeded = Timeout


class NotFound(FerryError, KeyError):
    """Unknown (or unregistered) handle, counter or peer group."""

    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class AlreadyExists(FerryError):
    """Duplicate registration."""

    code = "ALREADY_EXISTS"


class ResourceExhausted(FerryError):
    """Pools, queues or slots are full."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(FerryError, RuntimeError):
    """The state forbids it: stopped engine, NIC-count mismatch, read-only target."""

    code = "FAILED_PRECONDITION"


class OutOfRange(FerryError, IndexError):
    """Offset plus length past a registered region."""

    code = "OUT_OF_RANGE"


class Unimplemented(FerryError, NotImplementedError):
    """Feature not available in this build or on this NIC."""

    code = "UNIMPLEMENTED"


class Internal(FerryError, RuntimeError):
    """A bug or an unexpected provider return."""

    code = "INTERNAL"


class Unavailable(FerryError, ConnectionError):
    """Transport failure: peer unreachable, provider error."""

    code = "UNAVAILABLE"


class Aborted(FerryError, ConnectionError):
    """The peer restarted (stale incarnation); the transfer was dropped."""

    code = "ABORTED"


BY_CODE: dict[str, type[FerryError]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        InvalidArgument,
        Timeout,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        Aborted,
    )
}

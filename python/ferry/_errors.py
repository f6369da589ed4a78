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
    "InvalidArgumentType",
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
    """The engine stopped before the operation finished (a transfer, an ImmCounter.wait)."""

    code = "CANCELLED"


class InvalidArgument(FerryError, ValueError):
    """Malformed input: bad bytes, wrong dtype, non-contiguous array, bad routing."""

    code = "INVALID_ARGUMENT"


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type (code INVALID_ARGUMENT); the message names it.

    Both an :class:`InvalidArgument` and a ``TypeError``, so either handler catches it.
    """


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
    """Duplicate registration, or an immediate already counted another way (an
    ``imm_counter`` and an ``expect_imm_count`` on the same immediate)."""

    code = "ALREADY_EXISTS"


class ResourceExhausted(FerryError):
    """Pools, queues or slots are full."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(FerryError, RuntimeError):
    """The state forbids it: stopped engine, NIC-count mismatch, read-only target."""

    code = "FAILED_PRECONDITION"


class OutOfRange(FerryError, IndexError):
    """Offset plus length past a registered region (also: an offset or length of 2**63 or
    more, a page index of 2**32 or more, a group number past the engine's groups)."""

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


# One class per code (what the extension raises for a ferry::Error); InvalidArgumentType
# shares INVALID_ARGUMENT and is raised by the extension for wrongly typed arguments.
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

"""Transfer: the completion handle of one submitted transfer (a Future)."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Generator, Optional

from . import _ferry
from ._args import _seconds_arg
from ._errors import FailedPrecondition, Timeout

__all__ = ["Transfer"]


class Transfer(concurrent.futures.Future):
    """Completion handle of one submitted transfer (a ``concurrent.futures.Future``).

    It resolves on the engine's callback thread once all local work is done
    (the NICs reported every piece): ``result()`` returns None or raises the
    ferry exception (``ferry.Unavailable``, ``ferry.Timeout``, ...). Remote
    visibility is signalled only by immediates. A transfer cannot be
    cancelled (``cancel()`` returns False). It is awaitable:
    ``await engine.submit_write(...)``; ``asyncio.wrap_future(t)`` works too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()  # running from the start: cancel() is refused
        self.id: int = 0  #: the engine's transfer id

    def _check_wait(self) -> None:
        if not self.done() and _ferry.in_callback():
            raise FailedPrecondition(
                "waiting for a transfer inside a ferry callback would block the callback "
                "thread that completes it; use add_done_callback or on_done instead"
            )

    def result(self, timeout: Optional[float] = None) -> None:
        """Wait up to `timeout` seconds (None: forever) for the transfer; raise its error.

        Raises ferry.Timeout (a TimeoutError) when it is still running at the deadline, and
        ferry.Cancelled when its engine stops first.
        """
        timeout = _seconds_arg(timeout, "timeout")
        self._check_wait()
        try:
            return super().result(timeout)
        except concurrent.futures.TimeoutError:
            if self.done():  # the transfer itself failed with a timeout-like error
                raise
            raise Timeout(f"transfer {self.id} still running after {timeout} s") from None

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Wait like result(); return the transfer's error or None."""
        timeout = _seconds_arg(timeout, "timeout")
        self._check_wait()
        try:
            return super().exception(timeout)
        except concurrent.futures.TimeoutError:
            raise Timeout(f"transfer {self.id} still running after {timeout} s") from None

    def wait(self, timeout: Optional[float] = None) -> None:
        """Alias of result(timeout)."""
        return self.result(timeout)

    def __await__(self) -> Generator[Any, None, None]:
        import asyncio  # here: `import ferry` does not load asyncio

        return asyncio.wrap_future(self).__await__()

    def __repr__(self) -> str:
        return f"<Transfer id={self.id} {self._state.lower()}>"

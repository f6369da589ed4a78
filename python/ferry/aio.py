"""asyncio helpers.

A :class:`ferry.Transfer` is awaitable as it is (``await engine.submit_write(...)``);
these helpers cover immediates, whose arrival is not a Transfer::

    counter = engine.imm_counter(7)
    await ferry.aio.wait_imm(counter, 4, timeout=5)      # consume 4 arrivals

    fut = ferry.aio.expect_imm(engine, 9, count=1)       # before the peer sends
    await fut
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from ._engine import Transfer, TransferEngine
from ._ferry import ImmCounter

__all__ = ["wrap", "wait_imm", "expect_imm"]


def wrap(transfer: Transfer, loop: Optional[asyncio.AbstractEventLoop] = None) -> "asyncio.Future[Any]":
    """The asyncio future of a Transfer (same as asyncio.wrap_future)."""
    return asyncio.wrap_future(transfer, loop=loop)


async def wait_imm(counter: ImmCounter, n: int = 1, timeout: Optional[float] = None) -> None:
    """Await n arrivals on an ImmCounter and consume them; ferry.Timeout after `timeout` s.

    Fast path without a thread hop when the arrivals are already there; otherwise the
    blocking wait (GIL released) runs in the loop's default executor.
    """
    if counter.try_consume(n):
        return
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, counter.wait, n, timeout)


def expect_imm(engine: TransferEngine, imm: int, count: int = 1) -> "asyncio.Future[None]":
    """An asyncio future resolved once `count` immediates `imm` arrived.

    Call it before the peer sends. It replaces an earlier expectation for `imm`; an
    imm_counter (or imm_counter_gpu) for `imm` on this engine makes it raise
    ferry.AlreadyExists (remove_imm_count first). The expectation stays installed (remove_imm_count to drop it).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def fire() -> None:
        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        loop.call_soon_threadsafe(resolve)

    engine.expect_imm_count(imm, count, fire)
    return fut

"""A bounded wait that never loses a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the result of an awaitable that finished in
the same turn of the event loop as the waiting task was cancelled, and drops the
cancellation (fixed in 3.12, where it is built on ``asyncio.timeout``). A cancelled
acquire would then go on as if nobody had cancelled it, and a connection task cancelled
by ``close()`` as its connection came up would take the channel over and wait on that
connection forever, holding ``close()`` with it. ``asyncio.timeout`` raises the
cancellation in every case. (Python 3.10 had only ``wait_for``, with the same fault: a
cancelled acquire went on waiting and took the lock; tenure needs 3.11.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["within"]

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """Await ``awaitable`` for at most ``seconds`` (None: without a bound).

    Raises:
        TimeoutError: not done in time.
    """
    async with asyncio.timeout(seconds):
        return await awaitable

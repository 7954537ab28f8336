"""Ending the driver's own tasks (connections, subscriptions), from whichever event loop
closes the client.

A client outlives event loops: each ``asyncio.run`` makes a new one, and the client's
connections follow the loop that uses them. ``aclose()`` may then run in a loop other
than the one that started a task. Such a task can be neither cancelled nor waited for
from here (its loop ended, which ended the task too, or it runs in another thread);
touching it raised ``RuntimeError: Event loop is closed``. Only the running loop's own
tasks are cancelled and awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["finish"]


async def finish(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until they end, those of the running loop only."""
    loop = asyncio.get_running_loop()
    ours = [task for task in tasks if task.get_loop() is loop]
    for task in ours:
        task.cancel()
    await asyncio.gather(*ours, return_exceptions=True)

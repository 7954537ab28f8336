"""The asyncio driver's watchdog: a task per watched lease drives the core's watchdog
flow (``Flows.watchdog``); a release cancels it.

The flow always begins with a pause (until the first extension, or until the validity's
end when it only watches). So the task is made only when that pause is over: until then
a timer stands for it, on the loop's heap of watches (``Deadlines``). ``async with
lock:`` watches every lease it holds (so that a loss can cancel the body), and most
bodies end long before the first pause does: they cost a timer set and cancelled, not a
task's creation, two steps, its cancellation and the wait for its end (about a sixth of
an uncontended acquire and release on one node).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._core.flows import ExtendLease, Op, Pause
from .._core.watchdog import KeepAlive
from .._driver.clock import monotonic
from .._driver.lease import watched
from .deadlines import Deadline
from .drive import adrive
from .tasks import finish

if TYPE_CHECKING:
    from .client import AsyncLease

__all__ = ["Watchdog"]


class Watchdog:
    """Extends (or only watches) one lease until it is released, lost or capped."""

    def __init__(self, lease: AsyncLease, policy: KeepAlive) -> None:
        self._lease = lease
        self.policy = policy
        self.extends = policy.extend  # False: it only watches (``async with lock:``)
        watched(lease)  # marked lost in a child after fork()
        self._flow = lease._client._flows.watchdog(lease, policy)
        self._first: Op | None = next(self._flow)
        self.task: asyncio.Task[None] | None = None
        self._timer: Deadline | None = None
        self._wakeup: asyncio.Future[None] | None = None  # resolved to end a pause early
        self._replanned = False  # the first pause, still a timer, was ended early
        first = self._first
        if isinstance(first, Pause):
            # On the loop's heap of watches, not a timer of the loop's own: one made and
            # cancelled per lease cost about as many calls of Python as the watch itself.
            self._watches = lease._client._channels.watches()
            self._timer = self._watches.add(
                self._watches.time() + max(first.until - monotonic(), 0.0), self._start
            )
        else:
            self._start()

    def _start(self, _when: float = 0.0) -> None:
        self._timer = None
        self.task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        """Stop it: before its task began, at once; afterwards, the task is cancelled
        (an extension in progress is cancelled with it, as any awaited call is)."""
        if self._timer is not None:
            self._watches.cancel(self._timer)
            self._timer = None
            self._flow.close()
        elif self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def replan(self) -> None:
        """The lease was extended by hand: end the pause, so that the flow plans its next
        wake from the lease as it is now (not from its own extensions: they plan)."""
        if self._timer is not None:
            # The first pause, still a timer: begin the task now, its pause over.
            self._watches.cancel(self._timer)
            self._replanned = True
            self._start()
        elif self.task is not asyncio.current_task():
            wakeup = self._wakeup
            if wakeup is not None and not wakeup.done():
                wakeup.set_result(None)

    async def join(self) -> None:
        """Wait for its task to end, once stopped (unless called from it). A task of
        another event loop is not waited for: the end of its loop (an ``asyncio.run``
        before this one) ended it (``_async/tasks.finish``)."""
        task = self.task
        if task is not None and task is not asyncio.current_task():
            await finish([task])

    async def _watch(self) -> None:
        first, self._first = self._first, None
        await adrive(self._flow, self._perform, first)

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, Pause):
            # Asked to stop, the task is cancelled; never told (the result is False).
            if self._replanned:
                self._replanned = False
                return False
            loop = asyncio.get_running_loop()
            self._wakeup = wakeup = loop.create_future()
            timer = loop.call_later(max(op.until - monotonic(), 0.0), _end, wakeup)
            try:
                await wakeup
            finally:
                timer.cancel()
                self._wakeup = None
            return False
        if isinstance(op, ExtendLease):
            return await self._lease._extend(None, op.policy)
        raise TypeError(f"not an operation of a watchdog: {op!r}")


def _end(wakeup: asyncio.Future[None]) -> None:
    if not wakeup.done():
        wakeup.set_result(None)

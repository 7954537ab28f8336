"""The deadlines of the rounds in flight on one event loop, on one timer.

A round waits for its replies until its deadline. With a timer of its own per round
(``loop.call_later``, cancelled once the round was decided, nearly always long before it
fired), every round made, scheduled and cancelled a timer, and the loop carried the
cancelled ones in its schedule until their time passed. Here a round pushes its deadline
on a heap, and one timer is armed at the earliest; it moves only when an earlier
deadline comes (rounds made one after another have later ones). A round that ends
cancels its entry, which stays on the heap, inert, until the timer passes it (a node
timeout later at most), or until cancelled entries outnumber the live ones on a large
heap, which is then rebuilt. Measured with callgrind against one node, the asyncio
client runs 4% fewer instructions per acquire and release with one task, 6% with 16.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable

__all__ = ["Deadline", "Deadlines"]

# Below this size the heap is never rebuilt: cancelled entries cost nothing there.
_COMPACT_FROM = 1024
# The loop runs a timer up to its clock's resolution early, as it runs ours.
_RESOLUTION = time.get_clock_info("monotonic").resolution


class Deadline:
    """One round's place on the heap: ``callback(when)`` runs at ``when`` unless
    cancelled first."""

    __slots__ = ("callback", "when")

    def __init__(self, when: float, callback: Callable[[float], None]) -> None:
        self.when = when
        self.callback: Callable[[float], None] | None = callback


class Deadlines:
    """Deadlines on ``loop``'s clock (``loop.time()``), served by one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()  # equal deadlines run in the order they came
        self._timer: asyncio.TimerHandle | None = None
        self._live = 0

    def add(self, when: float, callback: Callable[[float], None]) -> Deadline:
        """Run ``callback(when)`` once the loop's clock reaches ``when``."""
        entry = Deadline(when, callback)
        heap = self._heap
        if len(heap) >= _COMPACT_FROM and len(heap) > 2 * self._live:
            heap[:] = [item for item in heap if item[2].callback is not None]
            heapq.heapify(heap)
        heapq.heappush(heap, (when, next(self._order), entry))
        self._live += 1
        timer = self._timer
        if timer is None or when < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(when, self._fire)
        return entry

    def cancel(self, entry: Deadline) -> None:
        """Forget ``entry`` (its round ended first); nothing if it already ran."""
        if entry.callback is not None:
            entry.callback = None
            self._live -= 1

    def time(self) -> float:
        """Now, on the clock of the deadlines."""
        return self._loop.time()

    def __len__(self) -> int:
        """Deadlines still to run."""
        return self._live

    def _fire(self) -> None:
        self._timer = None
        heap = self._heap
        now = self._loop.time() + _RESOLUTION
        due: list[Deadline] = []
        while heap and (heap[0][2].callback is None or heap[0][0] <= now):
            entry = heapq.heappop(heap)[2]
            if entry.callback is not None:
                due.append(entry)
        for entry in due:
            callback = entry.callback
            if callback is not None:  # (an earlier callback may have cancelled it)
                entry.callback = None
                self._live -= 1
                # It may add a deadline (a grace): that one waits for a later turn.
                callback(entry.when)
        if heap and self._timer is None:
            self._timer = self._loop.call_at(heap[0][0], self._fire)

    def close(self) -> None:
        """Drop every deadline (the loop's channels are closed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
        self._live = 0

"""The blocking driver's watchdog: one daemon thread per kept-alive lease.

The thread drives the core's watchdog flow (``Flows.watchdog``): it sleeps on an event
(so a release stops it at once) and extends through ``Lease._extend`` (``extend``, with
the watchdog's policy, which judges whether a failed try is worth another); the flow
marks the lease lost when an extension fails for good, when it wakes after the validity
ended (the process was paused), or when the hold cap runs out.
After ``fork()`` the child marks every kept-alive lease lost (``_driver.lease.watched``):
the lease and its thread belong to the parent, and the child must not act as the holder.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._core.flows import ExtendLease, Op, Pause, drive
from .._core.watchdog import KeepAlive
from .._driver.clock import monotonic
from .._driver.events import Event
from .._driver.lease import watched

if TYPE_CHECKING:
    from .client import Lease

__all__ = ["Watchdog"]


class Watchdog:
    """Extends one lease in a daemon thread until it is released or lost."""

    def __init__(self, lease: Lease, policy: KeepAlive) -> None:
        self._lease = lease
        self.policy = policy
        self._stop = Event()
        self._nudged = Event()  # ends a pause: stopped, or to plan again
        self._thread = threading.Thread(
            target=self._run, name=f"tenure-watchdog[{lease.name}]", daemon=True
        )
        watched(lease)  # marked lost in a child after fork()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Tell the thread to stop (it ends after an extension in progress)."""
        self._stop.set()
        self._nudged.set()

    def replan(self) -> None:
        """The lease was extended by hand: end the pause, so that the flow plans its next
        wake from the lease as it is now (not from its own extensions: they plan)."""
        if threading.current_thread() is not self._thread:
            self._nudged.set()

    def join(self) -> None:
        """Wait for the thread to end, once told to stop (unless called from it). A
        release interrupted (Ctrl-C) before it told the watchdog to stop joins nothing:
        the lease is still held and kept alive, and waiting would hang the interrupt."""
        if (
            self._stop.is_set()
            and threading.current_thread() is not self._thread
            and self._thread.is_alive()
        ):
            self._thread.join()

    def _run(self) -> None:
        lease = self._lease
        drive(lease._client._flows.watchdog(lease, self.policy), self._perform)

    def _perform(self, op: Op) -> Any:
        if isinstance(op, Pause):
            self._nudged.wait(max(op.until - monotonic(), 0.0))
            self._nudged.clear()  # a nudge after this is read by the flow's next plan
            return self._stop.is_set()
        if isinstance(op, ExtendLease):
            return self._lease._extend(None, op.policy)
        raise TypeError(f"not an operation of a watchdog: {op!r}")

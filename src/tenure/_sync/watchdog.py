"""The blocking driver's watchdog: one daemon thread per kept-alive lease.

The thread carries out ``_core.watchdog.KeepAlive``: it sleeps on an event (so a release
stops it at once), extends, and marks the lease lost when an extension fails, when it
wakes after the validity ended (the process was paused), or when the hold cap runs out.
After ``fork()`` the child marks every kept-alive lease lost: the lease and its thread
belong to the parent, and the child must not act as the holder.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

from .._core.watchdog import Extend, GiveUp, KeepAlive, Lost
from .._driver.clock import monotonic
from .._driver.lease import closed_under
from .._errors import ClientClosed, InheritedLease, LeaseLost, NotHeld

if TYPE_CHECKING:
    from .client import Lease

__all__ = ["Watchdog"]


class Watchdog:
    """Extends one lease in a daemon thread until it is released or lost."""

    def __init__(self, lease: Lease, policy: KeepAlive) -> None:
        self._lease = lease
        self._policy = policy
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"tenure-watchdog[{lease.name}]", daemon=True
        )
        _WATCHED.add(lease)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread (unless called from it)."""
        self._stop.set()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        lease, policy = self._lease, self._policy
        wake = policy.next_wake(lease._state)
        while not self._stop.wait(max(wake - monotonic(), 0.0)):
            action = policy.decide(monotonic(), lease._state, lease._first_started)
            if isinstance(action, Lost):
                lease._mark_lost(action.error)
                return
            if isinstance(action, GiveUp):
                if not self._stop.wait(max(action.at - monotonic(), 0.0)):
                    lease._mark_lost(action.error)
                return
            assert isinstance(action, Extend)
            try:
                lease.extend()
            except NotHeld:
                return  # released meanwhile
            except LeaseLost:
                return  # extend() marked it lost
            except ClientClosed:
                lease._mark_lost(closed_under(lease.name))
                return
            except Exception as exc:  # anything unexpected: the lease can't be vouched for
                lease._mark_lost(LeaseLost(lease.name, f"the watchdog failed: {exc!r}"))
                return
            wake = policy.next_wake(lease._state)


_WATCHED: weakref.WeakSet[Lease] = weakref.WeakSet()


def _disown_after_fork() -> None:
    for lease in list(_WATCHED):
        lease._mark_lost(InheritedLease(lease.name, "use the lease", lease._pid), notify=False)
    _WATCHED.clear()


os.register_at_fork(after_in_child=_disown_after_fork)

"""The blocking driver's ``Event`` and ``Condition``, which a Ctrl-C cannot leave locked.

The standard library's ``threading.Event`` takes its lock through a ``Condition``,
whose ``__enter__`` and ``__exit__`` are Python functions around the lock's C ones. A
signal handler that raises as the C ``acquire`` returns, or as the Python ``__exit__``
begins, leaves the lock held, on every Python: the event's next ``set()``, ``clear()``
or ``wait()``, in any thread, waits for ever. And ``Condition.wait`` gives its lock up
before it enters the ``try`` whose ``finally`` takes it back: interrupted in between,
it raises with the lock given up, and the caller's ``with`` block, releasing a lock it
no longer holds, replaces the ``KeyboardInterrupt`` with a ``RuntimeError``. With real
signals (a 0.5 ms timer whose handler raises, in a loop, 200 runs each, Python 3.11):
``Event.wait(0)`` left its lock held 28 times and raised a ``RuntimeError`` 14 times,
``set()`` left it held 67 times, and ``Condition.wait(0)`` in a ``with`` of its lock
raised a ``RuntimeError`` 15 times. For tenure each was a hang, or the wrong exception:
a Ctrl-C in a release as it told the watchdog to stop left the watchdog unable to wake
and the next release waiting for ever; one in a wait on ``Lease.lost``, the thread that
found the lease lost, in its ``set()``, holding the lease's lock; one in a round's wait
for its connections, the connecting thread as it ended; one in a wait for a
notification, the thread filing them.

These take their lock with a ``with`` of a ``Guard`` (``_driver.guard``: its exit is the
C one, and on 3.14 its entry gives back what an interrupt took), and wake their waiters
without a Python call between the waking and the bookkeeping of it: a ``map`` of the
waiters' ``release``, made first, is drained by one C call, so an interrupt finds them
all woken and unlisted, or none. A waiter is a lock of its own, held until it is woken,
as in the standard library; an interrupted wait may leave it listed, and the next wake
releases it once, with nobody waiting on it (harmless). ``Condition.wait`` gives its
guard up inside its ``try`` and takes it back by ``taker``. Its one instant left: a
Ctrl-C while it waits for another thread to give the guard back (microseconds) leaves
it not taken, as the standard library's does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from time import monotonic

from .guard import Guard, taker

__all__ = ["Condition", "Event"]

_new_waiter = threading.Lock  # (Python 3.13 made it a class; a function before)
_release = type(threading.Lock()).release


def _sleep(waiter: threading.Lock, timeout: float | None) -> bool:
    """Until ``waiter`` is released (True) or ``timeout`` seconds pass (False)."""
    if timeout is None:
        return waiter.acquire()
    if timeout > 0:
        return waiter.acquire(True, min(timeout, threading.TIMEOUT_MAX))
    return waiter.acquire(False)


class Event(threading.Event):
    """A ``threading.Event`` a Ctrl-C cannot leave locked (module docstring).

    A subclass for what it promises to callers (``Lease.lost`` is one); it uses nothing
    of the parent's state.
    """

    def __init__(self) -> None:  # (not the parent's: no Condition)
        self._guard = Guard()
        self._flag = False
        self._waiters: list[threading.Lock] = []

    def _at_fork_reinit(self) -> None:
        # (The parent's, which the threading module calls for events of its own after a
        # fork; a guard or a waiter of a thread that is gone would block the child.)
        self._guard = Guard()
        self._waiters = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._guard:
            # No call returns to Python code between the map's making and its draining:
            # every waiter is unlisted and woken, or (interrupted as the map is made)
            # nothing is done.
            waking = map(_release, self._waiters)
            self._flag = True
            self._waiters = []
            deque(waking, 0)

    def clear(self) -> None:
        # Unguarded: one store, which falls before or after any guarded section (each
        # reads or writes the flag once), as if it had taken the guard.
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        waiter = _new_waiter()
        waiter.acquire()
        with self._guard:
            if self._flag:
                return True
            self._waiters.append(waiter)
        woken = _sleep(waiter, timeout)
        if not woken:
            with self._guard:
                if waiter in self._waiters:  # (not if set() took it out meanwhile)
                    self._waiters.remove(waiter)
        return woken


class Condition:
    """The part of ``threading.Condition`` the drivers use, over a ``Guard`` taken once
    (module docstring). ``wait`` and ``notify_all`` are called holding the guard."""

    __slots__ = ("_guard", "_waiters")

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._waiters: list[threading.Lock] = []

    def wait(self, timeout: float | None = None) -> bool:
        """Give the guard up until notified (True) or ``timeout`` seconds pass (False),
        then take it back."""
        waiter = _new_waiter()
        waiter.acquire()
        self._waiters.append(waiter)
        retaking = taker(self._guard)
        woken = False
        try:
            self._guard.release()  # inside the try: an interrupt as it returns is covered
            woken = _sleep(waiter, timeout)
            return woken
        finally:
            (_,) = retaking
            if not woken and waiter in self._waiters:
                self._waiters.remove(waiter)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """``wait`` until ``predicate()`` is true (its last answer), or ``timeout``."""
        end = None if timeout is None else monotonic() + timeout
        while not (answer := predicate()):
            left = None if end is None else end - monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
        return answer

    def notify_all(self) -> None:
        """Wake every waiter (as ``Event.set``: all, or none if interrupted first)."""
        waking = map(_release, self._waiters)
        self._waiters = []
        deque(waking, 0)

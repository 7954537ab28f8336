"""The drivers' mutex, which a Ctrl-C cannot leave held as its ``with`` block begins.

Python 3.14 compiles ``with lock:`` into a call of the lock's ``__enter__`` that, as
every call of a C function does, ends by running the signal handlers due, before the
block's handler is in place. A Ctrl-C that comes while the lock is being taken is raised
there: the lock is taken and the block's ``__exit__`` never runs, so the lock stays held
for good, and the next ``with`` of it, in any thread, waits for ever (CPython's tracker
has it as "`with lock`: can skip `__exit__` when a signal handler raises right after
`__enter__`"). With real signals, a timer's signal raising in a loop of ``with lock:
pass`` left a ``threading.Lock`` held 84 times of 200 on 3.14.10, an ``RLock`` 76 times,
and neither ever on 3.11, 3.12 or 3.13, which take the lock in one instruction that runs
no handler. For tenure it was a hang: an acquire interrupted there could not clean up,
its cleanup waiting for the lock the interrupt had left held.

``EnterGuarded`` takes the lock in an ``__enter__`` written in Python. The return of a
Python function runs no handler, so the ``with`` block is in place once ``__enter__``
returns; inside it, an interrupt raised as the C ``acquire`` returns is caught, and the
lock given back if this thread holds it. ``__exit__`` stays the C one: a Python
``__exit__`` would run the handlers due as it begins, before it gives the lock back. Its
cost: the start of ``__enter__`` runs the handlers due, one instant more for a Ctrl-C
(before the lock is taken: nothing held, but what the block was to do is not done), and
about 20 ns per ``with``. So ``Guard`` is ``EnterGuarded`` where the interpreter needs it
(3.14 and later) and the C ``RLock`` as it is before.

Both are re-entrant, as the guarded one has to know its owner: the thread that took it
gives it back. No caller takes one twice.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

__all__ = ["EnterGuarded", "Guard", "taker"]

if TYPE_CHECKING:
    # The stubs call the C RLock final; at run time it takes subclasses.

    class _RLock:
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
        def release(self) -> None: ...
        def _is_owned(self) -> bool: ...
        def __enter__(self) -> bool: ...
        def __exit__(self, *exc_info: object) -> None: ...

else:
    _RLock = type(threading.RLock())  # the C one (``threading.RLock`` is a function)


class EnterGuarded(_RLock):
    """An ``RLock`` whose ``with`` a Ctrl-C cannot leave held on Python 3.14 (module
    docstring)."""

    __slots__ = ()

    def __enter__(self) -> bool:
        try:
            return self.acquire()
        except BaseException:
            # Raised as acquire() returned (taken), or inside it, its wait interrupted
            # (not taken; an owner taking it again does not wait): what it took, it
            # gives back.
            if self._is_owned():
                self.release()
            raise


if TYPE_CHECKING:
    Guard = _RLock
elif sys.version_info >= (3, 14):
    Guard = EnterGuarded
else:
    Guard = _RLock


def taker(guard: _RLock) -> Iterator[bool]:
    """For a ``finally`` that must do its work under ``guard``: made before the ``try``
    and unpacked in the ``finally`` (``(_,) = taken``), it takes the guard from C, and
    no signal handler runs between the taking and the statements after it (give the
    guard back in a ``try``/``finally`` of their own). A ``with`` of the guard runs them
    as its ``__enter__`` begins on Python 3.14, and any call runs them as it returns: an
    interrupt there would skip the ``finally``'s work. An interrupt in the taking's wait
    leaves the guard not taken, and is raised."""
    return map(guard.acquire, (True,))

"""Real signals in the tests: a timer whose handler raises, as a Ctrl-C's does."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import pytest


class Interrupt(BaseException):
    """What the handler raises: a ``BaseException``, as ``KeyboardInterrupt`` is."""


main_thread_signals = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"),
    reason="signals reach the main thread only; setitimer is POSIX",
)


@contextmanager
def raising_on_alarm() -> Iterator[None]:
    """``SIGALRM`` raises ``Interrupt`` inside the block; the timer and the handler are
    put back after it."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Interrupt

    before = signal.signal(signal.SIGALRM, stop)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def interrupt(operation: Callable[[], object], after: float) -> None:
    """Run ``operation`` in a loop until the timer, armed for ``after`` seconds, raises
    ``Interrupt`` in it (inside ``raising_on_alarm``); any other exception fails the
    test."""
    with pytest.raises(Interrupt):
        _until_interrupted(operation, after)


def _until_interrupted(operation: Callable[[], object], after: float) -> None:
    # Armed here, inside the block that expects the interrupt: on a loaded machine the
    # signal may come before the loop begins.
    signal.setitimer(signal.ITIMER_REAL, after)
    for _ in range(10**7):
        operation()


def raising_at_return(
    k: int, exc: type[BaseException] = Interrupt
) -> Callable[[FrameType, str, object], None]:
    """A profile hook (``sys.setprofile``) raising ``exc`` as the ``k``-th C call
    returns, as a signal's handler may (the hook is not called for C functions that C
    code calls)."""
    returns = 0

    def hook(frame: FrameType, event: str, arg: object) -> None:
        nonlocal returns
        if event == "c_return":
            returns += 1
            if returns == k:
                sys.setprofile(None)
                raise exc

    return hook

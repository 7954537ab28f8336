"""A Ctrl-C at every instant of a blocking acquire and release: the lock is let go.

CPython raises a signal handler's exception (``KeyboardInterrupt``) only where it checks
for pending signals: after a call returns (before its value is stored), at a
function's first instruction, and at a loop's backward jump. This sweeps them all: one
``with lock:`` cycle (and its other forms) is run once to count the points where
tenure's code could be interrupted, then once per point with an interrupt raised
there, as CPython would raise it (from a profile function after a call returns: the
exception comes out of that call, in its caller's handlers; at a function's first
event; at a backward jump's opcode). After each: no key of the lock is left on the node
and the lock can be taken again at once, by the same thread, with no ``SelfDeadlock``.

The one instant Python code cannot cover is the first instruction of a ``__enter__`` or
``__exit__`` written in Python (a ``with`` statement calls it with nothing of its own
around it): an interrupt there leaves the block's lease held (docs/errors.md, "Ctrl-C").
Those points are checked to be exactly these, and to leave what the docs say.
"""

from __future__ import annotations

import dis
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis

import tenure
from tenure.testing import LocalCluster

from .conftest import Interrupted

SRC = str(Path(tenure.__file__).resolve().parent) + "/"
_JUMP_BACK = {dis.opmap[name] for name in ("JUMP_BACKWARD",) if name in dis.opmap}
_GENERATOR = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
# The first instruction of a Python ``__enter__``/``__exit__``: uncoverable.
DOCUMENTED = {("Lock", "__exit__"), ("Lease", "__enter__"), ("Lease", "__exit__")}


def _ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(SRC)


class Points:
    """Counts the interrupt points in tenure's code; raises ``Interrupted`` at point
    ``at`` (None: only count)."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.count = 0
        self.where: tuple[str, str, str, int] | None = None

    def _point(self, frame: FrameType, kind: str) -> None:
        if self.count == self.at:
            code = frame.f_code
            self.where = (kind, code.co_filename[len(SRC) :], code.co_qualname, frame.f_lineno)
            sys.setprofile(None)
            sys.settrace(None)
            self.count += 1
            raise Interrupted
        self.count += 1

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "return":
            # A Python call returned to tenure's code (a generator's yield or end is
            # the return of the C call that resumed it: ``c_return`` below).
            back = frame.f_back
            if not frame.f_code.co_flags & _GENERATOR and back is not None and _ours(back):
                self._point(back, "after a call")
        elif event == "c_return":
            if _ours(frame):
                self._point(frame, "after a call")
        elif event == "call" and _ours(frame) and not frame.f_code.co_flags & _GENERATOR:
            self._point(frame, "at the start")

    def trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if not _ours(frame):
            return None
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_code.co_code[frame.f_lasti] in _JUMP_BACK:
            self._point(frame, "at a loop's back-edge")
        return self.trace

    def run(self, cycle: Callable[[], None]) -> bool:
        """Run ``cycle``; whether it was interrupted."""
        sys.setprofile(self.profile)
        sys.settrace(self.trace)
        try:
            cycle()
        except Interrupted:
            return True
        finally:
            sys.setprofile(None)
            sys.settrace(None)
        return False


@pytest.fixture(scope="module")
def one() -> Iterator[LocalCluster]:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("an interrupt sweep traces the main thread")
    with LocalCluster(1) as cluster:
        yield cluster


FORMS = ["with lock", "with lock, watchdog", "with client.acquire()", "acquire() release()"]


def _cycle(form: str, client: tenure.Client, held: list[Any]) -> Callable[[], None]:
    lock = client.lock("swept", ttl=5.0, watchdog=form == "with lock, watchdog")

    def cycle() -> None:
        held.clear()
        if form == "with client.acquire()":
            with client.acquire("swept", ttl=5.0) as lease:
                held.append(lease)
        elif form == "acquire() release()":
            try:
                if lock.acquire():
                    lock.release()
            except Interrupted:
                # As a caller that goes on after Ctrl-C would: a release that was
                # interrupted before it began may be made again.
                if lock.lease is not None and not lock.lease.released:
                    lock.release()
                raise
        else:
            with lock as lease:
                held.append(lease)

    return cycle


@pytest.mark.parametrize("form", FORMS)
def test_an_interrupt_anywhere_in_a_cycle_lets_the_lock_go(one: LocalCluster, form: str) -> None:
    raw = redis.Redis.from_url(one.urls[0])
    key = "tenure:{swept}:lock"
    held: list[Any] = []
    client = tenure.Client(one.urls, node_timeout=0.5)
    try:
        cycle = _cycle(form, client, held)
        for _ in range(3):
            cycle()  # connected, scripts loaded: the steady state is what is swept
        counted = Points()
        counted.run(cycle)
        assert counted.count > 100, counted.count
        documented: list[str] = []
        missed = 0
        for at in range(counted.count):
            points = Points(at)
            if not points.run(cycle):
                # A cycle may take a step fewer than the counted one did (a connection
                # not checked this time): the points are mostly the same ones.
                missed += 1
                continue
            assert points.where is not None
            deadline = time.monotonic() + 2.0
            while raw.exists(key) and time.monotonic() < deadline:
                time.sleep(0.005)
            kind, path, qualname, line = points.where
            place = f"{kind} of {qualname} ({path}:{line}), point {at}"
            if raw.exists(key):
                # Only the first instruction of a ``with`` method leaves it: the caller's
                # lease (when it has it) is then held, and releasing it lets the lock go.
                assert kind == "at the start", f"lock left held: interrupted {place}"
                assert tuple(qualname.split(".")) in DOCUMENTED, place
                documented.append(qualname)
                if held:
                    held[0].release()
                else:
                    raw.delete(key)  # (``Lease.__enter__``: the lease never reached it)
                client.close()
                client = tenure.Client(one.urls, node_timeout=0.5)
                cycle = _cycle(form, client, held)
                for _ in range(3):
                    cycle()
                continue
            # The same thread takes it again at once: no SelfDeadlock, no leftover.
            again = client.lock("swept", ttl=5.0)
            assert again.acquire(timeout=2.0), f"not acquired again: interrupted {place}"
            again.release()
        expected = {
            "with lock": ["Lock.__exit__"],
            "with lock, watchdog": ["Lock.__exit__"],
            "with client.acquire()": ["Lease.__enter__", "Lease.__exit__"],
            "acquire() release()": [],
        }[form]
        assert documented == expected
        assert missed <= counted.count // 10, (missed, counted.count)
    finally:
        client.close()
        raw.close()

"""Interrupt points: where CPython may raise a signal handler's exception in tenure's
code, recorded in order or raised at one (the interrupt sweeps).

CPython raises a signal handler's exception (``KeyboardInterrupt``) only where it checks
for pending signals: after a call returns (before its value is stored), at a
function's first instruction, and at a loop's backward jump. ``Points`` raises
``Interrupted`` as CPython would there: from a profile function after a call returns
(the exception comes out of that call, in its caller's handlers), at a function's first
event, at a backward jump's opcode.
"""

from __future__ import annotations

import dis
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import tenure

from .conftest import Interrupted

SRC = str(Path(tenure.__file__).resolve().parent) + "/"
_JUMP_BACK = {dis.opmap[name] for name in ("JUMP_BACKWARD",) if name in dis.opmap}
_GENERATOR = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def _ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(SRC)


Where = tuple[str, str, str, int]  # the kind of point, file, function, line


class Points:
    """Records the interrupt points in tenure's code, in order (``at`` None), or raises
    ``Interrupted`` at one: the ``at[1]``-th time (from 0) a run reaches point ``at[0]``.
    A point is named by where it is, not by its rank in the cycle, so that a run that
    takes a step more or fewer elsewhere (a wait that loops once more) is still
    interrupted where it was meant to be."""

    def __init__(self, at: tuple[Where, int] | None = None) -> None:
        self.at = at
        self.order: list[tuple[Where, int]] = []
        self._reached: Counter[Where] = Counter()
        self.where: Where | None = None

    @property
    def count(self) -> int:
        return len(self.order)

    def _point(self, frame: FrameType, kind: str) -> None:
        code = frame.f_code
        here = (kind, code.co_filename[len(SRC) :], code.co_qualname, frame.f_lineno)
        nth = self._reached[here]
        self._reached[here] = nth + 1
        if self.at is None:
            self.order.append((here, nth))
        elif self.at == (here, nth):
            self.where = here
            sys.setprofile(None)
            sys.settrace(None)
            raise Interrupted

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "return":
            # A Python call returned to tenure's code (a generator's yield or end is
            # the return of the C call that resumed it: ``c_return`` below).
            # (A finalizer's return is not one: a reference dropped, not a call, ran it,
            # and CPython raises no interrupt there; one raised in it is dropped.)
            back = frame.f_back
            code = frame.f_code
            if (
                not code.co_flags & _GENERATOR
                and code.co_name != "__del__"
                and back is not None
                and _ours(back)
            ):
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

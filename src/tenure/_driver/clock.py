"""The clocks the drivers read (the core never reads one; times are passed in)."""

from __future__ import annotations

import time

__all__ = ["monotonic", "wall_us"]

# Every validity deadline is on this clock: it never jumps, unlike the wall clock.
monotonic = time.monotonic


def wall_us() -> int:
    """Wall-clock microseconds: the first guess of a fencing token proposal.

    Tokens stay correct whatever this returns (nodes refuse a proposal that is too low
    and say what the counter is); a clock roughly in step across clients only makes the
    first guess right, which keeps acquisition to one round trip.
    """
    return time.time_ns() // 1000

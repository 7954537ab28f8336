"""Numbers given by users: what counts as a finite one."""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["is_finite"]


def is_finite(value: object) -> TypeGuard[float]:
    """A finite int or float, not a bool. An int too large for a float is not finite:
    ``math.isfinite`` raises ``OverflowError`` on it, which must become the parameter's
    ``ConfigurationError``, not escape."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False

"""Retry back-off policies: small objects that say how long to wait before the next try.

Competing clients that fail together must not retry together, or they split the votes of
a quorum again. Every policy here is therefore random ("full jitter"): the delay is
drawn uniformly from ``[0, cap]``, so two clients that collided are unlikely to collide
on the next attempt. The caller owns the ``random.Random`` (a fresh one seeded from the OS
per client), which keeps the policies pure and the tests reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from .._errors import ConfigurationError
from .numbers import is_finite

__all__ = ["RetryPolicy", "wait_random", "wait_random_exponential"]


class RetryPolicy(Protocol):
    """Says how long to sleep after failed attempt number ``attempt`` (1 for the first)."""

    def delay(self, attempt: int, rng: random.Random) -> float: ...


# The longest sleep a retry policy may ask for between two attempts (a day). The
# sleeps of both drivers take no more (a huge one overflowed the clock's timestamps).
MAX_RETRY_DELAY = 86_400.0


def _check_delay(parameter: str, value: float) -> None:
    # Checked where the policy is made: a cap above the bound would pass here and then
    # fail an acquire many attempts later, when the back-off first grows past it.
    if not (is_finite(value) and 0 <= value <= MAX_RETRY_DELAY):
        raise ConfigurationError(
            parameter,
            f"must be a finite number of seconds in [0, {MAX_RETRY_DELAY:,.0f}], got {value!r}",
        )


@dataclass(frozen=True)
class wait_random:
    """Sleep a uniformly random time between ``minimum`` and ``maximum`` seconds."""

    minimum: float = 0.0
    maximum: float = 0.05

    def __post_init__(self) -> None:
        _check_delay("minimum", self.minimum)
        _check_delay("maximum", self.maximum)
        if self.maximum < self.minimum:
            raise ConfigurationError(
                "maximum", f"must be >= minimum ({self.minimum}), got {self.maximum}"
            )

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(self.minimum, self.maximum)


@dataclass(frozen=True)
class wait_random_exponential:
    """Full-jitter exponential back-off.

    The delay after attempt ``k`` is uniform in ``[0, min(maximum, initial * 2**(k-1))]``.
    """

    initial: float = 0.002
    maximum: float = 0.1

    def __post_init__(self) -> None:
        _check_delay("initial", self.initial)
        _check_delay("maximum", self.maximum)
        if self.initial <= 0:
            raise ConfigurationError("initial", f"must be > 0 seconds, got {self.initial}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        # Cap the exponent: 2**attempt overflows float long before it matters here.
        cap = min(self.maximum, self.initial * 2.0 ** min(max(attempt - 1, 0), 60))
        return rng.uniform(0.0, cap)

"""Acquisition as a state machine: the driver asks what to do next and reports back.

A driver runs::

    acq = Acquisition(spec, retry, rng, blocking=..., timeout=..., now=clock())
    while True:
        rnd = acq.begin(clock())               # send SET key token NX PX ttl to every node
        ...feed replies into rnd until rnd.decided or acq.deadline(rnd), then rnd.time_out()
        step = acq.conclude(rnd, token, clock())
        Granted -> hand out step.lease
        Retry   -> release on step.cleanup (now), sleep step.sleep, loop
        GiveUp  -> release on step.cleanup (now), then return False or raise step.error

The machine never sleeps past the caller's timeout, raises ``QuorumUnreachable`` as soon
as failures alone make a majority impossible (waiting would not help), and draws every
retry delay at random so that colliding clients drift apart (R6).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .._errors import LockError, QuorumUnreachable, ServerUnsupported
from .config import LockSpec
from .policy import RetryPolicy
from .quorum import Failure, Round

__all__ = ["Acquisition", "GiveUp", "Granted", "LeaseState", "Retry", "round_errors"]


@dataclass(frozen=True)
class LeaseState:
    """The facts of one successful acquisition or extension (times are monotonic seconds)."""

    name: str
    key: str
    token: str
    ttl: float
    started: float
    valid_until: float
    granted: frozenset[int]


@dataclass(frozen=True)
class Granted:
    lease: LeaseState


@dataclass(frozen=True)
class Retry:
    sleep: float
    cleanup: frozenset[int]


@dataclass(frozen=True)
class GiveUp:
    """Stop trying. ``error`` is None for an ordinary timeout (acquire returns False)."""

    cleanup: frozenset[int]
    error: LockError | ServerUnsupported | None


Step = Granted | Retry | GiveUp


def round_errors(rnd: Round, names: list[str] | None = None) -> dict[str, str]:
    """Per-node failure messages of a round, keyed by node name (or index)."""
    return {
        (names[i] if names else str(i)): f"{r.failure.value}: {r.detail}" if r.failure else r.detail
        for i, r in rnd.failures().items()
    }


class Acquisition:
    """The retry loop of one ``acquire`` call.

    Args:
        spec: the lock being acquired.
        retry: back-off policy between attempts.
        rng: source of the random delays.
        blocking: False makes exactly one attempt.
        timeout: for a blocking acquire, seconds after ``now`` to give up; None waits forever.
        now: monotonic time of the call.
        node_names: for error messages.
    """

    def __init__(
        self,
        spec: LockSpec,
        retry: RetryPolicy,
        rng: random.Random,
        *,
        blocking: bool,
        timeout: float | None,
        now: float,
        node_names: list[str],
    ) -> None:
        self.spec = spec
        self._retry = retry
        self._rng = rng
        self._blocking = blocking
        self._give_up_at = None if timeout is None or not blocking else now + timeout
        self._names = node_names
        self.attempts = 0

    def begin(self, now: float) -> Round:
        """Start an attempt at ``now``: the driver sends SET NX PX to every node."""
        self.attempts += 1
        return Round(self.spec.n_nodes, self.spec.quorum, now)

    def deadline(self, rnd: Round) -> float:
        """When the driver stops waiting for replies of this attempt."""
        return rnd.started + self.spec.node_timeout

    def conclude(self, rnd: Round, token: str, now: float) -> Step:
        """Decide the attempt once ``rnd`` is decided or its deadline passed."""
        spec = self.spec
        validity = rnd.validity(now, spec.ttl, spec.drift)
        if rnd.succeeded and validity > 0:
            return Granted(
                LeaseState(
                    name=spec.name,
                    key=spec.key,
                    token=token,
                    ttl=spec.ttl,
                    started=rnd.started,
                    valid_until=rnd.started + spec.ttl - spec.drift,
                    granted=rnd.granted(),
                )
            )
        cleanup = rnd.maybe_holding()
        if rnd.unreachable_blocks_quorum():
            return GiveUp(cleanup, self._unreachable(rnd))
        if not self._blocking:
            return GiveUp(cleanup, None)
        sleep = self._retry.delay(self.attempts, self._rng)
        if self._give_up_at is not None:
            left = self._give_up_at - now
            if left <= 0:
                return GiveUp(cleanup, None)
            sleep = min(sleep, left)
        return Retry(sleep, cleanup)

    def _unreachable(self, rnd: Round) -> LockError | ServerUnsupported:
        errors = round_errors(rnd, self._names)
        unsupported = [
            self._names[i] for i, r in rnd.failures().items() if r.failure is Failure.UNSUPPORTED
        ]
        if unsupported:
            node = unsupported[0]
            return ServerUnsupported(node, f"refused a command tenure needs: {errors[node]}")
        failed = len(rnd.failures())
        return QuorumUnreachable(
            self.spec.name,
            f"{failed} of {self.spec.n_nodes} nodes failed; a majority of {self.spec.quorum} "
            "is impossible until they recover",
            errors,
        )

"""Keeping a lease alive while its holder works, and deciding when it is lost.

Theory of operation
-------------------
A watchdog wakes about a third of the TTL after the lease's latest grant or extension
and extends it, two thirds of the validity ahead of its end. Its middle third is for
nodes that do not answer for a while (a failover, a restart, a busy server): an
extension that failed only for want of answers left the lease as it was, valid until its
``valid_until`` (``worth_another_try``), and is tried again every ``retry_gap``. The
last third is the holder's: a try is tried again only if it failed early enough for one
more to end before it (``retry_by``). If a try fails later, or a node that granted the
lease says it is not ours any more, the lease is lost: marked lost at once
(``Flows.extend``: the holder is told to stop, with about a third of the TTL left to do
it), and released when its validity ends (at once when a majority said "not ours").
Each wake is decided here from the clock reading the driver passes in:

* woke after ``valid_until``: the holder (and its watchdog with it) was paused past the
  lease, by a GC, a SIGSTOP, a swapped-out VM. Extending now could not undo that another
  client may have held the lock meanwhile; the lease is lost;
* extending would take the total hold past ``max_hold``: stop extending, let the lease
  run out, and report it lost when it does;
* the holder has been stuck in one step for ``max_busy`` (the instant its current step
  began is what ``busy_since`` reports): give up the same way. A holder that hangs (a
  call without a timeout) would otherwise keep the lease for as long as its process
  lives, since the watchdog's thread or task runs on regardless;
* otherwise extend (the extend round re-checks the majority and the validity).

The honest caveat: a watchdog lowers the risk that a slow holder loses its lease, but it
cannot stop a holder that pauses *after* its last check from writing late. Only fencing
at the storage can (``lease.fencing_token``, ``tenure.fencing``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import ConfigurationError, LeaseExpired, LeaseLost
from .acquire import LeaseState
from .numbers import is_finite

__all__ = ["RETRY_GAP", "Extend", "GiveUp", "KeepAlive", "Lost"]

# Seconds: the longest wait between tries of a failed extension (``KeepAlive.retry_gap``).
RETRY_GAP = 1.0


@dataclass(frozen=True)
class Extend:
    """Extend the lease now."""


@dataclass(frozen=True)
class GiveUp:
    """Stop extending; at ``at`` (the end of validity) the lease is lost with ``error``."""

    at: float
    error: LeaseExpired


@dataclass(frozen=True)
class Lost:
    error: LeaseLost


Action = Extend | GiveUp | Lost


@dataclass(frozen=True)
class KeepAlive:
    """A watchdog's policy.

    Args:
        extend: extend the lease (False only watches for its expiry).
        max_hold: the longest total hold in seconds from the first grant; None: no cap.
        max_busy: the longest the holder may stay in one step (``busy_since``) before
            the watchdog stops extending; None: no limit.
        busy_since: when the holder's current step began (the drivers' monotonic
            seconds), None while it is between steps; called by the watchdog at each
            wake, from its own thread or task, so it must only read a value.
    """

    extend: bool = True
    max_hold: float | None = None
    max_busy: float | None = None
    busy_since: Callable[[], float | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        cap: object = self.max_hold
        if cap is not None and not (is_finite(cap) and cap > 0):
            raise ConfigurationError(
                "max_hold",
                f"must be a finite number of seconds > 0, or None for no cap, got {cap!r}",
            )
        busy: object = self.max_busy
        if busy is not None and not (is_finite(busy) and busy > 0):
            raise ConfigurationError(
                "max_busy",
                f"must be a finite number of seconds > 0, or None for no limit, got {busy!r}",
            )
        if (busy is None) != (self.busy_since is None):
            raise ConfigurationError(
                "max_busy", "max_busy and busy_since go together: pass both or neither"
            )

    def check_ttl(self, ttl: float) -> None:
        """Refuse a cap below the lock's ``ttl``: the grant alone holds the lease that long,
        so the cap would be passed before the watchdog could keep it (the lease then ran
        its whole TTL and was reported lost for a cap it never kept).

        Raises:
            ConfigurationError: ``max_hold`` is below ``ttl``.
        """
        if self.max_hold is not None and self.max_hold < ttl:
            raise ConfigurationError(
                "max_hold",
                f"must be at least the lock's ttl ({ttl:g} s), got {self.max_hold!r}: the "
                "grant alone holds the lease for its ttl; raise max_hold or lower ttl",
            )

    def check_as_running(self, running: KeepAlive) -> None:
        """Refuse to keep alive with this policy a lease that a watchdog with another cap
        (``running``) keeps alive already: the cap is set when the watchdog starts, and
        a second call's cap, ignored, would not hold. (A policy that only watches asks
        for nothing a running watchdog does not do.)

        Raises:
            ConfigurationError: the caps differ.
        """
        if self.extend and running.extend and running.max_hold != self.max_hold:
            raise ConfigurationError(
                "max_hold",
                f"this lease is kept alive already, with max_hold={running.max_hold!r} "
                f"(got {self.max_hold!r}): a watchdog's cap is set when it starts; "
                "release the lease and acquire it again with the cap wanted",
            )

    def retry_gap(self, ttl: float) -> float:
        """How long after a failed extension the watchdog tries again: a twelfth of the
        lock's ``ttl`` (three or four tries in the middle third of the validity), at most
        ``RETRY_GAP`` (a failover's seconds are covered by tries a second apart)."""
        return min(ttl / 12, RETRY_GAP)

    def retry_by(self, lease: LeaseState, ttl: float, node_timeout: float) -> float:
        """The latest instant at which a failed extension of ``lease`` may end and still
        be tried again: one more, begun then, ends before the last third of the
        validity (a round takes up to ``node_timeout``). It is judged when the try
        ended (``Flows.extend``), not when it began: a try that failed at once (a
        connection reset, an error reply) leaves time for another even where one that
        waited out ``node_timeout`` would not, as under a short TTL, whose first
        extension begins only a third of it in. A try that fails after it marks the
        lease lost: the holder keeps about a third of the TTL to stop in, once told."""
        return _told_by(lease, ttl) - node_timeout

    def retry_at(self, now: float, lease: LeaseState, ttl: float, node_timeout: float) -> float:
        """When to try again after a try that failed at ``now`` (by ``retry_by``): a
        ``retry_gap`` later, or sooner if that is too late for the next try to end
        before the last third."""
        return min(now + self.retry_gap(ttl), self.retry_by(lease, ttl, node_timeout))

    def next_wake(self, lease: LeaseState) -> float:
        """When to wake next (monotonic seconds)."""
        if not self.extend:
            return lease.valid_until
        return lease.started + lease.ttl / 3

    def decide(self, now: float, lease: LeaseState, first_started: float, ttl: float) -> Action:
        """What to do on waking at ``now``; ``first_started`` began the first grant;
        ``ttl`` is what an extension gives (the lock's TTL, not the lease's latest, which
        a holder's own ``extend(ttl)`` may have made shorter)."""
        if not self.extend:
            expired = LeaseExpired(lease.name, "its validity ended (no watchdog extends it)")
            return Lost(expired) if now >= lease.valid_until else GiveUp(lease.valid_until, expired)
        if now >= lease.valid_until:
            late = now - self.next_wake(lease)
            return Lost(
                LeaseExpired(
                    lease.name,
                    f"the holder was paused: its watchdog woke {late:.3f}s late, after the "
                    "validity ended, so another client may have held the lock meanwhile",
                )
            )
        if self.max_hold is not None and now + ttl - first_started > self.max_hold:
            capped = LeaseExpired(
                lease.name, f"held for max_hold={self.max_hold}s; the watchdog stopped extending it"
            )
            return GiveUp(lease.valid_until, capped)
        return Extend()

    def unless_stuck(self, now: float, lease: LeaseState, busy_since: float | None) -> Action:
        """Whether an extension ``decide`` asked for at ``now`` still stands: not if the
        holder's current step, begun at ``busy_since`` (None: between steps), has run
        ``max_busy`` or longer. The lease then runs out and is reported lost, so that
        others may take it, as when the holder's process dies; a step that returns
        meanwhile finds the lease valid until then, lost after."""
        limit = self.max_busy
        if limit is None or busy_since is None or now - busy_since < limit:
            return Extend()
        stuck = LeaseExpired(
            lease.name,
            f"its holder has been in one step for {now - busy_since:.1f}s, past "
            f"max_busy={limit:g}s; the watchdog stopped extending it",
        )
        return GiveUp(lease.valid_until, stuck)


def _told_by(lease: LeaseState, ttl: float) -> float:
    """When the holder of ``lease`` is told of a loss at the latest (its last try failed):
    a third of the lock's ``ttl`` before the validity ends."""
    return lease.valid_until - ttl / 3

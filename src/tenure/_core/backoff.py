"""Reconnect back-off: how long a node whose connection failed is left alone.

Both drivers keep connections to every node (the round's links and the notification
subscriptions). A node that refuses connections, or whose connection was abandoned, is
not retried at once: each failure doubles the wait before the next attempt, from 25 ms
up to 1 s, and a connection that comes up resets it. The wait is short at first, so a
node that restarts is back in the next round or two, and bounded, so a node that stays
down costs one connect attempt a second per connection, not a busy loop. Rounds meanwhile
count the node as failed at once (``BackingOff``) instead of waiting on it.

A connection is abandoned when it has waited ``STALL`` seconds for replies and heard
none, with nothing unread in its socket: a frozen or cut-off node. Never for being
behind: a node that answers, however late, keeps its connection, whose order is what
makes a late grant be followed by its own release (docs/architecture.md).

A node whose connection was given up so must answer before a new one is used: the next
connection's set-up sends a PING and waits for its answer, within ``connect_timeout``
(``Reconnect.probe``). Rounds do not wait for that set-up: the node sits them out
until it answers, as in its back-off (``diagnosis.being_probed``), where waiting for a
set-up would cost each round the connect timeout for a node silent a moment ago. A
frozen server's kernel still accepts connections; without the probe, every link to the
node connected again as soon as its back-off ended, carried a second of commands, was
given up again, and was kept open for ``LINGER`` seconds in case the node woke: one
connection more (and, in the blocking client, one thread) per link every two seconds
that the node stayed frozen, until the process ran out of files. With it, only the
connections in use when the node froze are kept open.

A connection may also end while nobody uses it: the node closes connections idle past
its ``timeout`` setting, a proxy or a load balancer drops idle ones, a node restarts.
The asyncio client's event loop reads the end of such a connection as it comes; the
blocking client reads its sockets only within a round, and would find the end in the
reply to its next request (a release, an extension), failing that node for no fault of
it. So a connection left unused for ``IDLE_LOOK`` seconds or more is looked at before it
is used again: one that has something to read while it owes no reply was closed by the
node (or speaks out of turn), and is replaced before the round, without a back-off.
Connections reused sooner (as a busy client reuses them, within microseconds) are not
looked at: the look is a system call per node, a few percent of a round's client CPU,
and a node that closed a connection within milliseconds of answering on it was
restarting just then. Nor does the asyncio client look while other rounds of its await
replies: its loop is running then, and reads an end as it comes; a loop that runs
hundreds of tasks per turn (longer than ``IDLE_LOOK``) would otherwise look, and give up
turns, at the start of nearly every wave of rounds. A connection that ends with nothing
pending after it served for ``SERVED`` seconds or more (a node's idle timeout is a
second at least) is replaced without a back-off too; one that ends sooner, as when a
proxy accepts connections for a server that is gone, is a failure like any other.
"""

from __future__ import annotations

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "IDLE_LOOK", "LINGER", "SERVED", "STALL", "Reconnect"]

BACKOFF_MIN = 0.025
BACKOFF_MAX = 1.0
STALL = 1.0  # seconds a connection may wait for a reply hearing nothing
# Seconds a connection given up as stalled stays open, in case its node wakes: a frozen
# node runs what waits in a connection's buffer in order, releases behind grants
# included, but of a connection already closed only the first few commands. Past a
# minute, the grants of all but the longest leases have expired anyway.
LINGER = 60.0
IDLE_LOOK = 0.01  # seconds unused after which a connection is looked at before use
SERVED = 1.0  # seconds up after which a quiet close is no failure


class Reconnect:
    """One connection's back-off, on the caller's monotonic clock (seconds)."""

    __slots__ = ("_delay", "probe", "retry_at")

    def __init__(self) -> None:
        self.retry_at = 0.0
        self._delay = BACKOFF_MIN
        # A connection was given up as stalled since the last one that came up: the next
        # is used only once the node answered a PING on it.
        self.probe = False

    def failed(self, now: float, *, stalled: bool = False) -> float:
        """The connection failed at ``now`` (``stalled``: given up, having heard nothing
        for ``STALL`` seconds): the delay before the next attempt."""
        if stalled:
            self.probe = True
        delay = self._delay
        self.retry_at = now + delay
        self._delay = min(delay * 2, BACKOFF_MAX)
        return delay

    def succeeded(self) -> None:
        """The connection came up (answering the probe, if one was due): the next
        failure waits the shortest delay again."""
        self._delay = BACKOFF_MIN
        self.probe = False

    def left(self, now: float) -> float:
        """Seconds until the next attempt may be made (0: now)."""
        return self.retry_at - now if now < self.retry_at else 0.0

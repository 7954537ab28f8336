"""Notified waiting: the messages release.lua sends, and the numbers a waiter lives by.

Theory of operation (docs/waiting.md has the whole story)
---------------------------------------------------------
A blocked acquirer is queued on each node by the very attempt that found the lock held
(acquire.lua with ``WaitArgs``): a sorted set of waiter ids in arrival order, and per
waiter a *place* key with a TTL that says where to notify it. Each client process
subscribes once per node to its own channel; every waiter of that process shares it.

A release (release.lua) walks the queue from its head, dropping waiters whose place
expired or whose channel nobody listens to any more (``PUBLISH`` answered 0), and

* not fair: publishes ``W <waiter>`` to the first live one and reserves the free lock
  for it for ``hold_ms`` (newcomers are turned away meanwhile); it tries again at once,
  and stays queued until it acquires, so if it still loses (a split vote on a quorum),
  the next release wakes it again;
* fair: makes the first live one the owner right there (its waiter id is its owner
  token, its fencing token is the node's floor + 1) and publishes ``G <waiter> <token>``.

A notification may never come (the notification connection was killed, the holder
crashed and its key expired, a node restarted): a waiter re-checks at the latest after
a random delay in ``[recheck/2, recheck]`` (renewing its place), and never later than
the holder's key expires. A place lives ``place_ms`` without renewal, long enough for
several missed re-checks, so a live but slow waiter keeps its turn and a dead one is
skipped within that time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = [
    "CHANNEL_PREFIX",
    "STRAGGLE",
    "Departed",
    "Filing",
    "Switchboard",
    "Wake",
    "WakeTally",
    "channel_name",
    "handoff_token",
    "hold_ms",
    "parse_wake",
    "place_ms",
]

# Every client's notification channel starts with this; an ACL grants them all with
# ``&tenure:wake:*`` (docs/deployment.md).
CHANNEL_PREFIX = "tenure:wake:"


def channel_name(suffix: str) -> str:
    """The notification channel of one client: ``CHANNEL_PREFIX`` + a random ``suffix``."""
    return CHANNEL_PREFIX + suffix


@dataclass(frozen=True)
class Wake:
    """A notification: ``waiter`` may try again (``token`` 0), or, fair, owns the lock
    with fencing token ``token``."""

    waiter: str
    token: int = 0

    @property
    def handed_over(self) -> bool:
        return self.token > 0


def parse_wake(data: object) -> Wake | None:
    """Read a message published by release.lua (``W <id>`` or ``G <id> <token>``)."""
    if not isinstance(data, bytes):
        return None
    parts = data.split()
    try:
        if len(parts) == 2 and parts[0] == b"W":
            return Wake(parts[1].decode())
        if len(parts) == 3 and parts[0] == b"G":
            token = int(parts[2])
            return Wake(parts[1].decode(), token) if token > 0 else None
    except (ValueError, UnicodeDecodeError):
        return None
    return None


# On a quorum, a waiter wakes once a majority of nodes notified it, or this many seconds
# after the first did: a release reaches the nodes one after another, and trying after
# the first notification would find the others still held (a wasted round, and a
# partial grant to clean up).
STRAGGLE = 0.005


class WakeTally:
    """The notifications filed for one waiter since it last looked (a driver's slot
    adds how the waiter is woken: an event, a future)."""

    __slots__ = ("need", "nodes", "wakes")

    def __init__(self, need: int = 1) -> None:
        self.wakes: list[tuple[int, Wake]] = []  # (node, notification)
        self.nodes: set[int] = set()  # the nodes whose notifications are in ``wakes``
        self.need = need  # how many nodes' notifications make a majority

    def file(self, wake: Wake, node: int) -> bool | None:
        """File ``wake`` from ``node``: True when the waiter should wake now, False when
        it is the first of too few (wake it ``STRAGGLE`` seconds from now unless more
        come), None otherwise."""
        self.wakes.append((node, wake))
        self.nodes.add(node)
        if len(self.nodes) >= self.need:
            return True
        return False if len(self.nodes) == 1 else None

    def take(self) -> list[tuple[int, Wake]]:
        """The notifications so far, with their nodes, oldest first; starts afresh."""
        wakes, self.wakes = self.wakes, []
        self.nodes = set()
        return wakes


class Filing(Protocol):
    """A driver's slot: where ``Switchboard`` files a waiter's notifications."""

    def put(self, wake: Wake | None, node: int = -1) -> None:
        """File ``wake`` from ``node``; None only nudges the waiter to re-check."""
        ...


S = TypeVar("S", bound=Filing)


class Switchboard(Generic[S]):
    """The waiters of one client process, and where each message of its notification
    connections goes."""

    __slots__ = ("departed", "slots")

    def __init__(self) -> None:
        self.slots: dict[str, S] = {}
        self.departed = Departed()

    def message(self, reply: object, node: int, now: float) -> bool:
        """Handle one pub/sub reply from ``node`` (a message, or another kind); True
        if it confirmed the subscription."""
        if not isinstance(reply, list) or len(reply) != 3:
            return False
        if reply[0] == b"message":
            wake = parse_wake(reply[2])
            if wake is not None:
                slot = self.slots.get(wake.waiter)
                if slot is not None:
                    slot.put(wake, node)
                else:
                    self.departed.decline(wake.waiter, node, now)
            return False
        return bool(reply[0] == b"subscribe")

    def nudge_all(self) -> None:
        """Every waiter re-checks now (notifications sent while we were away were lost)."""
        for slot in list(self.slots.values()):
            slot.put(None)


def handoff_token(wall_us: int, fencing: int, seen: int) -> int:
    """The fencing token a release on a quorum hands the lock over with (mode "q").

    One value for every node, so that a majority handing over commits one token: above
    the releaser's own token (``fencing``) and every token it has seen (``seen``, already
    one above the highest), and at least its wall clock in µs, so that it is usually
    above the nodes' floors too. A node whose floor is not below it only wakes the next
    waiter, which then acquires with an ordinary round (docs/waiting.md).
    """
    return max(wall_us, fencing + 1, seen)


def place_ms(recheck: float, node_timeout: float) -> int:
    """How long a waiter's place lives without renewal: three of its longest re-check
    intervals plus a round, so one or two lost re-checks do not cost it its turn."""
    return max(1, round((3 * recheck + node_timeout) * 1000))


def hold_ms(node_timeout: float) -> int:
    """How long a released lock stays reserved for the waiter it woke: enough for the
    notification, a wake-up and one round, two node timeouts (100 ms by default). Only a
    waiter that is alive but frozen makes others wait that long."""
    return max(5, round(2000 * node_timeout))


class Departed:
    """Waiters of this client that gave up lately, and how to decline what still comes.

    A waiter that gives up (timeout, error, cancellation) leaves every queue with a
    dequeue; a node that dequeue did not reach (cut off, restarting, a reply lost) keeps
    its place until the place expires, and may hand it the lock meanwhile: the client's
    notification connection is still subscribed, so the release sees a live receiver,
    and the node would then be held by nobody for a whole TTL. So for as long as such a
    place can live, a notification to a departed waiter is declined: the dequeue is sent
    again, to that node, which passes the lock on at once.
    """

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, tuple[float, Callable[[int], None]]] = {}

    def add(self, waiter: str, decline: Callable[[int], None], until: float, now: float) -> None:
        """``decline(node)`` answers a notification to ``waiter`` until ``until``."""
        for old in [w for w, (t, _) in self._until.items() if t <= now]:
            del self._until[old]
        self._until[waiter] = (until, decline)

    def decline(self, waiter: str, node: int, now: float) -> bool:
        """Decline a notification from ``node`` if ``waiter`` departed lately."""
        entry = self._until.get(waiter)
        if entry is None or entry[0] <= now:
            return False
        entry[1](node)
        return True

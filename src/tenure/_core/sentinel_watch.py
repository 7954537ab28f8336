"""The watch of a Sentinel-managed node: which Sentinels to hear, when to give one up.

While a Sentinel-managed node has connections open, each client keeps subscriptions to
its Sentinels' announcements of a failover (``SWITCH_CHANNEL``), and ends its
connections to the old master at the first one (``_driver.sentinel_watch``). This
module decides on which Sentinels, when a subscription is given up, and what a
Sentinel's configuration says of a failover no subscription heard; the driver's thread
carries it out, reading every subscription it holds at once.

How many: a failover is carried out by a Sentinel that a majority of the node's
Sentinels voted for, and every Sentinel announces it once it learns of it. A Sentinel
cut off from the others, still answering its clients, learns of none, and announces
none: a client that heard only that one would keep its connections on the old master
until the old master is demoted, seconds later. So the watch holds as many
subscriptions as it takes to include one of every majority (``watched``: two of three
Sentinels, three of five); any failover then has a voter among them, which learns of
it from its leader as soon as the others do. The Sentinels heard are the first in the
order the connections ask them (the one that answered last first).

When to give one up: a subscription carries nothing until a failover, so its silence
says nothing of its Sentinel. After ``WATCH_PING`` seconds of it, the Sentinel is sent a
``PING``; one that does not answer within ``patience`` (its ask timeout, at least
``PATIENCE``) froze or was cut off from us, and is left for the next Sentinel. A
Sentinel whose subscription failed is passed over for the reconnect back-off
(``backoff``); one whose ACL refused the subscription for ``REFUSED_REST`` seconds.

A failover announced while no subscription was up: an announcement is not kept, so a
subscription made after it hears nothing of it, and the connections would stay on the
old master until the Sentinels demote it. So each Sentinel is asked for the master's
configuration (``SENTINEL MASTER``: the master and its ``config-epoch``, which every
failover raises) just before it is subscribed on (``told``). The first answer is the
reference: the connections were sent to the master moments before, when the node's
first connection asked. An answer whose epoch is above every one heard is a failover
made since: the connections move to its master, as at an announcement (those already
there, having followed the announcement, stay). One whose epoch is not above is a
Sentinel behind the others, or up to date, and moves nothing: a Sentinel's name for the
master alone cannot tell one behind from one ahead, and following one behind would send
the connections back to an old master still up. Announcements, which carry no epoch,
leave the reference as it is: the next answer above it is the announced failover or a
later one, and moving the connections there is right, but for a Sentinel that knows of
a failover before an announced one and not of that one (two failovers in a row, the
first unheard), whose master is a replica by then: the connections find that out by
its ``ROLE`` and ask the other Sentinels (``SentinelBook``), a short outage of the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .backoff import Reconnect
from .resp import as_text

__all__ = [
    "PATIENCE",
    "REFUSED_REST",
    "WATCH_PING",
    "Config",
    "WatchPlan",
    "master_config",
    "watched",
]

Address = tuple[str, int]

# Seconds a subscription may go without a message before its Sentinel is sent a PING: a
# Sentinel that froze or was cut off says nothing, and its silence would hide every
# failover from then on.
WATCH_PING = 2.0
# The least time a PING is given to be answered (the Sentinel's ask timeout, if longer):
# a loaded machine reads a healthy Sentinel's answer late, and giving it up for that
# would leave a gap in the announcements heard.
PATIENCE = 1.0
# Seconds before a Sentinel that refused the subscription (its ACL: ``tenure check``
# names it) is asked for it again: at the back-off's pace, every Sentinel of a
# deployment that refuses it would be sent a login and a refused command every second
# by every client, each refusal an entry in its ACL LOG.
REFUSED_REST = 60.0


def watched(sentinels: int) -> int:
    """How many of ``sentinels`` Sentinels to subscribe on: the fewest that include one
    of every majority of them."""
    return sentinels - sentinels // 2


@dataclass(frozen=True)
class Config:
    """A Sentinel's view of the node's master: the master, and the configuration epoch
    of the failover that made it one (0 before any)."""

    epoch: int
    master: Address


def master_config(reply: object) -> Config | None:
    """The master and its configuration epoch in a reply to ``SENTINEL MASTER <service>``
    (field names and values, flat in RESP2, a map in RESP3); None for a reply without
    them (not a Sentinel's)."""
    if isinstance(reply, (list, tuple)) and len(reply) % 2 == 0:
        reply = dict(zip(map(as_text, reply[::2]), reply[1::2], strict=True))
    if not isinstance(reply, dict):
        return None
    fields = {as_text(k): as_text(v) for k, v in reply.items()}
    host, port, epoch = fields.get("ip"), fields.get("port", ""), fields.get("config-epoch", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or not epoch.isdigit():
        return None
    return Config(int(epoch), (host, int(port)))


@dataclass
class _Held:
    """A subscription held: when it last said anything, and when its PING went out (None:
    none owed)."""

    heard: float
    pinged: float | None = None


class WatchPlan:
    """The subscriptions of one node's watch, on the caller's monotonic clock (seconds).

    The driver asks ``to_subscribe`` which Sentinels to subscribe on, reports each
    outcome (``subscribed``, ``failed``), each reply read (``heard``) and each PING sent
    (``pinged``), and gives up the Sentinels ``due`` names. It reports each Sentinel's
    configuration asked before subscribing (``told``, which names the master to move the
    connections to after a failover nobody announced).
    """

    __slots__ = ("_config", "_held", "_patience", "_resting", "_wanted")

    def __init__(self, sentinels: int, ask_timeout: float) -> None:
        self._wanted = watched(sentinels)
        self._patience = max(ask_timeout, PATIENCE)
        self._held: dict[Address, _Held] = {}
        self._resting: dict[Address, Reconnect] = {}  # the Sentinels that failed
        self._config: Config | None = None  # the newest configuration heard

    def held(self) -> list[Address]:
        """The Sentinels subscribed on."""
        return list(self._held)

    def to_subscribe(self, order: Sequence[Address], now: float) -> list[Address]:
        """The Sentinels to subscribe on now: the first of ``order`` (the connections'
        order of asking) neither held nor resting, as many as are missing."""
        missing = self._wanted - len(self._held)
        if missing <= 0:
            return []
        free = [
            s
            for s in order
            if s not in self._held and (s not in self._resting or now >= self._resting[s].retry_at)
        ]
        return free[:missing]

    def subscribed(self, sentinel: Address, now: float) -> None:
        self._held[sentinel] = _Held(now)
        resting = self._resting.get(sentinel)
        if resting is not None:
            resting.succeeded()

    def failed(self, sentinel: Address, now: float, *, refused: bool = False) -> None:
        """The subscription on ``sentinel`` failed or was given up (``refused``: its ACL
        refused it): it rests before it is asked again."""
        self._held.pop(sentinel, None)
        resting = self._resting.setdefault(sentinel, Reconnect())
        resting.failed(now)
        if refused:
            resting.retry_at = now + REFUSED_REST

    def heard(self, sentinel: Address, now: float) -> None:
        """A reply came on ``sentinel``'s subscription (an announcement, or the PING's)."""
        held = self._held.get(sentinel)
        if held is not None:
            held.heard, held.pinged = now, None

    def pinged(self, sentinel: Address, now: float) -> None:
        held = self._held.get(sentinel)
        if held is not None:
            held.pinged = now

    def due(self, now: float) -> tuple[list[Address], list[Address]]:
        """The Sentinels to send a PING now (quiet for ``WATCH_PING``), and those to give
        up (their PING unanswered past the patience: report them ``failed``)."""
        ping, give_up = [], []
        for sentinel, held in self._held.items():
            if held.pinged is not None:
                if now - held.pinged > self._patience:
                    give_up.append(sentinel)
            elif now - held.heard >= WATCH_PING:
                ping.append(sentinel)
        return ping, give_up

    def told(self, config: Config) -> Address | None:
        """A Sentinel answered ``SENTINEL MASTER`` with ``config``: the master to move the
        connections to when it names a failover newer than every one heard (the
        connections already there stay); None when it moves nothing."""
        known = self._config
        if known is not None and config.epoch <= known.epoch:
            return None  # behind, or what is known already
        self._config = config
        # The first answer is the reference: where the connections were just sent.
        return None if known is None else config.master

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

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from .slots import Address, key_slot, redirect, slot_tag

__all__ = [
    "CHANNEL_PREFIX",
    "SHARDED",
    "STRAGGLE",
    "Departed",
    "Filing",
    "ShardEvent",
    "ShardSubs",
    "Switchboard",
    "Wake",
    "WakeTally",
    "channel_name",
    "decline_again",
    "handoff_token",
    "hold_ms",
    "parse_wake",
    "place_ms",
    "route_of",
    "sharded_refused",
    "sharding",
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

    __slots__ = ("need", "nodes", "route", "wakes")

    def __init__(self, need: int = 1) -> None:
        self.wakes: list[tuple[int, Wake]] = []  # (node, notification)
        self.nodes: set[int] = set()  # the nodes whose notifications are in ``wakes``
        self.need = need  # how many nodes' notifications make a majority
        # Where the waiter's next attempt says to notify it, when the listener chose
        # (a Cluster node's sharded channel, see ``ShardSubs``): (channel, sharded).
        self.route: Callable[[], tuple[str, bool] | None] | None = None

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

    def take(self) -> list[tuple[int, Wake]]:
        """The notifications filed since the last take, with their nodes."""
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
        if reply[0] == b"message" or reply[0] == b"smessage":
            wake = parse_wake(reply[2])
            # Departed first: a waiter that gives up departs before it stops listening
            # (``Flows._end_call``), and what reaches it then is declined.
            if wake is not None and not self.departed.decline(wake.waiter, node, now):
                slot = self.slots.get(wake.waiter)
                if slot is not None:
                    slot.put(wake, node)
            return False
        return bool(reply[0] == b"subscribe")

    def leave(self, waiter: str) -> list[int]:
        """``waiter`` stops listening; returns the nodes of hand-offs filed for it that
        it never took (come after its last wait ended, before it departed), for
        ``departed.decline``. Dropped with the slot, such a hand-off left its node held
        by nobody for a TTL whenever the waiter's dequeue was lost too."""
        slot = self.slots.pop(waiter, None)
        return [node for node, wake in slot.take() if wake.handed_over] if slot else []

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


# How much longer a departed waiter is declined when a node did not answer its dequeue
# (``Flows._end_call``). A node frozen for longer than this, which then runs the waiter's
# stale attempt, can still be handed to nobody for one TTL: accepted, for so long a
# freeze.
UNHEARD_DEPARTURE = 60.0

# A decline that did not reach its node (the client's command connection to it was
# lost, in its reconnect back-off, or could not be set up, while the notification
# connection that brought the hand-off is up: a node just back from a freeze, or at its
# connection limit) is sent again after each of these delays in turn, then left to the
# place's expiry. Without it the node stayed held by nobody for the lock's TTL.
DECLINE_AGAIN = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0)


def decline_again(tries: int) -> float | None:
    """Seconds until a decline that did not reach its node is sent again, after
    ``tries`` failed sends; None: no more."""
    return DECLINE_AGAIN[tries - 1] if 0 < tries <= len(DECLINE_AGAIN) else None


# The most departed waiters a client remembers: a long outage of one node, with many
# waiters giving up, must not grow it without bound (the oldest go first).
DEPARTED_MAX = 10_000


class Departed:
    """Waiters of this client that gave up lately, and how to decline what still comes.

    A waiter that gives up (timeout, error, cancellation) leaves every queue with a
    dequeue; a node that dequeue did not reach (cut off, restarting, a reply lost) keeps
    its place until the place expires, and may hand it the lock meanwhile: the client's
    notification connection is still subscribed, so the release sees a live receiver,
    and the node would then be held by nobody for a whole TTL. So for as long as such a
    place can live, a notification to a departed waiter is declined: the dequeue is sent
    again, to that node, which passes the lock on at once.

    A released lease whose waiter id may still be queued somewhere departs too, as its
    release begins (``Flows._release_rounds``). Until that round ends, what reaches its id
    is *held*, and declined only then: the dequeue deletes a lock key that holds the
    waiter id, which is also the lease's own token, so a dequeue that ran ahead of the
    release on a node would take the lease's key there, and the release would count that
    node as lost (``LeaseLost`` for a lease that was valid all along).
    """

    __slots__ = ("_until",)

    def __init__(self) -> None:
        # In the order added: the oldest are dropped first when full. An OrderedDict, as
        # a plain dict's first entry takes a walk over the slots of those deleted
        # before it: once full, every addition cost 20 µs instead of 1.
        self._until: OrderedDict[str, _Departure] = OrderedDict()

    def add(
        self,
        waiter: str,
        decline: Callable[[int], None],
        until: float,
        now: float,
        *,
        hold: bool = False,
    ) -> list[int]:
        """``decline(node)`` answers a notification to ``waiter`` until ``until``;
        ``hold``: not yet, the nodes are kept until ``waiter`` is added again without it.
        Returns the nodes kept under ``waiter``'s previous entry, to decline now."""
        entries = self._until
        # The expired go, oldest first, up to the first that is not: a few steps per
        # call, not a walk over all of them. One kept longer (``UNHEARD_DEPARTURE``)
        # keeps the shorter ones behind it for as long, at most (they decline nothing
        # once expired: ``decline`` reads the time); the cap bounds them all.
        while entries:
            oldest = next(iter(entries.values()))
            if oldest[0] > now and len(entries) < DEPARTED_MAX:
                break
            entries.popitem(last=False)
        previous = entries.get(waiter)
        entries[waiter] = (until, decline, [] if hold else None)
        entries.move_to_end(waiter)  # a waiter id is new per call; re-added, it goes last
        kept = previous[2] if previous is not None else None
        return list(dict.fromkeys(kept)) if kept else []

    def decline(self, waiter: str, node: int, now: float) -> bool:
        """Decline a notification from ``node`` if ``waiter`` departed lately (or keep
        it, while its entry holds them)."""
        entry = self._until.get(waiter)
        if entry is None or entry[0] <= now:
            return False
        kept = entry[2]
        if kept is not None:
            kept.append(node)
            # The blocking client's listener thread runs this while the caller's thread
            # may add the waiter again: if it did meanwhile, it may have taken the kept
            # nodes before this one came, so this one is declined here (a dequeue sent
            # twice is harmless).
            if self._until.get(waiter) is entry:
                return True
        entry[1](node)
        return True

    def decline_all(self, node: int, now: float) -> None:
        """Decline on ``node`` what may have come for every waiter departed lately (as
        ``decline`` does for one): a notification from that node was lost (its
        subscription connection lost, or cut by an interrupt in the thread reading it),
        and it may have been a hand-off to one of them, which the node counted as
        received and nobody would decline. A dequeue that finds nothing of its waiter
        does nothing."""
        for waiter in list(self._until):
            self.decline(waiter, node, now)

    def __len__(self) -> int:
        return len(self._until)


# A departed waiter: until when, how to decline, and the nodes kept meanwhile (None: none
# are kept, each is declined as it comes).
_Departure = tuple[float, Callable[[int], None], list[int] | None]


# --- A Redis Cluster node: sharded pub/sub ----------------------------------------------
#
# On a Cluster node whose servers have sharded pub/sub (Redis 7.0 and later, Valkey), a
# waiter is notified on a channel of its lock's slot, ``<prefix>wake:{<T[s]>}:<random>``
# (``slots.slot_tag``), to which its process subscribes with SSUBSCRIBE at the slot's
# master, and the release script publishes with SPUBLISH: the message stays within the
# shard. The waiter's place then says so ("<channel> <ttl_ms> s", ``SHARDED``). Until a
# slot's subscription is confirmed (and on servers without sharded pub/sub), the waiter
# is notified as on any node, on its process channel (classic SUBSCRIBE and PUBLISH), so
# a place never names a sharded channel nobody has subscribed to.

# The mark a waiter's place carries when its channel is sharded (acquire.lua ARGV[12]).
SHARDED = "s"


def sharding(clusters: Sequence[bool]) -> bool:
    """Whether a client whose nodes are ``clusters`` (True: a Redis Cluster node) uses
    sharded channels: only when every node is a Cluster node. One command serves every
    node of a round, so one channel must do for all of them, and a plain node's process
    channel has no slot (a mixed set keeps the process channel everywhere)."""
    return bool(clusters) and all(clusters)


def route_of(inbox: object, channel: str) -> tuple[str, bool]:
    """Where an attempt of a waiter whose notification slot is ``inbox`` asks to be
    notified: the slot's route if its listener chose one, else the process ``channel``."""
    route = getattr(inbox, "route", None)
    chosen = route() if route is not None else None
    return chosen if chosen is not None else (channel, False)


def sharded_refused(error: str) -> bool:
    """Whether an error answering SSUBSCRIBE says the server has no sharded pub/sub
    (before Redis 7.0): the cluster then keeps the process channel for good."""
    lower = error.lower()
    return "unknown command" in lower or "unknown subcommand" in lower


@dataclass(frozen=True)
class ShardEvent:
    """What one reply on a sharded subscription connection means to its driver.

    ``kind``: "confirmed" (a slot's subscription is up), "ended" (the server ended a
    subscription still wanted, or the connection was lost: its waiters re-check now, and
    it is subscribed again at the slot's current owner), "again" (our unsubscribe was
    answered, and a waiter came for the slot meanwhile: plan again, to subscribe it
    anew; nobody was routed to it while it was leaving), "moved" (SSUBSCRIBE answered
    ``MOVED``: the slot's owner is ``to``; tell the slot map), "unsupported" (no sharded
    pub/sub on this cluster), "refused" (another error: ``detail``; drop the connection,
    it is tried again after its back-off), "cut" (an error answered our SUNSUBSCRIBE,
    and the server may have kept the subscription: Redis 8 serves SSUBSCRIBE at a
    replica of the slot's master and answers SUNSUBSCRIBE there ``MOVED``; drop the
    connection, the one way to end it, with nothing to report), "" (nothing to do).
    """

    kind: Literal["", "confirmed", "ended", "again", "moved", "unsupported", "refused", "cut"]
    slot: int = -1
    to: Address | None = None
    detail: str = ""


_NOTHING = ShardEvent("")


class ShardSubs:
    """The sharded subscriptions of one client process on one Cluster node.

    Reference-counted per slot: the first waiter on a slot makes the process subscribe
    to the slot's channel at the slot's master, the last to leave unsubscribes, so a
    long-lived process with waiters on many slots keeps subscriptions only for the
    slots it waits on. ``plan`` says what to send where; ``answered`` and ``lost`` take
    what came back. Pure: the driver keeps the connections (one per master).

    Slot maps are numbered as their loads begin: ``plan`` is given the number of the
    map in use, ``answered`` and ``lost`` the number of loads begun so far. A map whose
    load began before a subscription ended may have been read before the change that
    ended it (a load under way when the old master ended it, finished just after):
    it does not count as newer.
    """

    __slots__ = (
        "_after",
        "_asked",
        "_at",
        "_leaving",
        "_prefix",
        "_suffix",
        "_up",
        "_wanted",
        "supported",
    )

    def __init__(self, prefix: str, suffix: str) -> None:
        self._prefix = prefix  # the key prefix + "wake:"
        self._suffix = suffix  # the process's random part
        # Whether the cluster has sharded pub/sub: unknown until an SSUBSCRIBE is answered.
        self.supported: bool | None = None
        self._wanted: dict[int, int] = {}  # slot -> waiters on it
        self._at: dict[int, Address] = {}  # slot -> the master subscribed (or asked) at
        self._up: set[int] = set()  # slots whose subscription is confirmed
        self._leaving: set[tuple[int, Address]] = set()  # being unsubscribed there
        self._asked: dict[Address, list[tuple[str, int]]] = {}  # unanswered, per master
        # Slots whose subscription ended (slot -> the loads begun by then, the master it
        # ended at, and whether that master ended it): placed again once the map names
        # another master, or by a newer map (``plan``). The server ends a subscription
        # when the slot leaves the node, and that node, a replica of the slot's new
        # master now, would accept it again (SSUBSCRIBE is served by a shard's
        # replicas), where SPUBLISH's count, the master's alone, would not see it: its
        # waiters' notifications would count as undelivered.
        self._after: dict[int, tuple[int, Address, bool]] = {}

    def channel(self, slot: int) -> str:
        """The process's channel in ``slot``: it hashes to ``slot`` (``{T[s]}``)."""
        return f"{self._prefix}{{{slot_tag(slot)}}}:{self._suffix}"

    def add(self, slot: int) -> None:
        """A waiter on ``slot`` registered."""
        self._wanted[slot] = self._wanted.get(slot, 0) + 1

    def remove(self, slot: int) -> None:
        """A waiter on ``slot`` is gone."""
        left = self._wanted.get(slot, 0) - 1
        if left > 0:
            self._wanted[slot] = left
        else:
            self._wanted.pop(slot, None)

    def up(self, slot: int) -> bool:
        """The slot's subscription is confirmed (at the master it was asked of)."""
        return slot in self._up and slot in self._wanted

    def settled(self, slot: int) -> bool:
        """Nothing more to wait for before a waiter on ``slot`` queues: its subscription
        is up, or the cluster has no sharded pub/sub."""
        return self.supported is False or self.up(slot)

    def route(self, slot: int, channel: str) -> tuple[str, bool]:
        """The channel a waiter on ``slot`` records: sharded once its subscription is
        confirmed, else the process ``channel`` (classic, always subscribed)."""
        if self.supported and self.up(slot):
            return self.channel(slot), True
        return channel, False

    def plan(
        self,
        owner: Callable[[int], Address | None],
        generation: int = 0,
        source: Address | None = None,
    ) -> list[tuple[Address, str, str]]:
        """What to send now: ``(master, "SSUBSCRIBE" | "SUNSUBSCRIBE", channel)``, for
        wanted slots subscribed nowhere (at ``owner(slot)``, the slot map's master), for
        subscriptions nobody wants, and for those the map now puts elsewhere (a
        failover, a slot moved: they follow it). ``generation`` is the map's number,
        ``source`` the member that gave it.

        A slot without a master waits for the map. One whose subscription ended, where
        the map still names the master it ended at, waits for a map whose load began
        since; if that master ended it itself, for one that master gave, too: it knows
        whether the slot came back to it, where another member may not have heard of
        the change yet (a map naming another master is taken from anyone)."""
        out: list[tuple[Address, str, str]] = []
        if self.supported is False:
            return out
        for slot, where in list(self._at.items()):
            if slot in self._wanted and (slot, where) not in self._leaving:
                now_at = owner(slot)
                if now_at is not None and now_at != where:
                    del self._at[slot]
                    self._up.discard(slot)
                    self._unsubscribe(slot, where, out)
        for slot in self._wanted:
            if slot in self._at:
                continue
            master = owner(slot)
            if master is None:
                continue
            if slot in self._after:
                loaded, ended_at, ended = self._after[slot]
                if master == ended_at and (loaded >= generation or (ended and source != ended_at)):
                    continue
                del self._after[slot]
            self._at[slot] = master
            self._asked.setdefault(master, []).append(("s", slot))
            out.append((master, "SSUBSCRIBE", self.channel(slot)))
        for slot, where in self._at.items():
            if slot not in self._wanted and (slot, where) not in self._leaving:
                self._unsubscribe(slot, where, out)
        return out

    def _unsubscribe(self, slot: int, where: Address, out: list[tuple[Address, str, str]]) -> None:
        # Not up from now on: a waiter that comes for the slot before the answer must not
        # record a channel whose subscription is ending (its notifications would reach
        # nobody); it records the process channel until the slot is subscribed again.
        self._up.discard(slot)
        self._leaving.add((slot, where))
        self._asked.setdefault(where, []).append(("u", slot))
        out.append((where, "SUNSUBSCRIBE", self.channel(slot)))

    def unplaced(self) -> bool:
        """Some wanted slot is subscribed nowhere yet (its master unknown)."""
        return self.supported is not False and any(s not in self._at for s in self._wanted)

    def reload_from(self, owner: Callable[[int], Address | None]) -> tuple[Address, ...] | None:
        """Whether a newer slot map is needed, and whom to ask first: None if none is;
        else the masters that ended a subscription where the map (``owner``) still puts
        it (possibly none: a lost connection tells nothing). Those are asked first
        because each ended it on learning that the slot had left it: its own map is
        past the change, where another member's may not be yet (gossip takes a
        moment), and a map that still named it would place the subscription at what is
        now a replica (``plan`` waits for one of theirs, or one naming another
        master)."""
        if self.supported is False:
            return None
        first: dict[Address, None] = {}
        needed = False
        for slot, (_, at, ended) in self._after.items():
            if slot in self._wanted and owner(slot) == at:
                needed = True
                if ended:
                    first[at] = None
        return tuple(first) if needed else None

    def idle(self, where: Address) -> bool:
        """Nothing is subscribed or asked at ``where``: its connection may close."""
        return not self._asked.get(where) and where not in self._at.values()

    def answered(
        self, where: Address, reply: object, error: str | None = None, generation: int = 0
    ) -> ShardEvent:
        """A reply from the connection to ``where`` (``error``: the text of an error
        reply, which answers the oldest unanswered request there; ``generation``: the
        slot-map loads begun so far)."""
        asked = self._asked.get(where)
        if error is not None:
            if not asked:
                return ShardEvent("refused", detail=error)
            verb, slot = asked.pop(0)
            self._drop(slot, where)
            if verb == "u":
                return ShardEvent("cut", slot, detail=error)
            if sharded_refused(error):
                self.supported = False
                return ShardEvent("unsupported", slot)
            hop = redirect(error, where)
            if hop is not None and hop.kind == "moved" and hop.to is not None:
                return ShardEvent("moved", hop.slot, hop.to)
            return ShardEvent("refused", slot, detail=error)
        if not isinstance(reply, list) or len(reply) != 3 or not isinstance(reply[1], bytes):
            return _NOTHING
        kind, slot = reply[0], key_slot(reply[1])
        if kind == b"ssubscribe":
            if asked and asked[0] == ("s", slot):
                asked.pop(0)
            self.supported = True
            if self._at.get(slot) == where:
                self._up.add(slot)
                return ShardEvent("confirmed", slot)
            return _NOTHING
        if kind == b"sunsubscribe":
            if asked and asked[0] == ("u", slot):
                asked.pop(0)  # the answer to ours
                self._drop(slot, where)
                # Wanted again meanwhile, and not subscribed elsewhere since (it was
                # leaving, so ``plan`` skipped it): subscribe it anew.
                if slot in self._wanted and slot not in self._at:
                    return ShardEvent("again", slot)
                return _NOTHING
            # The server ended it: the slot moved, or its master became a replica.
            if self._at.get(slot) == where and (slot, where) not in self._leaving:
                del self._at[slot]
                was_up = slot in self._up
                self._up.discard(slot)
                self._after[slot] = (generation, where, True)
                if slot in self._wanted:
                    return ShardEvent("ended", slot) if was_up else _NOTHING
            return _NOTHING
        return _NOTHING

    def lost(self, where: Address, generation: int = 0) -> bool:
        """The connection to ``where`` is gone, and its subscriptions with it (placed
        again by a slot map whose load began after the ``generation`` begun so far: the
        master may have failed); True if a wanted one was up (its waiters should
        re-check now)."""
        self._asked.pop(where, None)
        gone = [s for s, w in self._at.items() if w == where]
        was_up = False
        self._leaving = {(s, w) for s, w in self._leaving if w != where}
        for slot in gone:
            del self._at[slot]
            self._after[slot] = (generation, where, False)
            if slot in self._up:
                self._up.discard(slot)
                was_up = was_up or slot in self._wanted
        return was_up

    def _drop(self, slot: int, where: Address) -> None:
        """``slot`` is subscribed at ``where`` no more."""
        self._leaving.discard((slot, where))
        if self._at.get(slot) == where:
            del self._at[slot]
            self._up.discard(slot)

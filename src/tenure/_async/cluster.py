"""A whole Redis Cluster as one lock node, for the asyncio driver.

Theory of operation
-------------------
A ``ClusterChannel`` stands in ``Channels`` for one Cluster node: to the round it is a
``Channel``, and behind it are one plain ``Channel`` per member address (each with its
own pipelined connection, back-off and script cache) and the slot map (``CLUSTER
SLOTS``, loaded from the seeds by a task, reloaded in the background after a ``MOVED``).

Each command goes to the master of its slot (``Command.key``). Its replies come back
through a callback of this module before the round's: a ``MOVED`` updates the map and
sends the command to the new owner, an ``ASK`` sends ``ASKING`` and the command to the
target, at most ``MAX_REDIRECTS`` times per request; the round's callback gets the
final reply. A redirection not followed, ``TRYAGAIN``, ``CLUSTERDOWN`` and a slot without
a master reach it as ``SlotSilent`` (no vote this round, never the node's configuration).

Redirections are followed even after the round ended. So a request of a key goes where
the one before it of the same key went while that one is unanswered (``_Trail``), not
where the map says: a cleanup (of a cancelled or failed acquire) or a release then runs
after the request it undoes wherever that one ends up, as on a plain node's one
connection, even when the map learnt of a new owner in between. Routed by the new map,
a cleanup would run at once at the new owner, and the acquire, answered ``MOVED`` by
the old one, would run there after it: the lock held by nobody for its whole TTL.
Following, it is answered the same redirection, from the same connection's FIFO of
replies, right after the request before it, and sent on behind it; nothing is sent
twice. A ``NOSCRIPT`` is
passed on (the round resends the EVAL form within the round only, as for a plain node),
after marking the member's cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .._core.backoff import Reconnect
from .._core.commands import (
    ASKING,
    CLUSTER_SLOTS,
    Command,
    ScriptCache,
    about_scripts,
    next_hop,
)
from .._core.config import NodeAddress
from .._core.diagnosis import (
    BackingOff,
    Diagnosis,
    no_slot_map,
    not_a_cluster,
    slot_map_late,
    slot_unserved,
)
from .._core.quorum import NEVER, Failure
from .._core.slots import (
    Address,
    MapDoubt,
    SlotMap,
    map_sources,
    redirect,
    routed_slot,
)
from .._driver.redis_compat import before_first_reply, diagnose
from .._driver.timeouts import within
from .tasks import finish

__all__ = ["ClusterChannel", "SlotSilent"]


class SlotSilent(RedisConnectionError):
    """The node gives no vote for this request (a redirection not followed, a slot
    migrating or unserved, CLUSTERDOWN): a per-round silence, never misconfiguration."""


class _NotSent(SlotSilent):
    """The request went nowhere: the slot's master could not be connected, and the slot
    map is being reloaded (a dead master whose replica may have been promoted). Not
    asked (``Failure.CONNECTING``): a round after this one waits for the map."""


class _Reloading(BackingOff):
    """The slot's master is in its back-off, and the slot map is being reloaded: the
    node was not asked (``_NotSent``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(0.0)
        self.failure = Failure.CONNECTING
        self.detail = f"{detail}; the slot map is being reloaded"
        self.args = (self.detail,)


class _Scripts(ScriptCache):
    """The cluster node's face of the members' script caches, for ``Channels.run``: the
    member that answered ``NOSCRIPT`` was marked already (``ClusterChannel._on_reply``);
    this only gives the round the EVAL form to resend within it."""

    def packed(self, command: Command) -> bytes:
        return command.packed

    def answered(self, error: str, command: Command | None) -> Command | None:
        if command is None or command.fallback is None:
            return None
        if not about_scripts(error):
            return None
        return Command(command.fallback, command.parse, command.replies, key=command.key)


class _Trail:
    """The requests of one key written and not yet answered: how many replies they owe,
    which of them was written last (``last``: its number), and where it went last
    (``to``: the member, and whether after ``ASKING``; a redirection moves it on). The
    next request of the key goes there, behind it."""

    __slots__ = ("last", "owed", "to")

    def __init__(self) -> None:
        self.owed = 0
        self.last = 0
        self.to: tuple[Address, bool] | None = None


class ClusterChannel:
    """One Redis Cluster node of a client, in one event loop (a ``Channel`` to ``Channels``)."""

    def __init__(
        self,
        address: NodeAddress,
        make_channel: Callable[[NodeAddress], Any],
        make_pool: Callable[[NodeAddress], redis.asyncio.ConnectionPool],
        connect_timeout: float,
        changed: asyncio.Event,
        node: int,
    ) -> None:
        self.address = address
        self.node = node  # its place in the client's list of nodes, as a Channel's
        self.name = address.display
        self.scripts: ScriptCache = _Scripts()
        self.last: Diagnosis | None = None
        self._make_channel = make_channel
        self._make_pool = make_pool
        self._connect_timeout = connect_timeout
        self._changed = changed
        self._members: dict[Address, Any] = {}  # Address -> Channel
        self._pools: dict[Address, redis.asyncio.ConnectionPool] = {}
        self.map: SlotMap | None = None
        # Loads of the map are numbered as they begin: ``begun`` so far, and ``loads``,
        # the number of the one that gave the map in use (a load under way when a
        # sharded subscription ended does not count as newer: ``ShardSubs``).
        self.begun = 0
        self.loads = 0
        # Told when the map in use changes: the notification listener's, whose sharded
        # subscriptions follow the map (one put at a member that is now a replica would
        # not be counted by the slot's master).
        self.on_map: Callable[[], None] | None = None
        self._first: tuple[Address, ...] = ()  # whom the next load asks first
        self._stale = False
        self._doubt = MapDoubt()
        # A load of the map under way since a master could not be connected (a dead
        # master whose replica may have been promoted): rounds wait for it as for a
        # set-up (``connecting``), for connect_timeout at most (``_doubted``), and route
        # by its map.
        self._doubting = False
        self._closing = False  # no load begins while the members close (their errors)
        self._load: asyncio.Task[None] | None = None
        self._reconnect = Reconnect()
        self._blamed: Any = None  # the member whose reply the round judged last
        # The keys with requests unanswered, and where the last of each went (``send``).
        self._trails: dict[str, _Trail] = {}
        self._sent = 0  # requests written so far: each one's number, for its trail
        self.used_at = 0.0  # when a request was last written (``Channels.run``'s look)
        self.answered_at = NEVER  # as a Channel's, for any member's answer

    def diagnose(self, exc: Exception) -> Diagnosis:
        """``exc`` (an error reply a member sent, late or in its round) as this node's
        failure: a Cluster node's members are plain Redis nodes."""
        if isinstance(exc, _NotSent):
            return Diagnosis(Failure.CONNECTING, str(exc))
        return diagnose(exc)

    # --- members and the slot map -----------------------------------------------------

    def _member(self, where: Address) -> Any:
        channel = self._members.get(where)
        if channel is None:
            channel = self._members[where] = self._make_channel(self.address.member(*where))
        return channel

    def _pool(self, where: Address) -> redis.asyncio.ConnectionPool:
        pool = self._pools.get(where)
        if pool is None:
            pool = self._pools[where] = self._make_pool(self.address.member(*where))
        return pool

    def _start_load(self) -> None:
        if self._load is None:
            self._doubt.loading(time.monotonic())
            self.begun += 1
            self._load = asyncio.get_running_loop().create_task(self._load_map(self.begun))

    async def _load_map(self, number: int) -> None:
        errors: list[Diagnosis] = []
        now = time.monotonic()
        first, self._first = self._first, ()
        sources = map_sources(self.address.seeds, self.map, first)
        # Members in their back-off last (a dead master, most likely what the load is
        # for): one that does not even refuse would hold it up connect_timeout.
        sources.sort(key=lambda a: a in self._members and self._members[a].backing_off(now) > 0)
        try:
            for where in sources:
                seed = self.address.member(*where)
                name = seed.display
                conn = self._pool(where).make_connection()  # type: ignore[no-untyped-call]
                try:

                    async def ask(conn: Any = conn) -> object:
                        await conn.connect()
                        await conn.send_packed_command(CLUSTER_SLOTS, check_health=False)
                        return await conn.read_response()

                    reply = await within(ask(), self._connect_timeout)
                    self.map, self._stale = SlotMap.parse(reply, where), False
                    self.loads = number
                    self._map_changed()
                    self._reconnect.succeeded()
                    self.last = None
                    # The masters' set-ups begin now, so a round waiting for this node
                    # waits for them too (``connecting``), not within its own deadline.
                    self.connect(time.monotonic())
                    return
                except ResponseError as exc:
                    errors.append(not_a_cluster(name, str(exc)))
                except TimeoutError:
                    errors.append(slot_map_late(seed, self._connect_timeout))
                except ValueError as exc:
                    errors.append(Diagnosis(Failure.ERROR, f"{name}: {exc}"))
                except Exception as exc:  # not BaseException: cancellation goes on
                    why = diagnose(exc, plain="redis+cluster")
                    why = before_first_reply(why, exc, seed.login_form)
                    errors.append(Diagnosis(why.failure, f"{name}: {why.detail}"))
                finally:
                    with contextlib.suppress(Exception):
                        await conn.disconnect(nowait=True)
            if self.map is None:
                self.last = no_slot_map(errors)
                self._reconnect.failed(time.monotonic())
        finally:
            self._load = None
            self._doubting = False
            self._changed.set()

    # --- what the notification listener reads (sharded subscriptions) -----------------

    def owner(self, slot: int) -> Address | None:
        """The master of ``slot`` in the slot map (None: no map yet, or no master)."""
        return None if self.map is None else self.map.owner(slot)

    def member_pool(self, where: Address) -> redis.asyncio.ConnectionPool:
        """The connection pool of the member at ``where`` (made on first use)."""
        return self._pool(where)

    def moved(self, slot: int, to: Address) -> None:
        """A ``MOVED`` seen elsewhere (by the listener): as one a round met."""
        self._moved(slot, to)

    def refresh(self, first: tuple[Address, ...] = ()) -> None:
        """Have the whole map reloaded now (a sharded subscription ended), asking the
        members ``first`` first (when this begins a load: one under way goes on)."""
        self._stale = True
        if self._load is None:
            self._first = first
        self._start_load()

    def listener_pool(self) -> redis.asyncio.ConnectionPool:
        """Where the classic notification subscription connects (no sharded pub/sub,
        Redis 6.2): the first master of the map known so far, else the first seed. Any
        master hears a ``PUBLISH`` made anywhere in the cluster, and a seed that died is
        left once the map was reloaded (``listener_lost``)."""
        masters = self.map.masters() if self.map is not None else []
        return self._pool(masters[0] if masters else self.address.seeds[0])

    def listener_lost(self) -> None:
        """The classic subscription's connection to a master failed: as for any member
        that failed on the network, the map is put in doubt (a dead master, its replica
        promoted, which nothing tells a subscriber)."""
        self._failed()

    def _failed(self) -> None:
        """A member serving a slot failed on the network: its master may have died and
        a replica been promoted, which no ``MOVED`` tells, so the map is reloaded (at
        most once per ``MAP_RECHECK``: ``MapDoubt``)."""
        if self.map is None or self._closing:
            return
        if self._doubt.failed(time.monotonic()):
            self._stale = True
            self._start_load()
        if self._load is not None and not self._doubting:
            self._doubting = True
            asyncio.get_running_loop().call_later(self._connect_timeout, self._doubted)

    def _doubted(self) -> None:
        """Rounds no longer wait for the load begun after a master failed (it took
        connect_timeout): the map known so far serves meanwhile."""
        if self._doubting:
            self._doubting = False
            self._changed.set()

    def _moved(self, slot: int, to: Address) -> None:
        if self.map is not None:
            self.map = self.map.moved(slot, to)
            self._map_changed()
        self._stale = True

    def _map_changed(self) -> None:
        if self.on_map is not None:
            self.on_map()

    # --- what Channels reads of a channel ---------------------------------------------

    def connect(self, now: float) -> None:
        """Load the slot map (first use), then connect to every master.

        Raises:
            BackingOff: the map could not be loaded lately.
        """
        if self.map is None:
            wait = self._reconnect.left(now)
            if wait and self._load is None:
                raise BackingOff(wait, self.last)
            self._start_load()
            return
        if self._stale:
            self._start_load()  # in the background: the patched map serves meanwhile
        for where in self.map.members:  # the replicas too (``SlotMap.members``)
            # A member in its back-off fails the requests of its slots only (``send``).
            with contextlib.suppress(BackingOff):
                self._member(where).connect(now)

    @property
    def connecting(self) -> bool:
        if self.map is None:
            return self._load is not None
        # A member probing a node gone silent is not waited for (``Channel.probing``):
        # its slots' requests wait in its queue, sent once the node answers, or fail.
        return self._doubting or any(
            (member := self._member(w)).connecting and not member.probing
            for w in self.map.masters()
        )

    # What ``Channels._set_up`` asks of a channel: this one's members' probes are left
    # out of ``connecting`` instead, member by member.
    probing = False

    @property
    def ready(self) -> bool:
        return self.map is not None and not self.connecting

    def backing_off(self, now: float) -> float:
        return self._reconnect.left(now) if self.map is None and self._load is None else 0.0

    @property
    def batched(self) -> bool:
        return any(m.batched for m in self._members.values())

    @property
    def backlogged(self) -> bool:
        return any(m.backlogged for m in self._members.values())

    @property
    def unread(self) -> bool:
        return any(m.unread for m in self._members.values())

    def shed_if_closed(self) -> bool:
        """Let go of the member connections their nodes closed while unused, and set
        them up again: the round waits for that (``ready``), as for any set-up. True
        while replies owed on a member wait unread (``Channel.shed_if_closed``)."""
        behind = shed = False
        for member in self._members.values():
            if member.ready:
                behind = member.shed_if_closed() or behind
                shed = shed or not member.ready
        if shed:
            self.connect(time.monotonic())
        return behind

    def drop(self, exc: Exception) -> None:
        """The member whose reply made no sense, or refused for its configuration."""
        if self._blamed is not None:
            self._blamed.drop(exc)

    async def close(self, grace: float) -> None:
        self._closing = True
        load, self._load = self._load, None
        if load is not None:
            await finish([load])
        await asyncio.gather(*(m.close(grace) for m in self._members.values()))
        for pool in self._pools.values():
            await pool.disconnect()

    def send(self, command: Command, on_reply: Callable[[int, Any], None]) -> None:
        """Write ``command`` to the master of its slot, or behind the request of the same
        key still unanswered, if any (``_Trail``); its replies reach ``on_reply`` once
        redirections were followed.

        Raises:
            BackingOff: the slot's master (or the member the last request of the key
                went to) is in its back-off.
        """
        self.used_at = time.monotonic()
        if self._stale and self.map is not None:
            self._start_load()
        key = command.key
        trail = self._trails.get(key)
        if trail is None:
            trail = self._trails[key] = _Trail()
        to, before = trail.to, trail.last
        self._sent += 1
        trail.last = self._sent
        trail.owed += command.replies
        try:
            self._route(command, partial(self._answered, key, on_reply), 0, to, self._sent)
        except BackingOff as exc:
            trail.owed -= command.replies  # not written: it owes nothing
            if trail.last == self._sent:
                trail.last = before
            if trail.owed <= 0 and self._trails.get(key) is trail:
                del self._trails[key]
            self._failed()  # the slot's master failed lately: a dead master?
            if self._doubting and exc.failure is Failure.BACKING_OFF:
                raise _Reloading(exc.detail) from exc
            raise

    def _answered(
        self, key: str, on_reply: Callable[[int, Any], None], node: int, reply: tuple[bool, Any]
    ) -> None:
        """A final reply of a request of ``key`` (no redirection left to follow): one
        fewer owed on its trail, gone with the last one."""
        trail = self._trails.get(key)
        if trail is not None:
            trail.owed -= 1
            if trail.owed <= 0:
                del self._trails[key]
        on_reply(node, reply)

    def _route(
        self,
        command: Command,
        on_reply: Callable[[int, Any], None],
        hops: int,
        to: tuple[Address, bool] | None,
        number: int,
    ) -> None:
        slot = routed_slot(command.key)
        if to is None:
            where = None if self.map is None else self.map.owner(slot)
            if where is None:
                why = slot_unserved(slot) if self.map is not None else self.last
                detail = why.detail if why is not None else "no slot map yet"
                for _ in range(command.replies):
                    on_reply(self.node, (False, SlotSilent(detail)))
                return
            asking = False
        else:
            where, asking = to
        member = self._member(where)
        if asking:
            member.send(ASKING)  # its +OK is nobody's
        # Queued until the member is connected: its connections so far, to tell a
        # request that never went out when the set-up fails (``_on_reply``).
        ups = -1 if member.ready else member.ups
        member.send(
            command,
            partial(self._on_reply, command, on_reply, hops, (where, asking), member, ups, number),
        )
        trail = self._trails.get(command.key)
        if trail is not None and trail.last == number:
            trail.to = (where, asking)  # the last request of the key went here (so far)

    def _on_reply(
        self,
        command: Command,
        on_reply: Callable[[int, Any], None],
        hops: int,
        sent: tuple[Address, bool],
        member: Any,
        ups: int,
        number: int,
        node: int,
        reply: tuple[bool, Any],
    ) -> None:
        ok, value = reply
        self._blamed = member
        if not ok and not isinstance(value, (ResponseError, SlotSilent)):
            self._failed()  # the connection broke or was refused: a dead master?
            if ups == member.ups and self._doubting:
                # Queued for a connection that never came up: it went nowhere, and the
                # map is being reloaded. Not asked; a later round routes by the new map.
                value = _NotSent(f"{member.address.display}: {value}")
        if ok or not isinstance(value, ResponseError) or command.replies != 1:
            if not ok and isinstance(value, ResponseError):
                value = self._silenced(value) or value
            on_reply(node, (ok, value))
            return
        text = str(value)
        if about_scripts(text):
            member.scripts.answered(text, None)  # its next acquire goes by EVAL
            on_reply(node, reply)
            return
        where = (member.address.host or "", member.address.port or 0)
        hop = redirect(text, where)
        if hop is None:
            on_reply(node, reply)
            return
        if hop.kind == "moved" and hop.to is not None:
            self._moved(hop.slot, hop.to)
            self._start_load()
        # A release whose keys a migration split (TRYAGAIN) goes as the lock key alone,
        # to the member that answered, as it was sent there (``sent``), which has it.
        step = next_hop(command, hop, where, sent[1], hops)
        if step is None:
            on_reply(node, (False, SlotSilent(hop.detail(member.address.display))))
            return
        try:
            self._route(step.command, on_reply, hops + 1, (step.to, step.asking), number)
        except BackingOff as exc:
            on_reply(node, (False, SlotSilent(f"{hop.detail()}: {exc.detail}")))

    def _silenced(self, error: ResponseError) -> SlotSilent | None:
        hop = redirect(str(error))
        return None if hop is None else SlotSilent(hop.detail())

"""A whole Redis Cluster as one lock node, for the blocking driver.

Theory of operation
-------------------
A ``ClusterState`` is what every link set of a client shares about one Cluster node:
its slot map (``CLUSTER SLOTS``, loaded from the seeds in a thread of its own) and one
``NodeState`` per member address (its back-off and script cache). A ``ClusterLink`` is
that node's link in one ``LinkSet``: one plain ``Link`` per member, and, per round, the
one that carries the round's command, to the master of the command's slot
(``Command.key``). The link set sees a ``Link``: it writes, ``select()``s on the socket of
the member carrying the request, reads, gives up and owes replies exactly as for a plain
node. Owed replies are counted per member connection, where they are owed.

Within a round a ``MOVED`` is followed once the member it names is connected (the map
takes the new owner at once, and is reloaded in the background before later rounds),
an ``ASK`` is followed with ``ASKING`` (whose reply is owed), at most ``MAX_REDIRECTS``
times; otherwise, and on ``TRYAGAIN`` or ``CLUSTERDOWN``, the node gives no vote this
round, which is never a configuration failure. A slot the map gives no master is the
same. A seed that is not in cluster mode is a configuration failure of the node.

What is written behind a round an interrupt cut short (a release, a failed attempt's
cleanup, a dequeue: ``send_behind``) is not read in the caller's thread, and the link
set is closed. It goes where that round's request went, with a marker behind it, and
the member connection is handed to a thread of its own (``_follow``) rather than
closed: it reads up to the marker and follows the answer's ``MOVED``, ``ASK`` or
``TRYAGAIN`` by the rule the rounds follow (``commands.next_hop``). A slot half
migrated answers ``ASK`` at the old owner, and the lock key, at the new one, would stay
there for its TTL, held by nobody.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import ResponseError

from .._core.backoff import Reconnect
from .._core.commands import (
    ASKING,
    CLUSTER_SLOTS,
    Command,
    ScriptCache,
    behind_marker,
    next_hop,
)
from .._core.config import NodeAddress
from .._core.diagnosis import (
    Diagnosis,
    no_slot_map,
    not_a_cluster,
    slot_map_late,
    slot_unserved,
)
from .._core.flows import RELEASE_PATIENCE
from .._core.quorum import NEVER, Failure, Round
from .._core.slots import (
    Address,
    MapDoubt,
    Redirect,
    SlotMap,
    map_load_bound,
    map_sources,
    redirect,
    routed_slot,
)
from .._driver.clock import monotonic
from .._driver.guard import Guard
from .._driver.ready import readable
from .._driver.redis_compat import (
    SocketReplies,
    before_first_reply,
    diagnose,
    reply_text,
    timed_out,
)
from .._driver.threads import start_thread
from .links import Link, NodeState, _Failed

__all__ = ["ClusterLink", "ClusterState"]


class _MapLoad:
    """``CLUSTER SLOTS`` asked of the seeds in turn, in a thread of its own.

    Each seed is given ``connect_timeout`` for its whole answer, connecting included, as
    the asyncio client's load gives it: redis-py's socket timeout bounds each wait for
    bytes, not a whole reply, so a seed answering a byte at a time (a stalled proxy, a
    server dying slowly) kept the thread reading for ever, and a first load with it.
    The answer is read here (``_slots_reply``), its seed given up at its deadline. A
    first load is waited for until ``ends_by`` at most (``map_load_bound``): one still
    under way then (a name lookup that hangs, a handshake answered a byte at a time) is
    given up (``give_up``); its thread ends with the seed it is reading, whose socket
    is shut down.
    """

    def __init__(
        self,
        members: list[NodeState],
        now: float,
        connect_timeout: float,
        on_done: Callable[[], None],
    ) -> None:
        # Rounds waiting for a reload (the map known so far serves) wait this long.
        self.deadline = now + connect_timeout
        # A first load is waited for this long (``ClusterState.slot_map``).
        self.ends_by = now + map_load_bound(len(members), connect_timeout)
        self.done = False
        self.number = 0  # its place among the loads begun (``ClusterState.begun``)
        self.result: SlotMap | None = None
        self.error: Diagnosis | None = None
        self._members = members
        self._connect_timeout = connect_timeout
        self._errors: list[Diagnosis] = []
        # The seed being read (its address: its name, and whether over TLS), and how.
        self._asking: tuple[NodeAddress, redis.Connection] | None = None
        self._given_up: Diagnosis | None = None  # why, once given up (``give_up``)
        # Called when it ends: the wake-up of every round waiting for it (``listen``).
        self._wakes = [on_done]
        self._lock = Guard()
        if start_thread(self._run, "tenure-slots") is None:
            self._run()  # no thread to be had (the interpreter is ending): here, done on return

    def abandon(self) -> None:
        """Nobody waits for it any more (``give_up``)."""
        self.give_up()

    def give_up(self) -> Diagnosis:
        """Let go of it before it ended: the seed being read is let go at once (its
        socket shut down), and no other is asked. Returns why there is no slot map:
        what the seeds asked so far said, and that the one being read gave no map in
        time (taken before its read ends: a read cut short says only "closed")."""
        with self._lock:
            if self._given_up is None:
                errors = list(self._errors)
                if self._asking is not None:
                    errors.append(slot_map_late(self._asking[0], self._connect_timeout))
                self._given_up = self._why(errors)
            asking, self._asking = self._asking, None
            why = self._given_up
        if asking is not None:
            _shut(asking[1])
        return why

    def _why(self, errors: list[Diagnosis]) -> Diagnosis:
        if not errors:  # given up before the first seed was asked
            errors = [slot_map_late(self._members[0].address, self._connect_timeout)]
        return no_slot_map(errors)

    def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when it ends (now, if it has)."""
        with self._lock:
            if not self.done:
                if wake not in self._wakes:
                    self._wakes.append(wake)
                return
        wake()

    def _run(self) -> None:
        errors = self._errors
        try:
            for member in self._members:
                until = monotonic() + member.connect_timeout
                conn = member.new_connection()
                with self._lock:
                    if self._given_up is not None:
                        break
                    self._asking = (member.address, conn)
                try:
                    conn.socket_timeout = member.connect_timeout
                    conn.connect()  # type: ignore[no-untyped-call]
                    reply = _slots_reply(conn, until)
                    asked = (member.address.host or "", member.address.port or 0)
                    self.result = SlotMap.parse(reply, asked)
                    return
                except _Late:
                    why = slot_map_late(member.address, member.connect_timeout)
                except ResponseError as exc:
                    why = not_a_cluster(member.name, reply_text(exc))
                except ValueError as exc:
                    why = Diagnosis(Failure.ERROR, f"{member.name}: {exc}")
                except Exception as exc:  # not BaseException: an interrupt is no node's failure
                    said = diagnose(exc, plain="redis+cluster")
                    said = before_first_reply(said, exc, member.address.login_form)
                    why = Diagnosis(said.failure, f"{member.name}: {said.detail}")
                finally:
                    with self._lock:
                        self._asking = None
                    with contextlib.suppress(Exception):
                        conn.disconnect()  # type: ignore[no-untyped-call]
                with self._lock:
                    errors.append(why)
            with self._lock:
                self.error = self._given_up or self._why(errors)
        finally:
            with self._lock:
                self.done = True
            for wake in self._wakes:
                wake()


class _Late(Exception):
    """A seed gave no whole answer by its deadline."""


def _slots_reply(conn: redis.Connection, until: float) -> object:
    """The answer to ``CLUSTER SLOTS`` on ``conn`` (just connected), whole by ``until``.

    Read here, not by redis-py, whose socket timeout bounds each wait for bytes only:
    a seed answering a byte at a time is given up at ``until`` all the same.

    Raises:
        _Late: no whole answer by ``until``.
        ResponseError: an error reply.
        ConnectionError, OSError, InvalidResponse: as a link's reads.
    """
    conn.send_packed_command([CLUSTER_SLOTS], check_health=False)  # type: ignore[no-untyped-call]
    io = SocketReplies(conn)
    while True:
        left = until - monotonic()
        if left <= 0.0 or not readable([io.sock], left):
            raise _Late
        if io.receive():
            return io.read()


def _shut(conn: redis.Connection) -> None:
    """End a read of ``conn`` under way in another thread: its socket shut down (the
    read sees the connection closed), not closed under it."""
    sock: socket.socket | None = conn._sock  # None until connected (typed as never None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class ClusterState(NodeState):
    """What every link set of one client shares about one Redis Cluster node (a
    ``NodeState`` to the link set and the notification listener)."""

    def __init__(
        self,
        address: NodeAddress,
        member_state: Callable[[NodeAddress], NodeState],
        timeout: float,
        connect_timeout: float,
    ) -> None:
        # Not NodeState.__init__: the node has no connection of its own, its members do.
        self.address = address
        self.name = address.display
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.last: Diagnosis | None = None
        self.scripts = ScriptCache()  # unused: each member has its own
        self._member_state = member_state
        self._members: dict[Address, NodeState] = {}
        self._lock = Guard()
        self._reconnect = Reconnect()
        self.map: SlotMap | None = None
        # Loads of the map are numbered as they begin: ``begun`` so far, and ``loads``,
        # the number of the one that gave the map in use (a load under way when a
        # sharded subscription ended does not count as newer: ``ShardSubs``).
        self.begun = 0
        self.loads = 0
        self._first: tuple[Address, ...] = ()  # whom the next load asks first
        # Told when the map in use changes: the notification listener's poke, whose
        # sharded subscriptions follow the map (one put at a member that is now a
        # replica would not be counted by the slot's master).
        self.on_map: Callable[[], None] | None = None
        self._stale = False
        self._doubt = MapDoubt()
        self._load: _MapLoad | None = None

    def member(self, where: Address) -> NodeState:
        """The state of the member at ``where`` (one per address, made on first use)."""
        with self._lock:
            return self._member_or_new(where)

    def new_link(self) -> ClusterLink:
        return ClusterLink(self)

    def new_connection(self) -> redis.Connection:
        """A connection to a master of the cluster (the first of the map, else the first
        seed): where the notification listener subscribes. The map is taken as rounds
        take it (``routing``): a load that the listener's lost connection made due
        (``failed``) begins here, and the connection after it goes by the new map."""
        slot_map = self.routing(monotonic())
        masters = slot_map.masters() if slot_map is not None else []
        return self.member(masters[0] if masters else self.address.seeds[0]).new_connection()

    def backing_off(self, now: float) -> float:
        return self._reconnect.left(now) if self.map is None else 0.0

    def down(self, now: float, why: Diagnosis | None = None, *, stalled: bool = False) -> None:
        self.last = why  # a member's failure: its own state keeps the back-off (and probe)

    def up(self) -> None:
        """Members keep their own back-off."""

    def moved(self, slot: int, to: Address) -> None:
        """A ``MOVED``: the slot's new owner now, the whole map reloaded before long."""
        with self._lock:
            if self.map is not None:
                self.map = self.map.moved(slot, to)
                self._map_changed()
            self._stale = True

    def in_use(self) -> tuple[SlotMap | None, int]:
        """The map in use and its number (``loads``), read together: a round in another
        thread may take a newer map between two reads."""
        with self._lock:
            return self.map, self.loads

    def _map_changed(self) -> None:
        if self.on_map is not None:
            self.on_map()

    def refresh(self, first: tuple[Address, ...] = ()) -> None:
        """Have the whole map reloaded (a sharded subscription ended: the slot moved),
        asking the members ``first`` first (when this begins a load: one under way goes
        on)."""
        with self._lock:
            self._stale = True
            if self._load is None:
                self._first = first

    def failed(self, now: float) -> None:
        """A member serving a slot failed on the network: its master may have died and
        a replica been promoted, which no ``MOVED`` tells, so the map is reloaded (at
        most once per ``MAP_RECHECK``: ``MapDoubt``)."""
        with self._lock:
            if self._doubt.failed(now):
                self._stale = True

    def reload(self, now: float) -> _MapLoad | None:
        """A member serving a slot could not be connected (``failed``): the load of the
        map that began for it, or was under way already, while it lasts; or one that
        ended since the round was routed, taken just now: the round went by the map
        before it, and the next one routes by the new map (a load to a live member takes
        about as long as routing a round and setting up its links, and no other load
        may begin for ``MAP_RECHECK``). The load begun here counts even if it has
        ended already: a live member answers in a few milliseconds, and this thread may
        have been descheduled for longer (the next round takes its map)."""
        self.failed(now)
        ended = self._load  # taken by slot_map if it ended with a map
        self.slot_map(now, _nothing)
        for load in (self._load, ended):
            if load is not None and (not load.done or load.result is not None):
                return load
        return None

    def routing(self, now: float) -> SlotMap | None:
        """The map a round is routed by: a reload that ended is taken, a due one begun
        (in the background; the map known so far serves meanwhile). A link that is
        ``ready`` is not prepared before its rounds, so this is where they see it."""
        if self._stale or self._load is not None:
            self.slot_map(now, _nothing)
        return self.map

    def slot_map(self, now: float, wake: Callable[[], None]) -> SlotMap | Diagnosis | None:
        """The slot map; None while it is being loaded for the first time; why there
        is none (the load failed, or its back-off has not ended)."""
        with self._lock:
            load = self._load
            if load is not None and load.done:
                self._load = None
                if load.result is not None:
                    self.map, self._stale = load.result, False
                    self.loads = load.number
                    self._map_changed()
                    self._reconnect.succeeded()
                    self.last = None
                elif self.map is None:
                    assert load.error is not None
                    self.last = load.error
                    self._reconnect.failed(now)
                    return load.error
                load = None
            elif load is not None and self.map is None and now >= load.ends_by:
                # A first load still under way past its bound: given up, as one that
                # failed (its thread ends with the seed it is reading). A later round,
                # after the back-off, begins a fresh one.
                self._load = None
                self.last = load.give_up()
                self._reconnect.failed(now)
                return self.last
            if load is None and (self.map is None or self._stale):
                if self.map is None and self._reconnect.left(now):
                    return self.last or Diagnosis(Failure.BACKING_OFF, "slot map not loaded")
                sources = map_sources(self.address.seeds, self.map, self._first)
                self._first = ()
                members = [self._member_or_new(a) for a in sources]
                # Those in their back-off last (a dead master, most likely what the load
                # is for): one that does not even refuse would hold it up connect_timeout.
                members.sort(key=lambda m: m.backing_off(now) > 0)
                self.begun += 1
                self._load = load = _MapLoad(members, now, self.connect_timeout, wake)
                load.number = self.begun
                self._doubt.loading(now)
            if self.map is not None:
                return self.map  # a stale map serves while it is reloaded
            return None if load is not None else self.last

    def _member_or_new(self, where: Address) -> NodeState:
        state = self._members.get(where)
        if state is None:
            state = self._members[where] = self._member_state(self.address.member(*where))
        return state

    @property
    def loading(self) -> _MapLoad | None:
        return self._load


class _Pending:
    """What ``LinkSet._set_up`` waits for: the map's load or members' set-ups."""

    def __init__(self, deadline: float, parts: list[Any]) -> None:
        self.deadline = deadline
        self._parts = parts

    # What ``LinkSet._set_up`` asks of a set-up: a member's probe of a node gone silent
    # is left out of ``ClusterLink.setup`` instead, member by member.
    probe = False

    def abandon(self) -> None:
        for part in self._parts:
            part.abandon()


def _awaited(sub: Link) -> bool:
    """Is ``sub`` (a member's link) being set up, for rounds to wait for? Not if its set-up
    probes a node gone silent (``SetUp.probe``): the round goes on, and the requests of
    that member's slots fail, its connection not being up."""
    return sub.setup is not None and not sub.setup.probe


class ClusterLink(Link):
    """One Cluster node's link in one link set: a plain link per member."""

    __slots__ = (
        "_asking",
        "_behind",
        "_current",
        "_hops",
        "_key",
        "_prepared",
        "_reload",
        "_subs",
        "_to_connect",
        "_wake",
        "cluster",
    )

    def __init__(self, cluster: ClusterState) -> None:  # no Link.__init__: nothing of its own
        self.cluster = cluster
        self.answered_at = NEVER  # a member's owed reply read (``LinkSet._read_one``)
        self._subs: dict[Address, Link] = {}
        self._current: Link | None = None  # the member carrying this round's request
        self._key = ""  # that request's routing key
        # What ``send_behind`` wrote behind an interrupted round, whose answers are
        # read, and redirections followed, once the link set is closed (``close``).
        self._behind: list[_Behind] = []
        self._hops = 0  # redirections followed in this round
        self._asking = False  # the request went with ASKING (an ASK followed)
        # A redirection not followed only because its member is still being connected:
        # the round is no evidence against the node (``Round.failed_untried``).
        self._to_connect = False
        # ``prepare`` has had a map and started a set-up of every member it names. Until
        # then the link has no member connection at all: with the map already loaded
        # (by another link set of the client) and nothing being set up, it would look
        # ready, and its first round would find the slot's master not connected.
        self._prepared = False
        # The slot map's load that began when a master could not be connected (a dead
        # master whose replica may have been promoted: no MOVED tells it). The link is
        # not ready while it lasts, so the next round waits for it as for a set-up
        # (within connect_timeout, not charged to node_timeout) and routes by its map.
        self._reload: _MapLoad | None = None
        self._wake: Callable[[], None] = _nothing  # the link set's (``prepare``)

    # What LinkSet reads and writes of a link, of the member carrying the request.

    @property
    def node(self) -> ClusterState:  # type: ignore[override]
        return self.cluster

    @property
    def conn(self) -> redis.Connection | None:  # type: ignore[override]
        current = self._current
        if current is not None and current.conn is not None:
            return current.conn
        return _READY if self._ready() else None

    @property
    def owed(self) -> int:
        return 0 if self._current is None else self._current.owed

    @owed.setter
    def owed(self, value: int) -> None:
        if self._current is not None:
            self._current.owed = value

    def take_late(self) -> Diagnosis | None:
        return None if self._current is None else self._current.take_late()

    def take_resends(self) -> list[Command]:
        return [] if self._current is None else self._current.take_resends()

    @property
    def partial(self) -> list[Any]:
        return [] if self._current is None else self._current.partial

    @partial.setter
    def partial(self, value: list[Any]) -> None:
        if self._current is not None:
            self._current.partial = value

    @property
    def setup(self) -> _Pending | None:  # type: ignore[override]
        load = self.cluster.loading
        parts: list[Any] = [s.setup for s in self._subs.values() if _awaited(s)]
        deadlines = [p.deadline for p in parts]
        if load is not None and self.cluster.map is None:
            parts.append(load)
            deadlines.append(load.ends_by)  # a first load: ``slot_map`` gives it up then
        if self._reload is not None:
            parts.append(self._reload)
            deadlines.append(self._reload.deadline)
        if not parts:
            return None
        return _Pending(min(deadlines), parts)

    def _ready(self) -> bool:
        # Not ``cluster.map``, which another thread may swap at any time: whether this
        # link was prepared changes only in the thread using it, so a round that has
        # just prepared it cannot find it unready with nothing being set up.
        return (
            self._prepared
            and self._reload is None
            and not any(_awaited(s) for s in self._subs.values())
        )

    def ready(self) -> bool:
        # Whatever carried the last round (``conn``): a new round waits for the members
        # still being set up, such as the promoted replica a redirection just named, or
        # it would find it still connecting again.
        return self._ready()

    def shed_if_closed(self, now: float, wake: Callable[[], None]) -> None:
        # A member closed here is set up again at once: the link is not ``ready`` while
        # that goes on, so the next round waits for it rather than finding it missing.
        for sub in self._subs.values():
            if sub.ready():
                sub.shed_if_closed(now, wake)
                if not sub.ready():
                    sub.prepare(now, wake)

    def _sub(self, where: Address) -> Link:
        sub = self._subs.get(where)
        if sub is None:
            sub = self._subs[where] = Link(self.cluster.member(where))
        return sub

    def prepare(self, now: float, wake: Callable[[], None]) -> Diagnosis | None:
        """Load the slot map (first use), then set up a connection to every member."""
        self._wake = wake
        reload = self._reload
        if reload is not None:
            if reload.done or now >= reload.deadline:
                self._reload = None  # taken below; or the map known so far serves
            else:
                reload.listen(wake)
        slot_map = self.cluster.slot_map(now, wake)
        if isinstance(slot_map, Diagnosis):
            return slot_map
        if slot_map is None:
            return None  # loading: ``setup`` says until when
        members = slot_map.members
        for where in members:  # the replicas too (``SlotMap.members``)
            sub = self._sub(where)
            # A member that cannot be connected fails the rounds of its slots only
            # (``send``), not the node's: its diagnosis is kept on its state. A master's
            # has the map reloaded, which the round waits for.
            if (
                sub.conn is None
                and sub.prepare(now, wake) is not None
                and where in slot_map.masters()
            ):
                self._await(self.cluster.reload(now), wake)
        for where, sub in self._subs.items():
            if sub.setup is not None and where not in members:
                # A member the map no longer names (a dead master, after a reload) whose
                # set-up began earlier (an ASK's target, a connection it closed): still
                # followed to its end, or ``ready`` would wait for it for ever and
                # ``LinkSet._set_up`` spin past its deadline. One still under way goes on
                # (an ASK's target may hold no slot yet), bounded by connect_timeout.
                sub.prepare(now, wake)
        # Last: a prepare an interrupt cut short, some members untried, is done again.
        self._prepared = True
        return None

    def backing_off(self, now: float) -> float:
        return self.cluster.backing_off(now)

    def send(self, command: Command, now: float) -> Any:
        """Write ``command`` to the master of its slot; returns the member's socket.

        Raises:
            _Failed: no master for the slot, its connection is not up, or the write
                failed.
        """
        self._hops = 0
        self._to_connect = False
        self._asking = False
        self._current = None
        self._key = command.key
        slot_map = self.cluster.routing(now)
        slot = routed_slot(command.key)
        where = None if slot_map is None else slot_map.owner(slot)
        if where is None:
            raise _Failed(slot_unserved(slot))
        return self._write(self._sub(where), command, now, asking=False)

    def send_behind(self, command: Command, now: float) -> None:
        """Write ``command`` (a release, a cleanup) behind a round an interrupt cut
        short, whose replies nobody reads any more: on the member connection that
        carried that round's request of the same slot, after ``ASKING`` if the request
        went so, where it runs after it (as the asyncio client's ``_Trail``); else to the
        slot's master in the map. Behind it goes a marker (``behind_marker``): once the
        link set is closed, its answer is told from whatever came before it, and a
        redirection (the slot half migrated: ``ASK`` at the old owner, ``TRYAGAIN`` at
        the new one) is followed in a thread of its own (``_follow``). Not followed,
        the key it was to delete stayed for its whole TTL, held by nobody.

        Raises:
            _Failed: it could not be written (no member connected for the slot).
        """
        slot = routed_slot(command.key)
        sub, asking = self._current, self._asking
        if sub is None or sub.conn is None or not self._key or routed_slot(self._key) != slot:
            slot_map = self.cluster.routing(now)
            where = None if slot_map is None else slot_map.owner(slot)
            if where is None:
                raise _Failed(slot_unserved(slot))
            sub, asking = self._subs.get(where), False
            if sub is None or sub.conn is None:
                raise _Failed(Diagnosis(Failure.CONNECTING, "the slot's master is not connected"))
        nonce = secrets.token_hex(8)
        self._current, self._asking = sub, asking
        if asking:
            sub.send(ASKING, now)
        sub.send(command, now)
        sub.send(Command(behind_marker(nonce)), now)
        self._behind.append(_Behind(sub, command, asking, nonce.encode()))

    def _await(self, load: _MapLoad | None, wake: Callable[[], None]) -> bool:
        """The next round waits for ``load`` (the map's, after a master failed), if any."""
        if load is None:
            return False
        self._reload = load
        load.listen(wake)
        return True

    def _write(self, sub: Link, command: Command, now: float, *, asking: bool) -> Any:
        if sub.conn is None:
            why = sub.prepare(now, self._wake)  # its set-up goes on for the next rounds
            # Refused, or in its back-off: a dead master whose replica was promoted? Not
            # asked: the request goes, in a round after this one, where the map names.
            if why is not None:
                load = self.cluster.reload(now)
                if not why.failure.configuration and self._await(load, self._wake):
                    why = Diagnosis(
                        Failure.CONNECTING,
                        f"{sub.node.name} (a master): {why.detail}; the slot map is being reloaded",
                    )
            raise _Failed(
                why
                or Diagnosis(Failure.CONNECTING, f"{sub.node.name} (a master) is not connected yet")
            )
        self._current = sub
        self._asking = asking
        try:
            if asking:
                sub.send(ASKING, now)
                sub.owed += 1  # its +OK comes before our reply and is nobody's
            return sub.send(command, now)
        except _Failed:
            self._await(self.cluster.reload(now), self._wake)
            raise

    def socket(self) -> Any:
        return None if self._current is None else self._current.socket()

    def reply(self) -> Any:
        assert self._current is not None
        return self._current.reply()

    def read(self) -> Any:
        assert self._current is not None
        return self._current.read()

    def more_ready(self) -> bool:
        return self._current is not None and self._current.more_ready()

    def abandon(self, now: float, replies: int = 1, command: Command | None = None) -> None:
        if self._current is not None:
            self._current.abandon(now, replies, command)

    def drop(self, now: float, why: Diagnosis | None = None, *, stalled: bool = False) -> None:
        if self._current is not None:
            self._current.drop(now, why, stalled=stalled)

    def end_writing(self) -> Any:
        # What was written behind an interrupted round is read in a thread (``close``).
        return None

    def close(self) -> None:
        behind, self._behind = self._behind, []
        if behind:
            # Their connections are not closed here: a thread reads the answers of what
            # was written behind an interrupted round, follows their redirections, and
            # closes them then (``_follow``).
            kept = {id(b.sub) for b in behind}
            self._subs = {w: s for w, s in self._subs.items() if id(s) not in kept}
            _start_following(self.cluster, behind)
        for sub in self._subs.values():
            sub.close()
        self._current = None
        self._prepared = False  # no member connected: the next round sets them up again

    def resend(self, command: Command, exc: ResponseError, now: float) -> Command | None:
        """Follow a redirection (or resend the EVAL form) within the round; None: the
        error is the node's answer for this round (``fail``)."""
        current = self._current
        assert current is not None
        text = reply_text(exc)
        where = _address(current)
        hop = redirect(text, where)
        if hop is None:
            retry = current.node.scripts.answered(text, command)
            if retry is not None:
                self._write(current, retry, now, asking=self._asking)
            return retry
        step = next_hop(command, hop, where, self._asking, self._hops)
        if step is None:
            return None
        if step.moved >= 0:
            self.cluster.moved(step.moved, step.to)
        sub = current if step.to == where else self._sub(step.to)
        if sub.conn is None:
            sub.prepare(now, self._wake)  # connected for a later round
            self._to_connect = True
            return None
        self._hops += 1
        self._write(sub, step.command, now, asking=step.asking)
        return step.command

    def fail(self, i: int, exc: Exception, rnd: Round, now: float) -> None:
        """A cluster redirection not followed is no vote this round, never the node's
        configuration; anything else is the member's failure, as for a plain node."""
        hop: Redirect | None = None
        if isinstance(exc, ResponseError):
            hop = redirect(reply_text(exc))
            if hop is not None and hop.kind == "moved" and hop.to is not None:
                self.cluster.moved(hop.slot, hop.to)
        to_connect, self._to_connect = self._to_connect, False
        if hop is not None:
            where = "" if self._current is None else self._current.node.name
            # Still connecting to where it points: not tried, so a blocking acquire waits
            # for that set-up rather than counting the round toward QuorumUnreachable.
            failure = Failure.CONNECTING if to_connect else Failure.UNREACHABLE
            rnd.fail(i, failure, hop.detail(where))
            return
        if self._current is not None:
            if not isinstance(exc, ResponseError):
                # The connection broke: a dead master? The next round waits for the map.
                self._await(self.cluster.reload(now), self._wake)
            self._current.fail(i, exc, rnd, now)
        else:
            why = diagnose(exc)
            rnd.fail(i, why.failure, why.detail)


class _Behind:
    """A command ``ClusterLink.send_behind`` wrote on the member connection ``sub``
    (after ``ASKING`` if ``asking``), the marker ``nonce`` behind it."""

    __slots__ = ("asking", "command", "nonce", "sub")

    def __init__(self, sub: Link, command: Command, asking: bool, nonce: bytes) -> None:
        self.sub = sub
        self.command = command
        self.asking = asking
        self.nonce = nonce


def _start_following(cluster: ClusterState, behind: list[_Behind]) -> None:
    """Follow what was written behind an interrupted round, one thread per member
    connection that carried some of it (nearly always one)."""
    by_sub: dict[int, list[_Behind]] = {}
    for b in behind:
        by_sub.setdefault(id(b.sub), []).append(b)
    for written in by_sub.values():
        try:
            threading.Thread(
                target=_follow, args=(cluster, written), name="tenure-behind", daemon=True
            ).start()
        except RuntimeError:  # the interpreter is shutting down: nobody would follow
            written[0].sub.close()


def _follow(cluster: ClusterState, written: list[_Behind]) -> None:
    """Read the answers of ``written``, in order, on their member connection, and send
    each command on where a redirection says (``next_hop``: ``MOVED``, ``ASK``, and a
    lease's release alone after ``TRYAGAIN``), at most ``MAX_REDIRECTS`` times, on
    connections of this thread's own. Each answer is awaited ``RELEASE_PATIENCE`` node
    timeouts at most, as a release round's; best effort: what does not get through
    stays until its TTL, as it did before. The connections are closed at the end."""
    sub = written[0].sub
    others: dict[Address, redis.Connection] = {}
    try:
        _follow_each(cluster, written, others)
    except Exception:  # not BaseException: the thread ends with the interpreter
        pass  # its key expires by its TTL, as it did before
    finally:
        sub.close()
        for conn in others.values():
            with contextlib.suppress(Exception):
                conn.disconnect()  # type: ignore[no-untyped-call]


def _follow_each(
    cluster: ClusterState, written: list[_Behind], others: dict[Address, redis.Connection]
) -> None:
    """``_follow``'s loops, apart from its ``try`` (docs/architecture.md, "A loop in a
    try or with block"); the connections it opens are put in ``others``."""
    sub = written[0].sub
    home = _address(sub)
    patience = RELEASE_PATIENCE * cluster.timeout
    for b in written:
        answer = _answer_behind(sub, b.nonce, monotonic() + patience)
        command, asking, at, hops = b.command, b.asking, home, 0
        while isinstance(answer, ResponseError):
            hop = redirect(reply_text(answer), at)
            step = None if hop is None else next_hop(command, hop, at, asking, hops)
            if step is None:
                break
            if step.moved >= 0:
                cluster.moved(step.moved, step.to)
            command, asking, at, hops = step.command, step.asking, step.to, hops + 1
            # On a connection of its own, even to the member that answered: all that
            # went before on the first one has run (its answer came), and what was
            # written behind it there is read in turn.
            conn = others.get(at)
            if conn is None:
                conn = others[at] = cluster.member(at).new_connection()
                conn.socket_timeout = patience
                conn.connect()  # type: ignore[no-untyped-call]
            answer = _ask(conn, command, asking)


def _answer_behind(sub: Link, nonce: bytes, deadline: float) -> object:
    """The reply read just before the marker ``nonce`` on ``sub`` (an error reply as
    its exception); None if the marker did not come by ``deadline``."""
    io = sub.io
    if io is None:
        return None
    answer: object = None
    while True:
        if not io.ready():
            left = deadline - monotonic()
            if left <= 0.0 or not readable([io.sock], left):
                return None
        try:
            reply = io.read()
        except ResponseError as exc:
            answer = exc
            continue
        except Exception as exc:  # not BaseException: an interrupt is no node's failure
            if timed_out(exc):  # the socket's timeout with a reply cut in two: read on
                continue
            return None
        if reply == nonce or (isinstance(reply, str) and reply.encode() == nonce):
            return answer
        answer = reply


def _ask(conn: redis.Connection, command: Command, asking: bool) -> object:
    """``command`` (by EVAL: this connection's script cache is unknown) on ``conn``,
    after ``ASKING`` if ``asking``; its reply, an error reply as its exception."""
    data = command.fallback or command.packed
    conn.send_packed_command([ASKING.packed, data] if asking else [data], check_health=False)  # type: ignore[no-untyped-call]
    answer: object = None
    for _ in range(2 if asking else 1):  # ASKING's +OK first
        try:
            answer = conn.read_response()
        except ResponseError as exc:
            answer = exc
    return answer


def _address(sub: Link) -> Address:
    address = sub.node.address
    return (address.host or "", address.port or 0)


def _nothing() -> None:
    """A set-up's wake-up call nobody waits for."""


# ``conn`` of a cluster link between rounds: ready to send (LinkSet tests for None only).
_READY: Any = object()

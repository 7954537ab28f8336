"""Release notifications for the blocking client: one subscriber thread per client.

Theory of operation
-------------------
A client that ever waits for a lock starts one daemon thread that holds one pub/sub
connection per node, subscribed to the client's own channel, and ``select()``s on all of
them. Every waiting thread of the client registers a ``Slot`` under its waiter id; whoever
reads the sockets files each message (``_core.waiting.Wake``) in its waiter's slot and sets
the slot's event. That is the subscriber thread, or, while one waits, a waiting thread
that took the sockets over (the *reader*, see ``Listener``: one context switch less per
hand-off). A waiter waits for at most the time the core allows (``Wait.timeout``): the
notification or the fallback re-check, whichever comes first.

A connection that fails is re-established after a back-off; once subscribed again,
every slot is nudged to re-check at once, since notifications sent meanwhile reached
nobody (release.lua then skipped those waiters; the re-check queues them again). After
``fork()`` the child forgets the parent's thread and sockets and picks a new channel.

A client whose nodes are all Redis Cluster nodes also subscribes per lock slot with
SSUBSCRIBE (``waiting.ShardSubs`` decides what, where and when): one more connection per
master of each cluster, opened, read and re-subscribed by whoever reads the sockets, like
the others. A waiter's attempts use the slot's channel once its subscription is
confirmed, and the process channel until then.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

from .._core import diagnosis
from .._core.backoff import Reconnect
from .._core.commands import pack
from .._core.resp import ErrorReply
from .._core.slots import Address, SlotMap, routed_slot
from .._core.waiting import (
    CHANNEL_PREFIX,
    STRAGGLE,
    ShardEvent,
    ShardSubs,
    Switchboard,
    Wake,
    WakeTally,
    sharding,
)
from .._driver.events import Condition, Event
from .._driver.guard import Guard, taker
from .._driver.ready import readable
from .._driver.redis_compat import diagnose, disconnect
from .._driver.replies import reply_reader
from .._driver.report import NodeReporter
from .._driver.threads import start_thread
from .cluster import ClusterState
from .connect import SetUp
from .links import NodeState

__all__ = ["Listener", "Slot"]

# After the first node's notification, how long a waiter on a quorum waits for a
# majority of them before trying (see ``Slot``).
# How long the subscriber thread stays parked once a waiter has been reading the sockets,
# before it checks whether it must read them again (see ``Listener.wait``).
PARK = 0.02


class Slot(WakeTally):
    """Where the notifications of one waiting thread are filed.

    On a quorum (``need`` > 1) the event is set once a majority of nodes have notified,
    or ``STRAGGLE`` seconds after the first did (``waiting.WakeTally``). The listener
    thread does the counting and keeps the timer, so the waiter wakes once, not once
    per node.
    """

    __slots__ = ("event", "since")

    def __init__(self, need: int = 1) -> None:
        super().__init__(need)
        self.event = Event()
        self.since = 0.0  # when the first notification of this round of them came

    def put(self, wake: Wake | None, node: int = -1) -> None:
        if wake is None:
            self.event.set()  # a nudge: re-check now
            return
        now = self.file(wake, node)
        if now:
            self.event.set()
        elif now is False:
            self.since = time.monotonic()

    def overdue(self, now: float) -> bool:
        """Notified by too few nodes for too long: let the waiter try anyway."""
        return bool(self.wakes) and not self.event.is_set() and now - self.since >= STRAGGLE

    def take(self) -> list[tuple[int, Wake]]:
        """The notifications so far, with their nodes (clears the event first, so none
        can be missed)."""
        self.event.clear()
        return super().take()

    def wait(self, timeout: float) -> bool:
        """Until notified (True) or ``timeout`` seconds pass (False)."""
        return self.event.wait(timeout)


class _ShardLink:
    """The sharded-subscription connection of one client to one master of a cluster."""

    __slots__ = ("conn", "outbox", "reader", "reconnect", "setup", "sock")

    def __init__(self) -> None:
        self.conn: object = None
        self.sock: socket.socket | None = None
        self.setup: SetUp | None = None
        self.reader = reply_reader()
        self.reconnect = Reconnect()
        self.outbox: list[bytes] = []  # written once connected


class Listener:
    """The notification sockets of one client, and who reads them.

    The subscriber thread connects, subscribes, reconnects, and reads whenever no waiter
    does. A waiting thread that finds no other waiter reading becomes the *reader* for
    the length of its wait: the thread steps aside (it is woken through a socket pair,
    and blocks until the reader is done), and the waiter ``select()``s on the sockets
    itself, filing every message it reads (its own, or other waiters'). A notification
    then wakes the waiter directly, not a thread that wakes the waiter: one context
    switch less on the path of every hand-off. Other waiters of the same client wait on
    their slots' events as before. The thread is poked only while it is in ``select()``,
    and takes the sockets back after a wait only when needed (see ``wait``), so a worker
    that acquires in a loop passes them from one wait to the next without waking it.
    """

    def __init__(
        self,
        nodes: Sequence[NodeState],
        reporter: NodeReporter | None = None,
        channel_prefix: str = CHANNEL_PREFIX,
    ) -> None:
        self._nodes = list(nodes)
        self._channel_prefix = channel_prefix  # the client's key prefix + "wake:"
        # Sharded subscriptions per slot, when every node is a Redis Cluster node.
        self._sharding = sharding([isinstance(n, ClusterState) for n in self._nodes])
        if self._sharding:
            for node in self._nodes:
                # The slots' subscriptions follow the map: whoever reads the sockets
                # plans them again (``_connect_shards``) once poked.
                cast("ClusterState", node).on_map = self._poke
        self._reporter = reporter or NodeReporter([n.name for n in self._nodes])
        self.channel = ""
        self._stop = False
        self._reset()
        _LISTENERS.add(self)

    def _reset(self) -> None:
        n = len(self._nodes)
        self._board = Switchboard[Slot]()
        self._slots = self._board.slots
        self.departed = self._board.departed
        self._lock = Guard()
        self._guard = Condition(self._lock)  # waited on and notified holding ``_lock``
        self._read = Guard()  # held by whoever reads the sockets
        self._reader: str | None = None  # the waiter reading them, if any
        self._wanting = 0  # waiters that want the subscriber thread to step aside
        self._followers = 0  # waiters waiting on their slots while another one reads
        self._thread_reading = False  # the thread is (about to be) in select(): poke it
        self._thread: threading.Thread | None = None
        self._waker: tuple[socket.socket, socket.socket] | None = None
        self._up = [False] * n
        self._subscribed = [False] * n  # node i's subscription was ever confirmed
        self._socks: list[socket.socket | None] = [None] * n
        self._conns: list[object] = [None] * n
        self._setups: list[SetUp | None] = [None] * n  # connections being set up
        self._readers = [reply_reader() for _ in range(n)]
        self._reconnect = [Reconnect() for _ in range(n)]
        suffix = secrets.token_hex(8)
        self.channel = self._channel_prefix + suffix
        self._shard_lock = Guard()  # the ShardSubs, their links, _waiter_slot
        self._shards = [ShardSubs(self._channel_prefix, suffix) for _ in range(n)]
        self._links: dict[tuple[int, Address], _ShardLink] = {}
        self._waiter_slot: dict[str, int] = {}  # waiter -> the slot it subscribed for

    @property
    def started(self) -> bool:
        return self._thread is not None

    def register(self, waiter: str, timeout: float, need: int = 1, key: str = "") -> Slot:
        """A slot for ``waiter``; starts the thread if needed and waits (up to ``timeout``)
        until every node confirmed the subscription, so the first queued attempt can be
        notified. ``need``: the notifications that make a majority (see ``Slot``).
        ``key``: the lock's key; on Cluster nodes its slot's channel is subscribed too
        (and waited for, up to ``timeout``)."""
        slot = Slot(need)
        shard = -1
        if self._sharding and key:
            shard = routed_slot(key)
            with self._shard_lock:
                self._waiter_slot[waiter] = shard
                for subs in self._shards:
                    subs.add(shard)
            slot.route = partial(self._route, shard)
        self._slots[waiter] = slot
        if self._thread is None or shard >= 0:
            try:
                with self._lock:
                    if self._thread is None and not self._stop:
                        # Made once: a start that an interrupt cut short leaves it to the
                        # next, rather than to the garbage collector, unclosed.
                        if self._waker is None:
                            self._waker = socket.socketpair()
                        self._thread = threading.Thread(
                            target=self._run, name="tenure-notify", daemon=True
                        )
                        self._thread.start()
                    if shard >= 0:
                        self._poke()  # whoever reads the sockets subscribes the slot now
                    self._guard.wait_for(
                        lambda: (all(self._up) and self._settled(shard)) or self._stop, timeout
                    )
            except BaseException:
                # Interrupted while it waited: the flow never got the slot, so nothing
                # else would take it out.
                self.unregister(waiter)
                raise
        return slot

    def unregister(self, waiter: str) -> list[int]:
        untaken = self._board.leave(waiter)
        if self._sharding:
            with self._shard_lock:
                shard = self._waiter_slot.pop(waiter, -1)
                if shard >= 0:
                    for subs in self._shards:
                        subs.remove(shard)  # the last one out unsubscribes (``_connect``)
            if shard >= 0:
                self._poke()
        return untaken

    def _settled(self, shard: int) -> bool:
        return shard < 0 or all(subs.settled(shard) for subs in self._shards)

    def _route(self, shard: int) -> tuple[str, bool] | None:
        """The slot's channel once every cluster confirmed it, else the process's."""
        routes = [subs.route(shard, self.channel) for subs in self._shards]
        return routes[0] if all(sharded for _, sharded in routes) else None

    def wait(self, waiter: str, slot: Slot, timeout: float) -> bool:
        """Until ``slot`` is notified (True) or ``timeout`` seconds pass (False); reads
        the sockets itself if no other waiter does."""
        if slot.event.is_set():
            return True
        # What this wait took is given back in ``finally`` as it was taken: a Ctrl-C in
        # the main thread can come between any two calls, and a reader or a follower
        # left counted would keep the thread from reading for good (every wait of the
        # client then ending at its re-check). So a thing is taken and noted taken in
        # one assignment, with nothing called in between. CPython runs a signal handler
        # only between bytecodes, at a call's return among others: ``reading =
        # self._read.acquire()`` could be interrupted with the lock taken and ``reading``
        # not yet set. ``list.extend(map(...))`` calls ``acquire`` and files its answer
        # in C, with no bytecode in between. (An interrupt inside ``acquire`` leaves
        # the lock not taken.)
        lead = follow = poke = False
        reading: list[bool] = []
        # The ``finally``'s guard, taken with no handler run before the count is given
        # back (a ``with`` of it would run them on Python 3.14: tenure._driver.guard).
        retaking = taker(self._lock)
        try:
            with self._lock:
                if self._reader is None and self._thread is not None and not self._stop:
                    lead, self._reader, self._wanting = True, waiter, self._wanting + 1
                    poke = self._thread_reading
                else:
                    follow, self._followers = True, self._followers + 1
            if follow:
                return slot.wait(timeout)
            end = time.monotonic() + timeout
            if poke:
                self._poke()
            reading.extend(map(self._read.acquire, (True,), (timeout,)))
            if not reading[0]:
                return slot.event.is_set()
            self._read_until(slot, end)
        finally:
            # The sockets are given back last, in a ``finally`` of their own: an
            # interrupt in ``notify_all`` (Python code) must not keep them, and one
            # after a call returns skips only what comes after that call.
            try:
                if lead or follow:
                    (_,) = retaking  # (an interrupt inside acquire: not taken, and raised)
                    try:
                        if follow:
                            self._followers -= 1
                        else:
                            self._reader = None
                            self._wanting -= 1
                            # The thread takes the sockets back within PARK, or at once
                            # if someone needs it now: another waiting thread, or a
                            # connection to re-establish. A client that acquires in a
                            # loop then does not wake it at every turn.
                            if self._followers or not all(self._up):
                                self._guard.notify_all()
                    finally:
                        self._lock.release()
            finally:
                if reading and reading[0]:
                    self._read.release()
        return slot.event.is_set()

    def _read_until(self, slot: Slot, end: float) -> None:
        """Read the sockets until ``slot`` is notified, the client closes, or ``end``.

        A function of its own, not a loop in ``wait``'s ``try`` (docs/architecture.md,
        "A loop in a try or with block"): a Ctrl-C that skipped ``wait``'s ``finally``
        would leave the reader counted and the sockets taken, and every later wait of
        the client would sleep to its re-check.
        """
        while not slot.event.is_set() and not self._stop:
            now = time.monotonic()
            left = end - now
            if left <= 0:
                return
            if not all(self._up) or any(self._setups) or self._sharding:
                # A subscription not up, or being set up, must not wait for this wait to
                # end: the reader starts or finishes it (a set-up pokes when it ends),
                # and subscribes the slots other waiters registered (they poke). A
                # waiter may take the sockets over before the thread ever connected: it
                # parks while waiters read.
                self._connect(now)
            # The waker too: ``close`` must reach a waiter reading the sockets.
            self._pump(left, watch_waker=True)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            waker, thread = self._waker, self._thread
            self._guard.notify_all()
        # Every waiter re-checks at once and finds the client closed (``ClientClosed``),
        # rather than sleep out its wait; the one reading the sockets is poked out of
        # its select(), and lets the thread end.
        self._nudge_all()
        self._poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        if waker is not None:
            for s in waker:
                s.close()

    def forget(self) -> None:
        """In a child after fork: the thread and its sockets are the parent's."""
        self._reset()

    def _poke(self) -> None:
        waker = self._waker
        if waker is not None:
            with contextlib.suppress(OSError):
                waker[1].send(b"x")

    def _nudge_all(self) -> None:
        self._board.nudge_all()

    def _drop(self, i: int, now: float) -> None:
        self._close(i)
        self._reconnect[i].failed(now)

    def _close(self, i: int) -> None:
        setup, self._setups[i] = self._setups[i], None
        if setup is not None:
            setup.abandon()
        conn = self._conns[i]
        self._conns[i] = self._socks[i] = None
        if conn is not None:
            with contextlib.suppress(Exception):
                disconnect(conn)
        self._up[i] = False

    def _cut(self, i: int) -> None:
        """An interrupt (Ctrl-C in a waiter reading the sockets) between node ``i``'s read
        and its parse, or among the messages it brought: what was read is lost, maybe
        half a message, and another waiter's notification with it. The connection is
        closed, not read on out of step (the rest of a message taken for garbage: "not
        the Redis protocol", a misconfiguration that is not one), and set up again at
        once, the node having done nothing wrong; every waiter re-checks now, and what
        may have come for the departed is declined again once it is back (``_handle``,
        ``_decline_lost``), as after any lost connection."""
        self._close(i)
        self._nudge_all()

    def _decline_lost(self, i: int) -> None:
        """Node ``i``'s subscription connection was lost (an interrupt as it was read,
        the node closing it, a network fault), and what it was bringing with it: maybe
        a hand-off to a waiter that departed lately, which the node counted as received
        and which a re-check cannot answer (that waiter no longer waits), so the node
        would be held by nobody for a TTL. Each of them is declined on that node
        (``Departed.decline_all``): once the node's subscription is confirmed again
        (``_handle``: the node is back), or, a sharded subscription's connection, at
        once (``_drop_link``: the decline goes to the slot's master, wherever it is by
        then). From a thread: a decline waits for the node's answer."""
        departed = self.departed
        if len(departed):
            start_thread(partial(departed.decline_all, i, time.monotonic()), "tenure-decline")

    def _lost(self, i: int, now: float) -> None:
        """Node ``i``'s subscription connection failed (refused, timed out, closed). A
        Cluster node's master may have died and a replica been promoted, which nothing
        tells a subscriber: its slot map is put in doubt, as for any member that failed
        (``ClusterState.failed``), and the next connection goes by the map reloaded."""
        self._drop(i, now)
        node = self._nodes[i]
        if isinstance(node, ClusterState):
            node.failed(now)

    def _connect(self, now: float) -> None:
        """(Re)connect and subscribe where needed (whoever reads the sockets, holding _read).

        Connections are set up in threads of their own (``SetUp``), every node at once,
        so a slow TLS handshake or a node that does not answer never holds up the
        notifications of the others; the reader is poked when a set-up ends.
        """
        subscribe = pack("SUBSCRIBE", self.channel)
        for i, node in enumerate(self._nodes):
            if self._socks[i] is not None:
                continue
            setup = self._setups[i]
            if setup is None:
                if not self._reconnect[i].left(now):
                    self._setups[i] = SetUp(
                        node.new_connection(),
                        node.connect_timeout,
                        node.timeout,
                        self._poke,
                        now + node.connect_timeout,
                    )
                continue
            if not setup.done:
                if now >= setup.deadline:
                    self._lost(i, now)
                continue
            self._setups[i] = None
            error = setup.error
            if error is None:
                try:
                    conn = setup.take()
                    self._conns[i] = conn
                    sock = cast("socket.socket | None", conn._sock)
                    if sock is None:
                        raise OSError("not connected")
                    sock.settimeout(node.timeout)
                    sock.sendall(subscribe)
                    self._socks[i] = sock
                    self._readers[i] = reply_reader()
                except Exception as exc:  # whatever the node did, this thread must live on
                    error = exc
            if error is not None:
                self._lost(i, now)
                why = diagnose(error)
                if why.failure.configuration:
                    self._reporter.note(i, why.failure, why.detail)
        if self._sharding:
            self._connect_shards(now)

    def _connect_shards(self, now: float) -> None:
        """Send what the slots' subscriptions need (``ShardSubs.plan``), connecting to
        the masters where needed, and close the connections nothing uses any more."""
        # Loops of their own, not in the ``with``: docs/architecture.md, "A loop in a
        # try or with block" (a Ctrl-C must not leave the lock taken).
        with self._shard_lock:
            self._plan_shards(now)
            self._send_shards(now)

    def _plan_shards(self, now: float) -> None:
        """Queue on each master's link the (un)subscriptions the slots' plans ask for."""
        for i, subs in enumerate(self._shards):
            node = cast("ClusterState", self._nodes[i])
            first = subs.reload_from(_owner(node.map))
            if first is not None:
                node.refresh(first)  # a subscription ended where the map still puts it
                node.slot_map(now, self._poke)  # loads a newer map (or takes it)
            slot_map, number = node.in_use()
            source = slot_map.source if slot_map is not None else None
            for where, verb, channel in subs.plan(_owner(slot_map), number, source):
                link = self._links.get((i, where))
                if link is None:
                    link = self._links[(i, where)] = _ShardLink()
                if verb == "SSUBSCRIBE":
                    link.outbox.append(pack("SSUBSCRIBE", channel))
                else:
                    link.outbox.append(pack("SUNSUBSCRIBE", channel))

    def _send_shards(self, now: float) -> None:
        """Connect the links with something to send, send it, and close the idle ones."""
        for (i, where), link in self._links.items():
            idle = self._shards[i].idle(where) and not link.outbox
            if idle:
                if link.sock is not None or link.setup is not None:
                    self._close_link(link)
                continue
            if link.sock is None:
                self._set_up_link(i, where, link, now)
            if link.sock is not None and link.outbox:
                data, link.outbox = b"".join(link.outbox), []
                try:
                    link.sock.sendall(data)
                except OSError:
                    self._drop_link(i, where, link, now)

    def _set_up_link(self, i: int, where: Address, link: _ShardLink, now: float) -> None:
        node = cast("ClusterState", self._nodes[i])
        setup = link.setup
        if setup is None:
            if not link.reconnect.left(now):
                link.setup = SetUp(
                    node.member(where).new_connection(),
                    node.connect_timeout,
                    node.timeout,
                    self._poke,
                    now + node.connect_timeout,
                )
            return
        if not setup.done:
            if now >= setup.deadline:
                self._drop_link(i, where, link, now)
            return
        link.setup = None
        if setup.error is None:
            try:
                conn = link.conn = setup.take()
                sock = cast("socket.socket | None", conn._sock)
                if sock is None:
                    raise OSError("not connected")
                sock.settimeout(node.timeout)
                link.sock = sock
                link.reader = reply_reader()
                link.reconnect.succeeded()
                return
            except Exception:  # whatever the node did, the reader must live on
                pass
        self._drop_link(i, where, link, now)

    def _close_link(self, link: _ShardLink) -> None:
        setup, link.setup = link.setup, None
        if setup is not None:
            setup.abandon()
        conn, link.conn, link.sock = link.conn, None, None
        link.outbox = []
        if conn is not None:
            with contextlib.suppress(Exception):
                disconnect(conn)

    def _drop_link(
        self, i: int, where: Address, link: _ShardLink, now: float, *, cut: bool = False
    ) -> None:
        """The connection to a master failed (``cut``: an interrupt cut its read): its
        subscriptions are gone (asked again at the slots' owners once it or they are
        back); their waiters re-check, and what it was bringing is declined for the
        departed (``_decline_lost``)."""
        self._close_link(link)
        link.reconnect.failed(now)
        node = cast("ClusterState", self._nodes[i])
        if self._shards[i].lost(where, node.begun) or cut:
            self._nudge_all()
            self._decline_lost(i)

    def _cut_link(self, i: int, where: Address, link: _ShardLink) -> None:
        """``_cut`` for a sharded-subscription connection: dropped as one that failed
        (its subscriptions asked again once it is back), every waiter re-checks now,
        and the departed are declined again on its node."""
        with self._shard_lock:
            self._drop_link(i, where, link, time.monotonic(), cut=True)

    def _read_link(self, i: int, where: Address, link: _ShardLink) -> None:
        sock = link.sock
        assert sock is not None
        try:
            data = sock.recv(65536)
            buffered = getattr(sock, "pending", None)  # TLS: see ``_pump``
            while data and buffered is not None and (more := buffered()):
                data += sock.recv(more)
        except OSError:
            data = b""
        try:
            replies = link.reader.feed(data) if data else None
        except ValueError:
            replies = None
        now = time.monotonic()
        if replies is None:
            with self._shard_lock:
                self._drop_link(i, where, link, now)
            return
        subs = self._shards[i]
        node = cast("ClusterState", self._nodes[i])
        for reply in replies:
            with self._shard_lock:
                if isinstance(reply, ErrorReply):
                    event = subs.answered(where, None, reply.message, node.begun)
                else:
                    self._board.message(reply, i, now)  # an smessage: file it
                    event = subs.answered(where, reply, None, node.begun)
                if event.kind == "refused":
                    why = diagnosis.error_reply(event.detail)
                    if why.failure.configuration:
                        self._reporter.note(i, why.failure, why.detail, notifications=True)
                if event.kind in ("refused", "cut"):  # "cut": nothing to report
                    self._drop_link(i, where, link, now)
                    return
            self._shard_event(i, event)

    def _shard_event(self, i: int, event: ShardEvent) -> None:
        # ("again" needs nothing here: whoever reads the sockets plans the subscriptions
        # again before each select(), ``_connect_shards``.)
        if event.kind == "moved" and event.to is not None:
            cast("ClusterState", self._nodes[i]).moved(event.slot, event.to)
        elif event.kind == "ended":
            self._nudge_all()  # its waiters' notifications reach nobody until it is back
        if event.kind in ("confirmed", "unsupported"):
            with self._lock:
                self._guard.notify_all()  # a waiter may be waiting for its slot

    def _pump(self, limit: float | None, *, watch_waker: bool) -> None:
        """One ``select()`` on the sockets (at most ``limit`` s) and what it brings."""
        socks = self._socks
        now = time.monotonic()
        pending = [] if limit is None else [limit]
        for i, s in enumerate(socks):
            if s is None:
                setup = self._setups[i]
                # A set-up pokes the reader when it ends: wake by its deadline only.
                pending.append(
                    self._reconnect[i].retry_at - now if setup is None else setup.deadline - now
                )
        if len(socks) > 1:
            overdue = False
            for slot in list(self._slots.values()):
                if slot.overdue(now):
                    slot.event.set()
                    overdue = True
                elif slot.wakes and not slot.event.is_set():
                    pending.append(slot.since + STRAGGLE - now)
            if overdue:
                # Return before select(): the reader may be the very waiter just set,
                # and it must not sleep out its wait in select() with its event set.
                return
        links: dict[socket.socket, tuple[int, Address, _ShardLink]] = {}
        if self._sharding:
            with self._shard_lock:  # (its loop apart: see ``_connect_shards``)
                links = self._links_to_read(now, pending)
        timeout = max(min(pending), 0.0005) if pending else None
        watched = [s for s in socks if s is not None]
        watched += links
        waker = self._waker
        if watch_waker and waker is not None:
            watched.append(waker[0])
        if not watched:
            time.sleep(min(timeout or 0.05, 0.05))
            return
        for sock in readable(watched, timeout):
            if waker is not None and sock is waker[0]:
                with contextlib.suppress(OSError):
                    sock.recv(4096)
                continue
            if sock in links:
                try:
                    self._read_link(*links[sock])
                except BaseException:
                    self._cut_link(*links[sock])  # an interrupt: see ``_cut``
                    raise
                continue
            if sock not in socks:
                continue
            i = socks.index(sock)
            try:
                self._read_node(i, sock)
            except BaseException:
                self._cut(i)
                raise

    def _links_to_read(
        self, now: float, pending: list[float]
    ) -> dict[socket.socket, tuple[int, Address, _ShardLink]]:
        """The sharded-subscription sockets to read; for the links not connected, when
        to look again, put in ``pending``."""
        links = {}
        for (i, where), link in self._links.items():
            if link.sock is not None:
                links[link.sock] = (i, where, link)
            elif link.setup is not None:
                pending.append(link.setup.deadline - now)
            elif link.outbox:
                pending.append(link.reconnect.retry_at - now)
        if any(subs.unplaced() for subs in self._shards):
            pending.append(0.05)  # the slot map is not loaded yet: look again
        return links

    def _read_node(self, i: int, sock: socket.socket) -> None:
        """Read node ``i``'s subscription connection and file what it brings (an
        interrupt in here: ``_cut``)."""
        try:
            data = sock.recv(65536)
            # TLS: recv returns one record at a time, and records already received are
            # not readable to select(); take them now, or a notification could sit in the
            # TLS buffer until the next one comes.
            buffered = getattr(sock, "pending", None)
            while data and buffered is not None and (more := buffered()):
                data += sock.recv(more)
        except OSError:
            data = b""
        try:
            replies = self._readers[i].feed(data) if data else None
        except ValueError as exc:  # not the Redis protocol
            why = diagnosis.not_redis(str(exc))
            self._reporter.note(i, why.failure, why.detail)
            replies = None
        if replies is None:
            self._lost(i, time.monotonic())
            return
        for reply in replies:
            if not self._handle(i, reply):
                self._drop(i, time.monotonic())
                return

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._read:
                for i in range(len(self._nodes)):
                    self._drop(i, 0.0)
                with self._shard_lock:
                    for link in self._links.values():
                        self._close_link(link)

    def _serve(self) -> None:
        """Read the sockets whenever no waiter does, until the client closes (its loops
        apart from ``_run``'s ``try``, as everywhere: see ``_read_until``)."""
        while not self._stop:
            with self._lock:
                self._park()
                # Set under the guard, with no waiter wanting the sockets: a waiter that
                # comes from now on pokes the thread out of its select().
                self._thread_reading = True
            try:
                stopped: bool = self._stop  # (set by close() while this one parked)
                if stopped:  # closed while parked: its poke went to a waiter
                    return
                if not self._read.acquire(timeout=0.1):
                    continue
                try:
                    self._connect(time.monotonic())
                    self._pump(None, watch_waker=True)
                finally:
                    self._read.release()
            finally:
                with self._lock:
                    self._thread_reading = False

    def _park(self) -> None:
        """While a waiter reads the sockets, wait (holding ``_guard``)."""
        while self._wanting and not self._stop:
            self._guard.wait(PARK)

    def _handle(self, i: int, reply: object) -> bool:
        """File one message from node ``i``; False if the subscription was refused."""
        if isinstance(reply, ErrorReply):
            # SUBSCRIBE refused (an ACL without the channel, NOAUTH): retried after the
            # back-off; waiters fall back to re-checking meanwhile.
            why = diagnosis.error_reply(reply.message)
            if why.failure.configuration:
                self._reporter.note(i, why.failure, why.detail, notifications=True)
            return False
        if self._board.message(reply, i, time.monotonic()):
            with self._lock:
                self._up[i] = True
                self._guard.notify_all()
            # Notifications sent while we were away reached nobody, and so did those to
            # waiters that queued before the first subscription was confirmed (only the
            # waiter that started the listener waits for it): each such release dropped
            # its waiter from the queue. They re-check now, and queue again.
            self._nudge_all()
            if self._subscribed[i]:
                self._decline_lost(i)  # what the lost connection was bringing
            self._subscribed[i] = True
        return True


def _owner(slot_map: SlotMap | None) -> Callable[[int], Address | None]:
    """Where a slot's subscription goes: its master in the slot map (none yet: wait)."""
    return _nowhere if slot_map is None else slot_map.owner


def _nowhere(slot: int) -> Address | None:
    return None


_LISTENERS: weakref.WeakSet[Listener] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for listener in list(_LISTENERS):
        listener.forget()


os.register_at_fork(after_in_child=_forget_after_fork)

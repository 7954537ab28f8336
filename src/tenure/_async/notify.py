"""Release notifications for the asyncio client: one subscription per node, shared.

Theory of operation
-------------------
The first time a task of an ``AsyncClient`` has to wait for a lock, the client opens one
pub/sub connection per node (in its event loop) and subscribes to its own channel. Every
waiting task registers an ``AsyncSlot`` under its waiter id; the connection's protocol
parses each message in ``data_received`` and settles the slot's future right there, so
a notification reaches its task in one trip through the event loop, and a thousand
waiting tasks cost one connection per node, not one each.

A connection that fails is re-established after a back-off; once subscribed again,
every slot is nudged to re-check (notifications sent meanwhile reached nobody).

A client whose nodes are all Redis Cluster nodes also subscribes per lock slot with
SSUBSCRIBE (``waiting.ShardSubs`` decides what, where and when): one more connection per
master of each cluster, each with a task that connects it and re-establishes it. A
waiter's attempts use the slot's channel once its subscription is confirmed, and the
process channel until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import redis.asyncio

from .._core import diagnosis
from .._core.backoff import Reconnect
from .._core.commands import pack
from .._core.resp import ErrorReply
from .._core.slots import Address, routed_slot
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
from .._driver.redis_compat import diagnose
from .._driver.report import NodeReporter
from .._driver.timeouts import within
from .protocol import RespProtocol, write
from .tasks import finish

if TYPE_CHECKING:
    from .cluster import ClusterChannel

__all__ = ["AsyncListener", "AsyncSlot"]


class AsyncSlot(WakeTally):
    """Where the notifications of one waiting task are filed.

    On a quorum (``need`` > 1) the waiter is woken once a majority of nodes have notified
    it, or ``STRAGGLE`` seconds after the first did (``waiting.WakeTally``).
    """

    __slots__ = ("_flag", "_future", "_timer")

    def __init__(self, need: int = 1) -> None:
        super().__init__(need)
        self._flag = False
        self._future: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def put(self, wake: Wake | None, node: int = -1) -> None:
        if wake is not None and not self.file(wake, node):
            if self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(STRAGGLE, self._fire)
            return
        self._fire()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop of the task waiting on this slot now, if one is."""
        future = self._future
        return None if future is None else future.get_loop()

    def _fire(self) -> None:
        self._flag = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def take(self) -> list[tuple[int, Wake]]:
        self._flag = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return super().take()

    async def wait(self, timeout: float) -> bool:
        """Until a notification is filed (True) or ``timeout`` seconds pass (False)."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_later(timeout, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None
        return self._flag


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ResponseRefused(Exception):
    """The node answered our SUBSCRIBE with an error (its text, as sent)."""


class _Cut(Exception):
    """A sharded-subscription connection closed on purpose (``ShardEvent`` "cut"):
    nothing to report."""


class _ShardLink:
    """The sharded-subscription connection of one client to one master of a cluster."""

    __slots__ = ("outbox", "task", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self.task: asyncio.Task[None] | None = None
        self.outbox: list[bytes] = []  # written once connected

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            write(self.transport, data)
        else:
            self.outbox.append(data)


class AsyncListener:
    """The subscriptions of one client in one event loop, started on first need."""

    def __init__(
        self,
        pools: Sequence[redis.asyncio.ConnectionPool],
        reporter: NodeReporter | None = None,
        channel_prefix: str = CHANNEL_PREFIX,
        clusters: Sequence[bool] = (),
        cluster: Callable[[int], ClusterChannel] | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self._pools = list(pools)
        # Bounds each connection's set-up (``_set_up``); None: redis-py's own bounds.
        self._connect_timeout = connect_timeout
        self._reporter = reporter or NodeReporter([str(i) for i in range(len(self._pools))])
        suffix = secrets.token_hex(8)
        self.channel = channel_prefix + suffix  # key prefix + "wake:" + random
        # Sharded subscriptions per slot, when every node is a Redis Cluster node.
        self._sharding = cluster is not None and sharding(clusters)
        self._cluster = cluster
        self._clusters = list(clusters)
        self._shards = [ShardSubs(channel_prefix, suffix) for _ in self._pools]
        self._links: dict[tuple[int, Address], _ShardLink] = {}
        self._waiter_slot: dict[str, int] = {}
        self._shard_changed: asyncio.Event | None = None  # set when a slot is settled
        self._replan_later: asyncio.Handle | None = None
        self._board = Switchboard[AsyncSlot]()
        self._slots = self._board.slots
        self.departed = self._board.departed
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False  # a task of ``_tasks`` ended while the listener was open
        self._retired: set[asyncio.Task[None]] = set()  # link tasks cancelled, not yet ended
        self._up = [False] * len(pools)
        self._all_up: asyncio.Event | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        # Not while a subscription task is to be started again (``_subscribe``): the
        # next waiter subscribes first, and hears the releases.
        return bool(self._tasks) and not self._stopped

    def register_now(self, waiter: str, need: int = 1, key: str = "") -> AsyncSlot:
        slot = self._slots[waiter] = AsyncSlot(need)
        if self._sharding and key and not self._closed:
            shard = self._waiter_slot[waiter] = routed_slot(key)
            for subs in self._shards:
                subs.add(shard)
            slot.route = partial(self._route, shard)
            self._replan()
        return slot

    async def register(
        self, waiter: str, timeout: float, need: int = 1, key: str = ""
    ) -> AsyncSlot:
        """A slot for ``waiter``; subscribes first if needed (waiting up to ``timeout``).
        ``key``: the lock's key; on Cluster nodes its slot's channel is subscribed too
        (and waited for, up to ``timeout``)."""
        slot = self.register_now(waiter, need, key)
        try:
            await self._subscribed(waiter, timeout)
        except BaseException:
            # Cancelled while it waited: the flow never got the slot, so nothing else
            # would take it out (it was kept, and its subscriptions, for the client's life).
            self.unregister(waiter)
            raise
        return slot

    async def _subscribed(self, waiter: str, timeout: float) -> None:
        """Until the client's subscriptions, and ``waiter``'s slot's on Cluster nodes, are
        confirmed, or ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not self._closed and (not self._tasks or self._stopped):
            self._subscribe(loop)
        if self._all_up is not None and not self._all_up.is_set():
            with contextlib.suppress(TimeoutError):
                await within(self._all_up.wait(), timeout)
        shard = self._waiter_slot.get(waiter, -1)
        while shard >= 0 and not self._closed and not self._settled(shard):
            left = deadline - loop.time()
            if left <= 0:
                break
            if self._shard_changed is None:
                self._shard_changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await within(self._shard_changed.wait(), left)

    def _subscribe(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a subscription task for every node without a live one: all of them at
        first, and again any that was cancelled from outside (a shutdown that cancels
        every task while its loop goes on), whose waiters would otherwise hear nothing
        and wait for their fallback re-check."""
        self._stopped = False
        tasks: list[asyncio.Task[None]] = []
        for i in range(len(self._pools)):
            task = self._tasks[i] if self._tasks else None
            if task is None or task.done():
                self._up[i] = False
                task = loop.create_task(self._run(i))
                task.add_done_callback(self._task_ended)
            tasks.append(task)
        self._tasks = tasks
        if not all(self._up) and (self._all_up is None or self._all_up.is_set()):
            self._all_up = asyncio.Event()

    def _task_ended(self, _task: asyncio.Task[None]) -> None:
        if not self._closed:
            self._stopped = True  # started again by the next registration

    def unregister(self, waiter: str) -> list[int]:
        untaken = self._board.leave(waiter)
        shard = self._waiter_slot.pop(waiter, -1)
        if shard >= 0:
            for subs in self._shards:
                subs.remove(shard)  # the last one out unsubscribes
            self._replan()
        return untaken

    async def close(self) -> None:
        self._closed = True
        # Every waiting task re-checks at once and finds the client closed
        # (``ClientClosed``), as the blocking client's waiters do, rather than sleep out
        # its wait (up to ``recheck``).
        self._nudge_all()
        if self._replan_later is not None:
            self._replan_later.cancel()
        tasks, self._tasks = self._tasks, []
        tasks += [link.task for link in self._links.values() if link.task is not None]
        tasks += self._retired
        await finish(tasks)

    def _nudge_all(self) -> None:
        """Have every waiting task re-check now, each in its own event loop: ``aclose()``
        may be awaited in another loop than the one a task waits in (loops taking turns)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for slot in list(self._slots.values()):
            loop = slot.loop
            if loop is None or loop is running:
                slot.put(None)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(slot.put, None)

    # --- sharded subscriptions (every node a Redis Cluster node) ------------------------

    def _settled(self, shard: int) -> bool:
        return all(subs.settled(shard) for subs in self._shards)

    def _route(self, shard: int) -> tuple[str, bool] | None:
        """The slot's channel once every cluster confirmed it, else the process's."""
        routes = [subs.route(shard, self.channel) for subs in self._shards]
        return routes[0] if all(sharded for _, sharded in routes) else None

    def _replan(self) -> None:
        """Send what the slots' subscriptions need (``ShardSubs.plan``), connecting to
        the masters where needed; close the connections nothing uses any more."""
        if self._closed or self._cluster is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a waiter let go after its loop stopped: nothing to send
            return
        unplaced = False
        for i, subs in enumerate(self._shards):
            cluster = self._cluster(i)
            # Here, not once: each event loop gets channels of its own (``Channels``),
            # and this is the running loop's.
            cluster.on_map = self._map_changed
            first = subs.reload_from(cluster.owner)
            if first is not None:
                cluster.refresh(first)  # a subscription ended where the map still puts it
            source = cluster.map.source if cluster.map is not None else None
            for where, verb, channel in subs.plan(cluster.owner, cluster.loads, source):
                link = self._links.get((i, where))
                if link is None:
                    link = self._links[(i, where)] = _ShardLink()
                if verb == "SSUBSCRIBE":
                    link.send(pack("SSUBSCRIBE", channel))
                else:
                    link.send(pack("SUNSUBSCRIBE", channel))
            unplaced = unplaced or subs.unplaced()
        for (i, where), link in self._links.items():
            if self._shards[i].idle(where) and not link.outbox:
                if link.task is not None:
                    link.task.cancel()
                    # Until it ends, its connection is open: close() waits for it.
                    self._retired.add(link.task)
                    link.task.add_done_callback(self._retired.discard)
                    link.task = link.transport = None
            elif link.task is None:
                link.task = loop.create_task(self._run_link(i, where, link))
        if unplaced and self._replan_later is None:
            # The slot map is not loaded yet (or not again since a subscription ended):
            # look again shortly.
            self._replan_later = loop.call_later(0.05, self._replan_again)

    def _replan_again(self) -> None:
        self._replan_later = None
        self._replan()

    def _map_changed(self) -> None:
        """A cluster's slot map in use changed (a load, a ``MOVED``): the subscriptions
        follow it (``ShardSubs.plan``) as soon as the loop is free, not in the middle of
        the round or load that changed it."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs: the next registration plans them
            return
        if self._replan_later is not None:
            self._replan_later.cancel()
        self._replan_later = loop.call_soon(self._replan_again)

    def _shard_event(self, i: int, event: ShardEvent) -> None:
        if event.kind == "moved" and event.to is not None and self._cluster is not None:
            self._cluster(i).moved(event.slot, event.to)
        elif event.kind == "ended" and self._cluster is not None:
            self._nudge_all()  # its waiters' notifications reach nobody until it is back
        if event.kind in ("confirmed", "unsupported"):
            changed, self._shard_changed = self._shard_changed, None
            if changed is not None:
                changed.set()  # a waiter may be waiting for its slot
        if event.kind in ("moved", "ended", "again"):
            asyncio.get_running_loop().call_soon(self._replan)

    def _subscriptions_lost(self, i: int) -> None:
        """Sharded subscriptions at node ``i`` ended with their connection: their waiters
        re-check, and what the connection was bringing, maybe a hand-off to a waiter
        that departed lately (counted as received by the master, and answered by no
        re-check), is declined for each of them (``Departed.decline_all``; the decline
        goes to the slot's master, wherever it is by then)."""
        self._nudge_all()
        self.departed.decline_all(i, time.monotonic())

    async def _run_link(self, i: int, where: Address, link: _ShardLink) -> None:
        assert self._cluster is not None
        subs = self._shards[i]
        reconnect = Reconnect()
        while not self._closed and not (subs.idle(where) and not link.outbox):
            pool = self._cluster(i).member_pool(where)
            conn: redis.asyncio.Connection = pool.make_connection()  # type: ignore[no-untyped-call]
            try:
                await self._set_up(conn)
                loop = asyncio.get_running_loop()
                lost: asyncio.Future[BaseException] = loop.create_future()

                def handle(reply: object, lost: asyncio.Future[BaseException] = lost) -> None:
                    begun = self._cluster(i).begun if self._cluster is not None else 0
                    if isinstance(reply, ErrorReply):
                        event = subs.answered(where, None, reply.message, begun)
                    else:
                        self._board.message(reply, i, time.monotonic())  # an smessage
                        event = subs.answered(where, reply, None, begun)
                    if event.kind in ("refused", "cut"):
                        if not lost.done():
                            cause = ResponseRefused if event.kind == "refused" else _Cut
                            lost.set_result(cause(event.detail))
                        return
                    self._shard_event(i, event)

                transport = conn._writer.transport  # type: ignore[union-attr]
                transport.set_protocol(RespProtocol(handle, lost))
                link.transport = transport
                reconnect.succeeded()
                if link.outbox:
                    data, link.outbox = b"".join(link.outbox), []
                    write(transport, data)
                raise await lost
            except asyncio.CancelledError:
                link.transport = None
                if link.task is asyncio.current_task() and not self._closed:
                    # Cancelled from outside (``_replan`` lets go of a task it retires
                    # first): its subscriptions ended with the connection. Lost, as when
                    # the connection fails, so that the slots' waiters re-check and the
                    # next registration's ``_replan`` starts a connection again (not
                    # now: the loop may be shutting down).
                    link.task = None
                    link.outbox = []
                    if subs.lost(where, self._cluster(i).begun):
                        self._subscriptions_lost(i)
                await conn.disconnect(nowait=True)
                raise
            except _Cut:
                pass  # its other subscriptions, if any, are placed again after the back-off
            except Exception as exc:  # a failed connection is retried after a back-off
                self._note_failure(i, exc)
            link.transport = None
            link.outbox = []
            await conn.disconnect(nowait=True)
            if subs.lost(where, self._cluster(i).begun):
                self._subscriptions_lost(i)
            self._replan()  # asked again at the slots' owners (here once it is back)
            await asyncio.sleep(reconnect.failed(time.monotonic()))
        if link.task is asyncio.current_task():
            link.task = None

    async def _set_up(self, conn: redis.asyncio.Connection) -> None:
        """Connect ``conn`` (TCP, TLS, AUTH, SELECT) within ``connect_timeout``.

        redis-py's socket timeout bounds each wait for bytes, not a whole reply: a node
        sending its reply to AUTH a byte at a time, each sooner than that, kept the
        subscription's task in its set-up for ever, and the node's notifications away
        for as long. Given up, the set-up is retried after the back-off, as the blocking
        client's listener does.

        Raises:
            TimeoutError: not set up within ``connect_timeout``.
        """
        await within(conn.connect(), self._connect_timeout)  # type: ignore[no-untyped-call]

    def _note_failure(self, i: int, exc: Exception) -> None:
        """A subscription connection to node ``i`` failed: a failure of its configuration
        (SUBSCRIBE refused by the ACL, NOAUTH) is told; any is retried after a back-off."""
        refused = isinstance(exc, ResponseRefused)
        why = diagnosis.error_reply(str(exc)) if refused else diagnose(exc)
        if why.failure.configuration:
            self._reporter.note(i, why.failure, why.detail, notifications=refused)

    def _cluster_of(self, i: int) -> ClusterChannel | None:
        """Node ``i`` in the running loop, if it is a Redis Cluster node."""
        if self._cluster is None or i >= len(self._clusters) or not self._clusters[i]:
            return None
        return self._cluster(i)

    def _pool(self, i: int) -> redis.asyncio.ConnectionPool:
        """Where node ``i``'s classic subscription connects: a Cluster node's master by
        its slot map, as the blocking client's listener (not its first seed for good: a
        seed that died would leave waiters to their fallback re-check)."""
        cluster = self._cluster_of(i)
        return self._pools[i] if cluster is None else cluster.listener_pool()

    async def _run(self, i: int) -> None:
        reconnect = Reconnect()
        ever = False
        while True:
            conn: redis.asyncio.Connection = self._pool(i).make_connection()  # type: ignore[no-untyped-call]
            try:
                await self._set_up(conn)
                lost: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

                def handle(reply: object, lost: asyncio.Future[BaseException] = lost) -> None:
                    nonlocal ever
                    if isinstance(reply, ErrorReply):
                        # SUBSCRIBE refused (ACL without the channel, NOAUTH): retried
                        # after the back-off; waiters re-check meanwhile.
                        if not lost.done():
                            lost.set_result(ResponseRefused(reply.message))
                        return
                    now = time.monotonic()
                    if self._board.message(reply, i, now):
                        self._up[i] = True
                        reconnect.succeeded()
                        if all(self._up) and self._all_up is not None:
                            self._all_up.set()
                        if ever:
                            # Subscribed again: the connection before was lost, and
                            # what it was bringing with it (``Departed.decline_all``).
                            self._nudge_all()
                            self.departed.decline_all(i, now)
                        ever = True

                transport = conn._writer.transport  # type: ignore[union-attr]
                transport.set_protocol(RespProtocol(handle, lost))
                write(transport, pack("SUBSCRIBE", self.channel))
                raise await lost
            except asyncio.CancelledError:
                await conn.disconnect(nowait=True)
                raise
            except Exception as exc:  # a failed connection is retried after a back-off
                self._note_failure(i, exc)
                cluster = self._cluster_of(i)
                if cluster is not None:
                    cluster.listener_lost()  # the next connection: a master of the new map
            self._up[i] = False
            await conn.disconnect(nowait=True)
            await asyncio.sleep(reconnect.failed(time.monotonic()))

"""The asyncio API: ``AsyncClient``, ``AsyncLock`` and ``AsyncLease``.

The same algorithm as the blocking API (the pure core decides everything), driven by
``await``. Cancellation is safe by construction: every cleanup is *written* to the nodes
synchronously, before ``CancelledError`` leaves the coroutine (see ``channels``), and an
acquire that is cancelled never returns a lease. ``CancelledError`` is never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from types import TracebackType
from typing import Any, cast

from .._core.acquire import LeaseState, Refused
from .._core.config import LockSpec
from .._core.flows import (
    AwaitWake,
    Flow,
    Listen,
    Op,
    Run,
    Send,
    Sleep,
)
from .._core.watchdog import KeepAlive
from .._driver.client_base import ClientBase
from .._driver.clock import monotonic
from .._driver.lease import LeaseView, leave_block
from .._driver.lock import LockView
from .._errors import EventLoopConflict, LeaseLost, NotHeld
from .channels import Channels, Reply, lost
from .cluster import ClusterChannel
from .drive import adrive
from .notify import AsyncListener, AsyncSlot
from .watchdog import Watchdog

__all__ = ["AsyncClient", "AsyncLease", "AsyncLock"]

_clock = monotonic
_log = logging.getLogger("tenure")
# What ``async with lock:`` does with a lease it was not asked to keep alive: watch it,
# to cancel the body once its validity ends.
_WATCH_ONLY = KeepAlive(extend=False)


class AsyncClient(ClientBase):
    """The asyncio twin of ``tenure.Client``; same arguments, same errors.

    As there, every lock's ``ttl`` must be at least ``2 * (node_timeout + drift)``, where
    ``drift = ttl * drift_factor + drift_floor`` (a shorter one raises
    ``ConfigurationError`` naming the minimum).

    Many tasks share one pipelined connection per node. Use ``async with`` or call
    ``aclose()`` so the connections and their tasks end with the client; a closed client
    can't be used again (``ClientClosed``).

    Locks are not reentrant: a blocking acquire by a *task* inside its own ``async with``
    block of that lock (through this client) raises ``SelfDeadlock`` at once. A lease
    held outside a block may be handed to another task, so its acquirer waits for it
    as anyone does. Other tasks wait for it as for any holder (a task that holds a lock
    and awaits another task acquiring the same lock still deadlocks: that can't be told
    apart from ordinary waiting).
    """

    _ASYNCIO = True

    def _open(self, connection_options: dict[str, Any]) -> None:
        self._channels = Channels(self.config, connection_options, self._reporter)
        self._tasks: set[asyncio.Task[object]] = set()  # flows run in the background (``Later``)
        self._listener_loop: asyncio.AbstractEventLoop | None = None
        self._listener_ = self._new_listener()

    def _new_listener(self) -> AsyncListener:
        clusters = [bool(a.seeds) for a in self.config.nodes]
        return AsyncListener(
            self._channels.pools,
            self._reporter,
            self.config.channel_prefix,
            clusters,
            self._cluster_channel,
            self.config.connect_timeout,
        )

    def _cluster_channel(self, i: int) -> ClusterChannel:
        """Node ``i`` (a Cluster node) in the running loop: its slot map and members."""
        return cast("ClusterChannel", self._channels._current()[i])

    @property
    def _listener(self) -> AsyncListener:
        loop = asyncio.get_running_loop()
        if loop is not self._listener_loop:
            # Connections belong to the loop that made them; a new loop gets new ones.
            self._listener_loop = loop
            self._listener_ = self._new_listener()
        return self._listener_

    def _check_loop(self, operation: str, name: str) -> None:
        """Refuse a call from an event loop while another one, running in another
        thread, uses the client. Its connections, their tasks and events belong to that
        loop: taken over at each call, they were set up again hundreds of times and
        woken from the wrong thread (raw ``RuntimeError`` under asyncio's debug mode, a
        loop never woken). Loops that take turns (one ``asyncio.run`` after another)
        are served as before."""
        if self._channels.serves_another_loop():
            raise EventLoopConflict(operation, name)

    def _notifications(self) -> AsyncListener:
        return self._listener

    def _owner(self) -> Hashable:
        # A coroutine driven without a task has no identity to compare: a fresh object
        # never conflicts, so such a caller is simply never refused.
        return asyncio.current_task() or object()

    def _describe(self, owner: Hashable) -> str:
        name = owner.get_name() if isinstance(owner, asyncio.Task) else repr(owner)
        return f"asyncio task {name!r}"

    def lock(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        watchdog: bool = False,
        max_hold: float | None = None,
        fair: bool | None = None,
    ) -> AsyncLock:
        """A lock object for ``name``; see ``Client.lock`` and ``AsyncLock``.

        ``ttl`` must be at least ``2 * (node_timeout + drift)`` with ``drift = ttl *
        drift_factor + drift_floor``.

        Raises:
            ClientClosed: the client was closed.
            ConfigurationError: bad name, TTL, timeout or ``max_hold`` (also: a
                ``max_hold`` without ``watchdog=True``, which it would not cap).
        """
        spec, keep = self._lock_args(name, ttl, fair, watchdog, max_hold)
        return AsyncLock(self, spec, blocking, timeout, keep)

    async def acquire(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        watchdog: bool = False,
        max_hold: float | None = None,
        fair: bool | None = None,
    ) -> AsyncLease:
        """Acquire ``name`` for ``ttl`` seconds; see ``Client.acquire``.

        ``ttl`` must be at least ``2 * (node_timeout + drift)`` with ``drift = ttl *
        drift_factor + drift_floor``.

        Raises:
            SelfDeadlock: blocking, and this task is inside an ``async with`` block of it
                (through this client).
            ClientClosed: the client was closed.
            EventLoopConflict: an event loop of another thread uses the client now.
            LockTimeout, QuorumUnreachable, ServerUnsupported, ConfigurationError: as
                for ``Client.acquire``.
        """
        spec = self._acquire_args(name, ttl, fair, watchdog, max_hold)
        lease = await self._acquire(spec, blocking, timeout)
        return self._handed_out(lease, name, blocking, timeout, watchdog, max_hold)

    async def _acquire(
        self, spec: LockSpec, blocking: bool, timeout: float | None
    ) -> AsyncLease | Refused:
        self._check_loop("acquire", spec.name)
        flow = self._acquire_flow(spec, blocking, timeout)
        state = await adrive(flow, self._perform)
        return state if isinstance(state, Refused) else AsyncLease(self, state, spec)

    async def _perform(self, op: Op) -> Any:
        """Carry out one operation of a flow (``_core.flows``). Those a flow yields while
        a cancellation propagates (``flows.INSTANT``) complete without awaiting."""
        if isinstance(op, Run):
            await self._channels.run(
                op.command,
                op.rnd,
                op.deadline,
                op.targets,
                hopeless_unsent=op.hopeless_unsent,
                begin_by=op.begin_by,
            )
        elif isinstance(op, Listen):
            if op.timeout == 0:
                return self._listener.register_now(op.waiter, op.need, op.key)
            return await self._listener.register(op.waiter, op.timeout, op.need, op.key)
        elif isinstance(op, AwaitWake):
            assert isinstance(op.inbox, AsyncSlot)
            return await op.inbox.wait(op.timeout)
        elif isinstance(op, Sleep):
            await asyncio.sleep(op.seconds)
        else:
            self._perform_now(op)
        return None

    def _send_now(self, send: Send) -> None:
        if not self.closed:
            self._channels.send(send.command, send.rnd, send.targets)

    def _deliver(self, send: Send, failed: Callable[[], None]) -> None:
        if self.closed:
            return
        told = False

        def on_reply(node: int, reply: Reply) -> None:
            nonlocal told
            if lost(reply) and not told:  # (an error reply came from the node: it got it)
                told = True
                failed()

        self._channels.send(send.command, send.rnd, send.targets, on_reply)
        if not told and send.rnd.failures():  # not even written (a reconnect back-off)
            told = True
            failed()

    def _later(self, delay: float, call: Callable[[], object]) -> None:
        asyncio.get_running_loop().call_later(delay, call)

    def _background(self, flow: Flow[object]) -> None:
        task = asyncio.get_running_loop().create_task(adrive(flow, self._perform))
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieved)

    async def aclose(self) -> None:
        """Close every connection (and the task behind it); the client can't be used again.

        Leases still held are not released (see ``Client.close``): their keys expire by
        their TTL, and extending or releasing them raises ``ClientClosed``.
        """
        self._flows.closed = True
        await self._listener_.close()
        await self._channels.close()

    async def __aenter__(self) -> AsyncClient:
        # As ``Client.__enter__``: refused at the block, not at its first operation.
        self._check_open("enter `async with client:`")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncClient nodes={self.node_names}>"


class AsyncLease(LeaseView):
    """One successful acquisition (asyncio): ``await lease.extend()``, ``await lease.release()``.

    ``async with lease:`` releases on exit; the body's exception wins over a loss or a
    failed release, as for ``Lease``, and entering it once released raises ``NotHeld``.
    A forked child may not extend or release it
    (``InheritedLease``), nor may anyone once its client was closed (``ClientClosed``).
    """

    _client: AsyncClient

    def __init__(self, client: AsyncClient, state: LeaseState, spec: LockSpec) -> None:
        super().__init__(state, spec, client)
        self._watcher: Watchdog | None = None
        # Extensions (the watchdog's) and the release run one at a time, as for the
        # blocking ``Lease``: an extension must not conclude on a lease being released.
        self._op_lock = asyncio.Lock()
        # Made when first asked for, or by the loss (``_signal_lost``): most leases are
        # released long before anyone looks, and an asyncio.Event costs calls of
        # Python to make.
        self._lost_event: asyncio.Event | None = None

    @property
    def lost(self) -> asyncio.Event:
        """Set the moment the lease is found lost (see ``lost_error``)."""
        event = self._lost_event
        if event is None:
            event = self._lost_event = asyncio.Event()
        return event

    def _signal_lost(self) -> None:
        self.lost.set()

    def _await_callback(self, callback: object, result: Awaitable[object]) -> None:
        # An ``async def`` callback: called and never awaited, it would not run at all.
        # It runs as a task of the loop that found the loss (the watchdog's, an
        # operation's), kept by the client until it ends; its failure is logged as a
        # plain callback's is.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # on_lost() of a lease lost already, called outside a loop
            super()._await_callback(callback, result)
            return
        task = asyncio.ensure_future(result, loop=loop)
        tasks = self._client._tasks
        tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(tasks.discard)
        task.add_done_callback(partial(_callback_ended, self.name))

    def keep_alive(self, *, max_hold: float | None = None) -> None:
        """Start a watchdog task that extends the lease every TTL/3; see ``Lease.keep_alive``.

        Raises:
            EventLoopConflict: no event loop runs here, or an event loop of another
                thread uses the client now (the task belongs on that loop).
        """
        policy = KeepAlive(max_hold=max_hold)
        policy.check_ttl(self._spec.ttl)
        watcher = self._watcher
        if watcher is None or not watcher.extends:
            # A plain method, it may be called where no loop runs (a thread, after
            # ``asyncio.run``), or on another thread's loop: the watchdog it starts
            # would be made on no loop, or take the client's connections from its own.
            # (One that runs already is only checked against: no loop needed.)
            self._check_usable("keep it alive")
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise EventLoopConflict("keep it alive", self.name, no_loop=True) from None
            self._client._check_loop("keep it alive", self.name)
        self._watch(policy)

    def _watch(self, policy: KeepAlive) -> None:
        self._check_usable("keep it alive")
        if self._released:
            raise NotHeld(self.name, "this lease was already released")
        watcher = self._watcher
        if watcher is None:
            self._watcher = Watchdog(self, policy)
        elif watcher.extends:
            policy.check_as_running(watcher.policy)
        elif policy.extend and self._loss is None:
            # ``async with lock:`` only watches its lease (to cancel the body at its end);
            # a ``keep_alive()`` in the body asks for more, and must not be ignored. The
            # body's cancel-on-loss is an ``on_lost`` callback, so it outlives the swap.
            # A watching task that already began is cancelled; it never extends, so
            # there is nothing to wait for.
            watcher.stop()
            self._watcher = Watchdog(self, policy)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()

    async def extend(self, ttl: float | None = None) -> None:
        """Give the lease ``ttl`` more seconds (default: its lock's TTL); see ``Lease.extend``."""
        await self._extend(ttl, None)

    async def _extend(self, ttl: float | None, retry: KeepAlive | None) -> LeaseLost | None:
        """``extend``; its watchdog's tries pass its policy as ``retry``
        (``Flows.extend``: the failure of one worth another try is returned, not acted
        on)."""
        client = self._client
        self._check_usable("extend")
        client._check_loop("extend", self.name)
        async with self._op_lock:
            failed = await adrive(client._flows.extend(self, ttl, retry), client._perform)
        watcher = self._watcher
        if watcher is not None:
            watcher.replan()
        return failed

    async def release(self) -> None:
        """Release on every node; see ``Lease.release``. Cancelling it still releases
        once it began (the release is written before the first await)."""
        client = self._client
        self._check_usable("release")
        client._check_loop("release", self.name)
        try:
            async with self._op_lock:
                await adrive(client._flows.release(self), client._perform)
        finally:
            watcher, self._watcher = self._watcher, None
            if watcher is not None:
                # The release flow stops it, but only once it has the lease: a release
                # cancelled while it waited for an extension in flight never got there,
                # and the watchdog, left running, would keep the lock for ever.
                watcher.stop()
                await watcher.join()

    async def __aenter__(self) -> AsyncLease:
        self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._unbind()
        failure: Exception | None = None
        if not self._released:
            try:
                await self.release()
            except Exception as error:  # reported below; the body's exception wins
                failure = error
        leave_block(self.name, self.lost_error, exc, failure)


class _Block:
    """One ``async with lock:`` block: its task, and whether tenure cancelled it."""

    __slots__ = ("body", "cancelled", "open")

    def __init__(self, body: asyncio.Task[Any] | None) -> None:
        self.body = body
        self.open = True  # cancelling the body is only right while the block runs
        self.cancelled = False

    def cancel_body(self, error: LeaseLost) -> None:
        """``on_lost`` of the block's lease: cancel the body, while the block runs."""
        body = self.body
        if not self.open or body is None or body.done():
            return
        if body is asyncio.current_task():
            return  # the body found the loss itself (extend, release): it was raised there
        self.cancelled = True
        body.cancel(f"tenure: lease lost: {error}")


class AsyncLock(LockView[AsyncLease, _Block]):
    """The asyncio twin of ``tenure.Lock``: ``async with lock as lease:``.

    Inside ``async with``, the body is cancelled the moment the lease is found lost (an
    extension failed, a node lost it, or it ran out: with ``watchdog=False`` it is
    watched until its validity ends), and ``LeaseLost`` is raised out of the block in
    place of the ``CancelledError``. A body that finishes after its lease was lost also
    gets ``LeaseLost``: it ran, at least in part, unprotected.

    A body that raises an exception of its own keeps it: the loss, or a release that
    failed at exit, is attached to it (a note on Python 3.11+, a warning on the
    ``tenure`` logger; ``lease.lost_error`` records the loss). So does a cancellation
    that did not come from tenure: if the task was also cancelled by someone else, its
    ``CancelledError`` goes on (Python 3.11+, where cancellations are counted).

    It is not reentrant: a blocking ``acquire()`` by a task inside an ``async with``
    block of this lock (through the same client) raises ``SelfDeadlock`` at once; other
    tasks wait, and so does a task whose lease from ``acquire()`` is held outside any
    block (another task may be the one to release it).
    """

    def __init__(
        self,
        client: AsyncClient,
        spec: LockSpec,
        blocking: bool,
        timeout: float | None,
        keep_alive: KeepAlive | None = None,
    ) -> None:
        super().__init__(client, spec, blocking, timeout, keep_alive)
        self._client = client

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``blocking`` is False or ``timeout`` passed first.

        Raises:
            SelfDeadlock: blocking, and this task is inside an ``async with`` block of
                the lock (through the same client).
            ClientClosed: the client was closed.
            EventLoopConflict: an event loop of another thread uses the client now.
            QuorumUnreachable: so many nodes failed that no majority is possible.
        """
        got = await self._client._acquire(self._spec, blocking, timeout)
        if not self._took(got):
            return False
        assert not isinstance(got, Refused)
        self._adopt(got)
        return True

    def _adopt(self, lease: AsyncLease) -> None:
        """Watch ``lease`` as its block's if it is the block's now: this task's innermost
        block of this object released the lease it entered with, and the body took the
        lock again through the object (``LockView._close`` leaves the block with it). Its
        loss must cancel the body as the first one's would have."""
        with self._guard:
            entries = self._blocks.get(self._caller())
            if not entries:
                return
            entered, block = entries[-1]
        if not entered.released or not block.open:
            return
        lease._watch(self._keep_alive or _WATCH_ONLY)
        lease.on_lost(block.cancel_body)

    async def release(self) -> None:
        """Release the lease this object holds; see ``Lock.release``."""
        lease = self._to_release()
        try:
            await lease.release()
        finally:
            self._released(lease)

    async def locked(self) -> bool:
        """Whether a majority of nodes hold this lock now (for anyone). One round trip.

        Raises:
            ClientClosed: the client was closed.
            EventLoopConflict: an event loop of another thread uses the client now.
            QuorumUnreachable: the nodes that did not answer (down, silent) decide
                it: too few answered, or those that did split between holding it and
                not. Those that did not may hold it, so there is no answer to give.
            NodeMisconfigured: as for ``acquire``, when misconfigured nodes are why.
        """
        client = self._client
        client._check_loop("ask whether it is locked", self.name)
        return await adrive(client._flows.locked(self._spec), client._perform)

    async def __aenter__(self) -> AsyncLease:
        got = await self._client._acquire(self._spec, self._blocking, self._timeout)
        lease = self._entered(got)
        lease._watch(self._keep_alive or _WATCH_ONLY)
        block = _Block(asyncio.current_task())
        lease._bind()
        self._open(lease, block)
        lease.on_lost(block.cancel_body)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The block's own lease: by now the object may hold another task's.
        lease, block = self._close()
        if lease is not None:
            lease._unbind()
        ours = False  # the body's CancelledError is the one tenure caused, and only that
        if block is not None:
            block.open = False  # from here on, a loss no longer cancels the task
            if block.cancelled and block.body is not None:
                # Take back our cancellation, even if the body swallowed it, so that the
                # task's count (asyncio.timeout, TaskGroup) sees only other cancellations.
                uncancel = getattr(block.body, "uncancel", None)  # Python >= 3.11
                remaining = uncancel() if uncancel is not None else 0
                ours = isinstance(exc, asyncio.CancelledError) and remaining == 0
        if lease is None:
            return
        failure: Exception | None = None
        if not lease.released:
            try:
                await lease.release()
            except Exception as error:  # reported below; the body's exception wins
                failure = error
        lost = lease.lost_error
        if ours and lost is not None:
            raise lost from None  # in place of the cancellation tenure caused
        leave_block(self.name, lost, exc, failure)


def _callback_ended(name: str, task: asyncio.Future[object]) -> None:
    """An ``async def`` ``on_lost`` callback's end: its failure is logged."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        _log.error("tenure: on_lost callback for %r failed", name, exc_info=error)


def _retrieved(task: asyncio.Task[object]) -> None:
    """A background flow's end: what it raised is dropped (best effort), not logged by
    the loop as never retrieved."""
    if not task.cancelled():
        task.exception()

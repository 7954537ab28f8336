"""The asyncio API: ``AsyncClient``, ``AsyncLock`` and ``AsyncLease``.

The same algorithm as the blocking API (the pure core decides everything), driven by
``await``. Cancellation is safe by construction: every cleanup is *written* to the nodes
synchronously, before ``CancelledError`` leaves the coroutine (see ``channels``), and an
acquire that is cancelled never returns a lease. ``CancelledError`` is never swallowed.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Hashable
from types import TracebackType
from typing import Any

from .._core import commands
from .._core.acquire import (
    Acquisition,
    GiveUp,
    Granted,
    LeaseState,
    Retry,
    Seed,
    Wait,
)
from .._core.acquire import cleanup_wait as _cleanup_wait
from .._core.config import LockSpec, check_acquire_args, check_flag
from .._core.lease import begin_extend, conclude_extend, conclude_locked, conclude_release
from .._core.quorum import Round
from .._core.watchdog import KeepAlive
from .._driver.client_base import ClientBase
from .._driver.clock import monotonic, wall_us
from .._driver.lease import LeaseView, leave_block
from .._driver.lease import not_acquired as _not_acquired
from .._errors import LeaseLost, LockTimeout, NotHeld
from .channels import Channels
from .notify import AsyncListener, AsyncSlot
from .watchdog import watch

__all__ = ["AsyncClient", "AsyncLease", "AsyncLock"]

_clock = monotonic


class AsyncClient(ClientBase):
    """The asyncio twin of ``tenure.Client``; same arguments, same errors.

    As there, every lock's ``ttl`` must be at least ``2 * (node_timeout + drift)``, where
    ``drift = ttl * drift_factor + drift_floor`` (a shorter one raises
    ``ConfigurationError`` naming the minimum).

    Many tasks share one pipelined connection per node. Use ``async with`` or call
    ``aclose()`` so the connections and their tasks end with the client; a closed client
    can't be used again (``ClientClosed``).

    Locks are not reentrant: a blocking acquire of a lock that the calling *task*
    already holds through this client raises ``SelfDeadlock`` at once. Other tasks wait
    for it as for any holder (a task that holds a lock and awaits another task acquiring
    the same lock still deadlocks: that can't be told apart from ordinary waiting).
    """

    _ASYNCIO = True

    def _open(self, connection_options: dict[str, Any]) -> None:
        self._channels = Channels(self.config, connection_options, self._reporter)
        self._listener_loop: asyncio.AbstractEventLoop | None = None
        self._listener_ = AsyncListener(self._channels.pools, self._reporter)

    @property
    def _listener(self) -> AsyncListener:
        loop = asyncio.get_running_loop()
        if loop is not self._listener_loop:
            # Connections belong to the loop that made them; a new loop gets new ones.
            self._listener_loop = loop
            self._listener_ = AsyncListener(self._channels.pools, self._reporter)
        return self._listener_

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
            ConfigurationError: bad name, TTL, timeout or ``max_hold``.
        """
        self._check_open("make a lock object", name)
        keep = KeepAlive(max_hold=max_hold) if check_flag("watchdog", watchdog) else None
        return AsyncLock(self, self._specs.get(name, ttl, fair), blocking, timeout, keep)

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
            SelfDeadlock: blocking, and this task already holds it through this client.
            ClientClosed: the client was closed.
            LockTimeout, QuorumUnreachable, ServerUnsupported, ConfigurationError: as
                for ``Client.acquire``.
        """
        spec = self._specs.get(name, ttl, fair)
        check_flag("watchdog", watchdog)
        if max_hold is not None:
            KeepAlive(max_hold=max_hold)  # validates max_hold before acquiring
        lease = await self._acquire(spec, blocking, timeout)
        if lease is None:
            raise LockTimeout(name, _not_acquired(blocking, timeout))
        if watchdog:
            lease.keep_alive(max_hold=max_hold)
        return lease

    async def _acquire(
        self, spec: LockSpec, blocking: bool, timeout: float | None
    ) -> AsyncLease | None:
        self._check_open("acquire", spec.name)
        self._check_reentry(spec, blocking)
        acq = self._acquisition(spec, blocking, timeout)
        listener = self._listener
        waiter = secrets.token_hex(16)
        ticket = wall_us()  # its place in a quorum's queues ("q"), the same on every node
        slot: AsyncSlot | None = None
        if blocking and listener.started and self.config.recheck > 0:
            slot = listener.register_now(waiter, spec.quorum)
        queued = False
        lease: AsyncLease | None = None
        try:
            while True:
                # Closed by another task while this one waited: stop, don't reconnect.
                self._check_open("acquire", spec.name)
                # One token per acquire call (its waiter id): release.lua then also takes
                # the holder out of queues it joined on nodes that said "held".
                token = waiter
                # Always the waiting form: even an attempt that will not queue must see
                # the queue (fair) and a reservation for a woken waiter.
                wait_args = self._wait_args(
                    spec, waiter, listener.channel, slot is not None, ticket
                )
                queued = queued or slot is not None
                if slot is not None:
                    slot.take()  # this attempt sees every release notified so far
                rnd = acq.begin(_clock())
                command = self._replicated(
                    commands.acquire(
                        spec,
                        token,
                        acq.proposal(wall_us()),
                        acq.mark,
                        self.config.max_ttl_ms,
                        wait_args,
                    )
                )
                try:
                    await self._channels.run(command, rnd, acq.deadline(rnd), hopeless_unsent=True)
                except asyncio.CancelledError:
                    # Written before the cancellation propagates, behind our grant on each link.
                    self._send_release(spec.key, token, rnd.maybe_holding())
                    raise
                step = acq.conclude(rnd, token, _clock())
                self._fence_floor = max(self._fence_floor, acq.floor)
                if isinstance(step, Granted):
                    if step.seed is not None:
                        await self._seed(spec, step.seed)
                    lease = AsyncLease(self, step.lease, spec)
                    return lease
                if step.cleanup:
                    command = self._cleanup_release(spec, token)
                    await self._cleanup_round(command, step.cleanup, _cleanup_wait(step, rnd))
                if isinstance(step, GiveUp):
                    if step.error is not None:
                        raise step.error
                    return None
                if isinstance(step, Retry) and step.seed is not None:
                    await self._seed(spec, step.seed)
                if isinstance(step, Wait):
                    if slot is None:
                        # First wait of this client: subscribe, then queue at once.
                        slot = await listener.register(
                            waiter, self.config.node_timeout, spec.quorum
                        )
                        continue
                    if await slot.wait(step.timeout):
                        lease = self._handed_over(slot, acq, spec, waiter)
                        if lease is not None:
                            return lease
                elif step.sleep:
                    await asyncio.sleep(step.sleep)
        finally:
            if slot is not None:
                listener.unregister(waiter)
            if queued and lease is None:
                # Written at once (no await), so a cancelled acquire leaves its place too.
                self._depart(listener.departed, spec, waiter)

    def _decline(self, spec: LockSpec, waiter: str, node: int | None) -> None:
        """Leave the queue on ``node`` (None: every node), passing on a lock handed to
        ``waiter`` meanwhile; again for a notification that reaches it after it gave up
        (see ``Departed``). Written at once, no await."""
        if self._closed:
            return  # closed: no reconnecting for it; the place expires on the nodes
        rnd = Round(len(self.node_names), self.config.quorum, _clock())
        command = commands.dequeue(self._release_waking(spec, waiter))
        self._channels.send(command, rnd, None if node is None else [node])

    def _handed_over(
        self, slot: AsyncSlot, acq: Acquisition, spec: LockSpec, waiter: str
    ) -> AsyncLease | None:
        """The lease a fair hand-off gave us, if the notifications say so (else re-check)."""
        granted = self._transferred(slot.take(), acq, waiter)
        return None if granted is None else AsyncLease(self, granted.lease, spec)

    async def _seed(self, spec: LockSpec, seed: Seed) -> None:
        command = commands.seed(spec, seed.floor, seed.warm_ms, seed.marks)
        await self._cleanup_round(command, seed.nodes, seed.nodes)

    async def _cleanup_round(
        self, command: commands.Command, targets: frozenset[int], wait_for: frozenset[int]
    ) -> None:
        """``command`` on ``targets``, waiting for every one of ``wait_for`` (up to the
        timeout); best effort, never an error of its own (see ``Client._cleanup_round``)."""
        now = _clock()
        rnd = Round.cleanup(len(self.node_names), wait_for, now)
        await self._channels.run(command, rnd, now + self.config.node_timeout, sorted(targets))

    def _send_release(self, key: str, token: str, targets: frozenset[int]) -> None:
        rnd = Round(len(self.node_names), self.config.quorum, _clock())
        self._channels.send(commands.release(key, token), rnd, sorted(targets))

    async def _round(self, command: commands.Command) -> Round:
        """``command`` on every node; decided once a majority said yes (or can't)."""
        now = _clock()
        rnd = Round(len(self.node_names), self.config.quorum, now)
        await self._channels.run(command, rnd, now + self.config.node_timeout)
        return rnd

    async def aclose(self) -> None:
        """Close every connection (and the task behind it); the client can't be used again.

        Leases still held are not released (see ``Client.close``): their keys expire by
        their TTL, and extending or releasing them raises ``ClientClosed``.
        """
        self._closed = True
        await self._listener_.close()
        await self._channels.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncClient nodes={self.node_names}>"


class AsyncLease(LeaseView):
    """One successful acquisition (asyncio): ``await lease.extend()``, ``await lease.release()``.

    ``async with lease:`` releases on exit; the body's exception wins over a loss or a
    failed release, as for ``Lease``. A forked child may not extend or release it
    (``InheritedLease``), nor may anyone once its client was closed (``ClientClosed``).
    """

    _client: AsyncClient

    def __init__(self, client: AsyncClient, state: LeaseState, spec: LockSpec) -> None:
        super().__init__(state, spec, client)
        self._watcher: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()
        """Set the moment the lease is found lost (see ``lost_error``)."""

    def _signal_lost(self) -> None:
        self.lost.set()

    def keep_alive(self, *, max_hold: float | None = None) -> None:
        """Start a watchdog task that extends the lease every TTL/3; see ``Lease.keep_alive``."""
        self._watch(KeepAlive(max_hold=max_hold))

    def _watch(self, policy: KeepAlive) -> None:
        self._check_usable("keep it alive")
        self._check_not_released()
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(watch(self, policy))

    async def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def extend(self, ttl: float | None = None) -> None:
        """Give the lease ``ttl`` more seconds (default: its lock's TTL); see ``Lease.extend``."""
        client = self._client
        self._check_usable("extend")
        spec = self._spec if ttl is None else LockSpec.build(client.config, self.name, ttl)
        self._check_not_released()
        rnd = begin_extend(self._state, spec, _clock())
        await client._channels.run(
            client._replicated(commands.extend(spec, self.token)),
            rnd,
            rnd.started + spec.node_timeout,
        )
        outcome = conclude_extend(self._state, spec, rnd, _clock(), client.node_names)
        if isinstance(outcome, LeaseState):
            self._state = outcome
            return
        self._set_released()
        await client._round(client._release_waking(spec, self.token, self.fencing_token))
        self._mark_lost(outcome)
        raise outcome

    async def release(self) -> None:
        """Release on every node; see ``Lease.release``. Cancelling it still releases."""
        client = self._client
        self._check_usable("release")
        self._check_not_released()
        self._set_released()
        await self._stop_watching()
        spec = self._spec
        rnd = await client._round(client._release_waking(spec, self.token, self.fencing_token))
        error = conclude_release(
            self._state,
            len(client.node_names),
            client.config.quorum,
            rnd,
            _clock(),
            client.node_names,
        )
        if isinstance(error, LeaseLost):
            self._mark_lost(error)
        if error is not None:
            raise error  # LeaseLost, or ServerUnsupported: a node refused the release (ACL)

    def _check_not_released(self) -> None:
        if self._released:
            raise NotHeld(self.name, "this lease was already released")

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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


class AsyncLock:
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

    It is not reentrant: a blocking ``acquire()`` by a task that already holds this lock
    through the same client raises ``SelfDeadlock`` at once; other tasks wait.
    """

    def __init__(
        self,
        client: AsyncClient,
        spec: LockSpec,
        blocking: bool,
        timeout: float | None,
        keep_alive: KeepAlive | None = None,
    ) -> None:
        check_acquire_args(blocking, timeout)
        self._client = client
        self._spec = spec
        self._blocking = blocking
        self._timeout = timeout
        self._keep_alive = keep_alive
        self._lease: AsyncLease | None = None
        self._block: _Block | None = None

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def lease(self) -> AsyncLease | None:
        return self._lease

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``blocking`` is False or ``timeout`` passed first.

        Raises:
            SelfDeadlock: blocking, and this task already holds the lock through the
                same client.
            ClientClosed: the client was closed.
            QuorumUnreachable: so many nodes failed that no majority is possible.
        """
        lease = await self._client._acquire(self._spec, blocking, timeout)
        if lease is None:
            return False
        if self._keep_alive is not None:
            lease.keep_alive(max_hold=self._keep_alive.max_hold)
        self._lease = lease
        return True

    async def release(self) -> None:
        """Release the lease this object holds.

        Raises:
            NotHeld: this object holds no lease.
            LeaseLost: the lease had expired on a majority before release.
            InheritedLease: this process is a fork of the holder; the lease is kept.
            ClientClosed: the client was closed; the lease is kept.
        """
        lease = self._lease
        if lease is None:
            raise NotHeld(self.name, "release() of a lock this object does not hold")
        lease._check_usable("release")
        self._lease = None
        await lease.release()

    async def locked(self) -> bool:
        """Whether a majority of nodes hold this lock now (for anyone). One round trip.

        Raises:
            ClientClosed: the client was closed.
        """
        self._client._check_open("ask whether it is locked", self.name)
        rnd = await self._client._round(commands.exists(self._spec.key))
        return conclude_locked(rnd, self._client.node_names)

    async def __aenter__(self) -> AsyncLease:
        if not await self.acquire(self._blocking, self._timeout):
            raise LockTimeout(self.name, _not_acquired(self._blocking, self._timeout))
        lease = self._lease
        assert lease is not None
        lease._watch(self._keep_alive or KeepAlive(extend=False))
        block = self._block = _Block(asyncio.current_task())

        def cancel_body(error: LeaseLost) -> None:
            body = block.body
            if not block.open or body is None or body.done():
                return
            if body is asyncio.current_task():
                return  # the body found the loss itself (extend, release): it was raised there
            block.cancelled = True
            body.cancel(f"tenure: lease lost: {error}")

        lease.on_lost(cancel_body)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        block, self._block = self._block, None
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

    def __repr__(self) -> str:
        return f"<AsyncLock {self.name!r} held={self._lease is not None}>"

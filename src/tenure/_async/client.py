"""The asyncio API: ``AsyncClient``, ``AsyncLock`` and ``AsyncLease``.

The same algorithm as the blocking API (the pure core decides everything), driven by
``await``. Cancellation is safe by construction: every cleanup is *written* to the nodes
synchronously, before ``CancelledError`` leaves the coroutine (see ``channels``), and an
acquire that is cancelled never returns a lease. ``CancelledError`` is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from types import TracebackType
from typing import Any

from .._client_base import ClientBase
from .._clock import monotonic, wall_us
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
from .._errors import LeaseLost, LockTimeout, NotHeld
from .._lease import LeaseView
from .._lease import not_acquired as _not_acquired
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
    ``aclose()`` so the reader tasks end with the client.
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
        """
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
        """Close every connection and reader task. Leases still held expire by their TTL."""
        await self._listener_.close()
        await self._channels.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncClient nodes={self.node_names}>"


class AsyncLease(LeaseView):
    """One successful acquisition (asyncio): ``await lease.extend()``, ``await lease.release()``."""

    def __init__(self, client: AsyncClient, state: LeaseState, spec: LockSpec) -> None:
        super().__init__(state, spec, client.node_names)
        self._client = client
        self._watcher: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()
        """Set the moment the lease is found lost (see ``lost_error``)."""

    def _signal_lost(self) -> None:
        self.lost.set()

    def keep_alive(self, *, max_hold: float | None = None) -> None:
        """Start a watchdog task that extends the lease every TTL/3; see ``Lease.keep_alive``."""
        self._watch(KeepAlive(max_hold=max_hold))

    def _watch(self, policy: KeepAlive) -> None:
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
        self._released = True
        await client._round(client._release_waking(spec, self.token, self.fencing_token))
        self._mark_lost(outcome)
        raise outcome

    async def release(self) -> None:
        """Release on every node; see ``Lease.release``. Cancelling it still releases."""
        client = self._client
        self._check_not_released()
        self._released = True
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

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if not self._released:
            await self.release()
        elif self._loss is not None and exc_type is None:
            raise self._loss  # lost (and released) while the block ran: say so


class AsyncLock:
    """The asyncio twin of ``tenure.Lock``: ``async with lock as lease:``.

    Inside ``async with``, the body is cancelled the moment the lease is found lost (an
    extension failed, a node lost it, or it ran out: with ``watchdog=False`` it is
    watched until its validity ends), and ``LeaseLost`` is raised out of the block in
    place of the ``CancelledError``. A body that finishes after its lease was lost also
    gets ``LeaseLost``: it ran, at least in part, unprotected.
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
        self._cancelled_body: asyncio.Task[object] | None = None

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def lease(self) -> AsyncLease | None:
        return self._lease

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``blocking`` is False or ``timeout`` passed first."""
        lease = await self._client._acquire(self._spec, blocking, timeout)
        if lease is None:
            return False
        if self._keep_alive is not None:
            lease.keep_alive(max_hold=self._keep_alive.max_hold)
        self._lease = lease
        return True

    async def release(self) -> None:
        """Release the lease this object holds (``NotHeld`` if none)."""
        lease, self._lease = self._lease, None
        if lease is None:
            raise NotHeld(self.name, "release() of a lock this object does not hold")
        await lease.release()

    async def locked(self) -> bool:
        """Whether a majority of nodes hold this lock now (for anyone). One round trip."""
        rnd = await self._client._round(commands.exists(self._spec.key))
        return conclude_locked(rnd, self._client.node_names)

    async def __aenter__(self) -> AsyncLease:
        if not await self.acquire(self._blocking, self._timeout):
            raise LockTimeout(self.name, _not_acquired(self._blocking, self._timeout))
        lease = self._lease
        assert lease is not None
        lease._watch(self._keep_alive or KeepAlive(extend=False))
        body = asyncio.current_task()
        self._cancelled_body = None

        def cancel_body(error: LeaseLost) -> None:
            if body is not None and not body.done():
                self._cancelled_body = body
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
        if lease is None:
            return
        error = lease.lost_error
        if error is None:
            await lease.release()
            return
        if not lease.released:
            with contextlib.suppress(LeaseLost):
                await lease.release()  # clear what is left of it on the nodes
        body, self._cancelled_body = self._cancelled_body, None
        if body is not None and exc_type is asyncio.CancelledError:
            uncancel = getattr(body, "uncancel", None)  # Python >= 3.11
            if uncancel is not None:
                uncancel()
            raise error from None
        if exc_type is None:
            raise error
        # Otherwise the body's own exception propagates.

    def __repr__(self) -> str:
        return f"<AsyncLock {self.name!r} held={self._lease is not None}>"

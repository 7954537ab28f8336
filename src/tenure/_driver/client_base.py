"""What the blocking and asyncio clients share: their settings and per-client state.

The drivers differ only in how a round reaches the nodes; everything a client *is* (its
validated configuration, the specs of the locks it has used, its random source, the
fencing floor it proposes above, which thread or task holds which of its leases, and
whether it was closed) is built here once.
"""

from __future__ import annotations

import functools
import os
import random
import secrets
import threading
import weakref
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from .._core import commands, waiting
from .._core.acquire import Acquisition, Granted
from .._core.commands import Command, acked_by_replicas
from .._core.config import ClientConfig, LockSpec, SpecCache, check_acquire_args
from .._core.holds import Held, Holds, self_deadlock
from .._core.policy import RetryPolicy
from .._core.waiting import Departed, Wake, hold_ms, place_ms
from .._errors import ClientClosed
from .clock import monotonic, wall_us
from .redis_compat import check_connection_options
from .report import NodeReporter

__all__ = ["ClientBase"]


class ClientBase:
    """Arguments and state common to ``Client`` and ``AsyncClient``.

    The arguments are documented on ``tenure.Client``; subclasses set up their driver's
    connections in ``_open``.
    """

    _ASYNCIO = False  # which redis-py connection classes ``connection_options`` must suit

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        node_timeout: float = 0.05,
        connect_timeout: float = 1.0,
        drift_factor: float = 0.01,
        drift_floor: float = 0.002,
        retry: RetryPolicy | None = None,
        allow_even: bool = False,
        max_ttl: float = 60.0,
        recheck: float = 0.5,
        wait_replicas: int = 0,
        retention: float | None = None,
        connection_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = ClientConfig.build(
            nodes,
            node_timeout=node_timeout,
            connect_timeout=connect_timeout,
            drift_factor=drift_factor,
            drift_floor=drift_floor,
            retry=retry,
            allow_even=allow_even,
            max_ttl=max_ttl,
            recheck=recheck,
            wait_replicas=wait_replicas,
            retention=retention,
        )
        options = check_connection_options(
            connection_options, self.config.nodes, self.config.node_timeout, asyncio=self._ASYNCIO
        )
        self.node_names = [a.display for a in self.config.nodes]
        self._reporter = NodeReporter(self.node_names)
        self._specs = SpecCache(self.config)
        self._rng = random.Random(secrets.randbits(64))
        self._fence_floor = 1  # proposals stay above every fencing token this client saw
        self._place_ms = place_ms(self.config.recheck, self.config.node_timeout)
        self._hold_ms = hold_ms(self.config.node_timeout)
        self._closed = False
        # Leases are released from any thread (a watchdog's, another worker's), so the
        # book of who holds what is guarded; the lock is only ever held for a dict update.
        self._holds = Holds()
        self._holds_guard = threading.Lock()
        _CLIENTS.add(self)
        self._open(options)

    @property
    def closed(self) -> bool:
        """True once the client was closed; it then refuses every operation."""
        return self._closed

    def _check_open(self, operation: str, name: str | None = None) -> None:
        """Raise ``ClientClosed`` if the client was closed (it must not reconnect)."""
        if self._closed:
            raise ClientClosed(operation, name)

    def _owner(self) -> Hashable:
        """Who is calling: the current thread (blocking) or asyncio task."""
        raise NotImplementedError

    def _describe(self, owner: Hashable) -> str:
        """``owner`` in words, for error messages."""
        raise NotImplementedError

    def _check_reentry(self, spec: LockSpec, blocking: bool) -> None:
        """Refuse a blocking acquire of a lock its caller already holds through this client.

        Raises:
            SelfDeadlock: the caller would wait for itself.
        """
        owner = self._owner()
        with self._holds_guard:
            holder = self._holds.conflict(spec.name, owner, monotonic(), blocking=blocking)
        if holder is not None:
            raise self_deadlock(spec.name, self._describe(owner), holder)

    def _hold(self, lease: Held) -> Hashable:
        """Enter a new lease in the book under its caller; returns that owner."""
        owner = self._owner()
        with self._holds_guard:
            self._holds.add(owner, lease, monotonic())
        return owner

    def _unhold(self, owner: Hashable, lease: Held) -> None:
        """Take a released or lost lease out of the book (from whichever thread)."""
        with self._holds_guard:
            self._holds.discard(owner, lease)

    def _forget_after_fork(self) -> None:
        """In a child after fork: it holds nothing (its inherited leases are the parent's),
        and the guard may have been copied locked by a thread that does not exist here."""
        self._holds = Holds()
        self._holds_guard = threading.Lock()

    def _replicated(self, command: Command) -> Command:
        """``command`` as it must be sent when grants count only once replicated."""
        config = self.config
        if not config.wait_replicas:
            return command
        return acked_by_replicas(command, config.wait_replicas, config.wait_timeout_ms)

    def _open(self, connection_options: dict[str, Any]) -> None:
        """Set up the driver's connections (lazily connected)."""
        raise NotImplementedError

    def _acquisition(self, spec: LockSpec, blocking: bool, timeout: float | None) -> Acquisition:
        """The core's state machine for one acquire call."""
        return Acquisition(
            spec,
            self.config.retry,
            self._rng,
            blocking=blocking,
            timeout=check_acquire_args(blocking, timeout),
            now=monotonic(),
            node_names=self.node_names,
            max_ttl_ms=self.config.max_ttl_ms,
            floor=self._fence_floor,
            recheck=self.config.recheck,
        )

    def _wait_args(
        self, spec: LockSpec, waiter: str, channel: str, queued: bool, ticket: int
    ) -> commands.WaitArgs:
        """The waiting arguments of an attempt (``queued``: it joins the queue if held)."""
        place = self._place_ms if queued else 0
        return commands.WaitArgs(spec.wait_mode, waiter, channel, place, ticket)

    def _release_waking(
        self, spec: LockSpec, token: str, fencing: int = 0, *, cleanup: bool = False
    ) -> Command:
        """release.lua for a lease (or, with a waiter id, a waiter giving up): delete our
        key, leave the queue (``cleanup``: stay), pass the lock on to the next waiter."""
        if spec.wait_mode == "q":
            arg = waiting.handoff_token(wall_us(), fencing, self._fence_floor)
        else:
            arg = self._hold_ms
        return commands.release_waking(spec, token, spec.wait_mode, arg, cleanup=cleanup)

    def _cleanup_release(self, spec: LockSpec, token: str) -> Command:
        """What releases the grants of a failed attempt. Fair on a quorum, they are
        passed on to the next in line: a waiter that needs them is told, rather than
        left waiting for its fallback re-check."""
        if spec.wait_mode == "q":
            return self._release_waking(spec, token, cleanup=True)
        return commands.release(spec.key, token)

    def _decline(self, spec: LockSpec, waiter: str, node: int | None) -> None:
        """Send ``waiter``'s dequeue to ``node`` (None: every node), at once."""
        raise NotImplementedError

    def _depart(self, departed: Departed, spec: LockSpec, waiter: str) -> None:
        """``waiter`` gave up: leave every queue now, and decline what still reaches it
        while a place it may have kept on a node its dequeue missed can live."""
        self._decline(spec, waiter, None)
        now = monotonic()
        decline = functools.partial(self._decline, spec, waiter)
        departed.add(waiter, decline, now + self._place_ms / 1000, now)

    def _transferred(
        self, wakes: list[tuple[int, Wake]], acq: Acquisition, waiter: str
    ) -> Granted | None:
        """The grant fair hand-offs gave us, if the notifications say so (else re-check)."""
        grants = [(i, w.token) for i, w in wakes if w.handed_over and w.waiter == waiter]
        granted = acq.transferred(waiter, grants, monotonic()) if grants else None
        if granted is not None:
            self._fence_floor = max(self._fence_floor, acq.floor)
        return granted


_CLIENTS: weakref.WeakSet[ClientBase] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for client in list(_CLIENTS):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)

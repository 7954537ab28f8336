"""What the blocking and asyncio clients share: their settings and per-client state.

The drivers differ only in how a round reaches the nodes; everything a client *is* (its
validated configuration, the specs of the locks it has used, its random source, the
fencing floor it proposes above, which thread or task holds which of its leases, and
whether it was closed) is built here once.
"""

from __future__ import annotations

import os
import random
import secrets
import threading
import weakref
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from .._core.config import ClientConfig, LockSpec, SpecCache
from .._core.flows import Flows, Send
from .._core.holds import Held, Holds, self_deadlock
from .._core.policy import RetryPolicy
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
        # Every operation is a flow of the core (``_core.flows``); the driver carries out
        # what it yields.
        rng = random.Random(secrets.randbits(64))
        self._flows: Flows = Flows(self.config, self.node_names, rng, monotonic, wall_us)
        # Leases are released from any thread (a watchdog's, another worker's), so the
        # book of who holds what is guarded; the lock is only ever held for a dict update.
        self._holds = Holds()
        self._holds_guard = threading.Lock()
        _CLIENTS.add(self)
        self._open(options)

    @property
    def closed(self) -> bool:
        """True once the client was closed; it then refuses every operation."""
        return self._flows.closed

    def _check_open(self, operation: str, name: str | None = None) -> None:
        """Raise ``ClientClosed`` if the client was closed (it must not reconnect)."""
        self._flows.check_open(operation, name)

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

    def _open(self, connection_options: dict[str, Any]) -> None:
        """Set up the driver's connections (lazily connected)."""
        raise NotImplementedError

    def _send_now(self, send: Send) -> None:
        """Write ``send.command`` to its targets without waiting; never raises."""
        raise NotImplementedError

    def _declined(self, spec: LockSpec, waiter: str, node: int) -> None:
        """A notification reached ``waiter`` after it departed: decline it on ``node``
        (``waiting.Departed``), at once and best effort."""
        send = self._flows.decline(spec, waiter, node)
        if send is not None:
            self._send_now(send)


_CLIENTS: weakref.WeakSet[ClientBase] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for client in list(_CLIENTS):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)

"""What the blocking and asyncio clients share: their settings and per-client state.

The drivers differ only in how an operation reaches the nodes; everything a client *is*
(its validated configuration, the specs of the locks it has used, its flows with their
random source and the fencing floor it proposes above, which thread or task holds which
of its leases, and whether it was closed) is built here once, with the glue around the
flows both drivers share (the arguments of ``lock()`` and ``acquire()``, the start of an
acquire flow, and the operations that complete without waiting).
"""

from __future__ import annotations

import functools
import os
import random
import secrets
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .._core.acquire import HELD_ELSEWHERE, LeaseState, Refused
from .._core.config import DEFAULT_KEY_PREFIX, ClientConfig, LockSpec, SpecCache, check_flag
from .._core.flows import Depart, Flow, Flows, Later, Op, Send, Unlisten
from .._core.holds import Held, Holds, own_block, self_deadlock
from .._core.policy import RetryPolicy
from .._core.waiting import Departed, decline_again
from .._core.watchdog import KeepAlive
from .._errors import ConfigurationError, LockTimeout
from .clock import monotonic, wall_us
from .guard import Guard
from .lease import not_acquired
from .process_bound import ProcessBound
from .redis_compat import check_connection_options
from .redis_objects import node_addresses
from .report import NodeReporter

__all__ = ["ClientBase", "Listening"]

L = TypeVar("L", bound="KeptAlive")


class Listening(Protocol):
    """What both drivers' notification listeners offer the glue."""

    channel: str
    departed: Departed

    @property
    def started(self) -> bool: ...

    def unregister(self, waiter: str) -> list[int]:
        """Stop filing for ``waiter``; the nodes of hand-offs filed that it never took."""
        ...


class KeptAlive(Protocol):
    def keep_alive(self, *, max_hold: float | None = None) -> None: ...


class ClientBase(ProcessBound):
    """Arguments and state common to ``Client`` and ``AsyncClient``.

    The arguments are documented on ``tenure.Client``; subclasses set up their driver's
    connections in ``_open``.
    """

    _ASYNCIO = False  # which redis-py connection classes ``connection_options`` must suit

    def __init__(
        self,
        nodes: Sequence[str | Any],
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
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self.config = ClientConfig.build(
            # redis-py clients and pools in the list become addresses with their settings
            node_addresses(nodes, asyncio=self._ASYNCIO),
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
            key_prefix=key_prefix,
        )
        options = check_connection_options(
            connection_options, self.config.nodes, self.config.node_timeout, asyncio=self._ASYNCIO
        )
        self.node_names = [a.display for a in self.config.nodes]
        self._reporter = NodeReporter(self.node_names, self.config.key_prefix)
        self._specs = SpecCache(self.config)
        # Every operation is a flow of the core (``_core.flows``); the driver carries out
        # what it yields.
        rng = random.Random(secrets.randbits(64))
        self._flows: Flows = Flows(self.config, self.node_names, rng, monotonic, wall_us)
        # Leases are released from any thread (a watchdog's, another worker's), so the
        # book of who holds what is guarded; the lock is only ever held for a dict update.
        self._holds = Holds()
        self._holds_guard = Guard()
        _CLIENTS.add(self)
        self._open(options)

    # One client per process, shared by its threads and tasks: a copy (of a structure
    # holding it, say) is the client itself. A second object shared its connections and
    # its "closed", so closing the copy closed the original. It does not leave its process
    # (its connections, threads and book of holders are this process's): see
    # ``ProcessBound``.
    def _remade_from(self) -> tuple[str, str]:
        return "the same nodes", "the node URLs rather than the client"

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
        if not self._holds:
            return  # no block holds anything: nobody to wait for themselves
        owner = self._owner()
        with self._holds_guard:
            holder = self._holds.conflict(spec.name, owner, monotonic(), blocking=blocking)
        if holder is not None:
            raise self_deadlock(spec.name, self._describe(owner), holder)

    def _refused(
        self, name: str, blocking: bool, timeout: float | None, reason: str
    ) -> LockTimeout:
        """The ``LockTimeout`` of an acquire of ``name`` refused for ``reason``
        (``_core.acquire.refusal``), in the caller's thread (task): a non-blocking one
        inside its caller's own block of the lock says so (``own_block``)."""
        if not blocking and reason == HELD_ELSEWHERE and self._holds:
            owner = self._owner()
            with self._holds_guard:
                own = self._holds.conflict(name, owner, monotonic(), blocking=True)
            if own is not None:
                reason = own_block(self._describe(owner), own)
        return LockTimeout(name, not_acquired(blocking, timeout, reason))

    def _hold(self, lease: Held) -> Hashable:
        """Enter a new lease in the book under its caller; returns that owner."""
        owner = self._owner()
        with self._holds_guard:
            self._holds.add(owner, lease, monotonic())
        return owner

    def _bound(self, name: str) -> Any:
        """The lease of the caller's innermost ``with`` block of ``name`` through this
        client (the book's), or None."""
        owner = self._owner()
        with self._holds_guard:
            return self._holds.held_by(name, owner, monotonic())

    def _unhold(self, owner: Hashable, lease: Held) -> None:
        """Take a released or lost lease out of the book (from whichever thread)."""
        with self._holds_guard:
            self._holds.discard(owner, lease)

    def _forget_after_fork(self) -> None:
        """In a child after fork: it holds nothing (its inherited leases are the parent's),
        and the guard may have been copied locked by a thread that does not exist here."""
        self._holds = Holds()
        self._holds_guard = Guard()

    def _open(self, connection_options: dict[str, Any]) -> None:
        """Set up the driver's connections (lazily connected)."""
        raise NotImplementedError

    def _lock_args(
        self, name: str, ttl: float, fair: bool | None, watchdog: bool, max_hold: float | None
    ) -> tuple[LockSpec, KeepAlive | None]:
        """The checked arguments of ``lock()``: the lock's spec, and its watchdog policy."""
        self._check_open("make a lock object", name)
        spec = self._specs.get(name, ttl, fair)
        return spec, _keep_alive(watchdog, max_hold, spec.ttl)

    def _acquire_args(
        self, name: str, ttl: float, fair: bool | None, watchdog: bool, max_hold: float | None
    ) -> LockSpec:
        """The checked arguments of ``acquire()``, all of them before anything is sent."""
        spec = self._specs.get(name, ttl, fair)
        _keep_alive(watchdog, max_hold, spec.ttl)  # (the lease is kept alive once acquired)
        return spec

    def _handed_out(
        self,
        lease: L | Refused,
        name: str,
        blocking: bool,
        timeout: float | None,
        watchdog: bool,
        max_hold: float | None,
    ) -> L:
        """What ``acquire()`` returns: the lease (kept alive if asked), or it raises."""
        if isinstance(lease, Refused):
            raise self._refused(name, blocking, timeout, lease.reason)
        if watchdog:
            lease.keep_alive(max_hold=max_hold)
        return lease

    def _acquire_flow(
        self, spec: LockSpec, blocking: bool, timeout: float | None
    ) -> Flow[LeaseState | Refused]:
        """The flow of one acquire call, once the caller may make it."""
        self._check_open("acquire", spec.name)
        self._check_reentry(spec, blocking)
        listener = self._notifications()
        return self._flows.acquire(
            spec,
            blocking,
            timeout,
            waiter=os.urandom(16).hex(),  # secrets.token_hex(16), without its two calls
            channel=listener.channel,
            listening=listener.started,
        )

    def _notifications(self) -> Listening:
        """The driver's notification listener."""
        raise NotImplementedError

    def _perform_now(self, op: Op) -> None:
        """Carry out an operation that completes without waiting (``flows.INSTANT``):
        the same in both drivers, and never an await, so a cancelled task writes its
        cleanup before the cancellation leaves it."""
        if isinstance(op, Send):
            self._send_now(op)
        elif isinstance(op, Unlisten):
            listening = self._notifications()
            now = monotonic()
            for node in listening.unregister(op.waiter):
                # Declined if it departed (it does before it stops listening), in the
                # background: declining may wait for the node's answer.
                self._later(
                    0.0, functools.partial(listening.departed.decline, op.waiter, node, now)
                )
        elif isinstance(op, Depart):
            decline = functools.partial(self._declined, op.spec, op.waiter)
            departed = self._notifications().departed
            for node in departed.add(op.waiter, decline, op.until, monotonic(), hold=op.hold):
                # In the background: declining may wait for the node's answer.
                self._later(0.0, functools.partial(decline, node))
        elif isinstance(op, Later):
            self._later(max(op.at - monotonic(), 0.0), functools.partial(self._background, op.flow))
        else:
            raise TypeError(f"not an operation of a driver: {op!r}")

    def _background(self, flow: Flow[object]) -> None:
        """Drive ``flow`` (``Later``) in the background; what it raises is dropped."""
        raise NotImplementedError

    def _send_now(self, send: Send) -> None:
        """Write ``send.command`` to its targets without waiting; never raises."""
        raise NotImplementedError

    def _declined(self, spec: LockSpec, waiter: str, node: int, tries: int = 0) -> None:
        """A notification reached ``waiter`` after it departed: decline it on ``node``
        (``waiting.Departed``), at once, and again later while it does not reach the
        node (``waiting.decline_again``)."""
        send = self._flows.decline(spec, waiter, node)
        if send is None:
            return

        def failed() -> None:
            delay = decline_again(tries + 1)
            if delay is not None:
                self._later(delay, functools.partial(self._declined, spec, waiter, node, tries + 1))

        self._deliver(send, failed)

    def _deliver(self, send: Send, failed: Callable[[], None]) -> None:
        """Write ``send.command`` to its one target now, and call ``failed`` (once) if it
        does not reach the node: not written, or the connection lost before its answer.
        Never raises."""
        raise NotImplementedError

    def _later(self, delay: float, call: Callable[[], object]) -> None:
        """Call ``call`` in ``delay`` seconds, in the background."""
        raise NotImplementedError


_CLIENTS: weakref.WeakSet[ClientBase] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for client in list(_CLIENTS):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)


def _keep_alive(watchdog: bool, max_hold: float | None, ttl: float) -> KeepAlive | None:
    """The watchdog policy ``watchdog`` and ``max_hold`` ask for (None: no watchdog) for
    a lock of ``ttl``, both checked, whichever way the lock is taken. A cap without the
    watchdog is refused: it caps the watchdog's extensions, and a caller who passed one
    and forgot ``watchdog=True`` would find the lease run out at its TTL."""
    watched = check_flag("watchdog", watchdog)
    if not watched and max_hold is None:
        return None  # (the common case: no policy to make)
    keep = KeepAlive(max_hold=max_hold)
    keep.check_ttl(ttl)
    if not watched:
        raise ConfigurationError(
            "max_hold",
            f"caps a watchdog's extensions, and watchdog is False (got max_hold={max_hold!r}): "
            "pass watchdog=True to keep the lease alive up to max_hold, or drop max_hold",
        )
    return keep

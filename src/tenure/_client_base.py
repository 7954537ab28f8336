"""What the blocking and asyncio clients share: their settings and per-client state.

The drivers differ only in how a round reaches the nodes; everything a client *is* (its
validated configuration, the specs of the locks it has used, its random source and the
fencing floor it proposes above) is built here once.
"""

from __future__ import annotations

import functools
import random
import secrets
from collections.abc import Sequence
from typing import Any

from ._clock import monotonic, wall_us
from ._core import commands
from ._core.acquire import Acquisition, Granted
from ._core.commands import Command, acked_by_replicas
from ._core.config import ClientConfig, LockSpec, SpecCache, check_acquire_args
from ._core.policy import RetryPolicy
from ._core.waiting import Departed, Wake, hold_ms, place_ms

__all__ = ["ClientBase"]


class ClientBase:
    """Arguments and state common to ``Client`` and ``AsyncClient``.

    The arguments are documented on ``tenure.Client``; subclasses set up their driver's
    connections in ``_open``.
    """

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
        connection_options: dict[str, Any] | None = None,
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
        )
        self.node_names = [a.display for a in self.config.nodes]
        self._specs = SpecCache(self.config)
        self._rng = random.Random(secrets.randbits(64))
        self._fence_floor = 1  # proposals stay above every fencing token this client saw
        self._place_ms = place_ms(self.config.recheck, self.config.node_timeout)
        self._hold_ms = hold_ms(self.config.node_timeout)
        self._open(dict(connection_options or {}))

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
            # The hand-off's token: one value for every node, above our own and every
            # token this client saw. A node whose counter is not below it only wakes the
            # next waiter, which then acquires with an ordinary round.
            arg = max(wall_us(), fencing + 1, self._fence_floor)
        else:
            arg = self._hold_ms
        return commands.release_waking(spec.keys, token, spec.wait_mode, arg, cleanup=cleanup)

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

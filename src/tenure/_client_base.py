"""What the blocking and asyncio clients share: their settings and per-client state.

The drivers differ only in how a round reaches the nodes; everything a client *is* (its
validated configuration, the specs of the locks it has used, its random source and the
fencing floor it proposes above) is built here once.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from typing import Any

from ._clock import monotonic
from ._core.acquire import Acquisition
from ._core.commands import Command, acked_by_replicas
from ._core.config import ClientConfig, LockSpec, SpecCache, check_acquire_args
from ._core.policy import RetryPolicy

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

"""The asyncio driver's watchdog: one task per watched lease drives the core's watchdog
flow (``Flows.watchdog``); a release cancels it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._core.flows import ExtendLease, Op, Pause
from .._core.watchdog import KeepAlive
from .._driver.clock import monotonic
from .drive import adrive

if TYPE_CHECKING:
    from .client import AsyncLease

__all__ = ["watch"]


async def watch(lease: AsyncLease, policy: KeepAlive) -> None:
    """Extend ``lease`` (or only watch its expiry) until it is released, lost or capped."""

    async def perform(op: Op) -> Any:
        if isinstance(op, Pause):
            await asyncio.sleep(max(op.until - monotonic(), 0.0))
            return False  # asked to stop: cancelled, not told
        if isinstance(op, ExtendLease):
            return await lease.extend()
        raise TypeError(f"not an operation of a watchdog: {op!r}")

    await adrive(lease._client._flows.watchdog(lease, policy), perform)

"""The asyncio driver's watchdog: one task per watched lease (see ``_core.watchdog``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._core.watchdog import Extend, GiveUp, KeepAlive, Lost
from .._driver.clock import monotonic
from .._driver.lease import closed_under
from .._errors import ClientClosed, LeaseLost, NotHeld

if TYPE_CHECKING:
    from .client import AsyncLease

__all__ = ["watch"]


async def watch(lease: AsyncLease, policy: KeepAlive) -> None:
    """Extend ``lease`` (or only watch its expiry) until it is released, lost or capped."""
    wake = policy.next_wake(lease._state)
    while True:
        await asyncio.sleep(max(wake - monotonic(), 0.0))
        if lease.released:
            return
        action = policy.decide(monotonic(), lease._state, lease._first_started)
        if isinstance(action, Lost):
            lease._mark_lost(action.error)
            return
        if isinstance(action, GiveUp):
            await asyncio.sleep(max(action.at - monotonic(), 0.0))
            if not lease.released:
                lease._mark_lost(action.error)
            return
        assert isinstance(action, Extend)
        try:
            await lease.extend()
        except (NotHeld, LeaseLost):
            return  # released meanwhile, or extend() marked it lost
        except ClientClosed:
            lease._mark_lost(closed_under(lease.name))
            return
        except Exception as exc:  # anything unexpected: the lease can't be vouched for
            lease._mark_lost(LeaseLost(lease.name, f"the watchdog failed: {exc!r}"))
            return
        wake = policy.next_wake(lease._state)

"""What watches the lease of an ``async with lock:`` block, against real nodes.

The block watches its lease so that a loss cancels the body. A ``keep_alive()`` in the
body must still keep it alive, and a lease the body took again through the object (the
block's from then on) must be watched as the first was.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import tenure
from tenure.testing import LocalCluster

# 1.5 s: the watchdog wakes every 0.5 s, a second before the lease would end, time to
# wake late on a loaded machine; woken after the end, it reports a paused holder, not
# the hold cap (a 1 s TTL left it 0.67 s).
TTL = 1.5
SLEEP = 5.0  # a body's work: far longer than any lease here lives unextended


def _drop_keys(cluster: LocalCluster, key: str) -> None:
    """The lock vanishes from every node (a stranger's delete)."""
    for node in cluster:
        with node.client() as c:
            c.delete(key)


def test_keep_alive_in_an_async_with_block_extends_its_lease(
    shared5: LocalCluster, key: str
) -> None:
    async def main() -> None:
        async with (
            tenure.AsyncClient(shared5.urls) as client,
            client.lock(key, ttl=TTL) as lease,
        ):
            lease.keep_alive()
            await asyncio.sleep(TTL * 1.6)  # past the TTL: only extensions keep it
            assert lease.valid
            assert lease.lost_error is None

    asyncio.run(main())


def test_keep_alive_in_an_async_with_block_keeps_its_max_hold_and_cancel_on_loss(
    shared5: LocalCluster, key: str
) -> None:
    reached_end = False

    async def main() -> None:
        nonlocal reached_end
        async with tenure.AsyncClient(shared5.urls) as client:
            with pytest.raises(tenure.LeaseExpired, match="held for max_hold="):  # noqa: PT012 - the body is the point
                async with client.lock(key, ttl=TTL) as lease:
                    lease.keep_alive(max_hold=1.5 * TTL)
                    await asyncio.sleep(SLEEP)  # cancelled once the capped lease runs out
                    reached_end = True

    started = time.monotonic()
    asyncio.run(main())
    assert not reached_end
    assert time.monotonic() - started < SLEEP - 1


@pytest.mark.parametrize("watchdog", [False, True], ids=["watched", "kept-alive"])
def test_async_body_is_cancelled_when_the_lease_it_took_again_is_lost(
    shared5: LocalCluster, key: str, watchdog: bool
) -> None:
    reached_end = False

    async def main() -> None:
        nonlocal reached_end
        async with tenure.AsyncClient(shared5.urls) as client:
            lock = client.lock(key, ttl=TTL, watchdog=watchdog)
            again: tenure.AsyncLease | None = None
            with pytest.raises(tenure.LeaseLost):  # noqa: PT012 - the body is the point
                async with lock as first:
                    await lock.release()
                    assert await lock.acquire()
                    again = lock.lease
                    assert again is not None
                    assert again is not first
                    if watchdog:  # its next extension fails
                        _drop_keys(shared5, again.key)
                    await asyncio.sleep(SLEEP)  # cancelled once the lease is found lost
                    reached_end = True
            assert again is not None
            assert again.lost_error is not None
            task = asyncio.current_task()
            assert task is not None
            if hasattr(task, "cancelling"):
                assert task.cancelling() == 0  # our cancellation was taken back
            await asyncio.sleep(0)

    started = time.monotonic()
    asyncio.run(main())
    assert not reached_end
    assert time.monotonic() - started < SLEEP - 1

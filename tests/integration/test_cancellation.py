"""asyncio cancellation never leaves a key behind and never reports a cancelled acquire as won."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

import pytest

import tenure
import tenure._async.channels
from tenure._core.backoff import STALL
from tenure._core.config import LockKeys
from tenure.testing import LocalCluster, LocalNode

from .conftest import EachLoop, holders
from .tcp import unread


def wait_until_gone(cluster: LocalCluster, key: str, within: float = 2.0) -> list[bytes | None]:
    deadline = time.monotonic() + within
    while True:
        values = holders(cluster, key)
        if not any(values) or time.monotonic() > deadline:
            return values


async def until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll ``predicate`` (the event loop running between polls) until it holds."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(0.005)


def test_cancel_mid_release_still_releases(
    each_loop: EachLoop, cluster5: LocalCluster, key: str
) -> None:
    async def main() -> str:
        async with tenure.AsyncClient(cluster5.urls, node_timeout=0.5) as client:
            lease = await client.acquire(key, ttl=5.0)
            for node in cluster5:
                node.pause()
            before = [unread(node) for node in cluster5]
            task = asyncio.create_task(lease.release())
            await until(
                lambda: all(unread(n) > b for n, b in zip(cluster5, before, strict=True)),
                "release written",
            )
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for node in cluster5:
                node.resume()
            assert lease.released
            return lease.key

    lock_key = each_loop.run(main())
    assert wait_until_gone(cluster5, lock_key) == [None] * 5


@pytest.mark.parametrize("stalled", [False, True], ids=["at-once", "after-stall"])
def test_cancel_mid_acquire_leaves_no_key(
    each_loop: EachLoop,
    cluster5: LocalCluster,
    key: str,
    stalled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every node is frozen while the SETs are in flight; the task is cancelled; then they
    wake, and run the SET and the release written behind it on the same connection.

    ``after-stall``: the loop is blocked for longer than a connection may go unanswered
    (``STALL``) before the cancellation comes, as on a starved machine, so the cleanup
    finds every connection stalled. It is written on each behind the grant all the
    same, and the connection stays open until the node, once awake, has run both and
    answered. Before, the connections were closed first and the cleanup never sent:
    every node kept the key for its TTL.

    ``at-once``: no connection may stall, yet a loaded machine may take most of
    ``STALL`` (1 s) between the SETs' writes and the nodes' answers (the polls, the
    resumes, the nodes' own wake-up); the bound is raised to 3 s for it."""
    if not stalled:
        monkeypatch.setattr(tenure._async.channels, "STALL", 3.0)

    async def main() -> tuple[bool, list[int]]:
        async with tenure.AsyncClient(cluster5.urls, node_timeout=0.5) as client:
            lease = await client.acquire(key + "-warm", ttl=5.0)  # connections up
            await lease.release()
            connected = [_clients(node) for node in cluster5]
            for node in cluster5:
                node.pause()
            before = [unread(node) for node in cluster5]
            task = asyncio.create_task(client.acquire(key, ttl=5.0))
            # The SETs are written (each frozen node has them unread); no node can answer.
            await until(
                lambda: all(unread(n) > b for n, b in zip(cluster5, before, strict=True)),
                "SETs written",
            )
            if stalled:
                # The loop blocked: no reply could be read meanwhile.
                time.sleep(STALL + 0.2)  # noqa: ASYNC251
            task.cancel()
            try:
                await task
                won = True
            except asyncio.CancelledError:
                won = False
            for node in cluster5:
                node.resume()
            gone = wait_until_gone(cluster5, f"tenure:{{{key}}}:lock")
            # A connection given up as stalled is closed once its node answered (the
            # client still open: not by ``aclose``); the others stay.
            expected = [c - 1 if stalled else c for c in connected]
            await until(
                lambda: [_clients(n) for n in cluster5] == expected,
                "the stalled connections closed",
                within=5.0,
            )
            return won, [0 if value is None else 1 for value in gone]

    won, kept = each_loop.run(main())
    assert won is False
    assert kept == [0] * 5


def _clients(node: LocalNode) -> int:
    """Connections open on ``node``, besides the one that asks."""
    with node.client() as c:
        return int(c.info("clients")["connected_clients"]) - 1


def test_cancel_during_retry_sleep(each_loop: EachLoop, cluster5: LocalCluster, key: str) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(cluster5.urls) as a, tenure.AsyncClient(cluster5.urls) as b:
            held = await a.acquire(key, ttl=5.0)
            waiter = asyncio.create_task(b.acquire(key, ttl=5.0))
            # b queues on the nodes once it waits for a notification between attempts.
            queue = LockKeys.of(key).queue
            await until(lambda: all(_zcard(n, queue) == 1 for n in cluster5), "b waits")
            waiter.cancel()
            try:
                await waiter
                raise AssertionError("a cancelled acquire reported success")
            except asyncio.CancelledError:
                pass
            # Only the holder's token is anywhere.
            values = holders(cluster5, held.key)
            assert {v for v in values if v} == {held.token.encode()}
            await held.release()

    each_loop.run(main())


def _zcard(node: LocalNode, name: str) -> int:
    with node.client() as c:
        return int(c.zcard(name))


def test_many_tasks_hold_different_locks(
    each_loop: EachLoop, cluster5: LocalCluster, key: str
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(cluster5.urls) as client:

            async def work(i: int) -> str:
                async with client.lock(f"{key}-{i}", ttl=5.0) as lease:
                    await asyncio.sleep(0.01)
                    return lease.token

            tokens = await asyncio.gather(*(work(i) for i in range(50)))
            assert len(set(tokens)) == 50

            # And many tasks contending for one lock take turns.
            inside = 0
            most = 0

            async def contend() -> None:
                nonlocal inside, most
                async with client.lock(key, ttl=5.0):
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.002)
                    inside -= 1

            await asyncio.gather(*(contend() for _ in range(20)))
            assert most == 1

    each_loop.run(main())


def test_a_release_cancelled_behind_the_watchdog_stops_the_watchdog(
    each_loop: EachLoop, cluster5: LocalCluster, key: str
) -> None:
    """A watched lease's release waits for the watchdog's extension in flight; cancelled
    there, it never began, and the watchdog it did not stop kept the lock alive."""
    node = cluster5[0]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with tenure.AsyncClient([node.url], node_timeout=1.0) as client:
            lease = await client.acquire(key, ttl=3.0, watchdog=True)  # extended every 1 s
            node.pause()  # the next extension waits for the node
            await until(lambda: lease._op_lock.locked(), "the watchdog extending")
            release = asyncio.ensure_future(lease.release())
            await asyncio.sleep(0.05)  # waiting for the extension
            release.cancel()
            node.resume()
            started = loop.time()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(release, 10.0)  # hung for ever before
            assert loop.time() - started < 5.0
        # Not released, and no longer extended: the key ends with its TTL.
        assert wait_until_gone(cluster5, LockKeys.of(key).lock, within=10.0) == [None] * 5

    each_loop.run(main())


def test_a_watched_lease_is_released_in_a_later_event_loop(
    each_loop: EachLoop, cluster5: LocalCluster, key: str
) -> None:
    """The end of the first ``asyncio.run`` ended the watchdog's task; the release in the
    next one must not wait for a task of a closed loop (``Event loop is closed``)."""
    client = tenure.AsyncClient([cluster5[0].url])

    async def acquire() -> tenure.AsyncLease:
        lease = await client.acquire(key, ttl=3.0, watchdog=True)
        watcher = lease._watcher
        assert watcher is not None
        await until(lambda: watcher.task is not None, "the watchdog's task begun")
        return lease

    lease = each_loop.run(acquire())

    async def release() -> None:
        await lease.release()
        await client.aclose()

    each_loop.run(release())
    assert holders(cluster5, LockKeys.of(key).lock)[0] is None


def test_waiters_cancelled_while_their_client_subscribes_leave_no_slot(
    each_loop: EachLoop, cluster5: LocalCluster, key: str
) -> None:
    """A waiter's first wait subscribes its client (the Listen that waits for the
    subscriptions); a task cancelled there never handed its slot to its flow, so nothing
    took it out, and the client kept it (with its subscriptions on Cluster nodes) for
    its whole life: 51 to 202 of 300 such tasks here."""
    urls = cluster5.urls[:3]

    async def attempt(client: tenure.AsyncClient, seconds: float) -> None:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(client.acquire(key, ttl=5.0), seconds)

    async def main() -> None:
        async with tenure.AsyncClient(urls) as holder:
            # Held past the whole test, however slow a loaded machine makes it.
            held = await holder.acquire(key, ttl=60.0)
            for _ in range(3):
                async with tenure.AsyncClient(urls) as client:
                    # Connected, and no listener yet: every waiter's first wait subscribes.
                    await (await client.acquire(f"{key}-warm", ttl=1.0)).release()
                    rng = random.Random(7)
                    await asyncio.gather(
                        *(attempt(client, rng.uniform(0.001, 0.05)) for _ in range(100))
                    )
                    await asyncio.sleep(0.05)
                    assert client._listener_._slots == {}
            await held.release()

    each_loop.run(main())

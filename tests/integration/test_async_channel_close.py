"""The asyncio driver's own tasks end cleanly however they are cancelled, in any loop.

Python 3.11's ``asyncio.wait_for`` returns the result of an awaitable that finished in
the same turn of the event loop as the waiting task was cancelled. A channel's
connection task cancelled then (by a reset after a stall, or by ``aclose()``) went on:
it took the channel over and waited on its connection forever, and ``aclose()`` waited
for it. A hang of ``test_overload.py`` under load led here; this test makes the reset
land in exactly that turn, from inside the connection's own ``connect()``.

A connection task cancelled from outside (a shutdown that cancels every task, as the end
of ``asyncio.run`` does) left the channel holding the closed connection: every later
write raised a raw ``AttributeError``. And ``aclose()`` in another event loop than the
one that started the notification listener raised ``Event loop is closed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis.asyncio

import tenure
from tenure._async.channels import Channel
from tenure._async.protocol import write
from tenure._core.config import LockKeys
from tenure.testing import LocalCluster

from .conftest import EachLoop, holders, released_everywhere


class _GivenUpAsItConnects(redis.asyncio.Connection):
    """Connects to the real node, then has the channel give it up before returning."""

    channel: ClassVar[Channel | None] = None

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        await super().connect(*args, **kwargs)  # type: ignore[no-untyped-call]
        assert self.channel is not None
        self.channel._reset(ConnectionError("given up as it came up"), time.monotonic())


def test_a_connection_given_up_as_it_comes_up_ends_and_close_returns(
    shared5: LocalCluster,
) -> None:
    async def main() -> None:
        client = tenure.AsyncClient([shared5.urls[0]], connect_timeout=2.0)
        channels = client._channels
        channels._pools[0].connection_class = _GivenUpAsItConnects
        channel = channels._current()[0]
        _GivenUpAsItConnects.channel = channel
        channel.connect(time.monotonic())
        task = channel._task
        assert task is not None
        # The reset ran inside connect(): the task was cancelled in the turn its
        # connection came up. It must end, not take the channel over.
        done, _ = await asyncio.wait({task}, timeout=5.0)
        assert task in done, "the connection task given up lives on"
        assert channel._conn is None
        assert not channel.ready
        await asyncio.wait_for(client.aclose(), 5.0)

    asyncio.run(main())


def test_a_connection_task_cancelled_from_outside_lets_the_channel_start_over(
    shared5: LocalCluster,
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient([shared5.urls[0]]) as client:
            await (await client.acquire("channel-cancelled", ttl=10)).release()
            channel = client._channels._current()[0]
            task = channel._task
            assert task is not None  # connected, as the round above shows
            task.cancel()  # as asyncio.run's shutdown cancels every task left
            await asyncio.wait({task}, timeout=5.0)
            assert task.done()
            # The channel let go of the closed connection; the next round connects again
            # at once (no back-off: the node did nothing wrong) and is granted.
            assert channel._conn is None
            assert not channel.ready
            lease = await client.acquire("channel-cancelled", ttl=10, blocking=False)
            await lease.release()

    asyncio.run(main())


def test_a_client_used_in_several_event_loops_closes_in_another(shared5: LocalCluster) -> None:
    # Each asyncio.run makes a loop of its own and, at its end, cancels every task left:
    # the client's connection and subscription tasks of that loop among them. aclose()
    # in a later loop raised "Event loop is closed" on the first loop's tasks.
    client = tenure.AsyncClient([shared5.urls[0]])

    async def wait_for_a_release() -> None:
        lease = await client.acquire("several-loops", ttl=10)
        waiter = asyncio.ensure_future(client.acquire("several-loops", ttl=10, timeout=5))
        await asyncio.sleep(0.1)  # it waits: the notification listener runs
        await lease.release()
        await (await waiter).release()

    asyncio.run(wait_for_a_release())
    asyncio.run(wait_for_a_release())  # the new loop gets new connections, and works
    asyncio.run(asyncio.wait_for(client.aclose(), 5.0))
    assert client.closed


def test_notifications_resume_after_the_listener_was_cancelled_from_outside(
    shared5: LocalCluster,
) -> None:
    # With the fallback re-check 10-20 s away, a waiter that gets the lock within 4 s of
    # its release was told by a notification.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with tenure.AsyncClient([shared5.urls[0]], recheck=20.0) as client:

            async def handed_over_after() -> float:
                lease = await client.acquire("listener-cancelled", ttl=10)
                waiter = asyncio.ensure_future(
                    client.acquire("listener-cancelled", ttl=10, timeout=30)
                )
                await asyncio.sleep(0.2)  # it waits, subscribed
                released = loop.time()
                await lease.release()
                got = await waiter
                took = loop.time() - released
                await got.release()
                return took

            assert await handed_over_after() < 4.0
            listener = client._listener
            for task in listener._tasks:
                task.cancel()  # as a shutdown that cancels every task, the loop going on
            await asyncio.sleep(0.05)
            assert await handed_over_after() < 4.0

    asyncio.run(main())


def test_locks_held_when_asyncio_run_fails_are_released(
    shared5: LocalCluster, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The main task fails while other tasks hold locks in ``async with``: asyncio.run
    # cancels every task, the client's connection tasks with them, and in whatever
    # order. Each block's release must reach the nodes (not wait out the TTL there), and
    # no connection task be left pending. (Their confirmations are read for 50 ms, which
    # a loaded machine may exceed: a LeaseLost told then is no failure here.)
    nodes = shared5.urls[:3]
    names = [f"{key}-{i}" for i in range(4)]
    client = tenure.AsyncClient(nodes)

    class Failed(Exception):
        pass

    async def hold(name: str) -> None:
        async with client.lock(name, ttl=30):
            await asyncio.sleep(60)

    async def main() -> None:
        holding = [asyncio.ensure_future(hold(name)) for name in names]
        for name in names:
            await until_held(client, name)
        assert not any(task.done() for task in holding)
        raise Failed

    with caplog.at_level(logging.WARNING):
        for _ in range(8):
            with contextlib.suppress(Failed):
                asyncio.run(main())
            for name in names:
                released_everywhere(shared5, LockKeys.of(name).lock, 3)
    asyncio.run(client.aclose())
    assert not [r.getMessage() for r in caplog.records if "destroyed" in r.getMessage()]


async def until_held(client: tenure.AsyncClient, name: str) -> None:
    deadline = time.monotonic() + 10.0
    while not await client.lock(name, ttl=30).locked():
        assert time.monotonic() < deadline, f"{name} not held within 10 s"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("operation", ["extend", "acquire"])
def test_flows_still_running_at_aclose_open_no_connections(
    cluster5: LocalCluster, key: str, operation: str
) -> None:
    # aclose() while rounds wait on frozen nodes: the failed extension's release, or the
    # attempt's cleanup, ran after it on new connections, which nobody closed (a
    # connection per node and its task left until the loop ended).
    urls = cluster5.urls[:3]

    def connections() -> list[set[str]]:
        seen = []
        for node in list(cluster5)[:3]:
            with node.client() as c:
                me = str(c.client_id())
                seen.append({e["id"] for e in c.client_list()} - {me})
        return seen

    async def main() -> None:
        before = connections()
        client = tenure.AsyncClient(urls)
        lease = await client.acquire(key, ttl=5.0)
        for node in list(cluster5)[:3]:
            node.pause()
        try:
            call = lease.extend() if operation == "extend" else client.acquire(f"{key}-2", ttl=5.0)
            pending = asyncio.ensure_future(call)
            await asyncio.sleep(0.01)  # written, unanswered
            await client.aclose()
        finally:
            for node in list(cluster5)[:3]:
                node.resume()
        with pytest.raises((tenure.LeaseLost, tenure.QuorumUnreachable, tenure.ClientClosed)):
            await pending
        # The nodes, just resumed, see the closes as they run again (on a loaded machine,
        # not within a fixed 0.2 s); connections left open stay while this loop runs.
        deadline = time.monotonic() + 5.0
        while connections() != before:
            assert time.monotonic() < deadline, (connections(), before)
            await asyncio.sleep(0.01)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []

    asyncio.run(main())


def test_a_client_in_use_by_a_loop_of_another_thread_refuses_a_second_loop(
    shared5: LocalCluster, key: str
) -> None:
    """Connections belong to one event loop; a client serves several loops in turn. Two
    at once (a thread running its own ``asyncio.run`` beside another) swapped the
    connections under each other at every call: hundreds of reconnects, events set from
    the wrong thread, and under ``PYTHONASYNCIODEBUG`` raw ``RuntimeError`` ("bound to a
    different event loop") and a thread that never returned. The second loop is refused
    before any I/O; the first goes on undisturbed, and once it ended the client serves
    the next loop."""
    client = tenure.AsyncClient([shared5.urls[0]])

    async def refused() -> list[str]:
        errors = []
        for call in (
            lambda: client.acquire(f"{key}-other", ttl=5, blocking=False),
            lambda: client.lock(key, ttl=10).locked(),
        ):
            with pytest.raises(tenure.EventLoopConflict, match="one event loop at a time") as e:
                await call()
            errors.append(str(e.value))
        return errors

    with _held_on_a_loop_of_another_thread(client, key):
        errors = asyncio.run(refused())
    assert "AsyncClient per event loop" in errors[0]
    assert holders(shared5, LockKeys.of(key).lock)[0] is None

    async def in_turn() -> None:
        await (await client.acquire(key, ttl=5, blocking=False)).release()
        await client.aclose()

    asyncio.run(in_turn())


def test_keep_alive_outside_the_loop_that_uses_the_client_is_refused(
    shared5: LocalCluster, key: str
) -> None:
    """``AsyncLease.keep_alive()`` is a plain method: called where no loop ran (after
    ``asyncio.run``) it raised asyncio's raw ``RuntimeError`` ("no running event loop");
    called on a loop while another thread's loop uses the client, it made the watchdog
    there and took the client's connections from that loop. Both are refused, naming
    the lock, and the lease is left as it was, kept alive once asked on a loop of its
    own."""
    client = tenure.AsyncClient([shared5.urls[0]])
    lease = asyncio.run(client.acquire(key, ttl=5))
    with pytest.raises(tenure.EventLoopConflict, match="no event loop running") as info:
        lease.keep_alive()
    assert repr(key) in str(info.value)

    async def from_another_loop() -> None:
        with pytest.raises(tenure.EventLoopConflict, match="one event loop at a time"):
            lease.keep_alive()

    with _held_on_a_loop_of_another_thread(client, f"{key}-other"):
        asyncio.run(from_another_loop())

    async def kept() -> None:
        lease.check()  # left as it was
        lease.keep_alive()
        await lease.release()
        await client.aclose()

    asyncio.run(kept())


@contextlib.contextmanager
def _held_on_a_loop_of_another_thread(client: tenure.AsyncClient, name: str) -> Iterator[None]:
    """Hold ``name`` on ``client`` from a thread running its own ``asyncio.run`` (the
    client in use by that loop) for the ``with`` block; then let it release, and check
    that the loop went on undisturbed."""
    held, go = threading.Event(), threading.Event()
    outcome: list[object] = []

    async def hold() -> None:
        async with client.lock(name, ttl=10) as lease:
            held.set()
            await asyncio.to_thread(go.wait, 10.0)
            lease.check()
        outcome.append("released")

    def other_thread() -> None:
        try:
            asyncio.run(hold())
        except BaseException as error:  # reported by the test
            outcome.append(error)

    worker = threading.Thread(target=other_thread, daemon=True)
    worker.start()
    try:
        assert held.wait(10.0)
        yield
    finally:
        go.set()
        worker.join(10.0)
    assert not worker.is_alive()
    assert outcome == ["released"]


def test_a_request_written_as_the_connection_closes_fails_on_that_node_only(
    shared5: LocalCluster, each_loop: EachLoop
) -> None:
    """uvloop refuses a write to a connection whose handle it closed (a reset read, an
    abort) in the turn before the protocol hears of the loss, with a ``RuntimeError``;
    asyncio's own transports drop it. The write escaped the round: a watchdog's
    extension marked its lease lost ("the watchdog failed: RuntimeError(...)"), an
    acquire raised it raw. Now the request fails with the loss, as one in flight does."""

    async def main() -> None:
        async with tenure.AsyncClient([shared5.urls[0]]) as client:
            await (await client.acquire("written-as-it-closes", ttl=10)).release()
            channel = client._channels._current()[0]
            writer = None if channel._conn is None else channel._conn._writer
            assert writer is not None
            writer.transport.abort()
            # One turn: the loop closes the connection and tells its protocol, whose
            # future wakes the channel's task only in the turn after: the write below
            # comes in between.
            await asyncio.sleep(0)
            assert channel._conn is not None
            lease = await client.acquire("written-as-it-closes", ttl=10, timeout=5)
            await lease.release()

    each_loop.run(main())


def test_a_write_to_a_connection_closed_in_this_turn_is_dropped(
    shared5: LocalCluster, each_loop: EachLoop
) -> None:
    """The same for the writes off the hot path (the notification connections'
    subscriptions, a stalled connection's last commands): ``protocol.write``."""

    async def main() -> None:
        node = shared5[0]
        assert node.port is not None
        _, writer = await asyncio.open_connection(node.host, node.port)
        writer.transport.abort()
        await asyncio.sleep(0)  # closed, and its protocol told
        write(writer.transport, b"PING\r\n")  # dropped, not raised
        with (
            pytest.raises(RuntimeError) if each_loop.name == "uvloop" else contextlib.nullcontext()
        ):
            writer.transport.write(b"PING\r\n")  # what uvloop does without it

    each_loop.run(main())

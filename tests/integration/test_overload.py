"""A client too busy to read its replies in time is slow, not cut off from its nodes.

An asyncio client's event loop can be blocked by other work (a CPU-bound callback, 256
tasks) past a round's deadline while the nodes' replies wait in its sockets. When the
loop runs again it reads the sockets before it fires the deadline, so those replies
count: every node is up, and none may be reported as failed. The tests block the loop
deterministically, for three node timeouts, right after a round was sent; and in the
turn that runs a round's deadline, just before it, while the replies come in.

When the nodes had not answered yet either (they share the starved cores), the deadline
the loop runs late gives them one node timeout more before they count as silent. And a
loop blocked for longer than a connection may go unanswered (``STALL``) keeps its
connections when their answers wait in the sockets. The blocking client's thread, held
up after its wait for replies ended at the deadline, reads what came meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio

import tenure
import tenure._async.channels
import tenure._core.acquire
import tenure._sync.client
import tenure._sync.links
from tenure._core.backoff import STALL
from tenure._core.quorum import BEHIND
from tenure.testing import LocalCluster, LocalNode
from tenure.verify.proxy import Proxy

from .conftest import Api, EachLoop

# Twice the default (50 ms): the nodes run on the same starved cores as the client, and
# must answer within a few node timeouts of the loop running again (a block of three,
# the late deadline's grace of one, a non-blocking acquire's second attempt): 0.15-0.2 s
# at 50 ms, within a loaded machine's scheduling delays (0.2-0.5 s); 0.3-0.4 s now.
NODE_TIMEOUT = 0.1
BLOCK = 3 * NODE_TIMEOUT


@pytest.fixture(scope="module")
def nodes() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        yield cluster


def _block_the_loop_after_this_send() -> None:
    # call_soon runs after the current task next yields: right after the round's
    # commands are written, before a reply can be read.
    asyncio.get_running_loop().call_soon(time.sleep, BLOCK)


async def _warm_up(client: tenure.AsyncClient, name: str) -> None:
    """Set up every connection, and let every reply come in: the release returns at a
    majority, and the next round's requests should go out at once, not in a turn's
    batch behind a callback that blocks the loop."""
    lease = await client.acquire(name, ttl=5.0, blocking=False)
    await lease.release()
    await asyncio.sleep(0.05)


def _resume_and_hear(nodes: LocalCluster) -> None:
    """Resume the frozen nodes and wait until what waited for them was answered: each
    has, once it answers a PING of its own; and those answers are in the client's
    sockets a moment later."""
    for node in nodes:
        node.resume()
    for node in nodes:
        with node.client() as c:
            c.ping()
    time.sleep(0.02)


@pytest.mark.parametrize("fair", [True, False])
def test_replies_waiting_in_the_sockets_are_not_silence(
    each_loop: EachLoop, nodes: LocalCluster, fair: bool
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=NODE_TIMEOUT) as client:
            for i in range(5):
                name = f"overload-{fair}-{i}"
                _block_the_loop_after_this_send()
                started = time.monotonic()
                # Non-blocking: one attempt, so a reply taken for silence would fail it.
                lease = await client.acquire(name, ttl=5.0, fair=fair, blocking=False)
                assert time.monotonic() - started >= BLOCK  # the loop really was blocked
                _block_the_loop_after_this_send()
                assert await client.lock(name).locked()  # a majority heard saying "held"
                _block_the_loop_after_this_send()
                await lease.release()  # a release heard from too few would raise LeaseLost

    each_loop.run(main())


def test_a_busy_loop_never_reports_healthy_nodes_unreachable(
    each_loop: EachLoop, nodes: LocalCluster
) -> None:
    """256 tasks locking their own names, with the loop blocked now and then: slower,
    never ``QuorumUnreachable``."""

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=NODE_TIMEOUT) as client:

            async def worker(k: int) -> None:
                for i in range(3):
                    lease = await client.acquire(f"busy-{k}-{i}", ttl=5.0)
                    await lease.release()

            async def hog() -> None:
                for _ in range(5):
                    await asyncio.sleep(0.02)
                    time.sleep(BLOCK)  # noqa: ASYNC251 - blocking the loop is the point

            await asyncio.gather(hog(), *(worker(k) for k in range(256)))

    each_loop.run(main())


def test_rounds_written_into_a_turns_batch_time_out_when_their_nodes_are_silent(
    each_loop: EachLoop,
    nodes: LocalCluster,
) -> None:
    """Many tasks' rounds in one turn of the loop go out in the turn's batch, and their
    wait for replies begins once it went out: with two of three nodes frozen, every
    acquire still fails at its deadline (no majority), not waits for ever."""
    timeout = 0.2

    async def main() -> list[BaseException | None]:
        async with tenure.AsyncClient(nodes.urls, node_timeout=timeout) as client:
            await _warm_up(client, "batched-silent-warm")
            for node in list(nodes)[1:]:
                node.pause()
            try:

                async def attempt(k: int) -> BaseException | None:
                    try:
                        await client.acquire(f"batched-silent-{k}", ttl=5.0, blocking=False)
                    except tenure.QuorumUnreachable as exc:
                        return exc
                    return None

                started = time.monotonic()
                outcomes = await asyncio.wait_for(
                    asyncio.gather(*(attempt(k) for k in range(16))), 20 * timeout
                )
                assert time.monotonic() - started >= timeout  # each waited out its deadline
                return outcomes
            finally:
                _resume_and_hear(nodes)

    outcomes = each_loop.run(main())
    assert all(isinstance(o, tenure.QuorumUnreachable) for o in outcomes), outcomes


def test_a_deadline_run_late_gives_the_nodes_one_node_timeout_more(
    each_loop: EachLoop, nodes: LocalCluster
) -> None:
    """The loop was blocked past a round's deadline while every node was frozen, and
    they answer a little after it runs again: the round waits for them (a grace), where
    a deadline taken at its word would call them all silent."""
    timeout = 0.2

    def resume_all() -> None:
        for node in nodes:
            node.resume()

    def starve() -> None:
        time.sleep(3 * timeout)
        # The nodes come back a quarter of a node timeout after the loop does.
        threading.Timer(timeout / 4, resume_all).start()

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=timeout) as client:
            await _warm_up(client, "late-deadline-warm")
            for node in nodes:
                node.pause()
            try:
                asyncio.get_running_loop().call_soon(starve)
                started = time.monotonic()
                lease = await client.acquire("late-deadline", ttl=5.0, blocking=False)
                assert time.monotonic() - started >= 3 * timeout  # it really was starved
            finally:
                resume_all()
            await lease.release()

    each_loop.run(main())


def test_replies_that_came_while_the_loop_ran_other_callbacks_are_not_silence(
    each_loop: EachLoop,
    nodes: LocalCluster,
) -> None:
    """The loop looks at its sockets once per turn, then runs that turn's callbacks,
    the round's deadline among them. Here a callback just before the deadline in the
    same turn holds the loop while the (frozen, then resumed) nodes answer: when the
    deadline runs, the answers wait in the sockets, unread, and they are not silence.
    The deadline did not run late by a node timeout, so that grace does not apply."""
    timeout = 0.2

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=timeout) as client:
            await _warm_up(client, "unread-warm")
            loop = asyncio.get_running_loop()
            sent = loop.time()  # the round's deadline comes a node timeout after this

            def hold_past_the_deadline() -> None:
                # The next turn then finds two timers due: this one, which comes first
                # (it is due earlier), and the round's deadline right behind it.
                loop.call_at(sent + timeout - 0.04, _resume_and_hear, nodes)
                while loop.time() < sent + timeout + 0.02:
                    time.sleep(0.005)

            for node in nodes:
                node.pause()
            try:
                loop.call_at(sent + timeout - 0.05, hold_past_the_deadline)
                lease = await client.acquire("unread", ttl=5.0, blocking=False)
            finally:
                for node in nodes:
                    node.resume()
            assert loop.time() - sent >= timeout  # the deadline really was reached
            await lease.release()

    each_loop.run(main())


def test_a_loop_blocked_past_the_stall_bound_keeps_its_connections(
    each_loop: EachLoop, nodes: LocalCluster
) -> None:
    """A connection with a request unanswered for ``STALL`` seconds is given up as
    stalled, but not while the answer waits in its socket: here the loop is blocked
    that long right after a round was sent, and the next task's round is written
    before the loop reads the replies. Both acquires are granted, none is refused."""

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=NODE_TIMEOUT) as client:
            await _warm_up(client, "stall-warm")
            loop = asyncio.get_running_loop()
            second: asyncio.Future[asyncio.Task[tenure.AsyncLease]] = loop.create_future()

            def block() -> None:
                time.sleep(STALL + 0.2)
                # Its first step runs before the loop reads the sockets again.
                acquire = client.acquire("stall-2", ttl=5.0, blocking=False)
                second.set_result(loop.create_task(acquire))

            loop.call_soon(block)
            first = await client.acquire("stall-1", ttl=5.0, blocking=False)
            other = await (await second)
            await first.release()
            await other.release()

    each_loop.run(main())


def test_a_loop_blocked_before_a_batch_is_written_keeps_its_connections(
    each_loop: EachLoop,
) -> None:
    """The stall bound counts from when a request was written, not queued. Requests
    made while others were in flight wait in the turn's batch, written at the end of the
    turn; here the loop is blocked past ``STALL`` before that, and the next request goes
    out just after the batch (the first task's release), before its replies can come
    (5 ms through a proxy). Their wait was counted from before the block: the client
    gave up its healthy connections, the batch's acquires raised
    ``QuorumUnreachable`` and left their keys for the TTL."""

    async def main(urls: list[str]) -> None:
        async with tenure.AsyncClient(urls, node_timeout=0.5) as client:
            await _warm_up(client, "batch-stall-warm")
            loop = asyncio.get_running_loop()

            async def cycle(name: str) -> None:
                lease = await client.acquire(name, ttl=5.0, blocking=False)
                await lease.release()

            # The first is written at once (nothing in flight); the others join the
            # turn's batch behind it; the block runs before the batch is written.
            tasks = [loop.create_task(cycle(f"batch-stall-{k}")) for k in range(9)]
            loop.call_soon(time.sleep, STALL + 0.2)
            await asyncio.gather(*tasks)

    with LocalCluster(3) as cluster, contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(Proxy(n.host, n.port or 0)) for n in cluster]
        for proxy in proxies:
            proxy.delay(0.005)
        each_loop.run(main([p.url for p in proxies]))
        for node in cluster:
            with node.client() as c:
                assert [k for k in c.keys("*") if b":node:" not in k] == []  # nothing left


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_round_held_up_before_its_requests_went_out_waits_for_them_in_full(
    nodes: LocalCluster, flavour: str
) -> None:
    """A round's wait for replies begins once its requests went out. Here the client is
    held up between a round's start and its writes (another thread holding the
    interpreter, a GC pause, a starved process), longer than the round's whole budget:
    one node timeout for an extension, ten for a release. Its nodes were given no time
    to answer and counted silent: the extension and the release raised ``LeaseLost``
    with every node up."""
    held = {"by": 0.0}

    def held_clock() -> float:
        # The round begins ``by`` seconds before the thread goes on to write it.
        by, held["by"] = held["by"], 0.0
        return time.monotonic() - by

    with Api(flavour) as api, contextlib.ExitStack() as stack:
        # Replies take a millisecond (a LAN's round trip): never there the moment the
        # requests went out.
        proxies = [stack.enter_context(Proxy(n.host, n.port or 0)) for n in nodes]
        for proxy in proxies:
            proxy.delay(0.0005)
        client = api.client([p.url for p in proxies], node_timeout=NODE_TIMEOUT)
        inner = client if flavour == "sync" else client.target
        inner._flows.clock = held_clock
        lease = client.acquire(f"held-before-send-{flavour}", ttl=5.0, blocking=False)
        held["by"] = 3 * NODE_TIMEOUT
        lease.extend()
        held["by"] = 12 * NODE_TIMEOUT
        lease.release()
        assert held["by"] == 0.0  # (both rounds were held up)


def _connections(node: LocalNode) -> int:
    """Connections the node has accepted so far (this one included)."""
    with node.client() as c:
        return int(c.info("stats")["total_connections_received"])


def test_a_frozen_node_is_given_up_after_the_stall_bound(
    each_loop: EachLoop, nodes: LocalCluster
) -> None:
    """The other side of the rule above: a node that really says nothing for
    ``STALL`` seconds has its connection given up, and the client connects anew once
    it is back (its requests would otherwise pile up behind the silence)."""

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=NODE_TIMEOUT) as client:

            async def cycle() -> None:
                lease = await client.acquire("stall-frozen", ttl=5.0, blocking=False)
                await lease.release()

            await cycle()
            frozen = nodes[2]
            before = _connections(frozen)
            frozen.pause()
            try:
                end = time.monotonic() + STALL + 0.3
                while time.monotonic() < end:
                    await cycle()
                    await asyncio.sleep(0.05)
            finally:
                frozen.resume()
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                await cycle()
                await asyncio.sleep(0.05)
            # Ours, and the one that counts them.
            assert _connections(frozen) >= before + 2

    each_loop.run(main())


def test_a_stalled_connection_whose_node_stays_frozen_closes_after_a_while(
    each_loop: EachLoop, nodes: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection given up as stalled stays open for its node to wake and run what it
    was sent (``LINGER``), but not for ever: here the node stays frozen past that, and
    the connection is closed without it."""
    monkeypatch.setattr(tenure._async.channels, "LINGER", 0.3)

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=NODE_TIMEOUT) as client:
            await _warm_up(client, "linger-warm")
            frozen = nodes[2]
            channel = client._channels._current()[2]
            lingering: set[asyncio.Task[None]] = set()
            frozen.pause()
            try:
                end = time.monotonic() + STALL + 3.0  # (until it is given up)
                while time.monotonic() < end and not lingering:
                    lease = await client.acquire("linger", ttl=5.0, blocking=False)
                    await lease.release()
                    lingering = {t for t in channel._retired if not t.done()}
                    await asyncio.sleep(0.05)
                assert lingering, "the stalled connection was not given up"
                await asyncio.wait(lingering, timeout=5.0)
                assert all(t.done() for t in lingering)
            finally:
                frozen.resume()

    each_loop.run(main())


def test_a_thread_that_runs_late_after_its_deadline_reads_what_came_meanwhile(
    nodes: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocking client's thread waits in ``select()`` until the round's deadline,
    but may run again well after it wakes (other threads holding the interpreter, a
    starved process). Replies that came in between are not silence: here the thread is
    held up right after its wait ended empty, while the frozen nodes are resumed and
    answer, and the acquire is granted."""
    timeout = 0.1
    late = {"armed": False, "held": False, "start": 0.0}

    def late_clock() -> float:
        now = time.monotonic()
        if late["armed"] and not late["held"] and now >= late["start"] + timeout:
            # The first look at the clock after select() gave up at the deadline.
            late["held"] = True
            _resume_and_hear(nodes)
            return time.monotonic()  # the thread runs again only now
        return now

    monkeypatch.setattr(tenure._sync.client, "_clock", late_clock)
    with tenure.Client(nodes.urls, node_timeout=timeout) as client:
        client.acquire("late-thread-warm", ttl=5.0, blocking=False).release()
        time.sleep(0.05)  # every reply in
        for node in nodes:
            node.pause()
        try:
            late["start"] = time.monotonic()
            late["armed"] = True
            lease = client.acquire("late-thread", ttl=5.0, blocking=False)
        finally:
            for node in nodes:
                node.resume()
        assert late["held"]  # the thread really was held up past the deadline
        lease.release()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_non_blocking_acquire_tries_once_more_when_its_majority_was_only_silent(
    nodes: LocalCluster, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers on the same starved cores as the client may answer after a round's
    deadline: silent, not gone. A non-blocking acquire whose majority failed only by
    silence tries once more at once, and is granted when the nodes answer that attempt.
    Here two of three nodes are frozen from the acquire's start for 1.5 node timeouts:
    the first attempt times out on them, the second hears them (half a second to spare
    each way, for the timer's thread and the acquire to run late on a loaded machine;
    frozen for less than ``STALL``, so their connections stay). ``STALL`` is raised for
    the test from 1 s, which allowed node timeouts of 0.5 s: a quarter of a second each
    way was too little."""
    stall = 2.5
    monkeypatch.setattr(tenure._async.channels, "STALL", stall)
    monkeypatch.setattr(tenure._sync.links, "STALL", stall)
    timeout = 1.0
    assert 2 * timeout <= stall
    name = f"starved-{kind}"
    starved = [nodes[1], nodes[2]]

    def resume() -> None:
        for node in starved:
            node.resume()

    def starve() -> threading.Timer:
        for node in starved:
            node.pause()
        timer = threading.Timer(1.5 * timeout, resume)
        timer.start()
        return timer

    def check(started: float, lease: tenure.Lease | tenure.AsyncLease) -> None:
        assert time.monotonic() - started >= timeout  # the first attempt timed out
        assert len(lease.nodes) >= 2

    if kind == "sync":
        with tenure.Client(nodes.urls, node_timeout=timeout) as client:
            client.acquire(f"{name}-warm", ttl=5.0, blocking=False).release()
            time.sleep(0.05)  # every reply in
            timer = starve()
            try:
                started = time.monotonic()
                lease = client.acquire(name, ttl=5.0, blocking=False)
            finally:
                timer.join()
            check(started, lease)
            lease.release()
        return

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, node_timeout=timeout) as client:
            await _warm_up(client, f"{name}-warm")
            timer = starve()
            try:
                started = time.monotonic()
                lease = await client.acquire(name, ttl=5.0, blocking=False)
            finally:
                await asyncio.to_thread(timer.join)
            check(started, lease)
            await lease.release()

    asyncio.run(main())


class _LoopBlockedAsItSetsUp(redis.asyncio.Connection):
    """A connection whose set-up finds its event loop blocked by other work for
    ``block`` seconds, after the TCP connect, in the middle of its exchange with the node
    (a PING here, as AUTH or SELECT would be)."""

    block = 0.0

    async def on_connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        await super().on_connect_check_health(*args, **kwargs)
        time.sleep(self.block)  # noqa: ASYNC251  # the whole loop: its timers, other tasks
        await self.send_command("PING")
        assert await self.read_response() in (b"PONG", "PONG")


def test_a_loop_blocked_while_its_connections_come_up_keeps_its_nodes(
    each_loop: EachLoop, nodes: LocalCluster, key: str
) -> None:
    # The set-up was bounded by a timer on the loop's clock, which the blocked loop ran
    # late: a loop blocked for longer than connect_timeout as its first connections came
    # up called every healthy node unreachable (QuorumUnreachable). It is given another
    # connect timeout, as a round's deadline that ran late is.
    connect_timeout = 0.3

    async def main() -> None:
        async with tenure.AsyncClient(nodes.urls, connect_timeout=connect_timeout) as client:
            for pool in client._channels._pools:
                pool.connection_class = _LoopBlockedAsItSetsUp
            _LoopBlockedAsItSetsUp.block = 2.5 * connect_timeout
            lease = await client.acquire(key, ttl=5.0, blocking=False)
            await lease.release()

    each_loop.run(main())


# A round trip through the proxy below of twice this: longer than BEHIND_TIMEOUT.
REPLY_DELAY = 0.05
BEHIND_TIMEOUT = 0.05


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_node_that_answers_only_after_the_node_timeout_for_a_while_is_waited_for(
    nodes: LocalCluster, flavour: str
) -> None:
    """A node whose every reply comes after the node timeout, for a second, and which
    answers in time again after that: on an overloaded machine (its server starved of
    CPU, hundreds of tasks ahead of ours on one connection) that lasts as long as the
    load. It answers each request the client gave up on, so it is up and behind, not
    down: a blocking acquire waits it out and is granted. (Three attempts or half a
    second of silence alone are an outage: ``QuorumUnreachable`` after 0.2-0.5 s.)"""
    with Api(flavour) as api, Proxy(nodes[0].host, nodes[0].port or 0) as proxy:
        client = api.client([proxy.url], node_timeout=BEHIND_TIMEOUT)
        name = f"behind-{flavour}"
        client.acquire(name, ttl=5.0, blocking=False).release()  # connected
        proxy.delay(REPLY_DELAY)
        # Back to a LAN's round trip, not to none: a chunk passed at once would overtake
        # those still delayed.
        timer = threading.Timer(1.0, proxy.delay, (0.0005,))
        timer.start()
        try:
            started = time.monotonic()
            lease = client.acquire(name, ttl=5.0, timeout=10.0)
            waited = time.monotonic() - started
        finally:
            timer.join()
        assert waited >= 0.9  # behind until the proxy passed replies in time again
        lease.release()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_node_timeout_shorter_than_the_round_trip_is_named_once_the_behind_span_ends(
    nodes: LocalCluster, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same node, behind for good: what a node timeout shorter than the nodes'
    round trip looks like from the client. A blocking acquire gives up after
    ``BEHIND_SPAN`` (5 s; 1 s here) with ``QuorumUnreachable``, which says so."""
    monkeypatch.setattr(tenure._core.acquire, "BEHIND_SPAN", 1.0)
    with Api(flavour) as api, Proxy(nodes[0].host, nodes[0].port or 0) as proxy:
        client = api.client([proxy.url], node_timeout=BEHIND_TIMEOUT)
        name = f"behind-for-good-{flavour}"
        client.acquire(name, ttl=5.0, blocking=False).release()
        proxy.delay(REPLY_DELAY)
        started = time.monotonic()
        with pytest.raises(tenure.QuorumUnreachable) as caught:
            client.acquire(name, ttl=5.0, timeout=10.0)
        assert time.monotonic() - started >= 1.0
        assert "only after the node timeout (0.05 s)" in str(caught.value)
        assert "longer node_timeout" in str(caught.value)
        assert list(caught.value.node_errors.values()) == [f"unreachable: {BEHIND}"]

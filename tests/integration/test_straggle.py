"""A waiter on a quorum handed the lock by a minority of nodes re-checks at once.

When the queues' heads differ, a release hands some nodes to one waiter and the rest to
another. The one left with a minority must not sit on its nodes: a few milliseconds
after its first notification (``STRAGGLE``) it re-checks, and releases them with a
hand-off to the next in line. Found by tracing waits of 0.3-1.1 s in the contention
benchmark: the blocking client's reader saw the straggle window end, but then slept in
``select()`` for the rest of its wait, so the waiter woke only at its fallback re-check,
while every waiter with a minority held its nodes: the whole queue stalled.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import tenure
from tenure._core import commands
from tenure._core.config import LockKeys
from tenure.local import LocalCluster, LocalNode

from .conftest import raw

RECHECK = 5.0  # a waiter that misses the straggle window would sleep 2.5-5 s


def _scripts_run(node: LocalNode) -> int:
    with raw(node) as c:
        return int(c.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))


def _queued(node: LocalNode, keys: LockKeys) -> int:
    with raw(node) as c:
        return int(c.zcard(keys.queue))


def _waiter(flavour: str, urls: list[str], key: str, got: list[int]) -> threading.Thread:
    """Acquire in a thread (the asyncio client in its own loop there); record the token."""

    def blocking() -> None:
        with tenure.Client(urls, recheck=RECHECK) as b:
            lease = b.acquire(key, ttl=10.0)
            got.append(lease.fencing_token)
            lease.release()

    async def tasks() -> None:
        async with tenure.AsyncClient(urls, recheck=RECHECK) as b:
            lease = await b.acquire(key, ttl=10.0)
            got.append(lease.fencing_token)
            await lease.release()

    target = blocking if flavour == "sync" else lambda: asyncio.run(tasks())
    thread = threading.Thread(target=target)
    thread.start()
    return thread


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_minority_hand_off_is_followed_by_a_recheck_not_a_fallback_sleep(
    shared5: LocalCluster, key: str, flavour: str
) -> None:
    nodes = list(shared5)[:3]
    urls = [n.url for n in nodes]
    keys = LockKeys.of(key)
    with tenure.Client(urls) as a:
        held = a.acquire(key, ttl=30.0)
        got: list[int] = []
        waiter = _waiter(flavour, urls, key, got)
        try:
            deadline = time.monotonic() + 5.0
            while not all(_queued(n, keys) == 1 for n in nodes):
                assert time.monotonic() < deadline, "the waiter never queued on every node"
                time.sleep(0.005)
            time.sleep(0.05)  # let its last look settle; it now waits
            before = _scripts_run(nodes[1])
            # The holder's release reaches node 0 only: a minority hand-off to the waiter.
            spec = a._specs.get(key, 30.0)
            release = commands.release_waking(spec, held.token, "q", held.fencing_token + 1)
            with raw(nodes[0]) as c:
                conn = c.connection_pool.get_connection()
                try:
                    conn.send_packed_command([release.packed])
                    assert conn.read_response() == 1
                finally:
                    c.connection_pool.release(conn)
            deadline = time.monotonic() + 1.0
            while _scripts_run(nodes[1]) == before:
                assert time.monotonic() < deadline, "no re-check within 1 s of the hand-off"
                time.sleep(0.005)
            assert not got, "a minority hand-off is not the lock"
        finally:
            held.release()
            waiter.join(RECHECK + 5)
        assert got, "the waiter did not acquire once the holder released"
        assert got[0] > held.fencing_token

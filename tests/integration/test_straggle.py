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

import threading

import tenure
from tenure._core import commands
from tenure._core.config import LockKeys
from tenure.testing import LocalCluster, LocalNode

from .conftest import Api, poll_until, scripts_run

RECHECK = 10.0  # a waiter that misses the straggle window would sleep 5-10 s


def _scripts_run(node: LocalNode) -> int:
    return scripts_run(node)


def _queued(node: LocalNode, keys: LockKeys) -> int:
    with node.client() as c:
        return int(c.zcard(keys.queue))


def test_a_minority_hand_off_is_followed_by_a_recheck_not_a_fallback_sleep(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    nodes = list(shared5)[:3]
    urls = [n.url for n in nodes]
    keys = LockKeys.of(key)
    with tenure.Client(urls) as a:
        held = a.acquire(key, ttl=30.0)
        got: list[int] = []
        b = api.client(urls, recheck=RECHECK)

        def wait_for_it() -> None:  # in a thread of its own (the asyncio client: its loop)
            lease = b.acquire(key, ttl=10.0)
            got.append(lease.fencing_token)
            lease.release()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        try:
            # A client queues only once subscribed, in the attempt that follows: queued on
            # every node, it has made its last look there and now waits to be notified.
            poll_until(lambda: all(_queued(n, keys) == 1 for n in nodes), "queued everywhere")
            before = _scripts_run(nodes[1])
            # The holder's release reaches node 0 only: a minority hand-off to the waiter.
            spec = a._specs.get(key, 30.0)
            release = commands.release_waking(spec, held.token, "q", held.fencing_token + 1)
            with nodes[0].client() as c:
                conn = c.connection_pool.get_connection()
                try:
                    conn.send_packed_command([release.packed])
                    assert conn.read_response() == 1
                finally:
                    c.connection_pool.release(conn)
            # A waiter that missed the straggle window re-checks 5 s after it began to
            # wait at the earliest: 2 s leaves its threads (or its loop) time to wake on
            # a loaded machine, and this test's own steps since then 3 s.
            poll_until(lambda: _scripts_run(nodes[1]) > before, "a re-check", within=2.0)
            assert not got, "a minority hand-off is not the lock"
        finally:
            held.release()
            waiter.join(RECHECK + 5)
        assert got, "the waiter did not acquire once the holder released"
        assert got[0] > held.fencing_token

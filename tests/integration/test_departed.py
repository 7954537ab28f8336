"""A hand-off that reaches a waiter after it gave up is declined at once.

A waiter that gives up sends a dequeue to every node; a node that dequeue missed keeps
its place until the place expires and may hand it the lock meanwhile, since the client's
notification connection is still subscribed. The client then sends the dequeue again to
that node, which passes the lock on (``tenure._core.waiting.Departed``), rather than leave
the node held by nobody for a whole TTL.
"""

from __future__ import annotations

import threading
import time

import pytest

from tenure._core.config import LockKeys
from tenure.testing import LocalCluster

from .conftest import Api


@pytest.mark.parametrize("n", [1, 3])
def test_a_hand_off_to_a_waiter_that_gave_up_is_declined(
    api: Api, shared5: LocalCluster, key: str, n: int
) -> None:
    urls = shared5.urls[:n]
    keys = LockKeys.of(key)
    last = shared5[n - 1]
    holder = api.client(urls).acquire(key, ttl=30.0)
    waiter = api.client(urls)
    # Read the waiter's queue entry and place while it waits (they go when it gives up).
    seen: list[tuple[bytes, float, bytes]] = []
    stop = threading.Event()

    def watch() -> None:
        with last.client() as c:
            while not stop.is_set() and not seen:
                for member, score in c.zrange(keys.queue, 0, -1, withscores=True):
                    place = c.get(f"{keys.queue}:{member.decode()}")
                    if place is not None:
                        seen.append((member, score, place))
                time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    # Its TTL (10 s) outlasts the check below: only the decline can free the node.
    assert waiter.lock(key, ttl=10.0).acquire(timeout=0.5) is False
    stop.set()
    watcher.join()
    assert seen, "the waiter was never queued"
    member, score, place = seen[0]
    with last.client() as c:
        assert c.zcard(keys.queue) == 0  # its dequeue reached every node
        # ... but say it had missed this one: the place is back, still live.
        c.zadd(keys.queue, {member: score})
        c.set(f"{keys.queue}:{member.decode()}", place, px=5000)
        holder.release()  # this node hands the lock to the departed waiter
        # (The asyncio client reads its notifications only while its loop runs.)
        api.wait_until(
            lambda: c.get(keys.lock) is None, 2.0, "the node stayed held by a departed waiter"
        )
        assert c.zcard(keys.queue) == 0

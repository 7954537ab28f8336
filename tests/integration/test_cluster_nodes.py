"""A Redis Cluster node listed as a plain node: a configuration failure, never an outage.

A plain node's commands are not routed by slot (``redis+cluster://`` lists a whole
cluster as one node: tests/integration/test_cluster_lock.py), so a cluster node given as
``redis://host:port`` answers tenure's scripts with cluster
redirections and refusals (``CROSSSLOT`` for every acquire, since the node's floor and
warm-up marker hash to slots of their own; ``MOVED`` for a read of a name whose slot
another master serves). Each is diagnosed as the node's configuration, through the
path every misconfigured node takes: no majority left, ``NodeMisconfigured`` at once,
naming the node and the fix; otherwise one warning and the lock goes on without it.
Both APIs, one body; real cluster processes (``tenure.testing.LocalRedisCluster``).

The fenced Redis store (``tenure.fencing.redis_store``) is meant to work on a cluster as
it is: its last test checks that a resource of any name keeps its two keys in one slot
there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

import tenure
from tenure._core.config import LockKeys
from tenure.fencing.redis_store import AsyncFencedStore, FencedStore, fenced_keys
from tenure.testing import LocalCluster, LocalRedisCluster

from .conftest import Api

TTL = 2.0

# What the error and the warning say of such a node: what it is, why tenure cannot lock
# there, and the fix.
SAYS = (
    "is a Redis Cluster node",
    "cluster mode",
    "listed as a plain node, whose commands are not routed by slot",
    "redis+cluster://host:port[,host:port...]",
    "independent masters that are not in cluster mode",
    "docs/cluster-and-sentinel.md",
)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """Three cluster masters (no replicas: nothing here fails over)."""
    with LocalRedisCluster(replicas=0) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def plain2() -> Iterator[LocalCluster]:
    """Two standalone nodes, next to which a test lists one cluster node."""
    with LocalCluster(2) as cluster:
        yield cluster


def _says_all(text: str) -> None:
    for words in SAYS:
        assert words in text, text


def _no_redis_exception(error: BaseException) -> None:
    seen: BaseException | None = error
    while seen is not None:
        assert not isinstance(seen, redis.RedisError), repr(seen)
        seen = seen.__cause__ or seen.__context__


def _name_served_elsewhere(cluster: LocalRedisCluster, urls: list[str], key: str) -> str:
    """A lock name whose slot the first listed master does not serve."""
    for n in range(100):
        name = f"{key}-{n}"
        owner = cluster.slot_owner(cluster.keyslot(LockKeys.of(name).lock))
        if owner.url != urls[0]:
            return name
    raise AssertionError("no name found in another master's slots")


def test_cluster_masters_listed_as_plain_nodes_are_misconfigured(
    api: Api, redis_cluster: LocalRedisCluster, key: str
) -> None:
    urls = [m.url for m in redis_cluster.masters()]
    name = _name_served_elsewhere(redis_cluster, urls, key)
    client = api.client(urls)

    with pytest.raises(tenure.NodeMisconfigured) as info:
        client.acquire(name, ttl=TTL)  # blocking, no timeout: raised at once
    error = info.value
    # Decided once a majority has failed: on a loaded machine the last node's answer can
    # come after that, and the error then names the two heard, the first listed of them.
    assert len(error.node_errors) >= 2
    assert set(error.node_errors) <= set(urls)
    assert error.node == next(url for url in urls if url in error.node_errors)
    assert error.parameter == f"nodes[{urls.index(error.node)}]"
    _says_all(str(error))
    assert "unreachable" not in str(error)
    _no_redis_exception(error)

    # A read of the name touches its lock key alone: a master that does not serve its
    # slot sends the client on (MOVED), which is said the same way. (A new client: the
    # first one leaves these nodes alone for a back-off, citing why they failed.)
    with pytest.raises(tenure.NodeMisconfigured) as info:
        api.client([urls[0]]).lock(name, ttl=TTL).locked()
    assert info.value.node == urls[0]
    assert "MOVED" in str(info.value)
    _says_all(str(info.value))
    _no_redis_exception(info.value)


def test_a_cluster_node_serving_the_names_slot_is_refused_too(
    api: Api, redis_cluster: LocalRedisCluster, key: str
) -> None:
    # Every acquire touches the node's floor and warm-up marker, whose slots are their
    # own: CROSSSLOT even on the master of the name's slot. No name locks there by an
    # accident of slots.
    owner = redis_cluster.slot_owner(redis_cluster.keyslot(LockKeys.of(key).lock))
    client = api.client([owner.url])
    with pytest.raises(tenure.NodeMisconfigured) as info:
        client.acquire(key, ttl=TTL)
    assert "CROSSSLOT" in str(info.value)
    _says_all(str(info.value))
    # What does answer is a read there, and it says what is true: not locked.
    assert api.client([owner.url]).lock(key, ttl=TTL).locked() is False


def test_one_cluster_node_of_three_is_logged_once_and_done_without(
    api: Api,
    redis_cluster: LocalRedisCluster,
    plain2: LocalCluster,
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.client(plain2.urls, allow_even=True).acquire(key, ttl=TTL).release()  # a history
    cluster_node = redis_cluster.masters()[0].url
    urls = [plain2.urls[0], cluster_node, plain2.urls[1]]

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tenure"]

    def cycle() -> None:
        lease = client.acquire(key, ttl=TTL)
        assert set(lease.nodes) == set(plain2.urls)
        lease.release()

    with caplog.at_level(logging.WARNING, logger="tenure"):
        client = api.client(urls)
        # The two plain nodes decide each round; on a loaded machine the cluster node's
        # CROSSSLOT may come after the round, and is told when it is read (by a later
        # round): lock on until it is, then some more, and it is told no second time.
        deadline = time.monotonic() + 10.0
        while not told():
            assert time.monotonic() < deadline, "the cluster node was never told"
            cycle()
        for _ in range(3):
            cycle()
    messages = told()
    assert len(messages) == 1, messages
    assert cluster_node in messages[0]
    _says_all(messages[0])


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("resource", ["}", "}x", "}}", "{}x", "a}b", "orders:42"])
def test_a_fenced_resource_of_any_name_is_written_on_a_cluster(
    redis_cluster: LocalRedisCluster, resource: str, flavour: str
) -> None:
    resource = f"{resource}-{uuid.uuid4().hex[:8]}"
    value_key, token_key = fenced_keys(resource)
    slot = redis_cluster.keyslot(value_key)
    assert redis_cluster.keyslot(token_key) == slot
    owner = redis_cluster.slot_owner(slot)
    if flavour == "sync":
        with owner.client() as c:
            store = FencedStore(c)
            store.write(resource, 3, b"v3")
            with pytest.raises(tenure.StaleToken):
                store.write(resource, 2, b"v2")
            assert store.read(resource) == (b"v3", 3)
        return

    async def go() -> tuple[bytes | None, int | None]:
        async with redis.asyncio.Redis.from_url(owner.url) as c:
            store = AsyncFencedStore(c)
            await store.write(resource, 3, b"v3")
            with pytest.raises(tenure.StaleToken):
                await store.write(resource, 2, b"v2")
            return await store.read(resource)

    assert asyncio.run(go()) == (b"v3", 3)

"""The Sentinel and Cluster harnesses (tenure.testing.topologies) against real servers.

Each test runs on every embedded server (Valkey 9, Redis 6.2, Redis 8) and checks what the
harness claims with a raw redis-py connection: who is master after a failover or a
crash, and the redirections (MOVED, ASK) a slot migration makes a node answer. The last
test checks tenure's lock keys against a real cluster's own slot function.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import redis
from redis.exceptions import AskError, MovedError, TryAgainError

from tenure import ConfigurationError
from tenure._core.config import LockKeys
from tenure.testing import (
    LocalCluster,
    LocalNode,
    LocalNodeError,
    LocalRedisCluster,
    LocalSentinelSet,
)

from .conftest import embedded_servers

SERVERS = embedded_servers()


@pytest.fixture(params=SERVERS)
def binary(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


def _info(node: LocalNode) -> dict[str, object]:
    with node.client() as c:
        info: dict[str, object] = c.info("replication")
        return info


def _sentinel_master(url: str, service: str) -> tuple[str, int]:
    with redis.Redis.from_url(url, socket_timeout=5.0) as c:
        host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)
    return host.decode(), int(port)


# --- Sentinel -----------------------------------------------------------------------------


def test_sentinel_failover_promotes_a_replica_under_a_new_replication_id(binary: str) -> None:
    with LocalSentinelSet(replicas=2, binary=binary) as sentinels:
        ports = ",".join(f"127.0.0.1:{s.port}" for s in sentinels.sentinels)
        assert sentinels.url == f"redis+sentinel://{ports}/tenure"
        old = sentinels.master()
        assert old is sentinels.nodes[0]
        with old.client() as c:
            c.set("before", "1")
            c.execute_command("WAIT", 2, 5000)
        old_replid = _info(old)["master_replid"]

        new = sentinels.failover()

        assert new is not old
        assert new in sentinels.nodes
        assert sentinels.master_address() == ("127.0.0.1", new.port)
        for url in sentinels.sentinel_urls:  # every Sentinel, asked directly
            assert _sentinel_master(url, "tenure") == ("127.0.0.1", new.port)
        info = _info(new)
        assert info["role"] == "master"
        # What a client can tell a failover by: the promoted node starts a new
        # replication history and keeps the old one as its second (PSYNC2).
        assert info["master_replid"] != old_replid
        assert info["master_replid2"] == old_replid
        with new.client() as c:
            assert c.get("before") == b"1"
            assert c.set("after", "1")


def test_sentinel_promotes_a_replica_when_the_master_dies(binary: str) -> None:
    with LocalSentinelSet(binary=binary) as sentinels:
        killed = sentinels.kill_master()
        assert not killed.is_running()

        new = sentinels.wait_for_promotion(killed)

        assert new is sentinels.nodes[1]
        assert sentinels.master() is new
        assert _info(new)["role"] == "master"
        assert sentinels.replicas() == [killed]


def test_failover_asks_a_sentinel_that_answers(binary: str) -> None:
    """It asked the first running Sentinel, paused or not: a raw redis TimeoutError
    after 2 s, and waiting for the paused one to report the new master never ended."""
    with LocalSentinelSet(binary=binary) as sentinels:
        old = sentinels.master()
        sentinels.sentinels[0].pause()

        new = sentinels.failover(timeout=20.0)

        assert new is not old
        assert sentinels.master_address() == ("127.0.0.1", new.port)
        assert _info(new)["role"] == "master"


def test_a_sentinel_cut_off_names_the_old_master_through_a_failover(binary: str) -> None:
    with LocalSentinelSet(binary=binary) as sentinels:
        old = sentinels.master()
        cut = sentinels.sentinels[0]
        with pytest.raises(LocalNodeError, match="is not a Sentinel of this set"):
            sentinels.cut_off(old)
        sentinels.cut_off(cut)
        with redis.Redis.from_url(cut.url, socket_timeout=5.0) as c:
            assert c.ping()  # it still answers its clients

        new = sentinels.failover(timeout=20.0)  # not waiting for the one cut off

        assert new is not old
        assert sentinels.master_address() == ("127.0.0.1", new.port)
        # The others tell each other of a new master every 2 s (hello messages): past
        # that, the one cut off would have heard it.
        time.sleep(3.0)
        assert _sentinel_master(cut.url, "tenure") == ("127.0.0.1", old.port)
        for url in sentinels.sentinel_urls[1:]:
            assert _sentinel_master(url, "tenure") == ("127.0.0.1", new.port)


def test_a_sentinel_that_fails_to_start_stops_the_data_nodes_already_up(binary: str) -> None:
    sentinels = LocalSentinelSet(replicas=1, sentinels=1, binary=binary)
    # A value every server refuses (Redis 8 starts with a directive it does not know).
    sentinels.sentinels[0].extra_config["loglevel"] = "no-such-level"
    with pytest.raises(LocalNodeError, match="no-such-level"), sentinels:
        pytest.fail("the body runs only after a start that succeeded")
    # The master and its replica were up and replicating when the Sentinel failed.
    procs = [node._proc for node in sentinels.nodes]
    assert all(proc is not None for proc in procs), "a data node was never started"
    assert [p.pid for p in procs if p is not None and p.poll() is None] == []
    assert not sentinels.directory.exists()


# --- Cluster ------------------------------------------------------------------------------


def test_cluster_starts_with_every_slot_served(binary: str) -> None:
    with LocalRedisCluster(binary=binary) as cluster:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in cluster)
        assert cluster.url == f"redis+cluster://{hosts}"
        masters = cluster.masters()
        assert sorted(m.name for m in masters) == ["c1", "c2", "c3"]
        assert {r.name for m in masters for r in cluster.replicas_of(m)} == {"c4", "c5", "c6"}
        for node in cluster:
            with node.client() as c:
                assert b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
        # The slots as the harness says and as a raw client is redirected.
        slot = cluster.keyslot("k")
        owner = cluster.slot_owner(slot)
        other = next(m for m in masters if m is not owner)
        with other.client() as c, pytest.raises(MovedError) as moved:
            c.get("k")
        assert (moved.value.slot_id, moved.value.node_addr) == (slot, ("127.0.0.1", owner.port))


def test_cluster_helpers_refuse_what_they_cannot_do_by_name(binary: str, tmp_path: Path) -> None:
    stranger = LocalNode("stranger", tmp_path / "stranger", binary=binary)
    stranger.start()
    try:
        with LocalRedisCluster(binary=binary) as cluster:
            with pytest.raises(LocalNodeError, match="stranger: is not a node of this"):
                cluster.replicas_of(stranger)
            for slot in ("5", 5.0, True):
                with pytest.raises(ConfigurationError, match=r"slot.*keyslot\(\)"):
                    cluster.slot_owner(slot)  # type: ignore[arg-type]
            master = cluster.masters()[0]
            with pytest.raises(LocalNodeError, match=r"refused REPLICAOF.*CLUSTER REPLICATE"):
                master.replicate_from(stranger)
            with pytest.raises(LocalNodeError, match="refused REPLICAOF NO ONE"):
                master.promote()
            assert cluster.replicas_of(master)  # nothing changed
    finally:
        stranger.stop()


def test_cluster_failover_hands_the_slots_to_the_replica(binary: str) -> None:
    with LocalRedisCluster(binary=binary) as cluster:
        slot = cluster.keyslot("k")
        old = cluster.slot_owner(slot)
        with old.client() as c:
            c.set("k", "v")
        (replica,) = cluster.replicas_of(old)

        new = cluster.failover(old)

        assert new is replica
        assert cluster.slot_owner(slot) is new
        assert cluster.replicas_of(new) == [old]
        with new.client() as c:
            assert c.get("k") == b"v"
        with old.client() as c, pytest.raises(MovedError) as moved:
            c.get("k")
        assert moved.value.node_addr == ("127.0.0.1", new.port)


def test_cluster_promotes_the_replica_of_a_dead_master(binary: str) -> None:
    with LocalRedisCluster(binary=binary) as cluster:
        slot = cluster.keyslot("k")
        dead = cluster.slot_owner(slot)
        (replica,) = cluster.replicas_of(dead)

        cluster.kill(dead)
        cluster.wait_converged()

        assert cluster.slot_owner(slot) is replica
        assert dead not in cluster.masters()
        with replica.client() as c:
            assert c.set("k", "v")


def test_a_slot_migration_answers_ask_then_moved(binary: str) -> None:
    with LocalRedisCluster(binary=binary) as cluster:
        slot = cluster.keyslot("k")
        source = cluster.slot_owner(slot)
        target = next(m for m in cluster.masters() if m is not source)
        with source.client() as c:
            c.set("k", "v")

        migration = cluster.migrate_slot(slot, target, finish=False)

        assert cluster.slot_owner(slot) is source  # halfway: still the source's slot
        with source.client() as c, pytest.raises(AskError) as asked:
            c.get("k")  # moved already: the source sends the client to the target
        assert type(asked.value) is AskError
        assert (asked.value.slot_id, asked.value.node_addr) == (slot, ("127.0.0.1", target.port))
        with target.client() as c:
            with pytest.raises(MovedError):
                c.get("k")  # without ASKING the target does not serve the slot yet
            with c.pipeline(transaction=False) as pipe:
                assert pipe.execute_command("ASKING").get("k").execute() == [True, b"v"]

        migration.finish()

        assert cluster.slot_owner(slot) is target
        with source.client() as c, pytest.raises(MovedError) as moved:
            c.get("k")
        assert moved.value.node_addr == ("127.0.0.1", target.port)
        with target.client() as c:
            assert c.get("k") == b"v"


@pytest.fixture(scope="module", params=SERVERS)
def shared_cluster(request: pytest.FixtureRequest) -> Iterator[LocalRedisCluster]:
    """A cluster no test faults, for reading slots."""
    with LocalRedisCluster(binary=request.param) as cluster:
        yield cluster


@pytest.mark.parametrize("name", ["orders:42", "}", "}x", "}}", "{}x", "a}b", "{x}y", "é}"])
def test_a_locks_keys_share_one_slot_on_a_real_cluster(
    shared_cluster: LocalRedisCluster, name: str
) -> None:
    keys = LockKeys.of(name)
    every = [keys.lock, keys.queue, f"{keys.queue}:0f3a9c", f"{keys.queue}:next"]
    slots = {shared_cluster.keyslot(key) for key in every}
    assert len(slots) == 1, dict(zip(every, map(shared_cluster.keyslot, every), strict=True))
    # One script over all of them is served (no CROSSSLOT) by the slot's owner.
    owner = shared_cluster.slot_owner(slots.pop())
    with owner.client() as c:
        assert c.eval("return redis.call('EXISTS', unpack(KEYS))", len(every), *every) == 0


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: LocalSentinelSet(replicas=0), "replicas"),
        (lambda: LocalSentinelSet(sentinels=3, quorum=4), "quorum"),
        (lambda: LocalSentinelSet(service="my master"), "service"),
        (lambda: LocalSentinelSet(down_after=0), "down_after"),
        (lambda: LocalRedisCluster(masters=2), "masters"),
        (lambda: LocalRedisCluster(node_timeout=0), "node_timeout"),
        # Each was a raw TypeError from a comparison or from range().
        (lambda: LocalSentinelSet(replicas="2"), "replicas"),  # type: ignore[arg-type]
        (lambda: LocalSentinelSet(replicas=1.5), "replicas"),  # type: ignore[arg-type]
        (lambda: LocalSentinelSet(sentinels=1, quorum=True), "quorum"),
        (lambda: LocalSentinelSet(down_after="1"), "down_after"),  # type: ignore[arg-type]
        (lambda: LocalRedisCluster(masters=3.5), "masters"),  # type: ignore[arg-type]
        (lambda: LocalRedisCluster(node_timeout="1"), "node_timeout"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_are_refused_before_any_process_starts(
    make: Callable[[], object], parameter: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert info.value.parameter == parameter


def test_a_script_over_a_migrating_slot_fails_closed(binary: str) -> None:
    # What docs/cluster-and-sentinel.md relies on: while a slot migrates, a script over
    # keys some of which are absent (a free lock, its node's floor present) is sent on
    # with ASK by the source and refused with TRYAGAIN by the target; it never runs on
    # a part of the keys.
    with LocalRedisCluster(binary=binary) as cluster:
        floor, lock = "tenure:{x}:floor", "tenure:{x}:lock"
        slot = cluster.keyslot(floor)
        source = cluster.slot_owner(slot)
        target = next(m for m in cluster.masters() if m is not source)
        with source.client() as c:
            c.set(floor, 5)
        script = "return redis.call('EXISTS', KEYS[1], KEYS[2])"

        migration = cluster.migrate_slot(slot, target, finish=False)

        with source.client() as c, pytest.raises(AskError) as asked:
            c.eval(script, 2, floor, lock)
        assert type(asked.value) is AskError
        with target.client() as c, c.pipeline(transaction=False) as pipe:
            pipe.execute_command("ASKING").eval(script, 2, floor, lock)
            asking, reply = pipe.execute(raise_on_error=False)
        assert asking is True
        assert isinstance(reply, TryAgainError)
        migration.finish()
        with target.client() as c:
            assert c.eval(script, 2, floor, lock) == 1


def test_asking_a_killed_cluster_node_is_a_local_node_error_naming_it(binary: str) -> None:
    """Each was a raw redis.ConnectionError (connection refused)."""
    with LocalRedisCluster(replicas=0, binary=binary) as cluster:
        node = cluster[2]
        cluster.kill(node)
        calls: dict[str, Callable[[], object]] = {
            "view": lambda: cluster.view(via=node),
            "node_id": lambda: cluster.node_id(node),
        }
        for name, call in calls.items():
            with pytest.raises(LocalNodeError, match=r"^node c3: .*not running") as info:
                call()
            assert info.value.node == "c3", name
            assert isinstance(info.value.__cause__, redis.ConnectionError), name
        assert len(cluster.view()) == 3  # asked of a running node


@pytest.mark.parametrize(
    "make",
    [lambda: LocalCluster(2), lambda: LocalSentinelSet(), lambda: LocalRedisCluster()],
    ids=["LocalCluster", "LocalSentinelSet", "LocalRedisCluster"],
)
def test_a_closed_deployment_refuses_to_start_again_and_says_why(
    make: Callable[[], LocalCluster | LocalSentinelSet | LocalRedisCluster],
) -> None:
    """It was a raw FileNotFoundError for redis.conf in the removed temporary directory."""
    deployment = make()
    with deployment:
        pass
    for again in (deployment.start, deployment.__enter__):
        with pytest.raises(LocalNodeError, match="make a new") as info:
            again()
        assert "base_dir" in str(info.value)
    # Each of its processes says the same (it was a raw FileNotFoundError for redis.conf).
    group = type(deployment).__name__
    for node in deployment._processes():
        for start in (node.start, node.restart, partial(node.restart, keep_data=False)):
            with pytest.raises(
                LocalNodeError, match=rf"^node {node.name}: its {group} was"
            ) as refused:
                start()
            assert f"make a new {group} (or give base_dir" in str(refused.value)
    assert not any(node.is_running() for node in deployment._processes())
    assert not deployment.directory.exists()


def test_a_closed_cluster_with_a_base_dir_starts_again(tmp_path: Path) -> None:
    cluster = LocalCluster(1, base_dir=tmp_path)
    with cluster:
        pass
    with cluster, cluster[0].client() as c:
        assert c.ping() is True

"""``tenure status`` on a ``redis+cluster://`` node whose lock slot is moving or whose
cluster is down, on real local clusters.

The members answer such a read with a cluster redirection (``ASK``, ``MOVED``) or a
transient state (``TRYAGAIN``, ``CLUSTERDOWN``): status follows the first as the lock
clients do and reports the second as what it is, never as a cluster member listed as a
plain node. The slot-moving tests share one cluster without replicas (each finishes its
migration before it ends); the cluster-down test kills a master of a cluster of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import time
from collections.abc import Iterator

import pytest

import tenure
from tenure._core.config import LockKeys, parse_node_url
from tenure._core.slots import key_slot
from tenure.cli import main
from tenure.cli._topology import cluster_map
from tenure.cli.node_rules import EXIT_UNAVAILABLE
from tenure.testing import LocalNode, LocalRedisCluster

pytestmark = pytest.mark.xdist_group("cli_status_cluster")

# The module, not the ``status`` function ``tenure.cli`` may bind under that name.
status_module = importlib.import_module("tenure.cli.status")

MISREAD = "listed as a plain node"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    with LocalRedisCluster(replicas=0) as c:
        yield c


def _status(name: str, url: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["status", name, "--redis", url])
    return code, out.getvalue() + err.getvalue()


def _where(node: LocalNode) -> str:
    return f"{node.host}:{node.port}"


def _slot(name: str) -> int:
    return key_slot(LockKeys.of(name, per_slot=True).lock)


def _other_master(cluster: LocalRedisCluster, slot: int) -> tuple[LocalNode, LocalNode]:
    source = cluster.slot_owner(slot)
    return source, next(m for m in cluster.masters() if m is not source)


def test_a_slot_migrating_with_the_keys_moved_is_the_migration(
    cluster: LocalRedisCluster, key: str
) -> None:
    """Every key moved: the owner answers ASK, the importing master (after ASKING)
    TRYAGAIN, since the lock's warm-up marker is on neither."""
    slot = _slot(key)
    source, target = _other_master(cluster, slot)
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=60.0, blocking=False)
        migration = cluster.migrate_slot(slot, target, finish=False)
        try:
            code, out = _status(key, cluster.url)
        finally:
            migration.finish()
        lease.release()
    assert code == EXIT_UNAVAILABLE, out
    assert f"(slot {slot}: master {_where(source)}, migrating to {_where(target)})" in out
    assert f"unreachable: slot {slot} is being migrated between two masters" in out
    assert "TRYAGAIN" in out
    assert MISREAD not in out


def test_a_slot_migrating_with_the_keys_split_is_the_migration(
    cluster: LocalRedisCluster, key: str
) -> None:
    """Only the lock key moved: the owner answers TRYAGAIN (Redis 7, Valkey), or ASK as
    the missing key is queued and then the importing master TRYAGAIN (Redis 6.2)."""
    slot = _slot(key)
    keys = LockKeys.of(key, per_slot=True)
    source, target = _other_master(cluster, slot)
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=60.0, blocking=False)
        with target.client() as t, source.client() as s:
            t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
            s.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", keys.lock)
        try:
            code, out = _status(key, cluster.url)
        finally:
            cluster.migrate_slot(slot, target)  # the rest of the keys, and the slot
        lease.release()
    assert code == EXIT_UNAVAILABLE, out
    assert f"(slot {slot}: master {_where(source)}" in out
    assert f"unreachable: slot {slot} is being migrated between two masters" in out
    assert "TRYAGAIN" in out
    assert MISREAD not in out


def test_an_ask_is_followed_to_the_importing_master(cluster: LocalRedisCluster, key: str) -> None:
    """With every key of the lock on the importing master, it serves the read after
    ASKING: the line is the lock as held there."""
    slot = _slot(key)
    keys = LockKeys.of(key, per_slot=True)
    source, target = _other_master(cluster, slot)
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=60.0, blocking=False)
        # A warm-up marker, so that no key the read names is missing there (a multi-key
        # read of an importing slot missing one is TRYAGAIN); it holds no grant back.
        with source.client() as s:
            s.set(keys.warm, b"1", px=60_000)
        migration = cluster.migrate_slot(slot, target, finish=False)
        try:
            code, out = _status(key, cluster.url)
        finally:
            migration.finish()
            with target.client() as t:
                t.delete(keys.warm)
        lease.release()
    assert code == 0, out
    line = out.splitlines()[0]
    where = f"(slot {slot}: master {_where(source)}, migrating to {_where(target)})  held "
    assert where in line, out
    assert f"token={lease.token[:8]}" in line.split(), out
    assert "warm=-" not in line, out  # the marker, read there


def test_a_moved_is_followed_to_the_new_owner(
    cluster: LocalRedisCluster, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot map read before the slot moved: the old owner answers MOVED, and the line
    is the new owner's."""
    slot = _slot(key)
    source, target = _other_master(cluster, slot)
    stale = cluster_map(parse_node_url(cluster.url, "url"), 2.0)
    with tenure.Client([cluster.url]) as client:
        lease = client.acquire(key, ttl=60.0, blocking=False)
        cluster.migrate_slot(slot, target)
        monkeypatch.setattr(status_module, "cluster_map", lambda *_: stale)
        code, out = _status(key, cluster.url)
        lease.release()
    assert stale.owner(slot) == (source.host, source.port)
    assert code == 0, out
    assert f"(slot {slot}: master {_where(target)})  held " in out
    assert f"token={lease.token[:8]}" in out.split()


def test_a_cluster_down_is_said_so(key: str) -> None:
    """A master lost without a replica to take over: the others answer CLUSTERDOWN."""
    with LocalRedisCluster(replicas=0) as down:
        slot = _slot(key)
        owner, other = _other_master(down, slot)
        down.kill(other)
        deadline = time.monotonic() + 30.0
        with owner.client() as c:
            while b"cluster_state:fail" not in c.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the cluster never went down"
                time.sleep(0.1)
        code, out = _status(key, down.url)
    assert code == EXIT_UNAVAILABLE, out
    assert f"(slot {slot}: master {_where(owner)})" in out
    assert f"unreachable: the cluster cannot serve slot {slot} now" in out
    assert "CLUSTERDOWN" in out
    assert MISREAD not in out

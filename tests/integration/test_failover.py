"""A failover or a restart is a data loss, and the node says so itself (docs/fencing.md).

Each lock node keeps, next to its floor, the replication ID its floor was written under;
the acquire script compares it with the server's own. A replica promoted in a failover
(which may lack its master's last grants) and a server restarted with its data (which
starts a new history all the same) answer "history changed" and are seeded with a
warm-up of ``max_ttl``, whatever a client knew before. Run on Valkey 9 and on Redis 6.2
(``TENURE_SERVER=redis``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tenure
from tenure._core.acquire import WARMING
from tenure._core.commands import HISTORY_CHANGED, NO_HISTORY
from tenure._core.config import LockKeys
from tenure._lua import script
from tenure.testing import LocalCluster, LocalNode, LocalSentinelSet, Persistence
from tenure.testing.fake import FakeNode, acquire_listed, acquire_lua, extend_lua, seed_lua
from tenure.verify.proxy import Proxy

from .conftest import Api, scripts_run

TTL = 1.0
MAX_TTL = 1.5  # the warm-up: short, so that the tests see it end
RETENTION_MS = 60_000


def _replid(node: LocalNode) -> str:
    with node.client() as c:
        return str(c.info("replication")["master_replid"])


def _node_keys(node: LocalNode) -> tuple[int | None, bytes | None, int]:
    """The node's floor, stored replication ID, and warm-up PTTL."""
    keys = LockKeys.of("x")
    with node.client() as c:
        floor = c.get(keys.floor)
        return (None if floor is None else int(floor)), c.get(keys.replid), c.pttl(keys.warm)


def _warm_up_ends(api: Api, node: LocalNode) -> None:
    api.wait_until(lambda: _node_keys(node)[2] < 0, within=10.0, what="the warm-up ends")


def test_a_promoted_replica_that_missed_a_grant_sits_out_the_warm_up(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    """The replication link is cut, A is granted the lock on the master, the master is
    lost and its replica promoted: the replica never saw A's lock. A client that lists
    the promoted node must not be granted the lock while A's lease may be valid."""
    master, replica, feed = replicated
    # A's lease must outlive the kill, the promotion and the refusal below (a dozen
    # round trips and a process reaped: over 1 s beside a CPU hog), and the warm-up
    # must outlast the lease: 2 s and 2.5 s here, not TTL and MAX_TTL.
    ttl, max_ttl = 2 * TTL, 2.5 * TTL
    with master.client() as m:  # the node set is in use: its floor reaches the replica
        holder = api.client([master.url], max_ttl=max_ttl)
        holder.acquire(f"{key}-before", ttl=ttl).release()
        assert m.execute_command("WAIT", 1, 10_000) == 1
    feed.blackhole()
    lease = holder.acquire(key, ttl=ttl)
    master.kill()
    replica.promote()
    floor, _, _ = _node_keys(replica)
    assert floor is not None
    assert floor < lease.fencing_token  # an old floor, not none: the loss is partial

    other = api.client([replica.url], max_ttl=max_ttl)
    assert other.lock(key, ttl=ttl).acquire(blocking=False) is False
    _, stored, warm = _node_keys(replica)
    assert warm > 0  # seeded with the warm-up, still on after the refusal
    assert stored == _replid(replica).encode()  # the seed recorded the new history
    assert lease.valid  # A's lease: nobody else holds the lock meanwhile
    _warm_up_ends(api, replica)
    assert not lease.valid  # max_ttl > ttl: every lease of the old master has ended
    second = other.acquire(key, ttl=ttl)
    assert second.fencing_token > lease.fencing_token  # by the clocks: one node
    second.release()


def test_a_sentinel_failover_is_a_changed_history(api: Api, tmp_path: Path, key: str) -> None:
    """``SENTINEL FAILOVER`` of a master in use, its replica in sync: the promoted node
    lost nothing this time, but it cannot know that, and a client that first connects to
    it after the failover learns it from the node: it warms up before granting anyone."""
    with LocalSentinelSet(replicas=1, base_dir=tmp_path) as sentinels:
        old = sentinels.master()
        holder = api.client([old.url], max_ttl=MAX_TTL)
        holder.acquire(key, ttl=TTL).release()
        new = sentinels.failover()
        assert new is not old
        floor, stored, _ = _node_keys(new)
        assert floor is not None  # replicated, with its history
        assert stored is not None
        other = api.client([new.url], max_ttl=MAX_TTL)
        assert other.lock(key, ttl=TTL).acquire(blocking=False) is False
        assert _node_keys(new)[2] > 0
        _warm_up_ends(api, new)
        lease = other.acquire(key, ttl=TTL)
        assert lease.fencing_token > floor
        lease.release()


def test_a_restart_with_the_data_kept_warms_up(api: Api, tmp_path: Path, key: str) -> None:
    """``appendfsync always`` keeps every key across a crash, but the server starts a new
    replication history: the node warms up after every restart (what it cannot tell from
    a restart that came back with an older snapshot)."""
    with LocalCluster(1, persistence=Persistence.AOF_ALWAYS, base_dir=tmp_path) as cluster:
        node = cluster[0]
        client = api.client(cluster.urls, max_ttl=MAX_TTL)
        client.acquire(f"{key}-before", ttl=TTL).release()
        before = _node_keys(node)[0]
        node.restart(keep_data=True)
        assert _node_keys(node)[0] == before  # the floor survived
        # A client that connects after the restart (the first one's connection is gone).
        other = api.client(cluster.urls, max_ttl=MAX_TTL)
        assert other.lock(key, ttl=TTL).acquire(blocking=False) is False
        assert _node_keys(node)[2] > 0
        # Nobody holds the lock: the refusal says the node is warming up.
        with pytest.raises(tenure.LockTimeout, match="1 of 1 nodes warming up") as info:
            other.acquire(key, ttl=TTL, blocking=False)
        assert "held by another client" not in str(info.value)
        _warm_up_ends(api, node)
        lease = other.acquire(key, ttl=TTL)
        assert before is not None
        assert lease.fencing_token > before
        lease.release()


def test_a_normal_run_costs_no_warm_up_and_no_extra_round_trip(api: Api, key: str) -> None:
    """Without a failover the check is invisible: a new node set is seeded at once, with
    no warm-up, the ID is recorded, and every later acquire and release is one script per
    node each."""
    with LocalCluster(3) as cluster:
        client = api.client(cluster.urls, max_ttl=MAX_TTL)
        client.acquire(key, ttl=TTL).release()  # a new node set: seeded at once, as ever
        for node in cluster:
            floor, stored, warm = _node_keys(node)
            assert floor is not None
            assert stored == _replid(node).encode()
            assert warm == -2
        before = [scripts_run(n) for n in cluster]
        for _ in range(3):
            client.acquire(key, ttl=TTL).release()
        assert [scripts_run(n) - b for n, b in zip(cluster, before, strict=True)] == [6] * 3


# --- the fake node (tenure.testing.fake) against the real scripts ------------------------


def test_the_fake_node_changes_history_like_redis(
    replicated: tuple[LocalNode, LocalNode, Proxy], tmp_path: Path
) -> None:
    """The model's mirror of the history check against the real scripts, step by step:
    a failover (with a grant the replica missed) and a restart with the data kept give
    the same replies and keys on the fake and on the server."""
    master, replica, feed = replicated
    keys = LockKeys.of("contract")
    acquire, seed, extend = (script(n).wire.decode() for n in ("acquire", "seed", "extend"))
    fake = FakeNode()
    now = 0

    def both_acquire(node: LocalNode, token: str, proposal: int, mark: int) -> list[int | str]:
        with node.client() as c:
            answer = c.eval(
                acquire, 3, keys.lock, keys.floor, keys.warm,
                token, 5000, proposal, mark, 5000, RETENTION_MS,
            )  # fmt: skip
        mirrored = acquire_lua(fake, keys, token, 5000, proposal, now, mark, 5000, RETENTION_MS)
        # A grant of the proposal is answered with the proposal alone by both.
        assert isinstance(answer, int) == isinstance(mirrored, int), (answer, mirrored)
        real, mirror = acquire_listed(answer), acquire_listed(mirrored)
        assert real[:3:2] == mirror[:3:2], (real, mirror)  # status and floor
        if real[0] == HISTORY_CHANGED:
            # With the node's replication ID (the fake's IDs are its own).
            assert real[3] == _replid(node).encode()
            assert mirror[3] == fake.replid
            assert real[:3] == mirror[:3]
            return mirror[:3]
        if real[0] != WARMING:  # a PTTL: a few ms apart
            assert real == mirror
        return mirror

    def both_seed(node: LocalNode, floor: int, warm_ms: int, mark: int) -> int:
        with node.client() as c:
            real = c.eval(seed, 2, keys.floor, keys.warm, floor, warm_ms, RETENTION_MS, mark)
        mirror = seed_lua(fake, keys, floor, warm_ms, now, frozenset({mark}), RETENTION_MS)
        assert real == mirror
        return mirror

    def same_keys(node: LocalNode) -> None:
        with node.client() as c:
            real_id = str(c.info("replication")["master_replid"])
            for k in (keys.floor, keys.lock):
                assert (c.get(k) or b"").decode() == (fake.get(k, now) or "")
            stored = (c.get(keys.replid) or b"").decode()
            warm = (c.get(keys.warm) or b"").decode()
        mirror_stored = fake.get(keys.replid, now) or ""
        # The IDs differ (the fake's are its own); what they are relative to the node's
        # own ID does not.
        assert (stored == real_id) == (mirror_stored == fake.replid)
        assert bool(stored) == bool(mirror_stored)
        assert warm.replace(real_id, "ID") == (fake.get(keys.warm, now) or "").replace(
            fake.replid, "ID"
        )

    assert both_acquire(master, "a", 100, 7)[0] == NO_HISTORY
    same_keys(master)
    assert both_seed(master, 10, 0, 7) == 1
    assert both_acquire(master, "a", 20, 7) == [1, 20, 20]
    same_keys(master)
    with master.client() as m:
        assert m.execute_command("WAIT", 1, 10_000) == 1
    copy = fake.replicate()
    feed.blackhole()
    with master.client() as m:
        m.delete(keys.lock)
    fake.delete(keys.lock, now)
    assert both_acquire(master, "b", 30, 7) == [1, 30, 30]  # lost with the failover
    master.kill()
    replica.promote()
    fake.promote(copy)
    same_keys(replica)
    assert both_acquire(replica, "c", 40, 9) == [HISTORY_CHANGED, 9, 20]
    assert both_acquire(replica, "c", 40, 11) == [HISTORY_CHANGED, 9, 20]  # mark kept
    same_keys(replica)
    with replica.client() as c:  # the holder of "a" still extends its own key
        assert c.eval(extend, 2, keys.lock, keys.floor, "a", 5000, RETENTION_MS) == 1
    assert extend_lua(fake, keys.lock, "a", 5000, now, keys.floor, RETENTION_MS) == 1
    assert both_seed(replica, 30, 0, 9) == -1  # never as a new node set
    assert both_seed(replica, 30, 1500, 11) == -1  # not the node's mark
    assert both_seed(replica, 30, 1500, 9) == 1
    same_keys(replica)
    assert both_acquire(replica, "c", 40, 9)[:3:2] == [WARMING, 30]

    # A restart with the data kept (an AOF): the same rule.
    node = LocalNode("aof", tmp_path / "aof", persistence=Persistence.AOF_ALWAYS)
    node.start()
    try:
        fake = FakeNode()
        assert both_acquire(node, "a", 100, 3)[0] == NO_HISTORY
        assert both_seed(node, 10, 0, 3) == 1
        assert both_acquire(node, "a", 20, 3) == [1, 20, 20]
        node.restart(keep_data=True)
        fake.restart()
        same_keys(node)
        assert both_acquire(node, "b", 30, 5) == [HISTORY_CHANGED, 5, 20]
        assert both_seed(node, 0, 1500, 5) == 1
        same_keys(node)
        # Once more, by a client that heard the new history max_ttl ago: the warm-up
        # served (1 ms), no marker is kept and the node votes at once.
        node.restart(keep_data=True)
        fake.restart()
        assert both_acquire(node, "b", 30, 6) == [HISTORY_CHANGED, 6, 20]
        assert both_seed(node, 0, 1, 6) == 1
        same_keys(node)
        with node.client() as c:  # "a" released
            c.delete(keys.lock)
        fake.delete(keys.lock, now)
        assert both_acquire(node, "b", 30, 6) == [1, 30, 30]
        same_keys(node)
    finally:
        node.kill()

"""``wait_replicas``: on a replicated master, a grant counts only once a replica has it.

The replica follows its master through a proxy of ours, so a test can cut the
replication link without touching either server.
"""

from __future__ import annotations

import time

import pytest

import tenure
from tenure.testing import LocalNode
from tenure.verify.proxy import Proxy

from .conftest import Api

TTL = 2.0


def test_grant_counts_once_the_replica_has_it(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    master, replica, _ = replicated
    client = api.client([master.url], wait_replicas=1)
    with client.lock(key, ttl=TTL) as lease:
        assert lease.valid
        # WAIT returned 1 before the grant counted: the replica already has the lock.
        with replica.client() as r:
            assert r.get(lease.key) == lease.token.encode()
        # Extended well past the grant's TTL, so that the replica's PTTL tells the
        # extension (4 TTLs) from the grant (1 TTL at most), with seconds to spare on a
        # loaded machine. (Extended by one TTL, the bound TTL - 0.5 s could not tell them
        # apart, and left a loaded machine half a second.)
        lease.extend(4 * TTL)
        with replica.client() as r:
            assert r.pttl(lease.key) > 3 * TTL * 1000


def test_unreplicated_grant_fails_closed_and_leaves_no_key(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    master, _, feed = replicated
    client = api.client([master.url], wait_replicas=1, node_timeout=0.1)
    feed.blackhole()
    assert client.lock(key, ttl=TTL).acquire(blocking=False) is False
    # The grant the master made was released again: nothing is left to fail over. (On a
    # loaded machine the master may miss the round's deadline, and then its release is
    # sent but not awaited: give it a moment, as test_faults does.)
    deadline = time.monotonic() + 1.0
    with master.client() as m:
        while m.keys("tenure:{" + key + "}:lock"):
            assert time.monotonic() < deadline, m.keys("tenure:{" + key + "}:lock")
            time.sleep(0.01)
    feed.heal()
    _caught_up(master)
    assert client.lock(key, ttl=TTL).acquire(blocking=True, timeout=5) is True


def test_a_missing_acknowledgement_is_a_refusal_not_an_unreachable_node(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    # With the replica cut off, the master answers the acquire at once but its WAIT only
    # on a cron tick (100 ms at hz 10), at or after the round's deadline. That node is
    # up: a blocking acquire must keep trying until its timeout, not give up with
    # QuorumUnreachable as if the master were silent (CI once saw exactly that). At hz 1
    # the WAIT is answered after the deadline almost every time, not just now and then.
    master, _, feed = replicated
    with master.client() as m:
        m.config_set("hz", 1)
    client = api.client([master.url], wait_replicas=1, node_timeout=0.1)
    feed.blackhole()
    started = time.monotonic()
    assert client.lock(key, ttl=TTL).acquire(blocking=True, timeout=1.0) is False
    assert time.monotonic() - started >= 1.0
    feed.heal()
    _caught_up(master)
    assert client.lock(key, ttl=TTL).acquire(blocking=True, timeout=5) is True


def _caught_up(master: LocalNode) -> None:
    """Wait until the replica has every write the master made (after a heal, the proxy
    resets the replication link that lost data, and the replica reconnects within its
    1 s replication cron: its link status alone may still say "up" from before)."""
    with master.client() as m:
        m.set("tenure-test:probe", "1")
        assert m.execute_command("WAIT", 1, 10_000) == 1


def test_extension_without_the_replica_loses_the_lease(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    master, _, feed = replicated
    client = api.client([master.url], wait_replicas=1, node_timeout=0.1)
    lease = client.acquire(key, ttl=TTL)
    feed.blackhole()
    with pytest.raises(tenure.LeaseLost):
        lease.extend()
    assert lease.lost_error is not None


def test_without_wait_replicas_an_unreplicated_grant_counts(
    api: Api, replicated: tuple[LocalNode, LocalNode, Proxy], key: str
) -> None:
    # The control: this is the failover hazard wait_replicas closes (verifier scenario 1).
    master, replica, feed = replicated
    client = api.client([master.url])
    feed.blackhole()
    with client.lock(key, ttl=TTL) as lease, replica.client() as r:
        assert r.get(lease.key) is None


@pytest.mark.parametrize(
    ("options", "parameter"),
    [
        ({"wait_replicas": -1}, "wait_replicas"),
        ({"wait_replicas": 65}, "wait_replicas"),
        ({"wait_replicas": True}, "wait_replicas"),
        ({"wait_replicas": 1.5}, "wait_replicas"),
    ],
)
def test_bad_wait_replicas_is_refused(options: dict[str, object], parameter: str) -> None:
    with pytest.raises(tenure.ConfigurationError) as info:
        tenure.Client(["redis://127.0.0.1:1"], **options)  # type: ignore[arg-type]
    assert info.value.parameter == parameter
    assert "[0, 64]" in str(info.value)


def test_fair_mode_cannot_wait_for_replicas() -> None:
    client = tenure.Client(["redis://127.0.0.1:1"], wait_replicas=1)
    with pytest.raises(tenure.ConfigurationError) as info:
        client.lock("x", ttl=TTL, fair=True)
    assert info.value.parameter == "fair"
    client.close()

"""Connections the nodes close while the client is not using them.

A node closes connections idle past its ``timeout`` setting (as do proxies and load
balancers, and a node that restarts). The next round must find fresh connections, not
the end of the old ones: a release, or a watchdog's extension, after a long critical
section failed on every node that had closed its side ("Connection closed by server"),
and the lease was reported lost while its keys stayed on the nodes until their TTL.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster

from .conftest import Api, holders, poll_until


def _closing(nodes: Iterable[LocalNode]) -> None:
    for node in nodes:
        with node.client() as c:
            c.config_set("timeout", 1)  # close connections idle for a second


@pytest.fixture
def closing3() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        _closing(cluster)
        yield cluster


def _closed_by_the_nodes(cluster: Iterable[LocalNode], api: Api | None = None) -> None:
    """Wait until the nodes closed the client's connections; with ``api``, its clients'
    background work runs meanwhile (an asyncio client's loop reads the ends as they
    come), without, it does not (the ends wait unread for the next round to find)."""

    def alone() -> bool:
        # Only the connection asking is left on each node.
        for node in cluster:
            with node.client() as c:
                if int(c.info("clients")["connected_clients"]) > 1:
                    return False
        return True

    what = "the nodes closing the idle connections"
    if api is None:
        poll_until(alone, what, within=10.0)
    else:
        api.wait_until(alone, within=10.0, what=what)


def test_leases_outlive_connections_the_nodes_closed_while_idle(
    api: Api, closing3: LocalCluster, key: str
) -> None:
    client = api.client(closing3.urls)
    lease = client.acquire(key, ttl=30)
    _closed_by_the_nodes(closing3, api)
    lease.extend()  # not LeaseLost: new connections carry it
    _closed_by_the_nodes(closing3)
    lease.release()
    assert holders(closing3, lease.key) == [None] * 3
    _closed_by_the_nodes(closing3)
    client.acquire(key, ttl=30, blocking=False).release()  # not QuorumUnreachable


def test_a_cluster_node_replaces_the_member_connections_it_lost_while_idle(
    api: Api, key: str
) -> None:
    # A Redis Cluster as one node: each master's connection is replaced before the round
    # that needs it, which waits for the new one rather than finding it missing.
    with LocalRedisCluster(replicas=0) as cluster:
        _closing(cluster.masters())
        client = api.client([cluster.url])
        lease = client.acquire(key, ttl=30)
        _closed_by_the_nodes(cluster.masters())
        lease.extend()
        lease.release()

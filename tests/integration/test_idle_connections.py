"""Connections the nodes close while the client is not using them.

A node closes connections idle past its ``timeout`` setting (as do proxies and load
balancers, and a node that restarts). The next round must find fresh connections, not
the end of the old ones: a release, or a watchdog's extension, after a long critical
section failed on every node that had closed its side ("Connection closed by server"),
and the lease was reported lost while its keys stayed on the nodes until their TTL.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterable, Iterator

import pytest

from tenure._driver.redis_compat import closed_by_peer
from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster
from tenure.verify.proxy import Proxy

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
    # (Decided at the first majority: the third node's release may land a moment later.)
    poll_until(lambda: holders(closing3, lease.key) == [None] * 3, "the release everywhere")
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


def test_a_node_that_always_answers_late_is_asked_again_after_an_idle_close(
    api: Api, closing3: LocalCluster, key: str
) -> None:
    # Node 0 answers every round after the other two decided it: its replies are owed
    # when the round ends, and wait unread, with the end of the connection behind them,
    # once the node closed it. The release must still reach it, on a new connection.
    api.client(closing3.urls).acquire(key, ttl=30).release()  # every node set up
    slow = Proxy(closing3[0].host, closing3[0].port or 0, name="slow")
    slow.start()
    try:
        slow.delay(0.2)  # four node timeouts: never in time
        client = api.client([slow.url, *closing3.urls[1:]], node_timeout=0.05)
        lease = client.acquire(key, ttl=30)
        assert slow.url not in lease.nodes
        poll_until(lambda: holders(closing3, lease.key)[0] is not None, "the late grant")
        _closed_by_the_nodes(closing3)
        # The proxy passes the close on after its delay (0.2 s), as it does replies: by
        # then, with 0.6 s to spare for its thread on a loaded machine (a release written
        # before the close arrives goes to a connection the node has closed).
        time.sleep(0.8)
        lease.release()
        poll_until(
            lambda: holders(closing3, lease.key) == [None] * 3,
            "the release on every node, the late one too",
            within=5.0,
        )
    finally:
        slow.close()


@pytest.mark.skipif(not hasattr(select, "POLLRDHUP"), reason="Linux tells a close apart")
def test_a_close_is_seen_behind_replies_not_yet_read() -> None:
    ours, node = socket.socketpair()
    with ours, node:
        node.sendall(b"+OK\r\n")
        assert not closed_by_peer(ours)  # a reply waits; the connection is open
        node.close()
        assert closed_by_peer(ours)  # its end, behind the reply
        assert ours.recv(16) == b"+OK\r\n"  # the look read nothing

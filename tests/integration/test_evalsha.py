"""The acquire and the release go by EVALSHA (and a single node's extension); a node that
cannot run one is sent the EVAL form at once (a release answered late: when it is read).

A node's script cache is empty after a restart or ``SCRIPT FLUSH`` (it answers NOSCRIPT),
and an ACL may grant ``+eval`` without ``+evalsha`` (NOPERM). Neither may cost the node
its vote: the EVAL form goes on the same connection within the same round. A node whose
ACL refused EVALSHA is sent EVAL from then on, not refused once per acquire.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import tenure
from tenure._lua import script
from tenure.testing import LocalCluster
from tenure.verify.proxy import Proxy

from .conftest import (
    LEAST_PRIVILEGE,
    SCRIPT_COMMANDS,
    Api,
    acl_user,
    holders,
    poll_until,
    scripts_run,
)


@pytest.fixture(scope="module")
def nodes3() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        yield cluster


def _scripts_loaded(cluster: LocalCluster) -> None:
    """Load the acquire and the release on every node of ``cluster``.

    Another test of this module may have flushed them: a NOSCRIPT that a client reads
    late (after a majority decided its round) sends that client's next scripts to the
    node by EVAL, once each, which is not what a test of EVALSHA means to watch.
    """
    for node in cluster:
        with node.client() as c:
            c.script_load(script("acquire").wire)
            c.script_load(script("release").wire)


@pytest.fixture
def third_proxied(nodes3: LocalCluster) -> Iterator[Proxy]:
    """A proxy in front of the third node, to slow it down (the others are reached
    directly); every node starts with the scripts loaded."""
    _scripts_loaded(nodes3)
    node = nodes3[2]
    proxy = Proxy(node.host, node.port or 0, name=node.name)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


def _third_loses_its_scripts_and_slows(nodes3: LocalCluster, proxy: Proxy) -> None:
    """Flush the third node's scripts and put it 500 ms away (250 ms each way): a release
    is decided by the other two, and that node's NOSCRIPT comes after."""
    with nodes3[2].client() as c:
        c.script_flush()
    proxy.delay(0.25)


def _commandstats(cluster: LocalCluster, command: str, *fields: str) -> list[int]:
    """The sum of ``fields`` of ``command``'s INFO commandstats, by node."""
    counts = []
    for node in cluster:
        with node.client() as c:
            stats = c.info("commandstats").get(f"cmdstat_{command}", {})
        counts.append(sum(int(stats.get(field, 0)) for field in fields))
    return counts


def _evalsha_refused(cluster: LocalCluster) -> list[int]:
    """EVALSHA calls each node refused or failed."""
    return _commandstats(cluster, "evalsha", "rejected_calls", "failed_calls")


def _granted_everywhere(api: Api, client: Any, name: str, cluster: LocalCluster) -> int:
    """Acquire ``name`` without waiting until one lease is held on every node: the nodes
    outside the first majority too, whose replies nobody awaited.

    A node's reply that comes after its round was decided is read only at the link's
    next use (the blocking client has no reader in the background), so a NOSCRIPT that
    late makes the *next* acquire go to that node by EVAL. Under load that can take a
    few acquires; a node that had lost its vote for good never holds the key. Returns
    how many acquires it took.
    """
    for attempt in range(1, 11):
        lease = client.acquire(name, ttl=5.0, blocking=False)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if holders(cluster, lease.key) == [lease.token.encode()] * len(cluster):
                lease.release()
                return attempt
            api.idle(0.01)
        lease.release()
    raise AssertionError(f"no lease on {name!r} reached every node in 10 acquires")


def test_a_flushed_script_cache_costs_no_vote(api: Api, nodes3: LocalCluster) -> None:
    with LocalCluster(1) as one:
        for cluster in (one, nodes3):
            client = api.client(cluster.urls)
            name = f"flushed-{uuid.uuid4().hex}"
            client.acquire(name, ttl=2.0).release()  # the scripts are cached
            for node in cluster:
                with node.client() as c:
                    c.script_flush()
            before = _evalsha_refused(cluster)
            # NOSCRIPT on every node: the EVAL form within the round, or, for a node
            # that answered after the round was decided, at its next acquire (a late
            # answer cannot stop an acquire already on its way: at most one refusal
            # per acquire until the EVAL form reached the node).
            client.acquire(name, ttl=2.0, blocking=False).release()
            acquires = 1 + _granted_everywhere(api, client, name, cluster)
            after = _evalsha_refused(cluster)
            refused = [a - b for a, b in zip(after, before, strict=True)]
            assert all(1 <= r <= acquires for r in refused), (refused, acquires)
            # The EVAL loaded the script again: from now on EVALSHA runs everywhere.
            for _ in range(3):
                _granted_everywhere(api, client, name, cluster)
            assert _evalsha_refused(cluster) == after


def _pttl_ms(cluster: LocalCluster, key: str) -> int:
    with cluster[0].client() as c:
        return int(c.pttl(key))


def test_a_single_nodes_release_and_extension_outlive_a_flushed_script_cache(api: Api) -> None:
    # One node is the whole majority, so its every reply is read within the round: the
    # release and the extension go by EVALSHA too, and a NOSCRIPT is answered by the
    # EVAL form at once. Had it been dropped, the extension would leave the old TTL and
    # the release would leave the key until it expired.
    with LocalCluster(1) as one:
        cached = api.client(one.urls).acquire("cached", ttl=2.0)
        cached.extend()
        cached.release()  # the node has the scripts
        for step in ("extend", "release"):
            # A client of its own for each step: after one NOSCRIPT, a client sends every
            # script once by EVAL, whichever refused.
            client = api.client(one.urls)
            warm = client.acquire(f"warm-{uuid.uuid4().hex}", ttl=2.0)
            warm.extend()
            warm.release()  # connected, each form by EVALSHA
            lease = client.acquire(f"single-{uuid.uuid4().hex}", ttl=2.0)
            with one[0].client() as c:
                c.script_flush()
            before = _evalsha_refused(one)
            if step == "extend":
                lease.extend(30.0)
                assert _pttl_ms(one, lease.key) > 20_000
            else:
                lease.release()
                assert holders(one, lease.key) == [None]
            # It went by EVALSHA (refused once), then by EVAL (which did the work).
            assert [a - b for a, b in zip(_evalsha_refused(one), before, strict=True)] == [1]


def test_an_asyncio_release_answered_late_by_noscript_is_sent_again_by_eval(
    nodes3: LocalCluster, third_proxied: Proxy
) -> None:
    # The asyncio client reads every reply as it comes, so its releases go by EVALSHA on
    # several nodes too. One node is 500 ms away and has lost its scripts: the release
    # is decided by the other two, and that node's NOSCRIPT comes after. The client
    # sends it the EVAL form then; without it the key would stay there for its 30 s TTL.

    async def main() -> None:
        urls = [nodes3[0].url, nodes3[1].url, third_proxied.url]
        async with tenure.AsyncClient(urls, node_timeout=1.0) as client:
            await (await client.acquire(f"warm-{uuid.uuid4().hex}", ttl=30.0)).release()
            lease = await client.acquire(f"late-{uuid.uuid4().hex}", ttl=30.0)
            deadline = time.monotonic() + 5.0
            while holders(nodes3, lease.key) != [lease.token.encode()] * 3:
                # Every grant in, the third node's too (the round ended at two).
                assert time.monotonic() < deadline, holders(nodes3, lease.key)
                await asyncio.sleep(0.02)
            _third_loses_its_scripts_and_slows(nodes3, third_proxied)
            before = _evalsha_refused(nodes3)
            await lease.release()
            assert holders(nodes3, lease.key)[2] == lease.token.encode()  # not yet
            deadline = time.monotonic() + 5.0
            while holders(nodes3, lease.key) != [None] * 3:
                assert time.monotonic() < deadline, holders(nodes3, lease.key)
                await asyncio.sleep(0.02)
            after = _evalsha_refused(nodes3)
            assert [a - b for a, b in zip(after, before, strict=True)] == [0, 0, 1]

    asyncio.run(main())


def test_a_blocking_release_answered_late_by_noscript_is_sent_again_by_eval(
    nodes3: LocalCluster, third_proxied: Proxy
) -> None:
    # The blocking client reads a reply that comes after its round at the link's next
    # use: a release that a node answered NOSCRIPT then goes to it again by EVAL, when
    # that round ends. The same slow, flushed third node as above; without the resend
    # the key would stay there for its 30 s TTL.
    urls = [nodes3[0].url, nodes3[1].url, third_proxied.url]
    with tenure.Client(urls, node_timeout=1.0) as client:
        client.acquire(f"warm-{uuid.uuid4().hex}", ttl=30.0).release()
        lease = client.acquire(f"late-{uuid.uuid4().hex}", ttl=30.0)
        poll_until(
            lambda: holders(nodes3, lease.key) == [lease.token.encode()] * 3,
            "every grant in, the third node's too (the round ended at two)",
        )
        _third_loses_its_scripts_and_slows(nodes3, third_proxied)
        before = _evalsha_refused(nodes3)
        lease.release()
        assert holders(nodes3, lease.key)[2] == lease.token.encode()  # not yet
        # By EVALSHA: the third node refuses it (its NOSCRIPT is on the way back).
        poll_until(lambda: _evalsha_refused(nodes3)[2] > before[2], "the EVALSHA refused")
        deadline = time.monotonic() + 10.0
        while holders(nodes3, lease.key) != [None] * 3:
            assert time.monotonic() < deadline, holders(nodes3, lease.key)
            client.acquire(f"other-{uuid.uuid4().hex}", ttl=5.0).release()  # next uses
        refused = [a - b for a, b in zip(_evalsha_refused(nodes3), before, strict=True)]
        # (The next uses' first commands to it may be refused too, before the
        # NOSCRIPT is read: then they go by EVAL.)
        assert refused[:2] == [0, 0], refused
        assert refused[2] >= 1, refused


def test_a_release_on_several_nodes_goes_by_evalsha(api: Api, nodes3: LocalCluster) -> None:
    # The acquire and the release, each by EVALSHA on each node, nothing by EVAL
    # (docs/architecture.md, "EVALSHA where a NOSCRIPT is always answered").
    # A node timeout of 1 s: one attempt, one acquire per node, even on a loaded machine.
    _scripts_loaded(nodes3)
    client = api.client(nodes3.urls, node_timeout=1.0)
    client.acquire(f"warm-{uuid.uuid4().hex}", ttl=5.0).release()  # connected, seeded
    for node in nodes3:
        with node.client() as c:
            c.config_resetstat()
    client.acquire(f"by-sha-{uuid.uuid4().hex}", ttl=5.0).release()

    def script_calls() -> list[dict[str, int]]:
        counts = []
        for node in nodes3:
            with node.client() as c:
                stats = c.info("commandstats")
            counts.append({k: int(stats[k]["calls"]) for k in SCRIPT_COMMANDS if k in stats})
        return counts

    # The nodes the rounds did not wait for run their commands a moment later.
    poll_until(lambda: sum(scripts_run(node) for node in nodes3) >= 6, "six script runs")
    assert script_calls() == [{"cmdstat_evalsha": 2}] * 3


def test_a_user_without_evalsha_is_sent_eval(api: Api, nodes3: LocalCluster) -> None:
    with acl_user(nodes3, f"u{uuid.uuid4().hex[:8]}", *LEAST_PRIVILEGE) as urls:
        client = api.client(urls)
        before = _evalsha_refused(nodes3)
        client.acquire(f"acl-{uuid.uuid4().hex}", ttl=2.0, blocking=False).release()
        acquires = 1 + _granted_everywhere(api, client, f"acl-{uuid.uuid4().hex}", nodes3)
        # Refused once per node (more only while its refusal came after the round was
        # decided and after the next command left: an acquire, or its release, which
        # goes by EVALSHA too; a loaded run once saw 3 for 2 acquires)...
        after = _evalsha_refused(nodes3)
        refused = [a - b for a, b in zip(after, before, strict=True)]
        assert all(1 <= r <= 2 * acquires for r in refused), (refused, acquires)
        # ... and then never tried again by this client.
        for _ in range(5):
            _granted_everywhere(api, client, f"acl-{uuid.uuid4().hex}", nodes3)
        assert _evalsha_refused(nodes3) == after


def test_a_late_evalsha_refusal_is_no_configuration_warning(
    api: Api, nodes3: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose user lacks ``+evalsha`` loses nothing: it is sent EVAL from then on.
    When its refusal comes after the round was decided (the node was slow), it was
    still told as "refused by ACL ... until it is fixed, locks need a majority of the
    other nodes", a warning for what needs no fix."""
    # The node set in use (seeded): with a node paused at its very first acquire, a
    # new set would sit out its warm-up.
    api.client(nodes3.urls).acquire(f"acl-{uuid.uuid4().hex}", ttl=2.0).release()
    with acl_user(nodes3, f"u{uuid.uuid4().hex[:8]}", *LEAST_PRIVILEGE) as urls:
        client = api.client(urls)
        assert not client.lock(f"acl-{uuid.uuid4().hex}").locked()  # connected, no EVALSHA
        slow = nodes3[2]
        slow.pause()
        try:
            client.acquire(f"acl-{uuid.uuid4().hex}", ttl=2.0).release()  # decided by two
        finally:
            slow.resume()
        # The slow node's refusal is read with the next round on its connection, which
        # it may also refuse while the first is still on its way.
        for _ in range(3):
            client.acquire(f"acl-{uuid.uuid4().hex}", ttl=2.0).release()
        assert _evalsha_refused(nodes3)[2] >= 1  # it did refuse, late
        warnings = [r.getMessage() for r in caplog.records if r.name.startswith("tenure")]
        assert not [w for w in warnings if "evalsha" in w.lower()], warnings


def test_a_resent_script_gets_a_node_timeout_of_its_own(api: Api, nodes3: LocalCluster) -> None:
    # Every node is 300 ms away (150 ms each way) and has lost its scripts: its NOSCRIPT
    # comes back after 300 ms, and its answer to the EVAL form sent then after 600 ms,
    # later than the node timeout (450 ms) counted from the round's start (150 ms of
    # margin either side, for a loaded machine's client, which reads replies late). A
    # node that answered and was asked again is not silent: the round waits a node
    # timeout from the resend, so the first attempt of a non-blocking acquire wins
    # (decided at the first majority of the answers to the EVAL form).
    proxies = [Proxy(node.host, node.port or 0, name=node.name) for node in nodes3]
    try:
        for proxy in proxies:
            proxy.start()
        client = api.client([proxy.url for proxy in proxies], node_timeout=0.45)
        name = f"resent-{uuid.uuid4().hex}"
        client.acquire(name, ttl=5.0).release()  # connected, and the scripts cached
        for node in nodes3:
            with node.client() as c:
                c.script_flush()
        for proxy in proxies:
            proxy.delay(0.15)
        before, evals_before = _evalsha_refused(nodes3), _commandstats(nodes3, "eval", "calls")
        lease = client.acquire(name, ttl=5.0, blocking=False)
        assert len(lease.nodes) >= 2
        # The round was decided at the first majority: on a loaded machine the third
        # node's request may reach it, and its NOSCRIPT be answered by EVAL (by the
        # asyncio client's loop, which runs while the test waits), a moment after.
        api.wait_until(
            lambda: (
                [a - b for a, b in zip(_evalsha_refused(nodes3), before, strict=True)] == [1] * 3
            ),
            within=2.0,
            what="one EVALSHA refused per node",
        )
        # One attempt, won by the answers to its EVAL forms: a round that gave up on
        # them at the first deadline would have tried again (a second EVAL each).
        api.wait_until(
            lambda: (
                [
                    a - b
                    for a, b in zip(
                        _commandstats(nodes3, "eval", "calls"), evals_before, strict=True
                    )
                ]
                == [1] * 3
            ),
            within=2.0,
            what="one EVAL per node",
        )
        lease.release()
    finally:
        for proxy in proxies:
            proxy.close()

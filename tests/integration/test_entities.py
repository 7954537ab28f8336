"""A lock per entity: names never used before, through node outages, growing node sets,
and the state left on the nodes (expired after the retention)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tenure._core.config import NODE_FLOOR, NODE_REPLID, NODE_WARM
from tenure._driver import clock as _clock
from tenure.testing import LocalCluster
from tenure.verify.proxy import Proxy

from .conftest import Api, holders, scripts_run

NODE_TIMEOUT = 0.05
# Behind the in-process proxies every reply crosses two more sockets and this process's
# GIL: on 2 loaded cores 50 ms is too tight for them. A round here is decided by the
# healthy majority, so a longer node_timeout costs the test nothing.
PROXIED_TIMEOUT = 0.5
FRESH = 12  # fresh names per check


@pytest.fixture(scope="module", params=[3, 5], ids=["3nodes", "5nodes"])
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, list[Proxy]]]:
    """Nodes, each behind a proxy that a test may cut off (and heals after)."""
    with LocalCluster(request.param) as cluster:
        proxies = [Proxy(n.host, n.port or 0, name=n.name) for n in cluster]
        for p in proxies:
            p.start()
        try:
            yield cluster, proxies
        finally:
            for p in proxies:
                p.close()


def _evals(cluster: LocalCluster, index: int) -> int:
    """How many scripts node ``index`` has run (its rounds, seeds and cleanups)."""
    return scripts_run(cluster[index])


def _fault(
    cluster: LocalCluster, proxies: list[Proxy], fault: str, victim: int
) -> Callable[[], None]:
    """Inflict ``fault`` on node ``victim``; returns what undoes it."""
    node, proxy = cluster[victim], proxies[victim]
    if fault == "frozen":
        node.pause()
        return node.resume
    if fault == "refusing":
        node.stop()  # the port is closed: connections are refused
        return node.start
    if fault == "killed":
        node.kill()
        return node.start
    assert fault == "cut off"
    proxy.blackhole()  # connections accepted, nothing ever answered
    return proxy.heal


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "notfair"])
@pytest.mark.parametrize("fault", ["frozen", "refusing", "killed", "cut off"])
def test_new_names_are_as_available_as_old_ones_with_a_node_down(
    api: Api, proxied: tuple[LocalCluster, list[Proxy]], fault: str, fair: bool
) -> None:
    cluster, proxies = proxied
    urls = [p.url for p in proxies]
    client = api.client(urls, node_timeout=PROXIED_TIMEOUT)
    old = f"old-{uuid.uuid4().hex}"
    client.acquire(old, ttl=2.0, fair=fair).release()  # the node set is in use
    undo = _fault(cluster, proxies, fault, victim=0)
    try:
        witness = 1  # a healthy node: counts the rounds every acquisition sends it

        def rounds(names: list[str]) -> list[int]:
            """Scripts per acquire+release (the release is one) on the witness node."""
            out = []
            for name in names:
                before = _evals(cluster, witness)
                lease = client.acquire(name, ttl=2.0, blocking=False, fair=fair)
                assert lease.valid
                assert cluster[0].url not in lease.nodes or fault == "cut off"
                lease.release()
                out.append(_evals(cluster, witness) - before)
            return out

        for name in [old] * 3 + [f"new-{uuid.uuid4().hex}" for _ in range(3)]:
            client.acquire(name, ttl=2.0, blocking=False, fair=fair).release()  # settle
        used = rounds([old] * FRESH)
        fresh = rounds([f"new-{uuid.uuid4().hex}" for _ in range(FRESH)])
        # The same number of rounds, give or take one per name (a fresh name's first
        # proposal may be below the node's floor: one immediate retry). Summed, since a
        # release awaits only a majority: its script may reach the witness after the
        # next acquisition has begun, and count there.
        assert sum(fresh) <= sum(used) + len(fresh), (used, fresh)
        # A blocking acquire of a new name does not wait either.
        started = time.monotonic()
        lease = client.acquire(f"new-{uuid.uuid4().hex}", ttl=2.0, timeout=5.0, fair=fair)
        assert time.monotonic() - started < 1.0
        lease.release()
    finally:
        undo()


def test_a_new_name_gets_a_token_above_every_token_its_nodes_issued(
    api: Api, shared5: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each name taken by a new client whose wall clock is an hour behind and stands
    # still: neither the clock nor a client's memory of the tokens it saw orders the
    # tokens then, only the nodes' floors. (With one client and the real clock, tokens
    # increased even when the nodes neither checked nor raised their floors.)
    behind = _clock.wall_us() - 3_600_000_000
    # The clock a client's flows read is injected when the client is made.
    monkeypatch.setattr("tenure._driver.client_base.wall_us", lambda: behind)
    tokens = []
    for _ in range(8):
        client = api.client(shared5.urls, node_timeout=NODE_TIMEOUT)
        lease = client.acquire(f"entity-{uuid.uuid4().hex}", ttl=2.0)
        tokens.append(lease.fencing_token)
        lease.release()
    # Each new name starts above its nodes' floor, which every earlier grant raised.
    assert all(a < b for a, b in itertools.pairwise(tokens))


def test_a_client_whose_clock_is_behind_after_the_history_expired(
    api: Api, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge of the retention: the lock has been idle past the retention, then a
    client whose wall clock is an hour behind takes the lock. Its first proposal is
    below the nodes' floors, which they still have (other locks keep them alive): it is
    told so and proposes above them, so the token still exceeds every earlier one."""
    with LocalCluster(3) as cluster:
        options: dict[str, Any] = {"node_timeout": NODE_TIMEOUT, "max_ttl": 1.0}
        writer = api.client(cluster.urls, retention=2.0, **options)
        first = writer.acquire(key, ttl=1.0)
        first.release()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # another lock keeps the floors alive
            writer.acquire(f"{key}-other", ttl=1.0).release()
            time.sleep(0.2)
        for node in cluster:
            with node.client() as c:
                assert c.get(NODE_FLOOR) is not None
        behind = _clock.wall_us() - 3_600_000_000
        # The clock a client's flows read is injected when the client is made.
        monkeypatch.setattr("tenure._driver.client_base.wall_us", lambda: behind)
        late = api.client(cluster.urls, retention=2.0, **options)
        lease = late.acquire(key, ttl=1.0)
        assert lease.fencing_token > first.fencing_token
        lease.release()


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 5)])
def test_growing_the_node_set_costs_at_most_max_ttl(
    api: Api, key: str, before: int, after: int
) -> None:
    """The new nodes are blank: they sit out max_ttl, then vote (docs/fencing.md)."""
    max_ttl = 1.0
    with LocalCluster(after) as cluster:
        options: dict[str, Any] = {"node_timeout": NODE_TIMEOUT, "max_ttl": max_ttl}
        small = api.client(cluster.urls[:before], **options)
        old = small.acquire(key, ttl=max_ttl)
        old.release()
        grown = api.client(cluster.urls, **options)
        started = time.monotonic()
        lease = grown.acquire(key, ttl=max_ttl, timeout=max_ttl + 2.0)
        waited = time.monotonic() - started
        assert waited < max_ttl + 1.0
        assert lease.fencing_token > old.fencing_token
        lease.release()
        # Names never used on either set are just as available.
        fresh = grown.acquire(f"{key}-fresh", ttl=max_ttl, timeout=max_ttl + 2.0)
        assert fresh.fencing_token > old.fencing_token
        fresh.release()
        if before == 1:
            # A majority of the grown set needs a new node: once warm, they vote.
            time.sleep(max_ttl)
            lease = grown.acquire(key, ttl=max_ttl, timeout=2.0)
            assert len(set(lease.nodes) - {cluster[0].url}) >= 1
            lease.release()


@pytest.mark.parametrize("wipe", ["flushall", "restart"])
def test_a_node_that_lost_its_data_is_still_kept_out(api: Api, key: str, wipe: str) -> None:
    """Losing data is told apart from a new name: the node's floor is gone with it."""
    max_ttl = 1.0
    with LocalCluster(3) as cluster:
        client = api.client(cluster.urls, node_timeout=NODE_TIMEOUT, max_ttl=max_ttl)
        client.acquire(key, ttl=max_ttl).release()
        victim = cluster[0]
        if wipe == "flushall":
            with victim.client() as c:
                c.flushall()
        else:
            victim.restart(keep_data=False)
        for name in (key, f"{key}-new"):
            lease = client.acquire(name, ttl=max_ttl, timeout=2.0)
            assert cluster[0].url not in lease.nodes
            with victim.client() as c:
                assert c.get(lease.key) is None  # blank or warming: it granted nothing
                if c.get(NODE_FLOOR) is not None:  # seeded from the others...
                    assert 0 < c.pttl(NODE_WARM) <= max_ttl * 1000  # ...and warming up
            lease.release()


def test_nothing_is_left_after_the_retention(api: Api) -> None:
    """Nothing is kept per name once its lease and its waiters are gone (only the
    node's floor and its replication ID), and every key tenure writes expires: after
    the retention, the nodes are empty."""
    with LocalCluster(3) as cluster:
        client = api.client(cluster.urls, retention=2.0, max_ttl=1.0, node_timeout=NODE_TIMEOUT)
        for i in range(200):
            client.acquire(f"order:{i}", ttl=1.0).release()
        lease = client.acquire("order:held", ttl=1.0)
        other = api.client(cluster.urls, retention=2.0, max_ttl=1.0, node_timeout=NODE_TIMEOUT)
        lock = other.lock("order:held", ttl=1.0)
        assert not lock.acquire(timeout=0.2)  # a waiter queued, then gave up
        lease.release()
        for node in cluster:
            with node.client() as c:
                # The floor, and the replication ID it was written under. A lock key
                # whose release did not reach this node in time (a loaded machine) may
                # remain, but only until its TTL ends: nothing else per name.
                node_keys = {NODE_FLOOR.encode(), NODE_REPLID.encode()}
                left = set(c.scan_iter("tenure:*"))
                assert node_keys <= left
                for k in left - node_keys:
                    assert k.endswith(b":lock"), k
                    assert 0 < c.pttl(k) <= 1000, (k, c.pttl(k))
                assert c.pttl(NODE_FLOOR) > 0
        time.sleep(2.2)
        for node in cluster:
            with node.client() as c:
                assert list(c.scan_iter("tenure:*")) == []


@contextlib.contextmanager
def _seeded_slowly(
    api: Api, cluster: LocalCluster, slow: list[Proxy], delay: float
) -> Iterator[None]:
    """Another client finds the new node set ``cluster`` blank and seeds it: its seeds
    reach the first nodes at once, and the last ones, behind the proxies ``slow``,
    ``delay`` seconds later. The block runs in between (the first nodes have a floor,
    the last ones none yet); its exit waits for that client to be done."""
    fast = len(cluster) - len(slow)
    seeder_api = api.sibling()  # the seeding client lives in a thread of its own

    # The slow nodes' answers take two delays (each way): heard within the node timeout.
    node_timeout = max(1.0, 2 * delay + 0.5)
    ttl = 4 * node_timeout

    def seed() -> None:
        urls = [*cluster.urls[:fast], *(p.url for p in slow)]
        seeder = seeder_api.client(urls, node_timeout=node_timeout)
        assert not seeder.lock("seeding", ttl=ttl).locked()  # connected everywhere
        for proxy in slow:
            proxy.delay(delay)
        seeder.acquire("seeding", ttl=ttl, timeout=ttl).release()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        seeding = pool.submit(seed)
        deadline = time.monotonic() + ttl
        while not all(holders(cluster, NODE_FLOOR)[:fast]):
            assert time.monotonic() < deadline, "the seeding client never seeded"
            time.sleep(0.002)
        assert not any(holders(cluster, NODE_FLOOR)[fast:])  # its seeds are on the way
        yield
        seeding.result(timeout=2 * ttl)


def test_a_new_node_set_seeded_by_one_client_is_not_warmed_up_by_another(api: Api) -> None:
    """Two clients meet a new node set at once. The first finds every node blank and
    seeds them all with no warm-up, but its seed to node 2 is slow on the way (1 s).
    The second arrives in between: nodes 0 and 1 have a floor, node 2 none. That may
    be a node that lost its data, or the first client's seed still on its way; a
    warm-up seed from the second client would get there first and keep a node that
    never granted anything out for max_ttl. It waits instead (four node timeouts: 2 s
    here), and the first client's seed lands: node 2 never warms up. (With a seed
    300 ms on its way, a test thread starved beside CPU hogs looked only after it had
    landed.)"""
    with LocalCluster(3) as cluster, Proxy(cluster[2].host, cluster[2].port or 0) as slow:
        second = api.client(cluster.urls, node_timeout=0.5)
        with _seeded_slowly(api, cluster, [slow], 1.0):
            # A few acquires, well within the patience: a round decided by nodes 0 and
            # 1 may drop node 2's answer (the asyncio client stops reading a round's
            # replies once it is decided), and each has the chance to see node 2 blank.
            hurry = time.monotonic() + 0.08
            for _ in range(10):
                second.acquire("new-set-b", ttl=5.0, blocking=False).release()
                if time.monotonic() > hurry:
                    break
        with cluster[2].client() as c:
            assert c.get(NODE_FLOOR) is not None  # seeded by the first client...
            assert not c.exists(NODE_WARM)  # ...as a node of a new set: no warm-up


def test_a_non_blocking_acquire_is_not_refused_while_another_client_seeds_the_set(
    api: Api,
) -> None:
    """A new node set of 5, and a client seeding it: its seeds reach nodes 0 and 1 at
    once and nodes 2, 3 and 4 400 ms later. A non-blocking acquire of a free lock in
    between sees two floors and three blank nodes: no majority, nobody holding it. It
    tries once more, a node timeout (1 s) later, and by then the seeds have landed.
    (With 150 ms, a loaded 2-core machine once looked at nodes 2-4 only after the seeds
    had landed there.)"""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(5))
        slow = [stack.enter_context(Proxy(n.host, n.port or 0)) for n in list(cluster)[2:]]
        second = api.client(cluster.urls, node_timeout=1.0)
        assert not second.lock("seeding-b", ttl=5.0).locked()  # connected everywhere
        with _seeded_slowly(api, cluster, slow, 0.4):
            lease = second.acquire("seeding-b", ttl=5.0, blocking=False)
            assert len(lease.nodes) >= 3
            lease.release()
        for node in cluster:
            with node.client() as c:
                assert not c.exists(NODE_WARM)  # a new set: seeded once, no warm-up

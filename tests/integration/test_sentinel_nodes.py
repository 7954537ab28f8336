"""A Sentinel-managed master as one lock node (``redis+sentinel://``), on real Sentinels.

Every test of the clients runs one body against the blocking and the asyncio client
(``api``; the announcement's on uvloop's loop too), on ``tenure.testing.LocalSentinelSet``
(a master, a replica, three Sentinels) started from the default server or
``$TENURE_SERVER``. After a fault the tests wait, under a generous
deadline, for an acquire that lands on the master the Sentinels name: how soon depends
on the Sentinels (a demoted master keeps its clients until the Sentinels reconfigure
it) and, once the scripts detect failovers, on a warm-up, so nothing here is timed,
but for one bound: a client that heard the Sentinels announce a ``SENTINEL FAILOVER``
is on the new master, its warm-up (3 s) over, before the Sentinels demote the old one
(about 10 s after the failover).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.sentinel

import tenure
from tenure._core import sentinel_watch as watch_rules
from tenure._core.config import LockKeys, parse_node_url
from tenure._driver import acl as _acl
from tenure._driver.sentinel import Locator, SocketEnd
from tenure.cli import main
from tenure.cli.node_rules import EXIT_UNAVAILABLE
from tenure.testing import LocalNode, LocalSentinelSet
from tenure.testing.topologies import server_version

from .conftest import Api

# Short leases and warm-ups, so that waiting out a failover takes seconds.
OPTIONS = {"max_ttl": 3.0, "connect_timeout": 1.0}
DEADLINE = 90.0


@pytest.fixture(scope="module")
def shared_set() -> Iterator[LocalSentinelSet]:
    """One deployment for the tests that inject no fault."""
    with LocalSentinelSet() as sentinels:
        yield sentinels


@pytest.fixture
def fresh_set() -> Iterator[LocalSentinelSet]:
    """A deployment of the test's own, to fail over or break."""
    with LocalSentinelSet() as sentinels:
        yield sentinels


def _holds(node: LocalNode, name: str) -> bool:
    with node.client(socket_timeout=2.0) as c:
        return bool(c.exists(LockKeys.of(name).lock))


def _lands_on(api: Api, client: object, name: str, sentinels: LocalSentinelSet) -> LocalNode:
    """Acquire ``name`` until the lease is held on the master the Sentinels name (a
    demoted master may grant until the Sentinels close its connections); returns it."""
    deadline = time.monotonic() + DEADLINE
    last: object = None
    while time.monotonic() < deadline:
        try:
            lease = client.acquire(name, ttl=1.0, blocking=True, timeout=0.5)  # type: ignore[attr-defined]
        except (tenure.QuorumUnreachable, tenure.LockTimeout) as exc:
            last = exc
        else:
            master = sentinels.master()
            there = _holds(master, name)
            try:
                lease.release()
            except tenure.LeaseLost as exc:  # the connection broke under it: try again
                last = exc
                continue
            if there:
                return master
            last = "held on a server that is not the Sentinels' master"
        api.idle(0.05)
    raise AssertionError(f"no lease on the Sentinels' master within {DEADLINE} s: {last}")


def _no_redis_exception(error: BaseException) -> None:
    seen: BaseException | None = error
    while seen is not None:
        assert not isinstance(seen, redis.RedisError), repr(seen)
        seen = seen.__cause__ or seen.__context__


def test_a_lock_through_the_sentinel_url(api: Api, shared_set: LocalSentinelSet) -> None:
    name = f"sentinel-url-{api.flavour}"
    client = api.client([shared_set.url], **OPTIONS)
    with client.lock(name, ttl=3.0):
        assert _holds(shared_set.master(), name)
    assert not _holds(shared_set.master(), name)


def test_a_master_for_client_as_the_node(api: Api, shared_set: LocalSentinelSet) -> None:
    # Its Sentinels, service and settings are taken; tenure connects on its own.
    name = f"sentinel-object-{api.flavour}"
    manager = redis.sentinel.Sentinel(_addresses(shared_set))  # type: ignore[no-untyped-call,unused-ignore]
    client = api.client([manager.master_for(shared_set.service)], **OPTIONS)  # type: ignore[no-untyped-call,unused-ignore]
    with client.lock(name, ttl=3.0):
        assert _holds(shared_set.master(), name)


def test_a_waiter_is_woken_by_the_release(api: Api, shared_set: LocalSentinelSet) -> None:
    # Notifications are subscribed on the master found through the Sentinels. With a
    # re-check far beyond the test, only a notification can hand the lock over within
    # 5 s of the release: the waiter's wait also ends when the holder's TTL runs out
    # (20 s, not 3: it passed without a notification), and at its timeout (30 s).
    name = f"sentinel-wake-{api.flavour}"
    holder = api.client([shared_set.url], **{**OPTIONS, "max_ttl": 30.0})
    lease = holder.acquire(name, ttl=20.0)
    sibling = api.sibling()
    other = sibling.client([shared_set.url], recheck=60.0, **OPTIONS)
    results: list[object] = []
    got_at: list[float] = []

    def wait() -> None:
        results.append(other.acquire(name, ttl=3.0, timeout=30.0))
        got_at.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        api.wait_until(
            lambda: _queued(shared_set.master(), name), within=10.0, what="waiter queued"
        )
        released = time.monotonic()
        lease.release()
        thread.join(30.0)
        assert results
        assert results[0] is not None
        results[0].release()  # type: ignore[attr-defined]
        took = got_at[0] - released
        assert took < 5.0, f"woken {took:.1f} s after the release: not by its notification"
    finally:
        thread.join(30.0)


def _queued(node: LocalNode, name: str) -> bool:
    with node.client(socket_timeout=2.0) as c:
        return bool(c.zcard(LockKeys.of(name).queue))


def test_the_client_follows_a_sentinel_failover(api: Api, fresh_set: LocalSentinelSet) -> None:
    name = "sentinel-failover"
    client = api.client([fresh_set.url], **OPTIONS)
    first = _lands_on(api, client, name, fresh_set)
    new = fresh_set.failover()
    assert new is not first
    assert _lands_on(api, client, name, fresh_set) is new


def test_the_client_follows_a_killed_master(api: Api, fresh_set: LocalSentinelSet) -> None:
    name = "sentinel-killed"
    client = api.client([fresh_set.url], **OPTIONS)
    killed = _lands_on(api, client, name, fresh_set)
    fresh_set.kill_master()
    new = fresh_set.wait_for_promotion(killed)
    assert _lands_on(api, client, name, fresh_set) is new


def _role(node: LocalNode) -> str:
    with node.client(socket_timeout=2.0) as c:
        role = c.role()[0]
    return role.decode() if isinstance(role, bytes) else str(role)


def test_a_holder_moves_to_the_master_the_sentinels_announce(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    _holder_moves_to_the_announced_master(api, fresh_set)


def test_a_holder_moves_to_the_master_the_sentinels_announce_on_uvloop(
    fresh_set: LocalSentinelSet,
) -> None:
    # uvloop hands out no socket of its transports to end: the connections are ended
    # through the loop.
    pytest.importorskip("uvloop", reason="uvloop is not installed")
    with Api("async", "uvloop") as api:
        _holder_moves_to_the_announced_master(api, fresh_set)


def _holder_moves_to_the_announced_master(api: Api, fresh_set: LocalSentinelSet) -> None:
    # SENTINEL FAILOVER leaves the old master up, and a master, until the Sentinels
    # reconfigure it as a replica (about 10 s later here). A holder whose connections
    # stayed there would extend its lease on the old master only, while the new one's
    # copy of the key ran out and, its warm-up over (max_ttl, 3 s), granted the lock to a
    # client connecting afresh: two holders. The Sentinels' announcement moves the
    # holder's connections at once, and its watchdog extends the lease on the new master.
    name = f"sentinel-announced-{api.flavour}"
    holder = api.client([fresh_set.url], **OPTIONS)
    old = fresh_set.master()
    lease = holder.acquire(name, ttl=3.0, watchdog=True)
    new = api.run_blocking(fresh_set.failover)
    assert new is not old
    other = api.client([fresh_set.url], **OPTIONS)  # connects afresh: to the new master
    until = time.monotonic() + 6.0  # past the warm-up and two of the lease's TTLs
    while time.monotonic() < until:
        with pytest.raises(tenure.LockTimeout):
            other.acquire(name, ttl=1.0, blocking=False)
        api.idle(0.2)
    assert lease.valid
    assert _holds(new, name)
    # New leases of the holder's client are taken on the new master too (the old one
    # still a master: its demotion did not move the client).
    assert _lands_on(api, holder, f"{name}-after", fresh_set) is new
    assert _role(old) == "master"
    lease.release()
    # The watch's thread ends with the clients' connections.
    api.close_clients()
    api.wait_until(
        lambda: "tenure-sentinel-watch" not in {t.name for t in threading.enumerate()},
        within=2.0,
        what="the watch's thread ended",
    )


def _watched_by(sentinel: LocalNode, user: str | None = None) -> bool:
    """Whether a client (logged in as ``user``) holds a subscription on ``sentinel``
    (the watch's)."""
    with sentinel.client(socket_timeout=2.0) as c:
        return any(
            int(client.get("sub", 0)) > 0 and user in (None, client.get("user"))
            for client in c.client_list()
        )


def _watching(sentinels: LocalSentinelSet) -> list[LocalNode]:
    """The Sentinels a client (the test's only one) holds a subscription on."""
    return [s for s in sentinels.sentinels if _watched_by(s)]


def _watching_client(api: Api, sentinels: LocalSentinelSet, name: str) -> tuple[Any, LocalNode]:
    """A client that locked ``name`` on the master (returned too), its watch subscribed on
    two of the three Sentinels (one of every majority)."""
    client = api.client([sentinels.url], **OPTIONS)
    master = _lands_on(api, client, name, sentinels)
    api.wait_until(lambda: len(_watching(sentinels)) == 2, what="two subscriptions")
    return client, master


def _moved_by_the_announcement(
    api: Api, client: Any, name: str, sentinels: LocalSentinelSet, old: LocalNode
) -> None:
    """Fail over: ``client`` locks ``name`` on the new master while ``old`` is a master
    still (the announcement moved it, not a demotion)."""
    new = api.run_blocking(sentinels.failover)
    assert _lands_on(api, client, name, sentinels) is new
    assert _role(old) == "master"


def test_the_watch_moves_to_another_sentinel_when_one_of_its_own_goes_silent(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    # The watch holds subscriptions on two of the three Sentinels (one of every
    # majority). One of them freezes: the watch PINGs it after a quiet spell, gets no
    # answer, and subscribes on the third, which announces the failover the other two
    # Sentinels carry out.
    name = f"sentinel-watch-moves-{api.flavour}"
    client, old = _watching_client(api, fresh_set, name)
    frozen, _ = _watching(fresh_set)
    [third] = [s for s in fresh_set.sentinels if not _watched_by(s)]
    frozen.pause()
    try:
        api.wait_until(
            lambda: _watched_by(third), within=20.0, what="a subscription on the third Sentinel"
        )
        _moved_by_the_announcement(api, client, name, fresh_set, old)
    finally:
        frozen.resume()


def test_a_holder_follows_a_failover_the_sentinel_it_asks_first_never_learns_of(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    # The Sentinel the client's connections ask first (the first listed: it answered) is
    # cut off from the others: it still answers PING and names the old master, learns of
    # no failover and announces none. The watch hears the announcement on the other
    # Sentinel it subscribed on, and the connections, asking again, pass over the one
    # that names another master than the one announced (it is asked last from then on).
    name = f"sentinel-cut-off-{api.flavour}"
    client, old = _watching_client(api, fresh_set, name)
    first = fresh_set.sentinels[0]
    assert _watched_by(first)  # the first in the order asked
    fresh_set.cut_off(first)
    _moved_by_the_announcement(api, client, name, fresh_set, old)
    with first.client() as c:  # still cut off, and naming the old master
        assert int(c.sentinel_get_master_addr_by_name(fresh_set.service)[1]) == old.port


def _client_as(api: Api, sentinels: LocalSentinelSet, user: str, *sentinel_rules: str) -> Any:
    """A client logged in as ``user``, a user with exactly docs/deployment.md's line on
    the master and its replica, and ``sentinel_rules`` on each Sentinel (whose default
    user stays as it is: the user's login is accepted, so the Sentinels are asked as that
    user; their ACL LOG is emptied)."""
    data = _acl.least_privilege_acl(user, "pw", kind="sentinel", version=server_version()[1])
    for node in sentinels.nodes:
        with node.client() as c:
            c.execute_command(*data.split())
    for sentinel in sentinels.sentinels:
        with sentinel.client() as c:
            c.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *sentinel_rules)
            c.execute_command("ACL", "LOG", "RESET")
    hosts = sentinels.url.partition("://")[2]
    return api.client([f"redis+sentinel://{user}:pw@{hosts}"], **OPTIONS)


def test_the_documented_sentinel_acl_lets_the_watch_subscribe(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    user = "watcher"
    documented = _acl.sentinel_acl(user, "pw").split()
    assert documented[:6] == ["ACL", "SETUSER", user, "reset", "on", ">pw"]
    client = _client_as(api, fresh_set, user, *documented[6:])
    client.acquire(f"sentinel-acl-{api.flavour}", ttl=1.0, timeout=10.0).release()
    api.wait_until(
        lambda: any(_watched_by(s, user) for s in fresh_set.sentinels),
        what="a subscription by the documented user",
    )
    for sentinel in fresh_set.sentinels:  # nothing it asks was refused
        with sentinel.client() as c:
            assert c.acl_log() == [], sentinel


def test_a_holder_follows_a_failover_announced_while_its_subscriptions_were_down(
    api: Api, fresh_set: LocalSentinelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An announcement is not kept: a failover announced while the watch had no
    # subscription up is not heard when it subscribes again, and the connections would
    # stay on the old master (still a master) until the Sentinels demote it. The watch
    # asks each Sentinel SENTINEL MASTER before it subscribes, and the announcing one
    # after an announcement: a configuration epoch above every one heard, naming
    # another master, moves the connections as an announcement does. The first failover
    # here is heard (the reference moves with it, from the announcing Sentinel's
    # answer); the second is announced while the Sentinels refuse the subscription.
    monkeypatch.setattr(watch_rules, "REFUSED_REST", 0.5)  # asked again soon
    user = "gap"
    documented = _acl.sentinel_acl(user, "pw").split()[6:]
    client = _client_as(api, fresh_set, user, *documented)
    name = f"sentinel-gap-{api.flavour}"
    first = _lands_on(api, client, name, fresh_set)
    api.wait_until(lambda: len(_watching(fresh_set)) == 2, what="two subscriptions")
    _moved_by_the_announcement(api, client, name, fresh_set, first)
    second = fresh_set.wait_settled()  # the first master demoted: fit to be promoted
    for sentinel in fresh_set.sentinels:
        with sentinel.client() as c:
            c.execute_command("ACL", "SETUSER", user, "-subscribe")
            c.execute_command("CLIENT", "KILL", "USER", user)
    api.wait_until(lambda: not _watching(fresh_set), what="no subscription")
    assert fresh_set.failover() is first  # announced; nobody subscribed to hear it
    for sentinel in fresh_set.sentinels:
        with sentinel.client() as c:
            c.execute_command("ACL", "SETUSER", user, "+subscribe")
    assert _lands_on(api, client, name, fresh_set) is first
    assert _role(second) == "master"  # moved by the epoch, not by a demotion


def test_sentinels_refusing_the_subscription_are_not_asked_for_it_again_at_once(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    # Sentinels whose ACL lets the user ask for the master but not subscribe: the lock
    # works, and the watch, refused, asks each Sentinel once a minute (at the back-off's
    # pace it would log a refusal on each every second): SENTINEL MASTER, then the
    # subscription, each refused once.
    question = "+sentinel|get-master-addr-by-name"
    client = _client_as(api, fresh_set, "unwatched", question)
    for _ in range(3):
        client.acquire(f"sentinel-unwatched-{api.flavour}", ttl=1.0, timeout=10.0).release()
        api.idle(1.0)

    def refusals(sentinel: LocalNode) -> int:
        with sentinel.client() as c:
            return sum(int(e.get("count", 1)) for e in c.acl_log())

    assert [refusals(s) for s in fresh_set.sentinels] == [2] * len(fresh_set.sentinels)


def test_an_announced_failover_ends_the_connections_to_other_servers(
    shared_set: LocalSentinelSet,
) -> None:
    # The node's Locator, as the connections of either driver use it, on socket pairs:
    # the test holds the far end of each connection it registers.
    locator = Locator(parse_node_url(shared_set.url), {}, 1.0, asyncio=False)
    service = shared_set.service
    found = locator.locate()
    moved_to = ("127.0.0.1", 1)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        (to_old, old_end), (to_new, new_end), (late, _) = pairs
        locator.connected(found, SocketEnd(to_old))
        locator.connected(found._replace(master=moved_to), SocketEnd(to_new))
        for end in (old_end, new_end):
            end.settimeout(0.2)
        # Another service's announcement, or a message of another shape, ends nothing.
        locator.announced(f"other {found.master[0]} {found.master[1]} 127.0.0.1 1".encode())
        locator.announced(b"not an announcement")
        for end in (old_end, new_end):
            with pytest.raises(TimeoutError):
                end.recv(1)
        locator.announced(f"{service} {found.master[0]} {found.master[1]} 127.0.0.1 1".encode())
        assert old_end.recv(1) == b""  # ended: the far end reads the end of the stream
        with pytest.raises(TimeoutError):
            new_end.recv(1)  # the new master's connection stays
        # Set up from an answer the announcement overtook: refused.
        with pytest.raises(redis.ConnectionError, match=r"announced 127\.0\.0\.1:1 since"):
            locator.connected(found, SocketEnd(late))
        # Asked again after it, the Sentinels name the master they name (unchanged here).
        assert locator.locate().announced == found.announced + 1
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()


def test_a_forked_child_neither_waits_for_nor_ends_its_parents_connections(
    shared_set: LocalSentinelSet,
) -> None:
    # The parent's watch takes the Locator's lock every second: a fork() meanwhile must
    # not leave the child a lock that nobody will release. And the parent's connections
    # are the parent's: a failover the child hears ends only the child's.
    locator = Locator(parse_node_url(shared_set.url), {}, 1.0, asyncio=False)
    found = locator.locate()
    parents, parents_end = socket.socketpair()
    try:
        locator.connected(found, SocketEnd(parents))
        with locator._lock:  # as the watch may hold it at the fork
            pid = os.fork()
        if pid == 0:  # the child: exit 0 only if all went as it should
            code = 1
            try:
                childs, childs_end = socket.socketpair()
                locator.connected(found, SocketEnd(childs))
                moved = f"{shared_set.service} {found.master[0]} {found.master[1]} 127.0.0.1 1"
                locator.announced(moved.encode())
                childs_end.settimeout(2.0)
                code = 0 if childs_end.recv(1) == b"" else 2  # its own connection ended
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10.0
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)  # the child we forked, stuck on the lock
            os.waitpid(pid, 0)
            raise AssertionError("the child waited for the lock its parent held at fork()")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        parents_end.settimeout(0.2)
        with pytest.raises(TimeoutError):
            parents_end.recv(1)  # the parent's connection was not ended
        assert locator.in_use()
    finally:
        parents.close()
        parents_end.close()


def test_an_unknown_service_is_an_unreachable_node_saying_why(
    api: Api, shared_set: LocalSentinelSet
) -> None:
    url = shared_set.url.rpartition("/")[0] + "/no-such-service"
    client = api.client([url], **OPTIONS)
    with pytest.raises(tenure.QuorumUnreachable) as info:
        client.acquire("sentinel-unknown", ttl=1.0, blocking=False)
    text = str(info.value)
    assert "no Sentinel named a master for service 'no-such-service'" in text, text
    for sentinel in shared_set.sentinels:
        assert f"127.0.0.1:{sentinel.port}: does not know the service" in text, text
    _no_redis_exception(info.value)


def test_a_data_server_listed_as_a_sentinel_is_a_misconfigured_node(
    api: Api, shared_set: LocalSentinelSet
) -> None:
    """It will never name a master: a blocking acquire says so at once, naming the
    address and the fix, rather than wait out its timeout for the node to recover."""
    data_server = shared_set.master()
    client = api.client([f"redis+sentinel://127.0.0.1:{data_server.port}/locks"], **OPTIONS)
    started = time.monotonic()
    with pytest.raises(tenure.NodeMisconfigured) as info:
        client.acquire("sentinel-data-server", ttl=1.0, timeout=30.0)
    assert time.monotonic() - started < 10.0
    text = str(info.value)
    assert f"127.0.0.1:{data_server.port}: is not a Sentinel" in text, text
    assert "lists the Sentinels (usually on port 26379), not the data servers" in text, text
    _no_redis_exception(info.value)


def _dead_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def test_no_sentinel_reachable_is_an_unreachable_node_saying_why(api: Api) -> None:
    ports = _dead_ports(3)
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    client = api.client([f"redis+sentinel://{hosts}/locks"], **OPTIONS)
    with pytest.raises(tenure.QuorumUnreachable) as info:
        client.acquire("sentinel-none", ttl=1.0, blocking=False)
    text = str(info.value)
    assert "no Sentinel named a master for service 'locks'" in text, text
    for port in ports:
        assert f"127.0.0.1:{port}: " in text, text
    _no_redis_exception(info.value)


def test_without_sentinels_a_reconnect_goes_to_the_master_found_last(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    # The Sentinels down while the master is fine: a connection that breaks is set up
    # again to the master they named last, checked with ROLE.
    name = "sentinel-outage"
    client = api.client([fresh_set.url], **OPTIONS)
    master = _lands_on(api, client, name, fresh_set)
    for sentinel in fresh_set.sentinels:
        sentinel.stop()
    with master.client() as c:
        c.client_kill_filter(_type="normal", skipme=True)
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            client.acquire(name, ttl=1.0, timeout=0.5).release()
            break
        except (tenure.QuorumUnreachable, tenure.LockTimeout):
            assert time.monotonic() < deadline
            api.idle(0.05)
    assert not _holds(master, name)


def test_without_sentinels_a_master_found_last_and_gone_names_the_sentinels_too(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    """The Sentinels down, and then the master they named last: the node said only that
    the master refused the connection ("Error 111 connecting to ..."), which reads as a
    master the Sentinels are about to replace, while no Sentinel is there to replace it.
    It says now that no Sentinel answered for the service, what each said, and that the
    master named last failed too."""
    name = "sentinel-all-gone"
    client = api.client([fresh_set.url], **OPTIONS)
    master = _lands_on(api, client, name, fresh_set)
    for sentinel in fresh_set.sentinels:
        sentinel.stop()
    master.kill()
    said: list[str] = []

    def names_the_sentinels() -> bool:
        with pytest.raises(tenure.QuorumUnreachable) as info:
            client.acquire(name, ttl=1.0, blocking=False)
        _no_redis_exception(info.value)
        said.append(str(info.value))
        return "no Sentinel answered" in said[-1]

    # The first acquires may still meet the connection the master closed, or the node's
    # back-off (which names no cause): the next connection set up says it.
    deadline = time.monotonic() + 20.0
    while not names_the_sentinels():
        assert time.monotonic() < deadline, said[-1]
        api.idle(0.05)
    text = said[-1]
    assert "no Sentinel answered for service 'tenure'" in text, text
    for sentinel in fresh_set.sentinels:
        assert f"127.0.0.1:{sentinel.port}: " in text, text
    assert f"the master they named last, 127.0.0.1:{master.port}, failed too: " in text, text


def test_a_demoted_master_is_silent_not_misconfigured(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    # READONLY from a Sentinel node's master means it was demoted: the node is
    # unreachable until the Sentinels name a master again, never NodeMisconfigured
    # (which a plain node answering READONLY is).
    name = "sentinel-demoted"
    client = api.client([fresh_set.url], **OPTIONS)
    master = _lands_on(api, client, name, fresh_set)
    nowhere = _dead_ports(1)[0]
    with master.client() as c:
        c.replicaof("127.0.0.1", nowhere)
    try:
        with pytest.raises(tenure.QuorumUnreachable) as info:
            client.acquire(name, ttl=1.0, blocking=False)
        assert "its master was demoted to a replica" in str(info.value), str(info.value)
        # Connecting again finds the same server, now a replica: still only unreachable.
        api.wait_until(lambda: _fails_as_replica(client, name), within=20.0, what="ROLE refused")
    finally:
        with master.client() as c:
            c.replicaof("NO", "ONE")
    assert _lands_on(api, client, name, fresh_set) is master


def test_sentinels_out_of_date_are_asked_last(api: Api, fresh_set: LocalSentinelSet) -> None:
    """Sentinels that disagree: the first listed names the replica as master, the second
    a server that is gone, the third the master. The node was unreachable for as long
    as the first one's view stayed out of date: the Sentinel that answered was asked
    first at every connection, and named the same replica each time (a blocking acquire
    raised QuorumUnreachable, again and again). A Sentinel whose master cannot be used
    is now asked last, so the next connection hears the others."""
    master, replica = fresh_set.master(), fresh_set.replicas()[0]
    stale = {fresh_set.sentinels[0]: replica.port, fresh_set.sentinels[1]: _dead_ports(1)[0]}
    for sentinel, port in stale.items():
        with sentinel.client() as c:
            # Its own view of the service, which the others never overrule: no failover
            # has happened, so they have no newer configuration to tell it of.
            c.execute_command("SENTINEL", "REMOVE", fresh_set.service)
            c.execute_command("SENTINEL", "MONITOR", fresh_set.service, "127.0.0.1", port, 3)
            named = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", fresh_set.service)
            assert int(named[1]) == port
    name = "sentinel-disagree"
    client = api.client([fresh_set.url], **OPTIONS)
    lease = client.acquire(name, ttl=3.0, timeout=10.0)
    assert _holds(master, name)
    lease.release()
    for _ in range(3):  # and it stays so: the Sentinel that named the master is asked first
        client.acquire(name, ttl=1.0, blocking=False).release()


def _fails_as_replica(client: object, name: str) -> bool:
    try:
        client.acquire(name, ttl=1.0, blocking=False).release()  # type: ignore[attr-defined]
    except tenure.QuorumUnreachable as exc:
        return "is a slave" in str(exc)
    return False


@pytest.mark.parametrize(
    ("scheme", "says"),
    [
        ("redis+sentinal", "has scheme 'redis+sentinal' (did you mean redis+sentinel://?)"),
        ("sentinel", "has scheme 'sentinel' (did you mean redis+sentinel://?)"),
        ("redis", "lists several hosts"),
    ],
)
def test_a_misspelt_sentinel_url_names_the_form_not_a_port(
    api: Api, shared_set: LocalSentinelSet, scheme: str, says: str
) -> None:
    """A Sentinel URL with a typo in its scheme, or its hosts under redis://, was read as
    one host whose port is "P1,127.0.0.1:P2,...": the message named a port that is not a
    number, neither the mistake nor the fix."""
    hosts = shared_set.url.partition("://")[2].rpartition("/")[0]
    url = f"{scheme}://user:Zq9xWv7kJm4@{hosts}/{shared_set.service}"
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client([url], **OPTIONS)
    text = str(info.value)
    assert text.startswith("nodes[0]: "), text
    assert says in text, text
    assert "redis+sentinel://" in text, text
    assert "Port could not be cast" not in text, text
    assert "Zq9xWv7kJm4" not in text, text


def test_sentinels_with_a_login_of_their_own_say_how_to_give_it(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    """Sentinels with a password other than the master's: the URL's credentials are the
    master's, the Sentinels refuse them and a request without any. The node is
    misconfigured, at once, and the message says the URL holds one login for both and
    names the two fixes; the generic advice (put the password in the URL) sent the
    reader back to the URL that already had the only password it can hold."""
    for node in fresh_set.nodes:
        with node.client() as c:
            c.config_set("masterauth", "master-pw")
            c.config_set("requirepass", "master-pw")
    for sentinel in fresh_set.sentinels:
        with sentinel.client() as c:
            c.execute_command("SENTINEL", "SET", fresh_set.service, "auth-pass", "master-pw")
            c.execute_command("ACL", "SETUSER", "default", "on", ">sentinel-pw")
    hosts = fresh_set.url.partition("://")[2]
    client = api.client([f"redis+sentinel://:master-pw@{hosts}"], **OPTIONS)
    started = time.monotonic()
    with pytest.raises(tenure.NodeMisconfigured) as info:
        client.acquire("sentinel-login", ttl=1.0, timeout=30.0)
    assert time.monotonic() - started < 10.0
    text = str(info.value)
    assert f"{fresh_set.url} cannot be found: no Sentinel named a master" in text, text
    for sentinel in fresh_set.sentinels:
        assert f"127.0.0.1:{sentinel.port}: requires a login of its own (NOAUTH" in text, text
    assert "used for the master and the Sentinels alike" in text, text
    assert "master_for() client" in text, text
    assert "sentinel_kwargs" in text, text
    assert "master-pw" not in text, text
    _no_redis_exception(info.value)
    # The fix the message names works: the Sentinels' own login in sentinel_kwargs.
    fixed = api.client([_master_for(fresh_set, "sentinel-pw")], **OPTIONS)
    fixed.acquire("sentinel-login", ttl=1.0, timeout=10.0).release()
    # A wrong one there is named as sentinel_kwargs', the master's settings being right.
    wrong = api.client([_master_for(fresh_set, "not-the-sentinel-pw")], **OPTIONS)
    with pytest.raises(tenure.NodeMisconfigured) as info:
        wrong.acquire("sentinel-login", ttl=1.0, timeout=30.0)
    text = str(info.value)
    assert "refused the user and password of sentinel_kwargs, and a request without" in text
    assert "give the Sentinels' user and password there" in text, text
    assert "pw" not in text.replace("password", ""), text
    _no_redis_exception(info.value)


def _addresses(sentinels: LocalSentinelSet) -> list[tuple[str, int]]:
    """The Sentinels' addresses, as redis-py's ``Sentinel`` takes them."""
    ports = [s.port for s in sentinels.sentinels]
    assert None not in ports, "Sentinels listen on TCP"
    return [("127.0.0.1", p) for p in ports if p is not None]


def _master_for(sentinels: LocalSentinelSet, sentinel_password: str) -> Any:
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        _addresses(sentinels),
        sentinel_kwargs={"password": sentinel_password},
        password="master-pw",
    )
    return manager.master_for(sentinels.service)  # type: ignore[no-untyped-call,unused-ignore]


def test_a_master_short_of_replicas_says_which_setting_refuses(
    api: Api, shared_set: LocalSentinelSet
) -> None:
    """min-replicas-to-write above the replicas connected: the master answers every
    write NOREPLICAS. Promptly an unreachable node (it passes when replicas come back),
    never a raw redis-py error, and the message names the setting and the fix."""
    master = shared_set.master()
    with master.client() as c:
        c.config_set("min-replicas-to-write", "2")  # one replica runs
    try:
        client = api.client([shared_set.url], **OPTIONS)
        started = time.monotonic()
        with pytest.raises(tenure.QuorumUnreachable) as info:
            client.acquire(f"sentinel-noreplicas-{api.flavour}", ttl=1.0, timeout=30.0)
        assert time.monotonic() - started < 10.0
    finally:
        with master.client() as c:
            c.config_set("min-replicas-to-write", "0")
    text = str(info.value)
    assert "NOREPLICAS" in text, text
    assert "min-replicas-to-write" in text, text
    assert "lower min-replicas-to-write or add replicas" in text, text
    _no_redis_exception(info.value)


def test_status_does_not_read_a_replica_the_sentinels_still_name(
    fresh_set: LocalSentinelSet,
) -> None:
    """Sentinels whose view is out of date name a server that is a replica now. The
    clients refuse it (ROLE) and find the node unreachable; ``tenure status`` read the
    replica's keys as the master's, and counted the node as answering (exit 0)."""
    master = fresh_set.master()
    with master.client() as c:
        c.replicaof("127.0.0.1", _dead_ports(1)[0])
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(["status", "sentinel-stale", "--redis", fresh_set.url])
    finally:
        with master.client() as c:
            c.replicaof("NO", "ONE")
    text = out.getvalue()
    assert code == EXIT_UNAVAILABLE, text
    assert f"(master 127.0.0.1:{master.port})  unreachable: " in text, text
    assert f"127.0.0.1:{master.port}, named master of service 'tenure'" in text, text
    assert "is a slave" in text, text
    assert "Traceback" not in text, text


# What the advice to give the master's password shows: the node's own kind of URL.
_SENTINEL_LOGIN_FORM = "redis+sentinel://user:password@host:port[,host:port...]/service_name"


def _master_needs_a_password(sentinels: LocalSentinelSet) -> None:
    """The master (and its replica) require a password the Sentinels know and the
    node's URL lacks; the Sentinels themselves require none."""
    for node in sentinels.nodes:
        with node.client() as c:
            c.config_set("masterauth", "master-pw")
            c.config_set("requirepass", "master-pw")
    for sentinel in sentinels.sentinels:
        with sentinel.client() as c:
            c.execute_command("SENTINEL", "SET", sentinels.service, "auth-pass", "master-pw")


def test_a_master_password_missing_from_the_url_is_asked_for_in_the_sentinel_form(
    api: Api, fresh_set: LocalSentinelSet
) -> None:
    """The advice showed redis://user:password@host:port, a URL of one server: followed,
    it lists the master itself and loses the Sentinels. It shows the form the user wrote."""
    _master_needs_a_password(fresh_set)
    client = api.client([fresh_set.url], **OPTIONS)
    with pytest.raises(tenure.NodeMisconfigured) as info:
        client.acquire("sentinel-master-login", ttl=1.0, timeout=30.0)
    text = str(info.value)
    assert f"node {fresh_set.url} requires a password: give it in the node URL (" in text, text
    assert f"({_SENTINEL_LOGIN_FORM})" in text, text
    assert "redis://" not in text, text


def test_status_and_check_ask_for_a_master_password_in_the_sentinel_form(
    fresh_set: LocalSentinelSet,
) -> None:
    _master_needs_a_password(fresh_set)
    for command in (["status", "sentinel-master-login"], ["check"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main([*command, "--redis", fresh_set.url])
        text = out.getvalue()
        assert code == EXIT_UNAVAILABLE, text
        assert "misconfigured: requires a password: give it in the node URL (" in text, text
        assert f"({_SENTINEL_LOGIN_FORM})" in text, text
        assert "redis://" not in text, text

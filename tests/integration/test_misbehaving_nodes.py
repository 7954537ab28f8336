"""Nodes that answer, but wrongly: never a redis-py exception, always a per-node failure.

Two kinds, against real servers, for both APIs in one body:

* something that is not Redis at a node's address (an HTTP server, random bytes, a
  service that answers in RESP but not as Redis: an echo, "+OK" to anything): every
  path (acquire, extend, release, the cleanup of a failed attempt, waiting with its
  notifications, ``locked()``) counts it as one failed node, and the others lock on;
* a node set up wrongly (a read-only replica, a wrong or missing password, an ACL user
  without the keys): one such node of three is logged once and done without; two leave
  no majority, and a blocking acquire raises ``NodeMisconfigured`` at once, naming the
  node and the fix, rather than waiting for a recovery that will not come.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import redis

import tenure
from tenure._core.config import LockKeys
from tenure.testing import LocalCluster, LocalNode
from tenure.testing.topologies import server_version
from tenure.verify.proxy import Proxy

from .conftest import LEAST_PRIVILEGE, Api, poll_until, scripts_run
from .garbage import GarbageServer, SlowSubscribe
from .hold_proxy import HoldingProxy

TTL = 2.0


@pytest.fixture(scope="module")
def redis2() -> Iterator[LocalCluster]:
    """Two healthy nodes, next to which a test puts a third that is not Redis.

    Used once by both first: a test that locks on the first alone would otherwise leave
    the second blank beside a node with a floor, and a later lock on both would sit out a
    warm-up of max_ttl (docs/fencing.md), longer than a test's time limit, depending on
    the order the tests ran in."""
    with LocalCluster(2) as cluster:
        with tenure.Client(cluster.urls, allow_even=True) as client:
            client.acquire("tenure-tests:set-up", ttl=1.0).release()
        yield cluster


def _give_history(api: Api, urls: list[str], key: str) -> None:
    """Use lock ``key`` once on ``urls`` alone, so those nodes have a floor.

    A node set that was never used is set up once every node has answered, or else with
    a warm-up of max_ttl (docs/fencing.md); that is not what these tests are about.
    """
    api.client(urls, allow_even=len(urls) % 2 == 0).acquire(key, ttl=TTL).release()


def _tenure_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tenure"]


@pytest.mark.parametrize(
    ("speaks", "password"),
    [
        ("http", False),  # garbage in reply to our commands
        ("http", True),  # garbage in reply to the AUTH of the connection handshake
        ("random", False),
        # Valid RESP, but not Redis: the replies cannot be the scripts' or EXISTS's.
        ("echo", False),
        ("ok", False),
        ("one", False),
    ],
)
def test_a_node_that_is_not_redis_is_one_failed_node(
    api: Api,
    redis2: LocalCluster,
    key: str,
    speaks: str,
    password: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with GarbageServer(speaks) as garbage, caplog.at_level(logging.WARNING, logger="tenure"):
        _give_history(api, redis2.urls, key)
        listed = garbage.url.replace("redis://", "redis://:secret@") if password else garbage.url
        urls = [redis2.urls[0], listed, redis2.urls[1]]
        # Both real nodes must answer every round (the third cannot): a node timeout of
        # 0.25 s, five times the default, so that a real node a loaded machine runs late
        # is not a second failure.
        a, b = api.client(urls, node_timeout=0.25), api.client(urls, node_timeout=0.25)
        for _ in range(5):
            lease = a.acquire(key, ttl=TTL)
            assert set(lease.nodes) == set(redis2.urls)
            assert a.lock(key, ttl=TTL).locked() is True
            lease.extend()
            # Held: b's attempt fails, and its cleanup goes to the node that failed too.
            assert b.lock(key, ttl=TTL).acquire(blocking=False) is False
            lease.release()
            assert a.lock(key, ttl=TTL).locked() is False
        # Waiting: b subscribes on every node (the garbage one too) and waits for a lease
        # that runs out, then gets the lock from the two real nodes.
        short = a.acquire(key, ttl=0.6)  # (the shortest TTL for that node timeout)
        second = b.acquire(key, ttl=TTL, timeout=10.0)
        assert second.acquired_at >= short.valid_until
        second.release()
        # Alone, it is a clear error of tenure's, never a redis-py exception.
        alone = api.client([listed])
        with pytest.raises(tenure.TenureError) as info:
            alone.acquire(key, ttl=TTL, blocking=False)
        if speaks != "random":
            assert isinstance(info.value, tenure.NodeMisconfigured)
            assert info.value.node == garbage.url
            assert "does not speak the Redis protocol" in str(info.value)
            assert "check the host and port" in str(info.value)
        if speaks == "http":
            # (A reply in RESP that is not Redis's is told only when read within its
            # round: one that came after the healthy nodes decided it is dropped unread.)
            told = [w for w in _tenure_warnings(caplog) if garbage.url in w]
            # Once per client that locks without it: a and b each say it once. Alone, it
            # leaves no majority: the error names it, and no warning says that "locks
            # need a majority of the other nodes".
            assert len(told) == 2, told


@pytest.mark.timeout(60)  # without a diagnosis, the blocking acquire never returns
@pytest.mark.parametrize("speaks", ["echo", "ok", "one"])
def test_nodes_that_speak_resp_but_are_not_redis_leaving_no_majority_raise_at_once(
    api: Api, redis2: LocalCluster, key: str, speaks: str
) -> None:
    # docs/errors.md: a node that is not Redis at all is a misconfiguration; when such
    # nodes leave no majority, acquire() raises NodeMisconfigured at once, even blocking
    # without a timeout, and locked() raises rather than answer. Replies that are valid
    # RESP but cannot be our scripts' or EXISTS's (an echo of the command, "+OK", ":1"
    # to anything) are as much not the Redis protocol as an HTTP reply is: not a node
    # where the lock is held elsewhere (a LockTimeout without a reason, a blocking
    # acquire waiting forever), nor an answer to locked() (":1" said "locked").
    with GarbageServer(speaks) as first, GarbageServer(speaks) as second:
        _give_history(api, redis2.urls[:1], key)
        fakes = {first.url, second.url}

        def check(error: tenure.NodeMisconfigured) -> None:
            assert error.node in fakes
            assert "does not speak the Redis protocol" in str(error)
            assert "check the host and port" in str(error)
            assert set(error.node_errors) <= fakes
            for said in error.node_errors.values():  # what came, said once
                assert said.count("does not speak the Redis protocol (a reply that is not") == 1

        # Alone, EXISTS's answer is the only one locked() hears.
        with pytest.raises(tenure.NodeMisconfigured) as info:
            api.client([first.url]).lock(key, ttl=TTL).locked()
        check(info.value)

        client = api.client([redis2.urls[0], first.url, second.url])
        with pytest.raises(tenure.NodeMisconfigured) as info:
            client.acquire(key, ttl=TTL, blocking=False)
        check(info.value)
        assert set(info.value.node_errors) == fakes
        started = time.monotonic()
        with pytest.raises(tenure.NodeMisconfigured) as info:
            client.acquire(key, ttl=TTL)  # blocking, without a timeout
        check(info.value)
        assert time.monotonic() - started < 5.0
        with pytest.raises(tenure.NodeMisconfigured) as info:
            client.lock(key, ttl=TTL).locked()
        check(info.value)
        # Nothing of the failed attempts stays on the real node.
        api.client(redis2.urls[:1]).acquire(key, ttl=TTL, blocking=False).release()


@pytest.mark.timeout(60)  # a hang guard: the blocking client read such a reply for ever
def test_a_node_that_sends_its_reply_a_byte_at_a_time_is_not_waited_for_ever(
    api: Api, redis2: LocalCluster, key: str
) -> None:
    # A node that begins its reply and sends the rest a byte at a time, each byte well
    # within any socket timeout (a stalled proxy, a server dying slowly): no timeout of
    # the socket's ends that reply. Alone, the acquire fails (the node gave no answer in
    # time); beside two healthy nodes, it is granted by them. (node_timeout is ten
    # bytes' wait: each byte comes well within the socket's timeout.)
    with GarbageServer("slow") as slow:
        with pytest.raises(tenure.AcquireError):
            api.client([slow.url], node_timeout=0.5).acquire(key, ttl=TTL, blocking=False)
        assert slow.connected.is_set()
        _give_history(api, redis2.urls, key)
        client = api.client([*redis2.urls, slow.url], node_timeout=0.5)
        for _ in range(2):  # the second time, the first answer is still owed
            lease = client.acquire(key, ttl=TTL, blocking=False)
            assert slow.url not in lease.nodes, lease.nodes
            lease.release()


def _threads_started_since(before: set[threading.Thread], name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t not in before]


@pytest.mark.timeout(60)
def test_a_set_up_given_up_on_a_node_sending_its_handshake_reply_a_byte_at_a_time_ends(
    key: str,
) -> None:
    # A node URL with a password: the connection's set-up sends AUTH, and the node sends
    # its reply a byte at a time. The acquire gives the node up at connect_timeout; the
    # set-up's thread, reading the reply byte by byte with each wait well within its
    # socket timeout, went on for ever (one thread and one socket more each time the
    # node was tried again). Given up, its socket is shut down and the thread ends.
    before = set(threading.enumerate())
    with GarbageServer("slow") as slow:
        url = f"redis://:pw@127.0.0.1:{slow.port}"
        with tenure.Client([url], node_timeout=0.05, connect_timeout=0.3) as client:
            with pytest.raises(tenure.AcquireError):
                client.acquire(key, ttl=TTL, blocking=False)
            assert slow.connected.is_set()
            deadline = time.monotonic() + 5.0  # a grace for the thread to see its socket shut
            while _threads_started_since(before, "tenure-connect"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert not _threads_started_since(before, "tenure-connect")


@pytest.mark.timeout(60)  # a hang guard
def test_a_node_that_sends_its_subscribe_reply_a_byte_at_a_time_costs_only_the_recheck(
    api: Api, redis2: LocalCluster, key: str
) -> None:
    # A healthy node whose release notifications pass through something that stalls
    # (a proxy): its reply to SUBSCRIBE comes a byte at a time, never whole. A waiting
    # acquire still ends at its timeout, still gets the lock at its fallback re-check
    # once the holder released it, and closing the client ends its listener at once.
    node = redis2[0]
    assert node.port is not None
    before = set(threading.enumerate())
    with SlowSubscribe(node.host, node.port) as proxy, tenure.Client(redis2.urls[:1]) as other:
        holder = other.acquire(key, ttl=30.0)
        waiter = api.client([proxy.url], recheck=1.0, node_timeout=0.2, connect_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(tenure.AcquireError):
            waiter.acquire(key, ttl=TTL, timeout=1.0)
        assert time.monotonic() - started < 5.0  # a hang guard: it ends at its timeout
        assert proxy.subscribed.is_set()
        release = threading.Timer(0.5, holder.release)
        release.start()
        try:
            lease = waiter.acquire(key, ttl=TTL, timeout=10.0)
        finally:
            release.join()
        assert lease.fencing_token > holder.fencing_token
        lease.release()
        closed = time.monotonic()
        api.close_clients()
        assert time.monotonic() - closed < 3.0  # a hang guard
    deadline = time.monotonic() + 5.0
    names = ("tenure-notify", "tenure-connect")
    while any(_threads_started_since(before, n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [t for n in names for t in _threads_started_since(before, n)]


@pytest.mark.timeout(60)  # a hang guard
def test_a_notification_set_up_answered_a_byte_at_a_time_is_given_up_and_tried_again(
    api: Api, redis2: LocalCluster, key: str
) -> None:
    # A third node sends its reply to AUTH a byte at a time: every set-up on it, the
    # notification listener's included, is given up at connect_timeout, and the listener
    # tries the node again after its back-off (the node may come back). The asyncio
    # listener's task read that first reply for ever instead: the node's notifications
    # never came back, whatever became of it, until the client was closed.
    with GarbageServer("slow") as slow:
        urls = [*redis2.urls, f"redis://:pw@127.0.0.1:{slow.port}"]
        _give_history(api, redis2.urls, key)
        holder = api.client(urls, node_timeout=0.2, connect_timeout=0.3)
        lease = holder.acquire(key, ttl=30.0)
        waiter = api.client(urls, node_timeout=0.2, connect_timeout=0.3)
        with pytest.raises(tenure.AcquireError):
            waiter.acquire(key, ttl=TTL, timeout=1.0)
        # No round runs from now on: only the waiter's listener connects to the node.
        tried = slow.accepted
        api.wait_until(lambda: slow.accepted > tried, what="the node tried again")
        lease.release()
        closed = time.monotonic()
        api.close_clients()
        assert time.monotonic() - closed < 3.0  # a hang guard


def _misconfigure(kind: str, node: LocalNode, spare: LocalNode, first: bool) -> str:
    """Set ``node`` up wrongly in the way ``kind`` says; the URL a client would list."""
    assert node.port is not None
    if kind == "replica":
        node.replicate_from(spare)
        node.wait_replication_link()
        return node.url
    if kind == "password":
        with node.client() as c:
            c.config_set("requirepass", "secret")
        # A wrong password, or none at all.
        return f"redis://:wrong@127.0.0.1:{node.port}" if first else node.url
    if kind == "client_name":
        # docs/deployment.md's least-privilege user, and a client that names itself
        # (redis-py sends CLIENT SETNAME on every new connection).
        with node.client() as c:
            c.execute_command(
                "ACL", "SETUSER", "lp", "reset", "on", ">pw", "~tenure:*", "&*",
                *LEAST_PRIVILEGE,
            )  # fmt: skip
        return f"redis://lp:pw@127.0.0.1:{node.port}?client_name=app"
    if kind == "database":
        # The same user, on a node whose URL names a database: every connection sends
        # SELECT, which that line does not grant (docs/deployment.md: add +select).
        with node.client() as c:
            c.execute_command(
                "ACL", "SETUSER", "lp", "reset", "on", ">pw", "~tenure:*", "&*",
                *LEAST_PRIVILEGE,
            )  # fmt: skip
        return f"redis://lp:pw@127.0.0.1:{node.port}/{_DATABASE}"
    assert kind == "acl"
    with node.client() as c:
        # A user who may run anything, but on no key of tenure's.
        c.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~app:*", "&*", "+@all")
    return f"redis://app:pw@127.0.0.1:{node.port}"


def _evals(node: LocalNode) -> int:
    """How many scripts ``node`` has run (INFO commandstats)."""
    return scripts_run(node)


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_missing_password_is_asked_for_in_the_nodes_own_form_of_url(
    api: Api, key: str, unix: bool
) -> None:
    # The advice showed redis://user:password@host:port for every node: a unix socket's
    # user was shown a TCP URL (only Sentinel nodes had their own form).
    with LocalCluster(1, unix=unix) as one:
        with one[0].client() as c:
            c.config_set("requirepass", "secret")
        with pytest.raises(tenure.NodeMisconfigured) as info:
            api.client(one.urls).acquire(key, ttl=TTL, blocking=False)
    form = "unix://user:password@/path/to/socket" if unix else "redis://user:password@host:port"
    assert f"requires a password: give it in the node URL ({form})" in str(info.value)


# What the error and the warning must say, per kind: the problem, and the fix.
_SAYS = {
    "replica": ("read-only replica", "list its master instead"),
    "password": ("password", "node URL"),
    "acl": ("ACL", "~tenure:*"),
    "client_name": ("CLIENT SETNAME", "+client|setname"),
    # It said to grant EVAL, EXISTS, WAIT, SUBSCRIBE and the scripts' commands, which the
    # user had: the one missing permission went unnamed.
    "database": ("SELECT", "+select", "database 0"),
}

# The database the "database" kind's URLs name.
_DATABASE = 3


@pytest.mark.parametrize("kind", ["replica", "password", "acl", "client_name", "database"])
def test_misconfigured_nodes_are_named_with_the_fix(
    api: Api, key: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with LocalCluster(4) as cluster, caplog.at_level(logging.WARNING, logger="tenure"):
        spare = cluster[3]  # the replica's master, never a lock node
        _give_history(api, cluster.urls[1:3], key)
        urls = cluster.urls[:3]
        shown = list(urls)  # as nodes are named in leases and errors (no credentials)
        urls[0] = _misconfigure(kind, cluster[0], spare, first=True)
        if kind == "database":
            shown[0] = f"{shown[0]}/{_DATABASE}"

        # One of three: the other two lock, and the node is logged once, with the fix.
        client = api.client(urls)
        for _ in range(3):
            lease = client.acquire(key, ttl=TTL)  # blocking, no timeout: must not hang
            assert set(lease.nodes) == {shown[1], shown[2]}
            assert client.lock(key, ttl=TTL).locked() is True
            lease.extend()
            lease.release()
        # A node whose every answer came after its round (a loaded machine) is told when
        # a later round on its connection reads them: more cycles, if need be (13
        # cycles were not enough once, beside a CPU hog).
        deadline = time.monotonic() + 10.0
        while not _tenure_warnings(caplog) and time.monotonic() < deadline:
            client.acquire(key, ttl=TTL).release()
        told = _tenure_warnings(caplog)
        assert len(told) == 1, told
        assert shown[0] in told[0]
        for words in _SAYS[kind]:
            assert words in told[0], told[0]

        # Two of three: no majority is left, and waiting would not bring one back.
        urls[1] = _misconfigure(kind, cluster[1], spare, first=False)
        if kind == "database":
            shown[1] = f"{shown[1]}/{_DATABASE}"
        stuck = api.client(urls)
        evals = _evals(cluster[2])
        with pytest.raises(tenure.NodeMisconfigured) as info:
            stuck.acquire(key, ttl=TTL)  # blocking, no timeout: raises at once
        # At once: one attempt reached the healthy node, then the release of its grant
        # there; no retries, as there would be for nodes that are merely down.
        assert _evals(cluster[2]) - evals <= 2
        error = info.value
        assert isinstance(error, tenure.ConfigurationError)
        assert isinstance(error, ValueError)
        assert error.node in (shown[0], shown[1])
        assert error.parameter in ("nodes[0]", "nodes[1]")
        assert set(error.node_errors) >= {shown[0], shown[1]}
        for words in _SAYS[kind]:
            assert words in str(error), str(error)
        if kind in ("acl", "client_name", "database"):
            assert isinstance(error, tenure.ServerUnsupported)
        if kind != "replica":  # a replica answers reads; the others refuse EXISTS too
            with pytest.raises(tenure.NodeMisconfigured):
                stuck.lock(key, ttl=TTL).locked()


def test_a_node_that_refuses_only_the_subscription_is_told_as_such(
    api: Api, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose ACL grants the lock's commands but not the wake channels still
    locks: the warning says its waiters re-check, not that locks need the others."""
    with LocalCluster(3) as cluster, caplog.at_level(logging.WARNING, logger="tenure"):
        _give_history(api, cluster.urls, key)
        urls = list(cluster.urls)
        with cluster[0].client() as c:
            c.execute_command(
                "ACL", "SETUSER", "nosub", "reset", "on", ">pw", "~tenure:*", "resetchannels",
                *LEAST_PRIVILEGE,
            )  # fmt: skip
        urls[0] = f"redis://nosub:pw@127.0.0.1:{cluster[0].port}"
        holder, waiter = api.client(urls), api.client(urls)
        for _ in range(20):  # it still locks (a round is decided by the first two)
            lease = holder.acquire(key, ttl=TTL)
            if cluster.urls[0] in lease.nodes:
                break
            lease.release()
        assert cluster.urls[0] in lease.nodes
        short = holder.acquire(f"{key}-short", ttl=0.5)
        # The waiter subscribes on every node, and the first refuses it.
        waiter.acquire(f"{key}-short", ttl=TTL, timeout=10.0).release()
        assert not short.valid
        lease.release()
        told = [w for w in _tenure_warnings(caplog) if cluster.urls[0] in w]
        assert told, _tenure_warnings(caplog)
        assert all("waiters re-check" in w for w in told), told
        assert not any("majority of the other nodes" in w for w in told), told


def test_a_misconfigured_node_that_answers_late_is_told_all_the_same(
    api: Api, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only replica behind a slow link: each of its READONLY replies comes after
    the two healthy nodes decided the round, and is read (and dropped) by a later one.
    What it says of the node's configuration is told all the same, once."""
    with LocalCluster(4) as cluster, caplog.at_level(logging.WARNING, logger="tenure"):
        _give_history(api, cluster.urls[1:3], key)
        _misconfigure("replica", cluster[0], cluster[3], first=True)
        slow = Proxy(cluster[0].host, cluster[0].port or 0, name="slow")
        slow.start()
        try:
            slow.delay(0.2)  # four node timeouts: never in time
            client = api.client([slow.url, *cluster.urls[1:3]], node_timeout=0.05)
            for _ in range(20):
                lease = client.acquire(key, ttl=TTL)
                assert slow.url not in lease.nodes
                lease.release()
                if _tenure_warnings(caplog):
                    break
                api.idle(0.25)  # the late replies come in; the next round reads them
            told = _tenure_warnings(caplog)
            assert len(told) == 1, told
            assert slow.url in told[0]
            for words in _SAYS["replica"]:
                assert words in told[0], told[0]
        finally:
            slow.close()


def test_a_database_number_written_into_a_unix_socket_path_is_a_misconfigured_node(
    api: Api,
) -> None:
    """``unix:///run/redis.sock/2`` (the number belongs in ``?db=2``) connects to a path
    one of whose parts is a socket, not a directory. It was an outage ("Not a directory":
    ``QuorumUnreachable`` ... "until they recover"), which no wait fixes."""
    with LocalCluster(1, unix=True) as cluster:
        wrong = cluster.urls[0].partition("?")[0] + "/2"
        client = api.client([wrong])
        with pytest.raises(tenure.NodeMisconfigured, match=r"\?db=N") as info:
            client.acquire("db-in-path", ttl=1.0)  # blocking, no timeout: at once all the same
        assert info.value.parameter == "nodes[0]"


@contextlib.contextmanager
def _busy(node: LocalNode) -> Iterator[None]:
    """``node`` runs a script that never ends (from a connection of its own), and
    answers every other command ``BUSY``, until the block ends and ``SCRIPT KILL``
    stops it: what a long Lua script of another application does to a lock node."""
    with node.client() as admin:
        try:
            admin.config_set("busy-reply-threshold", 10)
        except redis.ResponseError:  # Redis 6.2's name for it
            admin.config_set("lua-time-limit", 10)
        runner = node.client(socket_timeout=None)
        ended: list[BaseException] = []

        def run() -> None:
            try:
                runner.eval("while true do end", 0)
            except redis.ResponseError as e:  # the SCRIPT KILL
                ended.append(e)

        thread = threading.Thread(target=run, name="busy-script", daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 10.0
            while True:  # until the node says BUSY to others
                assert time.monotonic() < deadline, "the node never answered BUSY"
                try:
                    admin.ping()
                except redis.ResponseError as e:
                    if str(e).startswith("BUSY"):
                        break
                    raise
            yield
        finally:
            deadline = time.monotonic() + 10.0
            while thread.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(redis.ResponseError):  # not yet running
                    admin.script_kill()
                thread.join(0.05)
            runner.close()
        assert ended, "the busy script did not end"


def test_locked_does_not_answer_not_locked_while_a_failed_node_may_hold_it(
    api: Api, key: str
) -> None:
    """A lock held on nodes 1 and 2 of three; node 1 answers BUSY (a long script of
    another application), node 0 "not held", node 2 "held". Whether a majority holds it
    depends on node 1, so locked() cannot answer: it raises QuorumUnreachable naming
    node 1. Counting node 1's failure as a "no", it answered False about a lock held on
    a majority, while an acquire was refused it."""
    with LocalCluster(3) as cluster:
        _give_history(api, cluster.urls, key)
        # Half a second for BUSY to be read, not 50 ms: a loaded machine reads it late,
        # and a node that said nothing is another failure than one that said BUSY.
        client = api.client(cluster.urls, node_timeout=0.5)
        with _busy(cluster[0]):  # the lease is granted by nodes 1 and 2 only
            lease = client.acquire(key, ttl=30.0)
        assert set(lease.nodes) == set(cluster.urls[1:])
        lock = client.lock(key, ttl=30.0)
        assert lock.locked() is True
        free = client.lock(f"{key}-free", ttl=30.0)
        # Another client, its connections up before node 1 is busy: a client's first
        # round does not wait for a node it is still connecting to once the others could
        # decide it, and node 1's BUSY then leaves no majority (QuorumUnreachable, seen
        # on a loaded machine with a client made per attempt).
        other = api.client(cluster.urls)
        assert other.lock(f"{key}-free", ttl=1.0).locked() is False
        with _busy(cluster[1]):
            for _ in range(5):
                with pytest.raises(tenure.QuorumUnreachable) as info:
                    lock.locked()
                assert set(info.value.node_errors) == {cluster.urls[1]}
                said = info.value.node_errors[cluster.urls[1]]
                assert "BUSY" in said
                assert "SCRIPT KILL" in said  # what to do
                assert "1 hold the lock and 1 do not" in str(info.value)
                # What the others say settles it for a free lock: two "no" of three.
                assert free.locked() is False
                # An acquire is refused it all the same.
                assert other.lock(key, ttl=1.0).acquire(blocking=False) is False
        assert lock.locked() is True
        lease.release()
        assert lock.locked() is False


def test_a_new_clients_node_slower_to_connect_is_waited_for_when_a_connected_one_fails(
    api: Api, key: str
) -> None:
    """A new client's first round begins once the nodes connected could decide it, a
    node still connecting sitting it out. When one of those connected then fails (BUSY:
    a long script of another application), the slower node decides the round: the
    client waits for its set-up and asks again, rather than calling two of three nodes
    failed. Before, a free lock's non-blocking acquire raised QuorumUnreachable ("2 of 3
    nodes failed"), one of them healthy and only connecting."""
    with LocalCluster(3) as cluster:
        _give_history(api, cluster.urls, key)
        slow = cluster[2]
        assert slow.port is not None
        with HoldingProxy((slow.host, slow.port)) as proxy, _busy(cluster[1]):
            # The client name: a set-up that sends something (CLIENT SETNAME), which the
            # proxy holds back for 0.5 s, ten node timeouts.
            proxy.slow_new(0.5)
            urls = [cluster.urls[0], cluster.urls[1], f"{proxy.url}?client_name=slow"]
            client = api.client(urls, connect_timeout=3.0)
            lease = client.lock(key, ttl=30.0).acquire(blocking=False)
            assert lease is True
        with slow.client() as c:  # granted by nodes 0 and 2
            assert c.exists(LockKeys.of(key).lock)


def test_a_full_node_is_an_outage_that_says_what_to_do(api: Api, key: str) -> None:
    """Nodes at their maxmemory under noeviction refuse the acquire's writes (OOM): one
    of three is done without; two leave no majority, and the error names them with the
    fix (their own words say only that the command is not allowed). Locks held on them
    stay, and are released."""
    with LocalCluster(3) as cluster:
        _give_history(api, cluster.urls, key)
        client = api.client(cluster.urls)
        held = client.acquire(key, ttl=30.0)

        def fill(node: LocalNode) -> None:
            with node.client() as admin:
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", 1)  # below what it uses: full at once

        fill(cluster[0])
        lease = client.acquire(f"{key}-2", ttl=30.0)
        assert set(lease.nodes) == set(cluster.urls[1:])
        lease.release()
        fill(cluster[1])
        for blocking in (False, True):
            with pytest.raises(tenure.QuorumUnreachable) as info:
                client.acquire(f"{key}-3", ttl=30.0, blocking=blocking)
            assert set(info.value.node_errors) == set(cluster.urls[:2])
            for said in info.value.node_errors.values():
                assert "OOM" in said
                assert "is full" in said, said
                assert "maxmemory raised" in said, said
        # Held where it was granted (a full node still deletes and expires keys).
        assert client.lock(key, ttl=30.0).locked() is True
        held.extend()
        held.release()
        assert client.lock(key, ttl=30.0).locked() is False
        for node in cluster:
            with node.client() as raw:
                assert all(raw.pttl(k) > 0 for k in raw.scan_iter("tenure:{*")), node


def test_a_node_at_its_connection_limit_says_so_with_the_fix(api: Api, key: str) -> None:
    """A node at its ``maxclients`` sends its refusal as it takes a connection, and
    closes it. The blocking client reported redis-py's words alone, without the fix; the
    asyncio client, when the refusal came before its first request was written, only
    "connection closed by the node". Every attempt of every client says why now."""
    with LocalCluster(1) as one:
        node = one[0]
        with node.client() as admin:
            limit = admin.config_get("maxclients")["maxclients"]
            admin.config_set("maxclients", admin.info("clients")["connected_clients"])
            try:
                for _ in range(6):
                    client = api.client(one.urls, connect_timeout=2.0)
                    for wait in ({"blocking": False}, {"timeout": 0.3}):
                        with pytest.raises(tenure.QuorumUnreachable) as info:
                            client.acquire(key, ttl=TTL, **wait)
                        (said,) = info.value.node_errors.values()
                        assert said.startswith("unreachable: refused the connection"), said
                        assert "max number of clients reached" in said, said
                        assert "raise its maxclients" in said, said
            finally:
                admin.config_set("maxclients", limit)
        client = api.client(one.urls)
        client.acquire(key, ttl=TTL).release()


def test_a_node_loading_its_data_says_so_with_the_fix(api: Api, key: str) -> None:
    """A node restarted with its data answers every command ``LOADING`` until it has
    read it back. The blocking client reported redis-py's words without the code
    ("unreachable: Valkey is loading the dataset in memory") and neither client said
    what it meant; both do now, and the node takes part again once loaded."""
    family, version = server_version()
    if family == "redis" and version < (7, 0):
        pytest.skip("Redis 6.2 has no loading-process-events-interval-bytes")
    # A key a millisecond, and a look at the clients between them: a few seconds of
    # answering LOADING from a small data set.
    slow_load = {"key-load-delay": "1000", "loading-process-events-interval-bytes": "1024"}
    with LocalCluster(1, extra_config=slow_load) as one:
        node = one[0]
        with node.client() as admin:
            admin.mset({f"filler:{i}": "x" for i in range(3000)})
            admin.save()
        client = api.client(one.urls, connect_timeout=2.0)
        said: list[str] = []

        def answers_loading() -> bool:
            try:
                client.acquire(key, ttl=TTL, blocking=False)
            except tenure.QuorumUnreachable as exc:  # refused, until it listens
                (why,) = exc.node_errors.values()
                if "LOADING" in why:
                    said.append(why)
            return bool(said)

        restarting = threading.Thread(target=node.restart)
        restarting.start()
        try:
            poll_until(answers_loading, "the node answering LOADING")
        finally:
            restarting.join()
        assert said[0].startswith("error: is loading its data set into memory"), said[0]
        assert "INFO persistence shows how far it is" in said[0], said[0]
        assert "(LOADING " in said[0], said[0]
        client.acquire(key, ttl=TTL).release()


def test_a_node_that_drops_a_connection_before_answering_may_be_a_tls_port(
    api: Api, key: str
) -> None:
    """A TLS port resets a plain client's connection at its first command, unanswered,
    and the client said only "Connection reset by peer". A connection the node drops
    before its first reply now names the likely cause and the fix, whether the drop
    comes at a set-up command (AUTH, CLIENT SETNAME) or at the first lock command; one
    the node had answered and then drops (a node dying) says nothing of TLS."""
    with LocalCluster(1) as one:
        node = one[0]
        assert node.port is not None
        with HoldingProxy((node.host, node.port)) as proxy:
            # Time for the proxy's thread to reset the connection on a loaded machine.
            timeout = {"node_timeout": 0.9, "connect_timeout": 5.0}
            answered = api.client([proxy.url], **timeout)
            answered.acquire(key, ttl=TTL).release()
            proxy.drop()
            urls = [proxy.url, f"{proxy.url}?client_name=set-up-drop"]
            for client in [answered, *(api.client([url], **timeout) for url in urls)]:
                with pytest.raises(tenure.QuorumUnreachable) as info:
                    client.acquire(key, ttl=TTL, blocking=False)
                (said,) = info.value.node_errors.values()
                assert said.startswith("unreachable: "), said
                if client is answered:
                    assert "TLS" not in said, said
                else:
                    assert said.endswith(
                        "(closed before its first reply: the node may speak TLS; use "
                        "rediss:// for a TLS port)"
                    ), said

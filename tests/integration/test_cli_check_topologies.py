"""``tenure check`` and ``tenure status`` on a Sentinel-managed node and a whole Redis
Cluster node, given as the clients are given them (``redis+sentinel://``,
``redis+cluster://``), on real deployments.

One ``LocalSentinelSet`` (a master, a replica, three Sentinels) and one
``LocalRedisCluster`` (three masters, a replica each) serve the whole module: they are
expensive to start, so the tests run on one xdist worker (``xdist_group``) and inject no
fault; each test's ACL users and settings are undone by the test. Sentinels that disagree
get a ``LocalSentinelSet`` of their own (``disagreeing``).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import socket
import time
from collections.abc import Iterator
from typing import NamedTuple

import pytest

import tenure
from tenure._core.config import LockKeys
from tenure._core.slots import key_slot
from tenure._driver import acl as _acl
from tenure.cli import main
from tenure.cli.node_rules import EXIT_UNAVAILABLE
from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster, LocalSentinelSet
from tenure.testing.topologies import server_version

from .conftest import Api
from .garbage import GarbageServer

pytestmark = pytest.mark.xdist_group("cli_check_topologies")


@pytest.fixture(scope="module")
def sentinels() -> Iterator[LocalSentinelSet]:
    with LocalSentinelSet() as s:
        yield s


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    with LocalRedisCluster(replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def plain() -> Iterator[LocalCluster]:
    """Plain nodes set up as the deployments' servers are (no persistence)."""
    with LocalCluster(2) as c:
        yield c


def _run(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue() + err.getvalue()


def _check(*urls: str) -> tuple[int, list[dict[str, str]]]:
    code, out = _run("check", "--json", *[a for u in urls for a in ("--redis", u)])
    return code, json.loads(out.partition("\ntenure check:")[0])


def _rows(findings: list[dict[str, str]], node: str) -> dict[str, dict[str, str]]:
    return {f["check"]: f for f in findings if f["node"] == node}


def _where(node: LocalNode) -> str:
    return f"{node.host}:{node.port}"


def _with_user(url: str, user: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:pw@{rest}"


_USERS = itertools.count()


@contextlib.contextmanager
def _user(servers: list[LocalNode], *rules: str) -> Iterator[str]:
    """A user made by ``ACL SETUSER <name> <rules>`` on every one of ``servers`` (ACLs are
    per server, in a cluster and under Sentinels alike)."""
    name = f"topo-{next(_USERS)}"
    for node in servers:
        with node.client() as c:
            c.execute_command("ACL", "SETUSER", name, *rules)
    try:
        yield name
    finally:
        for node in servers:
            with node.client() as c:
                c.acl_deluser(name)


def _documented(kind: str, *, without: str = "") -> list[str]:
    # For the servers these tests run: Redis 6.2 refuses a rule naming SSUBSCRIBE, and
    # its line has none.
    version = server_version()[1]
    line = _acl.least_privilege_acl("x", "pw", kind=kind, version=version)
    rules = line.split()[3:]
    assert without in ("", *rules) or version < (7,), without
    return [r for r in rules if r != without]


def _apply(servers: list[LocalNode], line: str) -> None:
    """Run a fixing ``ACL SETUSER`` line, as printed, on every server."""
    for node in servers:
        with node.client() as c:
            c.execute_command(*line.split())


# The per-server checks whose verdict depends on the server alone: a healthy master of a
# Sentinel or Cluster node gets the verdict a plain node set up alike gets.
_SAME = ("server", "persistence", "eviction", "acl")


def _every_map_lists_every_replica(cluster: LocalRedisCluster) -> bool:
    """Whether every member's ``CLUSTER SLOTS`` names every replica: right after the
    cluster starts, a member may not know a replica yet, and the check reads one map."""
    want = {r.port for m in cluster.masters() for r in cluster.replicas_of(m)}
    for node in cluster.nodes:
        with node.client() as c:
            ranges = c.execute_command("CLUSTER", "SLOTS")
        if not want <= {server[1] for entry in ranges for server in entry[3:]}:
            return False
    return True


def test_healthy_sentinel_and_cluster_nodes_get_a_plain_nodes_verdicts(
    sentinels: LocalSentinelSet, redis_cluster: LocalRedisCluster, plain: LocalCluster
) -> None:
    deadline = time.monotonic() + 10.0
    while not _every_map_lists_every_replica(redis_cluster):
        assert time.monotonic() < deadline, "a member never listed every replica"
        time.sleep(0.05)
    code, findings = _check(sentinels.url, redis_cluster.url, plain.urls[0])
    assert code not in (2, 3, EXIT_UNAVAILABLE), findings
    reference = _rows(findings, plain.urls[0])
    master = f"{sentinels.url} (master {_where(sentinels.master())})"
    members = [f"{redis_cluster.url} (master {_where(m)})" for m in redis_cluster.masters()]
    for name in [master, *members]:
        rows = _rows(findings, name)
        assert {c: rows[c]["level"] for c in _SAME} == {c: reference[c]["level"] for c in _SAME}, (
            rows
        )
        assert rows["acl"]["level"] == "OK", rows["acl"]
    # The checks a Sentinel master adds; its replica is checked as a future master.
    sentinel_rows = _rows(findings, master)
    assert "ROLE" in sentinel_rows["acl"]["detail"]
    assert sentinel_rows["min-replicas"]["level"] == "WARN"
    assert "wait_replicas >= 1" in sentinel_rows["min-replicas"]["detail"]
    [replica] = sentinels.replicas()
    replica_rows = _rows(findings, f"{sentinels.url} (replica {_where(replica)})")
    assert replica_rows["role"]["level"] == "OK", replica_rows
    assert {c: replica_rows[c]["level"] for c in _SAME} == {c: reference[c]["level"] for c in _SAME}
    # A Cluster node: every master and every replica, and its slots as a whole.
    assert "ASKING, CLUSTER|SLOTS" in _rows(findings, members[0])["acl"]["detail"]
    for m in redis_cluster.masters():
        for r in redis_cluster.replicas_of(m):
            assert _rows(findings, f"{redis_cluster.url} (replica {_where(r)})")
    slots = _rows(findings, redis_cluster.url)["slots"]
    assert slots["level"] == "OK", slots
    assert slots["detail"] == "all 16384 slots served by 3 master(s), cluster_state ok"


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_the_documented_line_of_each_kind_is_enough(
    api: Api,
    sentinels: LocalSentinelSet,
    redis_cluster: LocalRedisCluster,
    kind: str,
    key: str,
) -> None:
    """A user with exactly docs/deployment.md's line for the node's kind, on every server
    of it, locks through the node's URL, and ``tenure check`` says its ACL is OK."""
    if kind == "sentinel":
        servers, node = list(sentinels.nodes), sentinels.url
    else:
        servers, node = list(redis_cluster), redis_cluster.url
    with _user(servers, *_documented(kind)) as user:
        url = _with_user(node, user)
        client = api.client([url], connect_timeout=2.0)
        lease = client.acquire(key, ttl=10.0, timeout=10.0)
        lease.extend()
        assert client.lock(key, ttl=10.0).locked()
        lease.release()
        _, findings = _check(url)
    rows = [f for f in findings if f["check"] == "acl" and "(master " in f["node"]]
    assert rows
    for acl in rows:
        assert acl["level"] == "OK", acl


def test_min_replicas_on_a_sentinel_master(sentinels: LocalSentinelSet) -> None:
    master = sentinels.master()
    name = f"{sentinels.url} (master {_where(master)})"
    with master.client(decode_responses=True) as c:
        c.config_set("min-replicas-max-lag", "5")
        c.config_set("min-replicas-to-write", "1")
        try:
            _, findings = _check(sentinels.url)
        finally:
            c.config_set("min-replicas-to-write", "0")
            c.config_set("min-replicas-max-lag", "10")
    row = _rows(findings, name)["min-replicas"]
    assert row["level"] == "OK", row
    assert "leases of at most max_ttl - 5 s" in row["detail"]


def test_a_sentinel_master_user_without_role_gets_the_fixing_line(
    sentinels: LocalSentinelSet,
) -> None:
    servers = sentinels.nodes
    name = f"{sentinels.url} (master {_where(sentinels.master())})"
    with _user(servers, *_documented("sentinel", without="+role")) as user:
        url = _with_user(sentinels.url, user)
        code, findings = _check(url)
        acl = _rows(findings, name)["acl"]
        assert code == 3
        assert acl["level"] == "UNSAFE", acl
        assert f"user '{user}' may not run ROLE" in acl["detail"]
        fix = acl["detail"].partition("Fix: ")[2]
        assert fix == f"ACL SETUSER {user} +role"
        _apply(servers, fix)
        _, findings = _check(url)
        assert _rows(findings, name)["acl"]["level"] == "OK"


def test_sentinels_refusing_the_question_get_the_fixing_line(
    sentinels: LocalSentinelSet,
) -> None:
    """Sentinels that ask for a login need SENTINEL GET-MASTER-ADDR-BY-NAME to find the
    master; one that refuses it is asked no further."""
    servers = sentinels.nodes
    with _user(servers, *_documented("sentinel")) as user:
        for sentinel in sentinels.sentinels:  # the same user, but no question allowed
            with sentinel.client() as c:
                c.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", "+ping")
        try:
            url = _with_user(sentinels.url, user)
            code, [row] = _check(url)
            assert code == EXIT_UNAVAILABLE
            assert (row["check"], row["level"]) == ("reachable", "UNSAFE")
            found = re.search(r"Fix \(on each Sentinel\): (ACL SETUSER .*)$", row["detail"])
            assert found is not None, row
            # The question and the subscription: one line, not a second round of fixing.
            assert found.group(1) == (
                f"ACL SETUSER {user} resetchannels &+switch-master "
                "+sentinel|get-master-addr-by-name +sentinel|master +subscribe +ping"
            )
            _apply(sentinels.sentinels, found.group(1))
            code, findings = _check(url)
            master = f"{sentinels.url} (master {_where(sentinels.master())})"
            assert _rows(findings, master)["acl"]["level"] == "OK", findings
            assert not [f for f in findings if f["check"] == "sentinels"], findings
        finally:
            for sentinel in sentinels.sentinels:
                with sentinel.client() as c:
                    c.acl_deluser(user)


@pytest.mark.parametrize(
    "rules",
    [
        # the line documented before the clients subscribed
        ("+sentinel|get-master-addr-by-name",),
        # the subscription, but not the PING that tells a Sentinel that froze
        ("+sentinel|get-master-addr-by-name", "resetchannels", "&+switch-master", "+subscribe"),
        # the line documented before the clients asked for the configuration epoch
        (
            "+sentinel|get-master-addr-by-name",
            "resetchannels",
            "&+switch-master",
            "+subscribe",
            "+ping",
        ),
    ],
    ids=["no-subscribe", "no-ping", "no-question"],
)
def test_sentinels_refusing_the_clients_subscription_get_the_fixing_line(
    sentinels: LocalSentinelSet, rules: tuple[str, ...]
) -> None:
    """A user that may ask for the master but not hold the subscription to the
    announcements of a failover: `tenure check` and `tenure status` name every such
    Sentinel, with the line that lets the clients subscribe; once it is applied, nothing
    is said."""
    with _user(sentinels.nodes, *_documented("sentinel")) as user:
        for sentinel in sentinels.sentinels:
            with sentinel.client() as c:
                c.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules)
        try:
            url = _with_user(sentinels.url, user)
            _, findings = _check(url)
            # Said of the node as listed, as every other word about its Sentinels.
            rows = [f for f in findings if f["check"] == "sentinels"]
            assert [(r["node"], r["level"]) for r in rows] == [(sentinels.url, "WARN")] * len(
                sentinels.sentinels
            ), findings
            fix = f"Fix (on that Sentinel): {_acl.sentinel_fix(user)}"
            # The subscription's refusal is named first: the same line fixes both.
            refused = (
                "question for the master's configuration (SENTINEL MASTER "
                f"{sentinels.service}: NOPERM"
                if "+ping" in rules
                else "subscription to its announcements of a failover (+switch-master: NOPERM"
            )
            for sentinel, row in zip(sentinels.sentinels, rows, strict=True):
                assert row["detail"].startswith(
                    f"Sentinel {_where(sentinel)} refuses the clients' {refused}"
                ), row
                assert "only once the old master is demoted" in row["detail"], row
                assert row["detail"].endswith(fix), row
            _, text = _run("status", "--redis", url, "sentinel-watch-acl")
            assert text.count(f"refuses the clients' {refused}") == len(sentinels.sentinels)
            _apply(sentinels.sentinels, _acl.sentinel_fix(user))
            _, findings = _check(url)
            assert not [f for f in findings if f["check"] == "sentinels"], findings
            _, text = _run("status", "--redis", url, "sentinel-watch-acl")
            assert "refuses the clients'" not in text, text
        finally:
            for sentinel in sentinels.sentinels:
                with sentinel.client() as c:
                    c.acl_deluser(user)


@pytest.mark.parametrize("without", ["+asking", "+cluster|slots"])
def test_a_cluster_user_without_a_cluster_command_gets_the_fixing_line(
    redis_cluster: LocalRedisCluster, without: str
) -> None:
    servers = list(redis_cluster)
    with _user(servers, *_documented("cluster", without=without)) as user:
        url = _with_user(redis_cluster.url, user)
        code, findings = _check(url)
        # Without CLUSTER SLOTS the node is unreachable: no server of it answered.
        assert code == (3 if without == "+asking" else EXIT_UNAVAILABLE)
        if without == "+asking":
            rows = [f for f in findings if f["check"] == "acl" and "(master " in f["node"]]
            assert len(rows) == 3
            for acl in rows:
                assert acl["level"] == "UNSAFE", acl
                assert f"user '{user}' may not run ASKING" in acl["detail"]
        else:
            # The slot map cannot be read at all: the clients could not either.
            [acl] = findings
            assert acl["check"] == "reachable"
            assert "no slot map" in acl["detail"]
        found = re.search(r"Fix( \(on each member\))?: (ACL SETUSER .*)$", acl["detail"])
        assert found is not None, acl
        fix = found.group(2)
        assert fix == f"ACL SETUSER {user} {without}"
        _apply(servers, fix)
        code, findings = _check(url)
        assert code not in (3, EXIT_UNAVAILABLE), findings
        # The masters' (a replica is not probed: the probe writes, and this user may not
        # ask ACL DRYRUN, so its row says it could not check).
        rows = [f for f in findings if f["check"] == "acl" and "(master " in f["node"]]
        assert len(rows) == 3
        for acl in rows:
            assert acl["level"] == "OK", acl


def test_a_command_added_to_the_kinds_table_is_checked_on_the_servers_it_is_sent_to(
    redis_cluster: LocalRedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sharded notifications will send SSUBSCRIBE to Cluster nodes of servers >= 7: one
    line of ``NODE_KINDS``, which the check then asks of such servers (by the probe, on
    a connection of its own, on a channel of the member's slot), with its fixing line."""
    extra = ("SSUBSCRIBE", None, ("$CHANNEL",), (7,), None)
    monkeypatch.setitem(_acl.NODE_KINDS, "cluster", (*_acl.NODE_KINDS["cluster"], extra))
    servers = list(redis_cluster)
    with _user(servers, *_documented("cluster", without="+ssubscribe")) as user:
        url = _with_user(redis_cluster.url, user)
        _, findings = _check(url)
        rows = [f for f in findings if f["check"] == "acl" and "(master " in f["node"]]
        assert len(rows) == 3
        with servers[0].client(decode_responses=True) as c:
            sharded = int(str(c.info("server")["redis_version"]).split(".")[0]) >= 7
        for acl in rows:
            if not sharded:  # not sent to a 6.2 server, so not asked of it
                assert acl["level"] == "OK", acl
                continue
            assert acl["level"] == "UNSAFE", acl
            assert f"user '{user}' may not run SSUBSCRIBE" in acl["detail"]
            assert acl["detail"].endswith(f"Fix: ACL SETUSER {user} +ssubscribe")
        if sharded:  # 6.2 has no such command, and refuses the rule
            _apply(servers, f"ACL SETUSER {user} +ssubscribe")
        _, findings = _check(url)
    rows = [f for f in findings if f["check"] == "acl" and "(master " in f["node"]]
    assert all(acl["level"] == "OK" for acl in rows), rows


def test_an_unknown_sentinel_service_is_an_unreachable_node(sentinels: LocalSentinelSet) -> None:
    url = sentinels.url.rpartition("/")[0] + "/no-such-service"
    code, findings = _check(url)
    assert code == EXIT_UNAVAILABLE
    [row] = findings
    assert (row["node"], row["check"], row["level"]) == (url, "reachable", "UNSAFE")
    assert "no Sentinel named a master for service 'no-such-service'" in row["detail"]
    for sentinel in sentinels.sentinels:
        assert f"{_where(sentinel)}: does not know the service" in row["detail"]


@pytest.mark.parametrize("scheme", ["redis+cluster", "redis+sentinel"])
@pytest.mark.parametrize("command", ["status", "check"])
def test_an_unreachable_cluster_or_sentinel_node_is_a_row_without_the_password(
    command: str, scheme: str
) -> None:
    # Nothing listens on ports 1 and 2 of the loopback.
    path = "/locks" if scheme == "redis+sentinel" else ""
    url = f"{scheme}://app:Zq9xWv7kJm4@127.0.0.1:1,127.0.0.1:2{path}"
    argv = ["status", "a-lock"] if command == "status" else ["check"]
    code, out = _run(*argv, "--redis", url)
    assert code == EXIT_UNAVAILABLE, out
    assert f"{scheme}://127.0.0.1:1,127.0.0.1:2{path}" in out
    if scheme == "redis+sentinel":  # the service, and what each Sentinel said
        assert "no Sentinel named a master for service 'locks'" in out, out
        assert "127.0.0.1:1: " in out, out
        assert "127.0.0.1:2: " in out, out
    else:  # as the clients diagnose it: the first seed's failure
        assert "no slot map: unreachable: 127.0.0.1:1: " in out, out
    assert "Zq9xWv7kJm4" not in out
    assert "Traceback" not in out


def _status(name: str, *urls: str, prefix: str | None = None) -> tuple[int, list[str]]:
    options = [] if prefix is None else ["--key-prefix", prefix]
    code, out = _run("status", name, *options, *[a for u in urls for a in ("--redis", u)])
    return code, out.splitlines()


def _floor(line: str) -> int:
    found = re.search(r"floor=(\d+)", line)
    assert found is not None, line
    return int(found.group(1))


def test_status_on_a_sentinel_node_reads_the_master(sentinels: LocalSentinelSet, key: str) -> None:
    with tenure.Client([sentinels.url]) as client:
        lease = client.acquire(key, ttl=60.0)
        code, [line] = _status(key, sentinels.url)
        lease.release()
    assert code == 0
    assert line.startswith(f"{sentinels.url} (master {_where(sentinels.master())})  held ")
    assert f"token={lease.token[:8]}" in line.split()
    assert _floor(line) >= lease.fencing_token


def test_status_on_a_cluster_node_reads_the_slots_master_and_per_slot_keys(
    redis_cluster: LocalRedisCluster, plain: LocalCluster, key: str
) -> None:
    """With a Cluster node listed, every node keeps its floor per slot, plain ones too."""
    urls = [redis_cluster.url, *plain.urls]
    # A key prefix of its own: a node set that is new under it is seeded at once, where
    # the slot's node keys under the default prefix may be warming up (other tests).
    prefix = f"st{key[-8:]}:"
    with tenure.Client(urls, key_prefix=prefix) as client:
        lease = client.acquire(key, ttl=60.0)
        code, lines = _status(key, *urls, prefix=prefix)
        lease.release()
    assert code == 0
    slot = key_slot(LockKeys.of(key, prefix=prefix).lock)
    owner = redis_cluster.slot_owner(slot)
    assert lines[0].startswith(f"{redis_cluster.url} (slot {slot}: master {_where(owner)})  held ")
    for line in lines:
        assert f"token={lease.token[:8]}" in line.split(), line
        assert _floor(line) >= lease.fencing_token
        assert re.search(r"replid=[0-9a-f]{8}$", line), line


def test_tenure_redis_keeps_the_hosts_of_a_sentinel_or_cluster_url_together(
    sentinels: LocalSentinelSet,
    redis_cluster: LocalRedisCluster,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
) -> None:
    monkeypatch.setenv("TENURE_REDIS", f"{sentinels.url},{redis_cluster.url}")
    code, lines = _status(key)
    assert code == 0, lines
    assert lines[0].startswith(f"{sentinels.url} (master "), lines
    assert lines[1].startswith(f"{redis_cluster.url} (slot "), lines


@pytest.fixture
def disagreeing() -> Iterator[tuple[LocalSentinelSet, LocalNode, list[tuple[str, str]]]]:
    """A deployment of its own whose Sentinels disagree: the first listed names the
    replica as master, the second a server that is gone, the third the master. Yields
    it, its master, and each out-of-date Sentinel with the server it names."""
    with LocalSentinelSet() as s:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            gone = free.getsockname()[1]
        master, [replica] = s.master(), s.replicas()
        stale = {s.sentinels[0]: replica.port, s.sentinels[1]: gone}
        for sentinel, port in stale.items():
            with sentinel.client() as c:
                # Its own view, which the others never overrule (no failover happened).
                c.execute_command("SENTINEL", "REMOVE", s.service)
                c.execute_command("SENTINEL", "MONITOR", s.service, "127.0.0.1", port, 3)
        yield s, master, [(_where(k), f"127.0.0.1:{v}") for k, v in stale.items()]


def test_check_on_sentinels_that_disagree_reads_the_master_the_clients_use(
    disagreeing: tuple[LocalSentinelSet, LocalNode, list[tuple[str, str]]],
) -> None:
    """The check stopped at the first Sentinel that answered: it read the replica that
    Sentinel named as the node's master (or, first listed, the server that is gone: the
    node unreachable), while the clients ask such a Sentinel last and lock on the master
    the others name. It now reads that master, and says, WARN, which Sentinel is out of
    date and what it named."""
    s, master, stale_ones = disagreeing
    code, findings = _check(s.url)
    rows = _rows(findings, f"{s.url} (master {_where(master)})")
    assert rows["role"]["level"] == "WARN", findings  # a master with a replica
    assert "master of the Sentinel-managed node" in rows["role"]["detail"]
    stale = [f for f in findings if f["check"] == "sentinels"]
    assert [f["level"] for f in stale] == ["WARN", "WARN"], findings
    assert all(f["node"] == s.url for f in stale), stale
    for (sentinel, named), finding in zip(stale_ones, stale, strict=True):
        assert f"Sentinel {sentinel} is out of date" in finding["detail"], finding
        assert named in finding["detail"], finding
        assert _where(master) in finding["detail"], finding
    assert "is a slave" in stale[0]["detail"], stale
    assert code == 1


def test_status_on_sentinels_that_disagree_reads_the_master_the_clients_use(
    disagreeing: tuple[LocalSentinelSet, LocalNode, list[tuple[str, str]]],
) -> None:
    """``tenure status`` said the node was unreachable (the first Sentinel's master is a
    replica) and exited 69, while the clients held the lock on the master the other
    Sentinels name. It now reads that master, and warns of the out-of-date Sentinels."""
    s, master, stale_ones = disagreeing
    key = "cli-status-disagree"
    with tenure.Client([s.url], connect_timeout=1.0) as client:
        lease = client.acquire(key, ttl=60.0, timeout=10.0)
        code, lines = _status(key, s.url)
        lease.release()
    assert code == 0, lines
    assert lines[0].startswith(f"{s.url} (master {_where(master)})  held "), lines
    assert f"token={lease.token[:8]}" in lines[0].split()
    warnings = lines[1:]
    assert len(warnings) == 2, lines
    for (sentinel, named), line in zip(stale_ones, warnings, strict=True):
        assert line.startswith(f"tenure status: warning: {s.url}: Sentinel {sentinel} "), line
        assert "is out of date" in line, line
        assert named in line, line


def _listing(url: str, *more: str) -> str:
    """A ``redis+sentinel://`` URL with ``more`` Sentinels listed after its own."""
    hosts, _, service = url.rpartition("/")
    return f"{','.join([hosts, *more])}/{service}"


class Differing(NamedTuple):
    url: str
    master: LocalNode
    first: str
    """The first Sentinel listed: it names the master."""
    others: list[tuple[str, str]]
    """Each Sentinel listed after it, and how what is said of it starts."""


@pytest.fixture
def differing_after_the_first() -> Iterator[Differing]:
    """A deployment of its own whose first Sentinel names the master, and whose other
    Sentinels, each listed after it, say otherwise: the second does not know the
    service, the third names the replica, the fourth a master of its own (a server
    apart); a fifth listed is down."""
    with LocalSentinelSet(sentinels=4) as s, LocalCluster(1) as apart:
        master, [replica] = s.master(), s.replicas()
        first, unknowing, stale, other = s.sentinels
        for sentinel, server in ((unknowing, None), (stale, replica), (other, apart[0])):
            with sentinel.client() as c:
                # Its own view, which the others never overrule (no failover happened).
                c.execute_command("SENTINEL", "REMOVE", s.service)
                if server is not None:
                    c.execute_command("SENTINEL", "MONITOR", s.service, "127.0.0.1", server.port, 3)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            down = f"127.0.0.1:{free.getsockname()[1]}"
        service = repr(s.service)
        yield Differing(
            _listing(s.url, down),
            master,
            _where(first),
            [
                (_where(unknowing), f"names no master of service {service}: it does not know it"),
                (_where(stale), f"is out of date: it names {_where(replica)} master of service "),
                (_where(other), f"disagrees: it names {_where(apart[0])} master of service "),
                (down, f"cannot be asked for the master of service {service}: "),
            ],
        )


def test_check_reports_every_sentinel_that_differs_not_only_those_asked_first(
    differing_after_the_first: Differing,
) -> None:
    """The check asked the Sentinels as the clients do, stopping at the first that named
    a usable master: with that one listed first, the Sentinels after it (out of date,
    not knowing the service, naming a master of their own, or down) went unreported. It
    asks every one now, reads the master the clients use, and has a WARN row for each."""
    url, master, first, others = differing_after_the_first
    code, findings = _check(url)
    rows = _rows(findings, f"{url} (master {_where(master)})")
    assert rows["role"]["level"] == "WARN", findings  # a master with a replica
    said = [f for f in findings if f["check"] == "sentinels"]
    assert [(f["node"], f["level"]) for f in said] == [(url, "WARN")] * len(others), findings
    for (sentinel, what), finding in zip(others, said, strict=True):
        assert finding["detail"].startswith(f"Sentinel {sentinel} {what}"), finding
        assert f"use {_where(master)}, named by Sentinel {first}" in finding["detail"], finding
    assert "which is a slave" in said[1]["detail"], said
    assert "which answers ROLE as a master too" in said[2]["detail"], said
    assert "Connection refused" in said[3]["detail"], said
    assert code == 1


def test_status_warns_of_every_sentinel_that_differs_and_waits_for_none(
    differing_after_the_first: Differing,
) -> None:
    """``tenure status`` warned only of the Sentinels asked before the one that named the
    master: of none, that one listed first. It warns of every one now; one that never
    ends its answer (listed last) is given up after a budget of its own, and the node's
    line is still the master's."""
    url, master, first, others = differing_after_the_first
    key = "cli-status-differ-after"
    with GarbageServer("slow") as slow:
        never = f"127.0.0.1:{slow.port}"
        listed = _listing(url, never)
        with tenure.Client([url], connect_timeout=1.0) as client:
            lease = client.acquire(key, ttl=60.0, timeout=10.0)
            started = time.monotonic()
            code, out = _run("status", key, "--redis", listed, "--node-timeout", "0.5")
            took = time.monotonic() - started
            lease.release()
    lines = out.splitlines()
    assert code == 0, lines
    assert lines[0].startswith(f"{listed} (master {_where(master)})  held "), lines
    assert f"token={lease.token[:8]}" in lines[0].split()
    warnings = lines[1:]
    expected = [*others, (never, "cannot be asked for the master of service ")]
    assert len(warnings) == len(expected), lines
    for (sentinel, what), line in zip(expected, warnings, strict=True):
        assert line.startswith(f"tenure status: warning: {listed}: Sentinel {sentinel} {what}")
        assert f"use {_where(master)}, named by Sentinel {first}" in line, line
    # Given up after its budget (2 x 4 waits x 0.5 s, and a second), not at its drip's end;
    # 0.5 s, not less, for the real Sentinels' answers on a loaded machine.
    assert "no complete answer within 5 s" in warnings[-1], warnings
    assert "check the Sentinel's host and port" in warnings[-1], warnings
    assert took < 15.0, took

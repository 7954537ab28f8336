"""``tenure check``: the pure evaluation rules (tables, no server) and the command on real
redis-server nodes set up to be safe, risky and unsafe in each way it reports.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure._core.config import LockKeys
from tenure._driver import acl as _acl
from tenure.cli import main
from tenure.cli.node_rules import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_WARN,
    Finding,
    Level,
    NodeFacts,
    UserLogin,
    check_access,
    check_eviction,
    check_independence,
    check_min_replicas,
    check_persistence,
    check_role,
    check_sentinels,
    check_server,
    check_slots,
    check_uptime,
    evaluate,
    exit_code,
)
from tenure.testing import (
    LocalCluster,
    LocalNode,
    Persistence,
)

from .conftest import Api, acl_user, embedded_servers
from .garbage import SPEAKS, GarbageServer

# --- the pure rules ----------------------------------------------------------------------

_INFO = {
    "redis_version": "6.2.14",
    "role": "master",
    "connected_slaves": "0",
    "uptime_in_seconds": "3600",
    "run_id": "a" * 40,
    "master_replid": "b" * 40,
    "aof_enabled": "1",
    "maxmemory_policy": "noeviction",
    "maxmemory": "0",
}
_CONFIG = {
    "appendonly": "yes",
    "appendfsync": "always",
    "save": "",
    "maxmemory-policy": "noeviction",
    "maxmemory": "0",
    "replica-read-only": "yes",
}
_DENIED_EVAL = "NOPERM this user has no permissions to run the 'eval' command or its subcommand"
_DENIED_IN_SCRIPT = (
    "@user_script: 11: The user executing the script can't run this command or subcommand"
)
_CHANNEL_IN_SCRIPT = (
    "@user_script: 4: The user executing the script can't publish to the channel mentioned "
    "in the command"
)
_ALLOWED: dict[str, str | None] = {need.name: None for need in _acl.needs()}

Overrides = Mapping[str, "str | None"]


def _merge(base: Mapping[str, str], overrides: Overrides) -> dict[str, str]:
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _facts(
    info: Overrides | None = None,
    config: Overrides | None = None,
    *,
    node: str = "n1",
    no_info: bool = False,
    no_config: bool = False,
    **fields: Any,
) -> NodeFacts:
    """Healthy facts (6.2, master, AOF always, noeviction, up an hour), with overrides."""
    return NodeFacts(
        node=node,
        info=None if no_info else _merge(_INFO, info or {}),
        info_error="INFO not permitted" if no_info else None,
        config=None if no_config else _merge(_CONFIG, config or {}),
        config_error="CONFIG not permitted" if no_config else None,
        **fields,
    )


def _expect(finding: Finding, level: Level, fragment: str) -> None:
    assert finding.level is level, finding
    assert fragment in finding.detail, finding


@pytest.mark.parametrize(
    ("facts", "level", "fragment"),
    [
        (_facts(), Level.OK, "appendfsync always"),
        (_facts(config={"appendfsync": "everysec"}), Level.WARN, "up to ~1 s"),
        (_facts(config={"appendfsync": "everysec"}), Level.WARN, "new replication history"),
        (_facts(config={"appendfsync": "no"}), Level.WARN, "~30 s"),
        (_facts(config={"appendonly": "no"}), Level.WARN, 'appendonly no, save ""'),
        (_facts(config={"appendonly": "no"}), Level.WARN, "docs/fencing.md"),
        (_facts(config={"appendonly": "no", "save": None}), Level.WARN, "save unknown"),
        (
            _facts(config={"appendonly": "no", "save": "3600 1 300 100 60 10000"}),
            Level.WARN,
            "RDB snapshots (save 3600 1",
        ),
        (
            _facts(no_config=True),
            Level.WARN,
            "cannot read persistence settings (CONFIG not permitted); INFO says AOF is on",
        ),
        (_facts({"aof_enabled": "0"}, no_config=True), Level.WARN, "INFO says AOF is off"),
    ],
)
def test_persistence_rules(facts: NodeFacts, level: Level, fragment: str) -> None:
    _expect(check_persistence(facts), level, fragment)


@pytest.mark.parametrize(
    ("facts", "level", "fragment"),
    [
        (_facts(), Level.OK, "noeviction"),
        (
            _facts(config={"maxmemory-policy": "volatile-lru", "maxmemory": "1073741824"}),
            Level.UNSAFE,
            "volatile-lru: under memory pressure Redis evicts keys with a TTL, and every lock "
            "key has one",
        ),
        (
            _facts(config={"maxmemory-policy": "volatile-ttl", "maxmemory": "100"}),
            Level.UNSAFE,
            "mutual exclusion breaks",
        ),
        (
            _facts(config={"maxmemory-policy": "volatile-ttl"}),
            Level.WARN,
            "setting a limit later makes it unsafe",
        ),
        (
            _facts(config={"maxmemory-policy": "allkeys-lru", "maxmemory": "1073741824"}),
            Level.UNSAFE,
            "evicts any key, lock keys included",
        ),
        (_facts(config={"maxmemory-policy": "allkeys-random"}), Level.WARN, "while maxmemory is 0"),
        (  # CONFIG refused: INFO memory says the same
            _facts({"maxmemory_policy": "allkeys-lfu", "maxmemory": "100"}, no_config=True),
            Level.UNSAFE,
            "allkeys-lfu",
        ),
        (
            _facts(no_config=True, no_info=True),
            Level.WARN,
            "cannot read maxmemory-policy (CONFIG not permitted)",
        ),
        (_facts(config={"maxmemory-policy": "mystery"}), Level.WARN, "unknown"),
    ],
)
def test_eviction_rules(facts: NodeFacts, level: Level, fragment: str) -> None:
    _expect(check_eviction(facts), level, fragment)


_REPLICA = {"role": "slave", "master_host": "10.0.0.1", "master_port": "6379"}


@pytest.mark.parametrize(
    ("facts", "level", "fragment"),
    [
        (_facts(), Level.OK, "master, no replicas"),
        (
            _facts({"connected_slaves": "2", "slave0": "ip=10.0.0.2,port=6380,state=online"}),
            Level.WARN,
            "2 connected replica(s) (10.0.0.2:6380)",
        ),
        (
            _facts({"connected_slaves": "1"}),
            Level.WARN,
            "failing over to an async replica can lose grants",
        ),
        (_facts(_REPLICA), Level.UNSAFE, "a replica of 10.0.0.1:6379"),
        (_facts(_REPLICA), Level.UNSAFE, "fail (READONLY)"),
        (
            _facts(_REPLICA, {"replica-read-only": "no"}),
            Level.UNSAFE,
            "lost at the next resync",
        ),
        (_facts({"cluster_enabled": "1"}), Level.WARN, "Redis Cluster"),
        (_facts(no_info=True), Level.WARN, "cannot read role (INFO not permitted)"),
    ],
)
def test_role_rules(facts: NodeFacts, level: Level, fragment: str) -> None:
    _expect(check_role(facts), level, fragment)


_VALKEY = {"redis_version": "7.2.4", "server_name": "valkey"}
_NO_EVAL = "ERR unknown command 'eval', with args beginning with: 'return 1' '2' "
_CROSSSLOT = "CROSSSLOT Keys in request don't hash to the same slot"


@pytest.mark.parametrize(
    ("info", "scripts", "level", "fragment"),
    [
        ({}, None, Level.OK, "Redis 6.2.14"),
        ({}, "OK", Level.OK, "Redis 6.2.14"),
        ({"redis_version": "7.2.4"}, "OK", Level.OK, "Redis 7.2.4"),
        ({"redis_version": "8.2.1"}, "OK", Level.OK, "Redis 8.2.1"),
        ({"redis_version": "2.6.11"}, None, Level.UNSAFE, "older than 2.6.12"),
        ({"redis_version": "2.6.12"}, None, Level.WARN, "the oldest tenure supports"),
        ({"redis_version": "5.0.7"}, "OK", Level.WARN, "older than Redis 6.2, the oldest"),
        ({"redis_version": "6.0.20"}, "OK", Level.WARN, "upgrade to Redis 6.2 or later"),
        # Valkey reports redis_version 7.2.4 whatever its own version is.
        ({**_VALKEY, "valkey_version": "9.1.2"}, "OK", Level.OK, "Valkey 9.1.2"),
        ({**_VALKEY, "valkey_version": "7.2.5"}, "OK", Level.OK, "Valkey 7.2.5"),
        ({"redis_version": "7.2.4", "valkey_version": "8.0.1"}, "OK", Level.OK, "Valkey 8.0.1"),
        (_VALKEY, "OK", Level.OK, "Valkey 7.2.4"),  # server_name alone
        ({**_VALKEY, "valkey_version": "7.0.1"}, "OK", Level.WARN, "older than Valkey 7.2"),
        ({"dragonfly_version": "df-v1.21.2"}, "OK", Level.WARN, "Dragonfly df-v1.21.2"),
        ({"dragonfly_version": "df-v1.21.2"}, "OK", Level.WARN, "untested"),
        ({"server_name": "garnet"}, "OK", Level.WARN, "garnet 6.2.14 (reports"),
        ({"redis_version": None}, None, Level.WARN, "not Redis?"),
        # What the probe script's reply says about the server.
        ({}, _NO_EVAL, Level.UNSAFE, "unsupported: Redis 6.2.14: this server cannot run Lua"),
        ({}, "ERR scripting is disabled", Level.UNSAFE, "every tenure lock operation is"),
        ({"redis_version": None}, _NO_EVAL, Level.UNSAFE, "unsupported: server unknown"),
        ({"cluster_enabled": "1"}, _CROSSSLOT, Level.UNSAFE, "unsupported: Redis 6.2.14: cluster"),
        ({"cluster_enabled": "1"}, _CROSSSLOT, Level.UNSAFE, "even of one (virtual) node"),
        ({"cluster_enabled": "1"}, "MOVED 3999 10.0.0.2:6379", Level.UNSAFE, "cluster mode"),
        ({}, _DENIED_EVAL, Level.OK, "scripts not permitted to this user (see the acl check)"),
        ({}, "ERR something odd", Level.WARN, "the probe script failed (ERR something odd)"),
    ],
)
def test_server_rules(info: Overrides, scripts: str | None, level: Level, fragment: str) -> None:
    _expect(check_server(_facts(info, scripts=scripts)), level, fragment)


def test_server_rule_without_info() -> None:
    _expect(check_server(_facts(no_info=True)), Level.WARN, "INFO not permitted")


@pytest.mark.parametrize(
    ("uptime", "config", "max_ttl", "level", "fragment"),
    [
        ("3600", {}, 60.0, Level.OK, "up 60 min"),
        ("60", {"appendonly": "no"}, 60.0, Level.OK, "up 60 s"),
        ("59", {"appendonly": "no"}, 60.0, Level.WARN, "(re)started 59 s ago"),
        ("10", {"appendonly": "no"}, 60.0, Level.WARN, "comes back empty is detected"),
        ("10", {"appendfsync": "everysec"}, 60.0, Level.WARN, "max_ttl 60 s"),
        ("10", {}, 60.0, Level.OK, "came back with all its data"),
        ("100", {"appendonly": "no"}, 300.0, Level.WARN, "max_ttl 300 s"),
        (None, {}, 60.0, Level.WARN, "no uptime_in_seconds"),
    ],
)
def test_uptime_rules(
    uptime: str | None, config: Overrides, max_ttl: float, level: Level, fragment: str
) -> None:
    facts = _facts({"uptime_in_seconds": uptime}, config)
    _expect(check_uptime(facts, max_ttl), level, fragment)


@pytest.mark.parametrize(
    ("fields", "level", "fragment"),
    [
        ({"access": _ALLOWED, "access_method": "probe", "user": "app"}, Level.OK, "'app'"),
        ({"access": _ALLOWED}, Level.OK, "in scripts: DEL, EXISTS, GET, INFO, MGET, PEXPIRE, PTTL"),
        ({"access": {**_ALLOWED, "EVAL": _DENIED_EVAL}}, Level.UNSAFE, "may not run EVAL"),
        (
            {"access": {**_ALLOWED, "EVAL": _DENIED_EVAL}, "user": "app"},
            Level.UNSAFE,
            "Fix: ACL SETUSER app +eval",
        ),
        (
            {"access": {**_ALLOWED, "SET": _DENIED_IN_SCRIPT}},
            Level.UNSAFE,
            "may not run SET (probe: @user_script: 11",
        ),
        (
            {"access": {**_ALLOWED, "ZADD": _DENIED_IN_SCRIPT, "PUBLISH": _DENIED_IN_SCRIPT}},
            Level.UNSAFE,
            "Fix: ACL SETUSER default +publish +zadd",
        ),
        (
            {
                "access": {
                    **_ALLOWED,
                    "EXISTS": "User app has no permissions to access the 'k' key",
                },
                "access_method": "ACL DRYRUN",
                "user": "app",
            },
            Level.UNSAFE,
            "may not run EXISTS on keys tenure:* (ACL DRYRUN: User app has no permissions",
        ),
        (
            {"access": {**_ALLOWED, "PUBLISH": _CHANNEL_IN_SCRIPT}, "user": "app"},
            Level.UNSAFE,
            "PUBLISH on channels tenure:wake:* (probe: @user_script: 4: The user executing "
            "the script can't publish to the channel mentioned in the command); tenure "
            "cannot lock on this node. Fix: ACL SETUSER app &tenure:wake:*",
        ),
        (
            {"access": {**_ALLOWED, "WAIT": _DENIED_EVAL.replace("eval", "wait")}},
            Level.WARN,
            "tenure sends WAIT only with wait_replicas > 0. Fix if you use that: "
            "ACL SETUSER default +wait",
        ),
        (
            {"access": {**_ALLOWED, "EVAL": _DENIED_EVAL, "GET": "the probe could not run"}},
            Level.UNSAFE,
            "; not checked: GET (the probe could not run)",
        ),
        (
            {"access": {**_ALLOWED, "SET": "OOM command not allowed"}},
            Level.WARN,
            "failed: OOM",
        ),
        ({"access_error": "Timeout reading from socket"}, Level.WARN, "cannot check"),
        (
            {"access": {c: None for c in _ALLOWED if c != "ZREM"}},
            Level.WARN,
            "the probe of ZREM failed: not checked",
        ),
    ],
)
def test_access_rules(fields: dict[str, Any], level: Level, fragment: str) -> None:
    [finding] = check_access(_facts(**fields))
    _expect(finding, level, fragment)


def test_access_not_checked_gives_no_finding() -> None:
    assert check_access(_facts()) == []


def test_independence_rules() -> None:
    a = _facts(node="a")
    b = _facts({"run_id": "c" * 40, "master_replid": "d" * 40}, node="b")
    twin = _facts(node="a/1")  # same run_id and replid as a
    kin = _facts({"run_id": "e" * 40}, node="r")  # same replid as a: a replica of it
    down = NodeFacts(node="x", error="unreachable: refused")

    assert [f.level for f in check_independence([a, b, down])] == [Level.OK, Level.OK]
    assert check_independence([a]) == []
    same = check_independence([a, b, twin])
    assert [(f.node, f.level) for f in same if f.level is Level.UNSAFE] == [
        ("a", Level.UNSAFE),
        ("a/1", Level.UNSAFE),
    ]
    assert "the same server as a/1" in same[0].detail
    family = {f.node: f for f in check_independence([a, kin])}
    _expect(family["r"], Level.UNSAFE, "one replication set with a")


def test_evaluate_and_exit_codes() -> None:
    ok = [_facts(node="a"), _facts({"run_id": "1", "master_replid": "2"}, node="b")]
    down = NodeFacts(node="x", error="unreachable: Connection refused")
    warn = _facts({"run_id": "3", "master_replid": "4"}, {"appendfsync": "everysec"}, node="c")

    findings = evaluate(ok)
    assert {f.level for f in findings} == {Level.OK}
    assert exit_code(ok, findings) == EXIT_OK
    assert exit_code([*ok, warn], evaluate([*ok, warn])) == EXIT_WARN

    with_down = evaluate([*ok, down])
    assert [f for f in with_down if f.node == "x"] == [
        Finding("x", "reachable", Level.UNSAFE, "unreachable: Connection refused")
    ]
    assert exit_code([*ok, down], with_down) == EXIT_UNSAFE
    lonely = [ok[0], down, NodeFacts(node="y", error="unreachable")]
    assert exit_code(lonely, evaluate(lonely)) == EXIT_UNAVAILABLE


def test_sentinels_out_of_date_are_a_warning_of_the_listed_node() -> None:
    """A Sentinel naming a master the clients cannot use, while another names one they
    can, is a WARN row of the node as listed, after its master's rows: the clients work,
    on one Sentinel fewer."""
    said = ("Sentinel 10.0.0.1:26379 is out of date: it names 10.0.0.9:6379 ...",)
    master = _facts(node="s (master m)")
    master.listed, master.kind, master.sentinel_warnings = "s", "sentinel", said
    findings = evaluate([master])
    assert findings[-1] == Finding("s", "sentinels", Level.WARN, said[0])
    assert [f.check for f in findings].count("sentinels") == 1
    assert check_sentinels(_facts(node="plain")) == []
    down = NodeFacts(node="s (master m)", error="unreachable", listed="s", sentinel_warnings=said)
    assert [(f.check, f.level) for f in evaluate([down])] == [
        ("reachable", Level.UNSAFE),
        ("sentinels", Level.WARN),
    ]


@pytest.mark.parametrize(
    ("config", "info", "level", "fragment"),
    [
        ({"min-replicas-to-write": "0", "min-replicas-max-lag": "10"}, {}, Level.WARN,
         "min-replicas-to-write 0: a master cut off"),
        ({"min-replicas-to-write": "1", "min-replicas-max-lag": "0"}, {}, Level.WARN,
         "min-replicas-max-lag 0"),
        ({"min-replicas-to-write": "1", "min-replicas-max-lag": "10"},
         {"connected_slaves": "1"}, Level.OK, "safe with leases of at most max_ttl - 10 s"),
        ({"min-replicas-to-write": "1", "min-replicas-max-lag": "60"},
         {"connected_slaves": "1"}, Level.WARN, "not below max_ttl 60 s"),
        ({"min-replicas-to-write": "2", "min-replicas-max-lag": "10"},
         {"connected_slaves": "1"}, Level.WARN, "refuses every write now"),
        ({"min-replicas-to-write": None}, {}, Level.WARN, "cannot read min-replicas"),
    ],
)  # fmt: skip
def test_min_replicas_rules(
    config: Overrides, info: Overrides, level: Level, fragment: str
) -> None:
    facts = _facts(info, config, kind="sentinel", listed="s")
    _expect(check_min_replicas(facts), level, fragment)
    assert "min-replicas" in {f.check for f in evaluate([facts])}


def test_min_replicas_is_checked_on_a_sentinel_master_only() -> None:
    plain = _facts()
    cluster = _facts(kind="cluster", listed="c")
    replica = _facts({"role": "slave"}, kind="sentinel", listed="s", replica=True)
    for facts in (plain, cluster, replica):
        assert "min-replicas" not in {f.check for f in evaluate([facts])}


@pytest.mark.parametrize(
    ("info", "replica", "level", "fragment"),
    [
        ({"connected_slaves": "1"}, False, Level.WARN, "sits out max_ttl"),
        ({}, False, Level.OK, "no replicas: nothing to fail over to"),
        ({"role": "slave"}, False, Level.WARN, "a failover under way?"),
        ({"role": "slave", "master_link_status": "up"}, True, Level.OK, "replica of"),
        ({"role": "slave", "master_link_status": "down"}, True, Level.WARN, "link down"),
        ({"role": "master"}, True, Level.WARN, "listed as a replica"),
    ],
)
def test_role_rules_of_a_managed_nodes_servers(
    info: Overrides, replica: bool, level: Level, fragment: str
) -> None:
    """A master of a Sentinel or Cluster node is expected to have replicas, and its
    replicas are what a failover promotes: not the UNSAFE replica of a plain node."""
    for kind in ("sentinel", "cluster"):
        facts = _facts(info, kind=kind, listed="x", replica=replica)
        _expect(check_role(facts), level, fragment)


def test_slots_rules() -> None:
    _expect(check_slots("c", 0, 3, ["ok", "ok", "ok"]), Level.OK, "all 16384 slots")
    _expect(check_slots("c", 5461, 2, ["ok", "ok"]), Level.UNSAFE, "5461 of 16384 slots")
    _expect(check_slots("c", 0, 3, ["ok", "fail", "ok"]), Level.UNSAFE, "cluster_state:fail")
    _expect(check_slots("c", 0, 3, ["ok", "CLUSTER INFO not permitted", "ok"]), Level.OK,
            "not read on 1: CLUSTER INFO not permitted")  # fmt: skip


def test_a_managed_nodes_servers_count_as_one_node() -> None:
    """A majority is of the listed nodes: a Cluster node answers when one of its
    masters does, and its replicas are neither votes nor another replication set."""
    masters = [
        _facts({"run_id": f"m{i}", "master_replid": f"r{i}"}, node=f"c{i}", kind="cluster",
               listed="c")
        for i in range(3)
    ]  # fmt: skip
    replica = _facts(
        {"role": "slave", "run_id": "x", "master_replid": "r0", "master_link_status": "up"},
        node="c-replica", kind="cluster", listed="c", replica=True,
    )  # fmt: skip
    down = [NodeFacts(node=n, error="unreachable") for n in ("a", "b")]
    facts = [*masters, replica, *down]
    findings = evaluate(facts)
    assert not [f for f in findings if f.check == "independent" and f.level is Level.UNSAFE]
    assert not [f for f in findings if f.node == "c-replica" and f.check == "uptime"]
    assert exit_code(facts, findings) == EXIT_UNAVAILABLE  # 1 of 3 listed nodes answered
    assert exit_code(facts[:4], evaluate(facts[:4])) != EXIT_UNAVAILABLE


# --- the command on real nodes -----------------------------------------------------------


@pytest.fixture(scope="module")
def safe() -> Iterator[LocalCluster]:
    """Three nodes that pass every check: AOF fsync'd on every write."""
    with LocalCluster(3, persistence=Persistence.AOF_ALWAYS) as c:
        yield c


@pytest.fixture(scope="module")
def volatile() -> Iterator[LocalCluster]:
    """Three nodes without persistence."""
    with LocalCluster(3) as c:
        yield c


def _tenure_check(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", *args])
    return code, out.getvalue(), err.getvalue()


def _check_json(urls: list[str], *args: str) -> tuple[int, list[dict[str, str]]]:
    code, out, _ = _tenure_check("--json", *args, *_redis(urls))
    findings: list[dict[str, str]] = json.loads(out)
    return code, findings


def _redis(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--redis", url)]


def _levels(findings: list[dict[str, str]]) -> set[tuple[str, str, str]]:
    return {(f["node"], f["check"], f["level"]) for f in findings}


def _unsafe(findings: list[dict[str, str]]) -> list[dict[str, str]]:
    return [f for f in findings if f["level"] == "UNSAFE"]


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}"  # nothing listens there once closed


@contextlib.contextmanager
def _config(node: LocalNode, **settings: str) -> Iterator[None]:
    with node.client(decode_responses=True) as c:
        before = {key: c.config_get(key)[key] for key in settings}
        for key, value in settings.items():
            c.config_set(key, value)
        try:
            yield
        finally:
            for key, value in before.items():
                c.config_set(key, value)


def test_aof_always_is_ok(safe: LocalCluster) -> None:
    code, out, _ = _tenure_check(*_redis(safe.urls))
    assert code == EXIT_OK, out
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "CHECK", "LEVEL", "DETAIL"]
    assert len(lines) == 1 + 3 * 7 + 1  # header, 7 checks per node, summary
    assert all(line.split()[2] == "OK" for line in lines[1:-1]), out
    assert lines[-1].endswith("all OK (exit 0)")


def test_no_persistence_warns(volatile: LocalCluster) -> None:
    code, findings = _check_json(volatile.urls)
    assert code == EXIT_WARN
    persistence = [f for f in findings if f["check"] == "persistence"]
    assert len(persistence) == 3
    assert all(f["level"] == "WARN" and "appendonly no" in f["detail"] for f in persistence)
    # Just started, no data to come back with: the uptime rule says so too.
    assert all(f["level"] == "WARN" for f in findings if f["check"] == "uptime")
    assert not _unsafe(findings)


@pytest.mark.parametrize(
    ("policy", "maxmemory", "code", "level"),
    [
        ("allkeys-lru", "1gb", EXIT_UNSAFE, "UNSAFE"),
        ("allkeys-lru", "0", EXIT_WARN, "WARN"),  # no limit: nothing evicted yet
        ("volatile-lru", "1gb", EXIT_UNSAFE, "UNSAFE"),  # lock keys have a TTL
        ("volatile-ttl", "0", EXIT_WARN, "WARN"),
    ],
)
def test_eviction_policy(
    safe: LocalCluster, policy: str, maxmemory: str, code: int, level: str
) -> None:
    with _config(safe[0], **{"maxmemory-policy": policy, "maxmemory": maxmemory}):
        got, findings = _check_json(safe.urls)
    assert got == code
    eviction = next(f for f in findings if f["node"] == safe[0].url and f["check"] == "eviction")
    assert eviction["level"] == level
    assert policy in eviction["detail"]
    assert all(f["level"] == "OK" for f in findings if f is not eviction)


def test_replica_is_unsafe() -> None:
    # Diskless sync without its default 5 s delay on Redis >= 7; harmless on 6.2.
    with LocalCluster(3, extra_config={"repl-diskless-sync-delay": "0"}) as c:
        master, replica = c[0], c[2]
        replica.replicate_from(master)
        deadline = time.monotonic() + 10
        with replica.client(decode_responses=True) as r:
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.02)
        code, findings = _check_json(c.urls)
    assert code == EXIT_UNSAFE
    levels = _levels(findings)
    assert (replica.url, "role", "UNSAFE") in levels
    assert (master.url, "role", "WARN") in levels  # a master with a replica
    assert (master.url, "independent", "UNSAFE") in levels  # one replication set
    assert (replica.url, "independent", "UNSAFE") in levels
    role = next(f for f in findings if f["node"] == replica.url and f["check"] == "role")
    assert f"a replica of 127.0.0.1:{master.port}" in role["detail"]


def test_same_server_listed_twice_is_unsafe(safe: LocalCluster) -> None:
    twice = [safe[0].url, f"{safe[0].url}/1", safe[1].url]
    code, findings = _check_json(twice)
    assert code == EXIT_UNSAFE
    unsafe = _unsafe(findings)
    assert {(f["node"], f["check"]) for f in unsafe} == {
        (twice[0], "independent"),
        (twice[1], "independent"),
    }
    assert all("same server" in f["detail"] and "run_id" in f["detail"] for f in unsafe)


def test_user_without_config_degrades_to_a_warning(safe: LocalCluster) -> None:
    with acl_user(safe, "tenure-noconfig", "+@all", "-config") as urls:
        code, findings = _check_json(urls)
    assert code == EXIT_WARN
    persistence = [f for f in findings if f["check"] == "persistence"]
    assert len(persistence) == 3
    for f in persistence:
        assert f["level"] == "WARN"
        assert "cannot read persistence settings (CONFIG not permitted)" in f["detail"]
    # INFO memory still tells the eviction policy, and the probe passes.
    assert all(f["level"] == "OK" for f in findings if f["check"] in ("eviction", "acl"))
    assert not _unsafe(findings)


# --- the ACL: what tenure sends, on every server version at hand -------------------------


# Every embedded server, whichever the suite's default is: Redis 6.2 (no ACL DRYRUN, the
# oldest tenure supports), Valkey 9 and Redis 8 (DRYRUN).
SERVERS = embedded_servers()


@pytest.fixture(scope="module", params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """One node of each embedded server: Redis 6.2 (no ACL DRYRUN), Valkey 9 and Redis 8
    (DRYRUN)."""
    with LocalCluster(1, binary=request.param) as c:
        yield c


_WHAT = itertools.count()


@contextlib.contextmanager
def _setuser(cluster: LocalCluster, *rules: str) -> Iterator[tuple[str, list[str]]]:
    """A fresh user made by ``ACL SETUSER <name> <rules>``; yields it and URLs logging in
    as it (password ``pw``)."""
    name = f"tenure-{next(_WHAT)}"
    for node in cluster:
        with node.client() as c:
            c.execute_command("ACL", "SETUSER", name, *rules)
    try:
        yield name, [f"redis://{name}:pw@{node.host}:{node.port}" for node in cluster]
    finally:
        for node in cluster:
            with node.client() as c:
                c.acl_deluser(name)


def _documented(*, without: str = "", extra: tuple[str, ...] = ()) -> list[str]:
    """The rules of docs/deployment.md's line (password ``pw``), less one, plus some."""
    rules = _acl.least_privilege_acl("x", "pw").split()[3:]
    assert without in ("", *rules), without
    return [r for r in rules if r != without] + list(extra)


def _acl_finding(urls: list[str]) -> dict[str, str]:
    _, findings = _check_json(urls)
    [acl] = [f for f in findings if f["check"] == "acl"]
    return acl


def _queued(cluster: LocalCluster, name: str) -> bool:
    with cluster[0].client() as c:
        return int(c.zcard(LockKeys.of(name).queue)) > 0


def _wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# --- the servers: which are supported, and the flavours tenure cannot use ---------------


def _server_finding(urls: list[str]) -> tuple[int, dict[str, str]]:
    code, findings = _check_json(urls)
    [server] = [f for f in findings if f["check"] == "server"]
    return code, server


@pytest.mark.parametrize("name", SERVERS)
def test_the_embedded_servers_are_supported(name: str) -> None:
    with LocalCluster(1, persistence=Persistence.AOF_ALWAYS, binary=name) as c:
        _, server = _server_finding(c.urls)
        assert server["level"] == "OK", server
        version = {"valkey": "Valkey 9.", "redis": "Redis 6.2.", "redis8": "Redis 8."}[name]
        assert server["detail"].startswith(version)


@pytest.mark.parametrize("name", SERVERS)
def test_cluster_mode_with_one_node_is_unsupported(name: str, key: str, tmp_path: Path) -> None:
    # A cluster-mode endpoint that owns every slot itself, as a managed service's single
    # (virtual) node: it still refuses a script whose keys are in two slots, and every
    # tenure script declares the lock's key and the node's floor.
    node = LocalNode("n1", tmp_path, binary=name, extra_config={"cluster-enabled": "yes"})
    node.port = _cluster_port()
    node.start()
    try:
        with node.client() as r:
            r.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
            _wait_until(lambda: r.cluster("info")["cluster_state"] == "ok")
        code, server = _server_finding([node.url])
        assert code == EXIT_UNSAFE
        assert server["level"] == "UNSAFE", server
        assert server["detail"].startswith("unsupported: ")
        assert "CROSSSLOT" in server["detail"]
        assert "even of one (virtual) node" in server["detail"]
        # What the finding says is so: the lock cannot be taken there.
        with tenure.Client([node.url]) as client, pytest.raises(tenure.ConfigurationError):
            client.acquire(key, ttl=5.0, blocking=False)
    finally:
        node.stop()


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too: Redis 6.2 takes no
    ``cluster-port`` and refuses ports above 55535."""
    for _ in range(100):
        with socket.socket() as s, socket.socket() as bus:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            if port > 55535:
                continue
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    pytest.fail("no free port pair below 55535")


@pytest.mark.parametrize("name", SERVERS)
def test_a_server_without_scripts_is_unsupported(name: str, key: str) -> None:
    # Services without Lua answer EVAL as an unknown command, as a renamed one does.
    with LocalCluster(1, binary=name, extra_config={"rename-command": 'EVAL ""'}) as c:
        code, server = _server_finding(c.urls)
        assert code == EXIT_UNSAFE
        assert server["level"] == "UNSAFE", server
        assert "unsupported: " in server["detail"]
        assert "cannot run Lua scripts (EVAL: " in server["detail"]
        # Two round trips (EVALSHA, then EVAL after its NOSCRIPT): a node timeout of 1 s,
        # not the default 50 ms, which a loaded machine once missed (the node reported
        # silent instead of unsupported).
        with (
            tenure.Client(c.urls, node_timeout=1.0) as client,
            pytest.raises(tenure.ConfigurationError),
        ):
            client.acquire(key, ttl=5.0, blocking=False)


@pytest.mark.parametrize("name", SERVERS)
def test_config_disabled_as_on_managed_services_warns(name: str) -> None:
    with LocalCluster(1, binary=name, extra_config={"rename-command": 'CONFIG ""'}) as c:
        code, findings = _check_json(c.urls)
    assert code == EXIT_WARN
    levels = {f["check"]: f for f in findings}
    persistence = levels["persistence"]
    assert persistence["level"] == "WARN"
    assert "CONFIG is disabled or renamed, as managed services do" in persistence["detail"]
    assert levels["eviction"]["level"] == "OK"  # INFO memory stands in for CONFIG
    assert levels["server"]["level"] == "OK"


@pytest.mark.parametrize("fair", [True, False])
def test_the_documented_acl_is_enough(api: Api, server: LocalCluster, key: str, fair: bool) -> None:
    """A user with exactly the documented ACL acquires, waits for a notification, extends
    and releases, and ``tenure check`` says OK for it."""
    with _setuser(server, *_documented()) as (_, urls):
        other = api.sibling()  # the holder, released from a thread of its own
        try:
            lease = other.client(urls).acquire(key, ttl=30.0, fair=fair)
            lease.extend()
            # A re-check comes after 15 s at the earliest and the holder's key lives 30 s:
            # within the 10 s timeout, only the release's notification gets the lock.
            waiter = api.client(urls, recheck=30.0)
            assert waiter.lock(key, ttl=5.0).locked()  # EXISTS

            def release_once_queued() -> None:
                _wait_until(lambda: _queued(server, key))
                lease.release()

            releaser = threading.Thread(target=release_once_queued)
            releaser.start()
            started = time.monotonic()  # (its last attempt, at the timeout, would get it)
            got = waiter.acquire(key, ttl=5.0, timeout=10.0, fair=fair)
            took = time.monotonic() - started
            releaser.join()
            assert took < 5.0, f"woken after {took:.1f} s: not by the release's notification"
            assert got.fencing_token > lease.fencing_token
            got.extend()
            got.release()
            assert not waiter.lock(key, ttl=5.0).locked()
        finally:
            other.close()
        acl = _acl_finding(urls)
    assert acl["level"] == "OK", acl
    assert "may run everything tenure sends" in acl["detail"]


_NEEDED = [need.command for need in _acl.needs()]


@pytest.mark.parametrize("command", _NEEDED)
def test_a_documented_user_without_one_command_fails_the_check(
    server: LocalCluster, command: str
) -> None:
    with _setuser(server, *_documented(without=f"+{command.lower()}")) as (user, urls):
        acl = _acl_finding(urls)
    optional = command == "WAIT"  # only sent with wait_replicas > 0
    assert acl["level"] == ("WARN" if optional else "UNSAFE"), acl
    assert f"user '{user}' may not run {command} (probe: " in acl["detail"]
    assert re.search(rf": ACL SETUSER {user} \+{command.lower()}(;|$)", acl["detail"]), acl


@pytest.mark.parametrize("command", _NEEDED)
def test_a_user_with_all_but_one_command_fails_the_check(
    server: LocalCluster, command: str
) -> None:
    """Asked with ACL DRYRUN (Valkey) or computed from ACL GETUSER (Redis 6.2)."""
    rules = ("reset", "on", ">pw", "~*", "&*", "+@all", f"-{command.lower()}")
    with _setuser(server, *rules) as (user, urls):
        acl = _acl_finding(urls)
    assert acl["level"] == ("WARN" if command == "WAIT" else "UNSAFE"), acl
    assert re.search(rf"may not run {command} \(ACL (DRYRUN|GETUSER): ", acl["detail"]), acl
    assert re.search(rf": ACL SETUSER {user} \+{command.lower()}(;|$)", acl["detail"]), acl


@pytest.mark.parametrize(
    ("without", "extra", "refused", "grant"),
    [
        ("~tenure:*", ("~app:*",), "EVAL on keys tenure:*", "~tenure:*"),
        ("&tenure:wake:*", ("&app:*",), "SUBSCRIBE on channels tenure:wake:*", "&tenure:wake:*"),
    ],
)
def test_a_documented_user_without_a_pattern_fails_the_check(
    server: LocalCluster, without: str, extra: tuple[str, ...], refused: str, grant: str
) -> None:
    with _setuser(server, *_documented(without=without, extra=extra)) as (user, urls):
        acl = _acl_finding(urls)
    assert acl["level"] == "UNSAFE", acl
    assert refused in acl["detail"]
    assert f"Fix: ACL SETUSER {user} {grant}" in acl["detail"]


@pytest.mark.parametrize(
    "without", [("+publish",), ("&tenure:wake:*", "&app:*")], ids=["command", "channel"]
)
def test_a_release_refused_by_acl_is_a_configuration_error(
    api: Api, server: LocalCluster, key: str, without: tuple[str, ...]
) -> None:
    """Without PUBLISH (or its channels), the release script deletes the lock, then fails
    to hand it to the waiter: the client says the node is set up wrong, not that the lease
    was lost."""
    rules = _documented(without=without[0], extra=without[1:])
    with _setuser(server, *rules) as (_, urls):
        lease = api.client(urls).acquire(key, ttl=30.0)
        box: list[int] = []

        def wait() -> None:
            with tenure.Client([server[0].url], recheck=0.2) as waiter:
                got = waiter.acquire(key, ttl=5.0, timeout=20.0)
                box.append(got.fencing_token)
                got.release()

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            _wait_until(lambda: _queued(server, key))
            with pytest.raises(tenure.ServerUnsupported) as info:
                lease.release()
        finally:
            thread.join()  # the waiter gets the lock at its next re-check
        acl = _acl_finding(urls)
    assert not isinstance(info.value, tenure.LeaseLost)
    assert info.value.node == server[0].url
    assert "refused PUBLISH in the release of lock" in str(info.value)
    assert "tenure check" in str(info.value)
    assert box, "the waiter got the lock"
    assert acl["level"] == "UNSAFE"
    assert "may not run PUBLISH" in acl["detail"]


@pytest.mark.parametrize("without", ["", "+zadd"])
def test_an_admin_login_checks_the_clients_user(server: LocalCluster, without: str) -> None:
    """--acl-user: one admin login reads every setting and judges the clients' user."""
    with _setuser(server, *_documented(without=without)) as (user, _):
        _, findings = _check_json(server.urls, "--acl-user", user)
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert re.search(r"\(ACL (DRYRUN|GETUSER)", acl["detail"]), acl
    if without:
        assert acl["level"] == "UNSAFE", acl
        assert f"user '{user}' may not run ZADD" in acl["detail"]
        assert acl["detail"].endswith(f"Fix: ACL SETUSER {user} +zadd")
    else:
        assert acl["level"] == "OK", acl
        assert f"user '{user}' may run everything tenure sends" in acl["detail"]
    # The admin login reads what a least-privilege user may not.
    assert not [f for f in findings if "not permitted" in f["detail"]], findings


@pytest.mark.parametrize(
    ("suffix", "grant", "command", "instead"),
    [
        ("/3", "+select", "SELECT", "or use database 0"),
        ("?client_name=app", "+client|setname", "CLIENT|SETNAME", "or leave client_name out"),
    ],
    ids=["db", "client-name"],
)
def test_an_admin_login_asks_for_what_the_urls_connections_send(
    server: LocalCluster, suffix: str, grant: str, command: str, instead: str
) -> None:
    """A URL naming a database other than 0 has every connection send SELECT, one setting
    a client name CLIENT SETNAME: the documented user, without that permission, fails
    every connection, and --acl-user said OK for it."""
    with _setuser(server, *_documented()) as (user, urls):
        refused = pytest.raises(tenure.NodeMisconfigured, match=re.escape(grant))
        with refused, tenure.Client([urls[0] + suffix]) as client:
            client.acquire("connect", ttl=5.0, blocking=False)
        code, findings = _check_json([u + suffix for u in server.urls], "--acl-user", user)
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert code == EXIT_UNSAFE, findings
    assert acl["level"] == "UNSAFE", acl
    assert f"user '{user}' may not run {command} (ACL " in acl["detail"], acl
    assert f"Fix: ACL SETUSER {user} {grant} ({instead}" in acl["detail"], acl
    # Granted, the clients lock, and the check says so, naming what it asked about.
    with _setuser(server, *_documented(extra=(grant,))) as (user, urls):
        with tenure.Client([urls[0] + suffix]) as client:
            client.acquire("connect", ttl=5.0).release()
        _, findings = _check_json([u + suffix for u in server.urls], "--acl-user", user)
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert acl["level"] == "OK", acl
    assert f", {command}; in scripts" in acl["detail"], acl


@pytest.mark.parametrize(
    ("change", "why", "grant"),
    [
        ({"on": "off"}, "is switched off", "on"),
        ({">pw": None}, "has no password (and is not nopass)", ">PASSWORD"),
    ],
    ids=["off", "no-password"],
)
def test_an_admin_login_finds_a_clients_user_nobody_can_log_in_as(
    server: LocalCluster, change: dict[str, str | None], why: str, grant: str
) -> None:
    """ACL DRYRUN and GETUSER's rules judge permissions whether or not anybody can log in
    as the user: one switched off, or without a password, passed them (OK) while every
    client's AUTH failed."""
    rules = [change.get(r, r) for r in _documented()]
    with _setuser(server, *(r for r in rules if r is not None)) as (user, urls):
        refused = pytest.raises(tenure.NodeMisconfigured, match="refused the credentials")
        with refused, tenure.Client(urls) as client:
            client.acquire("login", ttl=5.0, blocking=False)
        code, findings = _check_json(server.urls, "--acl-user", user)
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert code == EXIT_UNSAFE
    assert acl["level"] == "UNSAFE", acl
    assert acl["detail"].startswith(f"user '{user}' {why}: every client logging in as it"), acl
    assert "(its permissions are enough otherwise)" in acl["detail"], acl
    assert acl["detail"].endswith(f"Fix: ACL SETUSER {user} {grant}"), acl


_DENIED_ZADD = "NOPERM User tenure has no permissions to run the 'zadd' command"


def test_a_clients_user_nobody_can_log_in_as_keeps_its_permission_row() -> None:
    """Switched off and short of a command: both fixes are named, one row each."""
    facts = NodeFacts(
        node="redis://n1:6379",
        info=dict(_INFO, redis_version="7.2.4"),
        user="tenure",
        access=dict(_ALLOWED, ZADD=_DENIED_ZADD),
        access_method="ACL DRYRUN",
        login=UserLogin(("off", "sanitize-payload"), 1),
    )
    login, permissions = check_access(facts)
    assert (login.level, permissions.level) == (Level.UNSAFE, Level.UNSAFE)
    assert login.detail.endswith("cannot lock on this node. Fix: ACL SETUSER tenure on")
    assert "may not run ZADD" in permissions.detail
    # A user that can log in gets the permission row alone.
    for flags, passwords in [(("on",), 1), (("on", "nopass"), 0)]:
        facts.login = UserLogin(flags, passwords)
        assert check_access(facts) == [permissions]


def test_acl_user_needs_a_login_that_may_ask(server: LocalCluster) -> None:
    with _setuser(server, *_documented()) as (_, urls):
        _, findings = _check_json(urls, "--acl-user", "someone")
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert acl["level"] == "WARN", acl
    assert (
        "cannot check the permissions of user 'someone': --acl-user needs a login that "
        in (acl["detail"])
    )


def test_acl_user_the_node_does_not_have_is_said_so(server: LocalCluster) -> None:
    # An admin login was told "--acl-user needs a login that may run ACL DRYRUN", which
    # it may: the node refused DRYRUN only because it has no such user (a typo).
    _, findings = _check_json(server.urls, "--acl-user", "no-such-user")
    [acl] = [f for f in findings if f["check"] == "acl"]
    assert acl["level"] == "WARN", acl
    assert "the node has no ACL user 'no-such-user'" in acl["detail"], acl
    assert "needs a login" not in acl["detail"], acl


def test_the_probe_leaves_nothing_behind(server: LocalCluster) -> None:
    with _setuser(server, *_documented(without="+zadd")) as (_, urls):
        assert _acl_finding(urls)["level"] == "UNSAFE"
    with server[0].client() as c:
        assert c.keys("tenure:{check}*") == []


def test_unreachable_node_is_unsafe(safe: LocalCluster) -> None:
    dead = _dead_url()
    code, findings = _check_json([*safe.urls[:2], dead])
    assert code == EXIT_UNSAFE
    [down] = [f for f in findings if f["node"] == dead]
    assert down["check"] == "reachable"
    assert down["level"] == "UNSAFE"
    assert down["detail"].startswith("unreachable: ")
    assert _unsafe(findings) == [down]


def _check_process(
    *urls: str, options: tuple[str, ...] = ()
) -> tuple[int, list[dict[str, str]], str]:
    """``tenure check --json`` as an operator runs it: a process of its own."""
    result = subprocess.run(
        [sys.executable, "-m", "tenure.cli", "check", "--json", *_redis(list(urls)), *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(tenure.__file__).parents[1])},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("speaks", SPEAKS)
def test_a_server_that_is_not_redis_is_named_with_the_fix(safe: LocalCluster, speaks: str) -> None:
    # It was a traceback and exit 1 for a server that speaks RESP without being Redis
    # (an echo, +OK or :1 to anything), and "unreachable" without a fix for an HTTP
    # server: a node that answered at once, blamed on the network.
    with GarbageServer(speaks) as garbage:
        code, findings, err = _check_process(*safe.urls[:2], garbage.url)
    assert code == EXIT_UNSAFE, err
    [row] = [f for f in findings if f["node"] == garbage.url]
    assert (row["check"], row["level"]) == ("reachable", "UNSAFE")
    assert row["detail"].startswith("misconfigured: does not speak the Redis protocol"), row
    assert "check the host and port" in row["detail"], row
    assert _unsafe(findings) == [row]


@pytest.mark.parametrize("kind", ["plain", "sentinel", "cluster"])
def test_a_node_that_never_ends_its_answer_is_given_up(kind: str) -> None:
    # redis-py bounds each wait for bytes by the socket timeout, not a whole reply: a
    # server sending one byte at a time (a stalled proxy, a dying server) kept `tenure
    # check` reading it for ever, whatever --node-timeout said. (Alone: the module's
    # nodes are kept young for the uptime checks.) A node timeout of 0.25 s: five of the
    # server's bytes to each wait, so that a loaded machine's late drip (the server is a
    # thread of this process) is not read as a node that never answered at all (0.1 s
    # was, under a load of 14; the test's time grows with it: 0.5 s took 72 s).
    with GarbageServer("slow") as slow:
        url = slow.as_node(kind)
        code, findings, err = _check_process(url, options=("--node-timeout", "0.25"))
    assert code == EXIT_UNAVAILABLE, err
    [row] = findings
    assert (row["node"], row["check"], row["level"]) == (url, "reachable", "UNSAFE"), row
    if kind == "sentinel":
        # Every Sentinel is asked, each within a budget of its own: the one that never
        # ends its answer is named, the node found without a master.
        said = f"(127.0.0.1:{slow.port}: no complete answer within"
        assert row["detail"].startswith("no Sentinel named a master for service 'locks' " + said)
        assert "check the Sentinel's host and port" in row["detail"], row
    else:
        assert row["detail"].startswith("unreachable: no complete answer within"), row
        assert "check the node's host and port" in row["detail"], row


def test_a_refused_password_is_named_with_the_fix(safe: LocalCluster) -> None:
    # It was "login failed: " and the server's words, without what to check.
    wrong = safe[0].url.replace("redis://", "redis://:wrong@")
    code, findings, err = _check_process(wrong, *safe.urls[1:])
    assert code == EXIT_UNSAFE, err
    [row] = _unsafe(findings)
    assert (row["node"], row["check"]) == (safe[0].url, "reachable")
    assert row["detail"].startswith("misconfigured: refused the credentials"), row
    assert "check the user name and password" in row["detail"], row


def test_majority_unreachable_exits_69(safe: LocalCluster) -> None:
    code, out, err = _tenure_check(*_redis([safe[0].url, _dead_url(), _dead_url()]))
    assert code == EXIT_UNAVAILABLE
    assert "only 1 of 3 nodes answered" in err
    assert "(exit 69)" in out


def test_json_output_from_a_real_process(volatile: LocalCluster) -> None:
    # A bare environment (no TENURE_* from the caller), but the same tenure this test
    # imports, installed or not.
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(tenure.__file__).parents[1]),
        "TENURE_REDIS": ",".join(volatile.urls),
    }
    result = subprocess.run(
        # A day, the longest max_ttl: the module's nodes, however long its tests ran
        # before this one, are younger, so the uptime finding that echoes it is there
        # (--max-ttl 30 missed it once the nodes had run 30 s).
        [sys.executable, "-m", "tenure.cli", "check", "--json", "--max-ttl", "86400"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert result.returncode == EXIT_WARN, result.stderr
    findings = json.loads(result.stdout)
    assert isinstance(findings, list)
    assert {tuple(sorted(f)) for f in findings} == {("check", "detail", "level", "node")}
    assert {f["node"] for f in findings} == set(volatile.urls)
    assert {f["level"] for f in findings} <= {"OK", "WARN", "UNSAFE"}
    assert any("max_ttl 86400 s" in f["detail"] for f in findings)


@pytest.mark.parametrize(
    "args",
    [
        [],  # no --redis and no TENURE_REDIS
        ["--redis", "http://127.0.0.1:1"],
        ["--redis", "redis://127.0.0.1:1", "--max-ttl", "0"],
        ["--redis", "redis://127.0.0.1:1", "--", "extra"],
        # URL options redis-py refuses: a traceback and exit 1 (the "warnings" code).
        ["--redis", "redis://127.0.0.1:1?socket_timeout=abc"],
        ["--redis", "redis://127.0.0.1:1?ssl_cert_reqs=bogus"],
        # Out of the clients' ranges: each node's row was "error: OverflowError: timestamp
        # out of range", exit 69; --max-ttl 1e300 warned of every node's uptime.
        ["--redis", "redis://127.0.0.1:1", "--node-timeout", "1e300"],
        ["--redis", "redis://127.0.0.1:1", "--node-timeout", "61"],
        ["--redis", "redis://127.0.0.1:1", "--max-ttl", "1e300"],
    ],
)
def test_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.delenv("TENURE_REDIS", raising=False)
    code, _, err = _tenure_check(*args)
    assert code == 2
    assert "Traceback" not in err


def test_the_same_url_twice_gets_one_finding_per_entry() -> None:
    a, b = _facts(node="a"), _facts(node="a")
    findings = [f for f in evaluate([a, b]) if f.check == "independent"]
    assert [(f.node, f.level) for f in findings] == [("a", Level.UNSAFE), ("a", Level.UNSAFE)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--max-ttl", "0"],
            "--max-ttl: must be a number of seconds from 0.001 to 86400, got 0 (the default "
            "is 60 s; e.g. --max-ttl 120)",
        ),
        (
            ["--node-timeout", "1s"],
            "--node-timeout: must be a number of seconds from 0.001 to 60, got '1s', not a "
            "number (the default is 1 s; e.g. --node-timeout 2)",
        ),
    ],
)
def test_a_refused_number_says_the_default_and_an_example(args: list[str], said: str) -> None:
    # "must be in [0.001, 86400] seconds, got 0": neither the default nor a value that works.
    code, out, err = _tenure_check("--redis", "redis://127.0.0.1:1", *args)
    assert code == 2
    assert out == ""
    assert err.splitlines()[-1] == f"tenure check: error: argument {said}", err


def _check_usage_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``tenure check ARGS`` as a script runs it, without TENURE_REDIS."""
    return subprocess.run(
        [sys.executable, "-m", "tenure.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(tenure.__file__).parents[1])},
    )


_NOWHERE = "redis://127.0.0.1:1"  # never reached: the command line is refused first


@pytest.mark.parametrize(
    ("args", "rows"),
    [
        (["check", "--json", "--redis", _NOWHERE, "--max-ttl", "0"], 1),
        (["check", "--redis", _NOWHERE, "--max-ttl", "0", "--json"], 1),
        (["check", "--js", "--node-timeout", "61", "--redis", _NOWHERE], 1),
        (["check", "--json", "--bogus", "--max-ttl", "1e300"], 2),  # one row each
        (["--json", "check"], 1),  # a top-level option it does not have
        # Refused by tenure check itself, after the parse (exit 2, "usage error" too).
        (["check", "--json"], 1),  # no --redis and no TENURE_REDIS
        (["check", "--json", "--redis", "http://127.0.0.1:1"], 1),
        (["check", "--json", "--redis", f"{_NOWHERE}?socket_timeout=abc"], 1),
    ],
)
def test_a_usage_error_with_json_is_a_json_finding_on_stdout(args: list[str], rows: int) -> None:
    # stdout was empty: a script parsing it failed on the JSON, not on the usage error.
    result = _check_usage_process(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    errors = [
        line.split(": error: ", 1)[1] for line in result.stderr.splitlines() if ": error: " in line
    ]
    assert len(errors) == rows, result.stderr
    findings = json.loads(result.stdout)
    # The findings' shape, which readers of `tenure check --json` know: a list of
    # {node, check, level, detail}; UNSAFE, so that none takes it for a pass.
    assert findings == [
        {"node": "", "check": "usage", "level": "UNSAFE", "detail": error} for error in errors
    ], result.stderr
    assert _unsafe(findings) == findings


def test_only_check_with_json_answers_a_usage_error_on_stdout() -> None:
    asked = _check_usage_process("check", "--json", "--max-ttl", "0")
    assert asked.returncode == 2, asked
    assert json.loads(asked.stdout)[0]["check"] == "usage", asked
    # argparse's usage line and error stay on stderr.
    assert asked.stderr.startswith("usage: tenure check "), asked.stderr
    assert "tenure check: error: argument --max-ttl: " in asked.stderr
    for args in [
        ["check", "--redis", _NOWHERE, "--max-ttl", "0"],
        ["status", "x", "--json"],  # only tenure check has a JSON output
        ["run", "x", "--json", "--", "true"],  # run's stdout is its command's
    ]:
        result = _check_usage_process(*args)
        assert result.returncode == (78 if args[0] == "run" else 2), result
        assert result.stdout == "", result
        assert "error: " in result.stderr

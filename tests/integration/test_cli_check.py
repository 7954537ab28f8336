"""``tenure check``: the pure evaluation rules (tables, no server) and the command on real
redis-server nodes set up to be safe, risky and unsafe in each way it reports.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tenure.check import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_WARN,
    Finding,
    Level,
    NodeFacts,
    check_access,
    check_eviction,
    check_independence,
    check_persistence,
    check_role,
    check_server,
    check_uptime,
    evaluate,
    exit_code,
)
from tenure.cli import main
from tenure.local import LocalCluster, LocalNode, Persistence

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
_ALLOWED = {"EVAL": None, "EXISTS": None, **{f"{c} in scripts": None for c in ("SET", "DEL")}}

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
        (_facts(config={"appendfsync": "everysec"}), Level.WARN, "keep the node out for max_ttl"),
        (_facts(config={"appendfsync": "no"}), Level.WARN, "~30 s"),
        (_facts(config={"appendonly": "no"}), Level.WARN, 'appendonly no, save ""'),
        (_facts(config={"appendonly": "no"}), Level.WARN, "docs/fencing.md"),
        (_facts(config={"appendonly": "no", "save": None}), Level.WARN, "save unknown"),
        (
            _facts(config={"appendonly": "no", "save": "3600 1 300 100 60 10000"}),
            Level.UNSAFE,
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
        (_facts(config={"maxmemory-policy": "volatile-lru"}), Level.WARN, "lock keys"),
        (_facts(config={"maxmemory-policy": "volatile-ttl"}), Level.WARN, "warm-up markers"),
        (
            _facts(config={"maxmemory-policy": "allkeys-lru", "maxmemory": "1073741824"}),
            Level.UNSAFE,
            "fencing counters included",
        ),
        (_facts(config={"maxmemory-policy": "allkeys-random"}), Level.WARN, "maxmemory 0"),
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
        (_facts({"connected_slaves": "1"}), Level.WARN, "R9"),
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


@pytest.mark.parametrize(
    ("info", "level", "fragment"),
    [
        ({}, Level.OK, "Redis 6.2.14"),
        ({"redis_version": "7.2.4"}, Level.OK, "Redis 7.2.4"),
        ({"redis_version": "2.6.11"}, Level.UNSAFE, "older than 2.6.12"),
        ({"redis_version": "2.6.12"}, Level.WARN, "untested"),
        ({"redis_version": "5.0.7"}, Level.WARN, "older than 6.2"),
        ({"redis_version": None}, Level.WARN, "not Redis?"),
        ({"valkey_version": "8.0.1", "redis_version": "7.2.4"}, Level.WARN, "Valkey 8.0.1"),
    ],
)
def test_server_rules(info: Overrides, level: Level, fragment: str) -> None:
    _expect(check_server(_facts(info)), level, fragment)


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
        ({"access": {**_ALLOWED, "EVAL": _DENIED_EVAL}}, Level.UNSAFE, "may not run EVAL"),
        (
            {"access": {**_ALLOWED, "SET in scripts": _DENIED_IN_SCRIPT}},
            Level.UNSAFE,
            "may not run SET in scripts",
        ),
        (
            {
                "access": {
                    **_ALLOWED,
                    "EXISTS": "This user has no permissions to access the 'k' key",
                },
                "access_method": "ACL DRYRUN",
            },
            Level.UNSAFE,
            "(ACL DRYRUN: This user has no permissions",
        ),
        (
            {"access": {**_ALLOWED, "SET in scripts": "OOM command not allowed"}},
            Level.WARN,
            "failed: OOM",
        ),
        ({"access_error": "Timeout reading from socket"}, Level.WARN, "cannot check"),
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


@contextlib.contextmanager
def _acl_user(cluster: LocalCluster, name: str, *commands: str) -> Iterator[list[str]]:
    """User ``name`` (password ``pw``, any key) on every node; yields URLs logging in as it."""
    for node in cluster:
        with node.client() as c:
            c.acl_setuser(
                name,
                enabled=True,
                reset=True,
                passwords=["+pw"],
                keys=["*"],
                commands=list(commands),
            )
    try:
        yield [f"redis://{name}:pw@{node.host}:{node.port}" for node in cluster]
    finally:
        for node in cluster:
            with node.client() as c:
                c.acl_deluser(name)


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
        ("volatile-lru", "1gb", EXIT_WARN, "WARN"),
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
    assert (master.url, "role", "WARN") in levels  # a master with a replica (R9)
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
    with _acl_user(safe, "tenure-noconfig", "+@all", "-config") as urls:
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


@pytest.mark.parametrize(
    ("rules", "refused"),
    [
        (("-eval", "-evalsha"), "may not run EVAL"),
        (("-set",), "may not run SET in scripts"),  # refused inside the script
        (("-exists",), "may not run EXISTS, EXISTS in scripts"),
    ],
)
def test_user_without_a_needed_command_is_unsafe(
    safe: LocalCluster, rules: tuple[str, ...], refused: str
) -> None:
    with _acl_user(safe, "tenure-limited", "+@all", *rules) as urls:
        code, findings = _check_json(urls)
    assert code == EXIT_UNSAFE
    acl = [f for f in findings if f["check"] == "acl"]
    assert len(acl) == 3
    for f in acl:
        assert f["level"] == "UNSAFE"
        assert "user 'tenure-limited' " + refused in f["detail"]
    assert [f for f in _unsafe(findings) if f["check"] != "acl"] == []
    with safe[0].client() as c:
        assert not c.exists("tenure:{check}:probe")  # the probe cleaned up


def test_unreachable_node_is_unsafe(safe: LocalCluster) -> None:
    dead = _dead_url()
    code, findings = _check_json([*safe.urls[:2], dead])
    assert code == EXIT_UNSAFE
    [down] = [f for f in findings if f["node"] == dead]
    assert down["check"] == "reachable"
    assert down["level"] == "UNSAFE"
    assert down["detail"].startswith("unreachable: ")
    assert _unsafe(findings) == [down]


def test_majority_unreachable_exits_69(safe: LocalCluster) -> None:
    code, out, err = _tenure_check(*_redis([safe[0].url, _dead_url(), _dead_url()]))
    assert code == EXIT_UNAVAILABLE
    assert "only 1 of 3 nodes answered" in err
    assert "(exit 69)" in out


def test_json_output_from_a_real_process(volatile: LocalCluster) -> None:
    env = {"PATH": "/usr/bin:/bin", "TENURE_REDIS": ",".join(volatile.urls)}
    result = subprocess.run(
        [sys.executable, "-m", "tenure.cli", "check", "--json", "--max-ttl", "30"],
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
    assert any("max_ttl 30 s" in f["detail"] for f in findings)


@pytest.mark.parametrize(
    "args",
    [
        [],  # no --redis and no TENURE_REDIS
        ["--redis", "http://127.0.0.1:1"],
        ["--redis", "redis://127.0.0.1:1", "--max-ttl", "0"],
        ["--redis", "redis://127.0.0.1:1", "--", "extra"],
    ],
)
def test_usage_errors_exit_2(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.delenv("TENURE_REDIS", raising=False)
    code, _, _ = _tenure_check(*args)
    assert code == 2


def test_the_same_url_twice_gets_one_finding_per_entry() -> None:
    a, b = _facts(node="a"), _facts(node="a")
    findings = [f for f in evaluate([a, b]) if f.check == "independent"]
    assert [(f.node, f.level) for f in findings] == [("a", Level.UNSAFE), ("a", Level.UNSAFE)]

"""Configuration: node URLs, node counts, client settings, lock specs, acquire arguments."""

from __future__ import annotations

import enum
import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError
from tenure._core.caching import CACHED_CHARS
from tenure._core.config import (
    MAX_NAME_BYTES,
    NODE_FLOOR,
    NODE_WARM,
    ClientConfig,
    LockKeys,
    LockSpec,
    NodeAddress,
    SpecCache,
    check_acquire_args,
    check_key_prefix,
    check_node_count,
    lock_key,
    min_ttl,
    parse_node_url,
)
from tenure._core.policy import wait_random, wait_random_exponential
from tenure._core.slots import slot_tag

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=200)

THREE = ["redis://a:6379", "redis://b:6379", "redis://c:6379"]


def config(
    nodes: list[str] | None = None,
    *,
    node_timeout: float = 0.05,
    drift_factor: float = 0.01,
    drift_floor: float = 0.002,
    max_ttl: float = 60.0,
) -> ClientConfig:
    return ClientConfig.build(
        nodes or THREE,
        node_timeout=node_timeout,
        drift_factor=drift_factor,
        drift_floor=drift_floor,
        max_ttl=max_ttl,
    )


# --- node URLs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "scheme", "host", "port", "path", "db"),
    [
        ("redis://localhost", "redis", "localhost", 6379, None, 0),
        ("redis://localhost:6380", "redis", "localhost", 6380, None, 0),
        ("redis://localhost:6380/3", "redis", "localhost", 6380, None, 3),
        ("redis://localhost/3", "redis", "localhost", 6379, None, 3),
        ("redis://localhost:6380/", "redis", "localhost", 6380, None, 0),
        ("redis://localhost?db=4", "redis", "localhost", 6379, None, 4),
        ("redis://10.0.0.7:7000/0", "redis", "10.0.0.7", 7000, None, 0),
        ("REDIS://Example.COM:1", "redis", "example.com", 1, None, 0),
        ("redis://[::1]:6390", "redis", "::1", 6390, None, 0),
        ("rediss://secure.example:6380/1", "rediss", "secure.example", 6380, None, 1),
        ("rediss://secure.example", "rediss", "secure.example", 6379, None, 0),
        ("redis://user:secret@host:6390/2", "redis", "host", 6390, None, 2),
        ("redis://:secret@host", "redis", "host", 6379, None, 0),
        ("redis://host:65535", "redis", "host", 65535, None, 0),
        ("unix:///tmp/redis.sock", "unix", None, None, "/tmp/redis.sock", 0),
        ("unix:///tmp/redis.sock?db=2", "unix", None, None, "/tmp/redis.sock", 2),
        ("unix:///tmp/with%20space.sock", "unix", None, None, "/tmp/with space.sock", 0),
    ],
)
def test_parse_node_url(
    url: str, scheme: str, host: str | None, port: int | None, path: str | None, db: int
) -> None:
    a = parse_node_url(url)
    # The URL redis-py is given spells its scheme in lower case: its blocking client
    # refuses any other.
    given = url.replace("REDIS://", "redis://")
    assert (a.url, a.scheme, a.host, a.port, a.path, a.db) == (given, scheme, host, port, path, db)


@pytest.mark.parametrize(
    ("url", "given"),
    [
        ("  redis://h:6380/2  ", "redis://h:6380/2"),
        ("\tRediss://h:6380\n", "rediss://h:6380"),
        ("UNIX:///tmp/r.sock?db=1", "unix:///tmp/r.sock?db=1"),
        ("Redis://u:p@h:1/0?db=0", "redis://u:p@h:1/0?db=0"),
    ],
)
def test_whitespace_and_the_schemes_case_are_no_part_of_the_url(url: str, given: str) -> None:
    a = parse_node_url(url)
    assert a.url == given
    assert a.display == parse_node_url(given).display


@pytest.mark.parametrize("url", ["redis://h:1/3?db=4", "redis://h:1/0?db=2", "rediss://h/1?db=0"])
def test_a_url_naming_two_databases_is_refused(url: str) -> None:
    # redis-py would take the query's, while the node is named by the path's.
    with pytest.raises(ConfigurationError) as info:
        parse_node_url(url, "nodes[1]")
    assert info.value.parameter == "nodes[1]"
    assert "give the database once" in str(info.value)


@pytest.mark.parametrize(
    ("url", "display"),
    [
        ("redis://user:secret@host:6390/2", "redis://host:6390/2"),
        ("redis://:secret@host", "redis://host:6379"),
        ("rediss://admin:hunter2@h:1", "rediss://h:1"),
        ("redis://h:7000/0", "redis://h:7000"),
        ("unix://:pw@/tmp/r.sock?db=3", "unix:///tmp/r.sock?db=3"),
        ("unix:///tmp/r.sock", "unix:///tmp/r.sock"),
    ],
)
def test_display_hides_credentials(url: str, display: str) -> None:
    a = parse_node_url(url)
    assert a.display == display
    for secret in ("secret", "hunter2", "admin", "user", "pw"):
        assert secret not in a.display


@pytest.mark.parametrize(
    "url",
    [
        "redis://host",
        "redis://host:7000/5",
        "rediss://u:p@host:7000",
        "unix:///tmp/x.sock?db=1",
        "redis://[::1]:6390",
        "redis://[2001:db8::1]/3",
    ],
)
def test_display_is_a_url_for_the_same_server(url: str) -> None:
    """What goes into logs and error messages can be pasted back and means the same node."""
    a = parse_node_url(url)
    assert parse_node_url(a.display).identity == a.identity


def test_two_databases_of_one_server_are_refused_as_two_nodes() -> None:
    """A crash, pause or restart without data of the server takes both votes at once: not
    the independent masters a Redlock needs (``tenure check`` calls it unsafe too)."""
    for nodes in (
        ["redis://h:7001/0", "redis://h:7001/1", "redis://h:7002"],
        ["unix:///tmp/a.sock", "redis://h:7002", "unix:///tmp/a.sock?db=3"],
        [
            "redis+sentinel://s1:26379,s2:26379/main/0",
            "redis://h:7002",
            "redis+sentinel://s2:26379,s1:26379/main/2",
        ],
    ):
        with pytest.raises(ConfigurationError) as info:
            ClientConfig.build(nodes)
        assert "is the same server as nodes[" in str(info.value)
        assert "a different database, but the same server" in str(info.value)


def test_identity() -> None:
    assert parse_node_url("redis://h").identity == parse_node_url("rediss://u:p@H:6379/0").identity
    # Two databases of one server are one process: one vote.
    assert parse_node_url("redis://h/1").identity == parse_node_url("redis://h/2").identity
    assert parse_node_url("unix:///a?db=1").identity == parse_node_url("unix:///a").identity
    assert parse_node_url("redis://h:1").identity != parse_node_url("redis://h:2").identity
    assert parse_node_url("unix:///a").identity != parse_node_url("unix:///b").identity


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "redis://",
        "redis://:6379",
        "redis:///0",
        "redis://host:99999",
        "redis://host:65536",
        "redis://host:abc",
        "redis://host:-1",
        "redis://host:0",
        "redis://host/abc",
        "redis://host/-1",
        "redis://host?db=x",
        "http://host:6379",
        "tcp://host:6379",
        "host:6379",
        "localhost",
        "unix://",
        "unix:///tmp/x.sock?db=abc",
        "unix:///tmp/x.sock?db=-2",
        "redis://[::1",
    ],
)
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_node_url(url, "nodes[3]")
    assert info.value.parameter == "nodes[3]"


def test_a_cluster_url_is_one_node() -> None:
    url = "rediss+cluster://app:s3cret@h1:7000,[::1]:7001,h1:7000?ssl_cert_reqs=none"
    config = ClientConfig.build(["redis://a", url, "redis://c"])
    node = config.nodes[1]
    assert len(config.nodes) == 3  # one vote, however many seeds
    assert node.seeds == (("h1", 7000), ("::1", 7001))
    assert node.display == "rediss+cluster://h1:7000,[::1]:7001"
    assert "s3cret" not in repr(node)
    member = node.member("10.0.0.5", 7002)
    assert member.url == "rediss://app:s3cret@10.0.0.5:7002?ssl_cert_reqs=none"
    assert member.display == "rediss://10.0.0.5:7002"
    assert config.per_slot
    assert not ClientConfig.build(["redis://a"]).per_slot
    # The same cluster listed twice by the same seeds counts its vote twice: refused.
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build([url, "redis://b", "REDISS+CLUSTER://h1:7000,[::1]:7001"])
    assert info.value.parameter == "nodes[2]"
    # So is the same cluster named by other members: one seed in common is one cluster
    # (a RedisCluster object names every member it discovered, a URL those it lists).
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build([url, "redis://b", "rediss+cluster://h9:7000,[::1]:7001"])
    assert info.value.parameter == "nodes[2]"
    assert "same Redis Cluster as nodes[0]" in str(info.value)
    assert "[::1]:7001" in str(info.value)
    assert len(ClientConfig.build([url, "redis://b", "redis+cluster://h9:7000"]).nodes) == 3


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://", "names an empty host"),
        ("redis+cluster://h1:7000,,h2:7001", "names an empty host"),
        ("redis+cluster://u:s3cret@h1:99999", "port must be in 1..65535"),
        ("redis+cluster://h1:x", "is not a number"),
        ("redis+cluster://h1:7000/1", "database 0 only"),
        ("redis+cluster://::1:7000", "IPv6 address in brackets"),
        ("redis+cluster://[::1:7000", "closing ']'"),
    ],
)
def test_a_malformed_cluster_url_is_refused_naming_the_form(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(["redis://a", url, "redis://c"])
    message = str(info.value)
    assert info.value.parameter == "nodes[1]"
    assert says in message
    assert "redis+cluster://[user:password@]host:port[,host:port...]" in message
    assert "s3cret" not in message


def test_a_cluster_clients_node_keys_are_per_slot_on_every_node() -> None:
    config = ClientConfig.build(["redis://a", "redis+cluster://h:1", "redis://c"])
    for name in ("orders:1", "}x", "a}b", "{}"):
        keys = LockSpec.build(config, name, 2.0).keys
        slot = key_slot(keys.lock)
        assert keys.floor == f"tenure:{{{slot_tag(slot)}}}:floor"
        assert keys.warm == f"tenure:{{{slot_tag(slot)}}}:warm"
        assert {key_slot(k) for k in (keys.lock, keys.queue, keys.floor, keys.warm)} == {slot}
    plain = LockSpec.build(ClientConfig.build(["redis://a"]), "orders:1", 2.0).keys
    assert (plain.floor, plain.warm) == ("tenure:node:floor", "tenure:node:warm")


@pytest.mark.parametrize("url", [None, 6379, b"redis://h", ["redis://h"], 1.5])
def test_non_string_urls_are_refused(url: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_node_url(url, "nodes[0]")
    assert info.value.parameter == "nodes[0]"


@pytest.mark.parametrize(
    ("nodes", "index"),
    [
        (["redis://a", "http://b", "redis://c"], 1),
        (["redis://a", "redis://b", "redis://c:99999"], 2),
        ([42, "redis://b", "redis://c"], 0),
        (["redis://a", "redis://b", ""], 2),
        (["redis://a", "redis://b", "redis://c:abc"], 2),
    ],
)
def test_client_config_names_the_bad_node(nodes: list[object], index: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(nodes)
    assert info.value.parameter == f"nodes[{index}]"
    assert str(info.value).startswith(f"nodes[{index}]:")


@pytest.mark.parametrize("nodes", ["redis://a", None, 3, {"redis://a"}, b"redis://a"])
def test_nodes_must_be_a_list(nodes: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(nodes)
    assert info.value.parameter == "nodes"
    assert "one node too goes in a list, e.g. ['redis://" in str(info.value)  # the fix


def test_a_bare_object_is_named_by_its_class_and_a_bare_url_without_its_password() -> None:
    # A redis-py client's repr runs to a page (its every setting).
    class Verbose:
        def __repr__(self) -> str:
            return "<Verbose " + "setting=1," * 100 + ">"

    with pytest.raises(ConfigurationError, match=r"got a \S+Verbose; one node") as info:
        ClientConfig.build(Verbose())
    assert len(str(info.value)) < 300
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build("redis://app:s3cret@10.0.0.1:6379")
    assert "s3cret" not in str(info.value)
    assert "redis://app:***@10.0.0.1:6379" in str(info.value)


def test_malformed_url_error_hides_nothing_it_should_not_need() -> None:
    # The error names the offending entry; it is a ValueError for generic callers.
    with pytest.raises(ValueError, match=r"nodes\[1\]"):
        ClientConfig.build(["redis://a", "ftp://b", "redis://c"])


# --- node counts ---------------------------------------------------------------------------


def test_empty_node_list_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty") as info:
        ClientConfig.build([])
    assert info.value.parameter == "nodes"
    with pytest.raises(ConfigurationError):
        ClientConfig.build([], allow_even=True)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_even_node_counts_refused_unless_allowed(n: int) -> None:
    urls = [f"redis://h{i}" for i in range(n)]
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(urls)
    message = str(info.value)
    assert info.value.parameter == "nodes"
    assert "odd" in message
    assert "allow_even=True" in message
    assert f"majority is {n // 2 + 1}" in message
    cfg = ClientConfig.build(urls, allow_even=True)
    assert len(cfg.nodes) == n
    assert cfg.quorum == n // 2 + 1
    assert cfg.allow_even


@pytest.mark.parametrize(("n", "quorum"), [(1, 1), (3, 2), (5, 3), (7, 4)])
def test_odd_node_counts_accepted(n: int, quorum: int) -> None:
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(n)])
    assert cfg.quorum == quorum
    assert all(isinstance(a, NodeAddress) for a in cfg.nodes)


def test_check_node_count_directly() -> None:
    check_node_count(1, allow_even=False)
    check_node_count(4, allow_even=True)
    with pytest.raises(ConfigurationError):
        check_node_count(0, allow_even=True)
    with pytest.raises(ConfigurationError):
        check_node_count(2, allow_even=False)


@pytest.mark.parametrize(
    ("nodes", "second", "first"),
    [
        (["redis://a", "redis://b", "redis://a"], 2, 0),
        (["redis://a", "redis://a:6379/0", "redis://c"], 1, 0),
        (["redis://a", "redis://b", "rediss://u:p@A:6379"], 2, 0),
        (["redis://x", "redis://b/1", "redis://b?db=1"], 2, 1),
        (["unix:///s", "redis://b", "unix:///s?db=0"], 2, 0),
    ],
)
def test_duplicate_nodes_refused_naming_the_second(
    nodes: list[str], second: int, first: int
) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(nodes)
    assert info.value.parameter == f"nodes[{second}]"
    assert f"nodes[{first}]" in str(info.value)
    assert "twice" in str(info.value)


def test_same_host_different_port_is_not_a_duplicate() -> None:
    cfg = ClientConfig.build(["redis://a/0", "redis://a:6380/1", "redis://a:6381"])
    assert len(cfg.nodes) == 3


# --- client settings ----------------------------------------------------------------------


def test_client_defaults() -> None:
    cfg = config()
    assert cfg.node_timeout == 0.05
    assert cfg.connect_timeout == 1.0
    assert cfg.drift_factor == 0.01
    assert cfg.drift_floor == 0.002
    assert isinstance(cfg.retry, wait_random_exponential)
    assert cfg.quorum == 2
    assert cfg.max_ttl_ms == 60_000
    assert ClientConfig.build(THREE).max_ttl_ms == 60_000
    custom = ClientConfig.build(THREE, retry=wait_random(0.0, 0.1))
    assert custom.retry == wait_random(0.0, 0.1)


@pytest.mark.parametrize(
    ("parameter", "good", "bad"),
    [
        (
            "node_timeout",
            [0.001, 1, 60.0],
            [0, 0.0, 0.0009, -1, 60.001, math.nan, math.inf, True, "1"],
        ),
        ("connect_timeout", [0.001, 2, 60.0], [0, -1, 60.001, math.nan, math.inf, False, None]),
        ("drift_factor", [0, 0.0, 0.01, 0.499], [-0.01, 0.5, 1, math.nan, math.inf, False]),
        ("drift_floor", [0, 0.0, 0.002, 10], [-0.001, 10.001, math.nan, -math.inf, True]),
    ],
)
def test_numeric_ranges(parameter: str, good: list[object], bad: list[object]) -> None:
    # (A max_ttl of a day, so that every TTL allowed by the good values is below it.)
    for value in good:
        cfg = ClientConfig.build(THREE, max_ttl=86_400, **{parameter: value})  # type: ignore[arg-type]
        assert getattr(cfg, parameter) == value
        assert type(getattr(cfg, parameter)) is float
    for value in [*bad, 2**1100, -(2**1100)]:  # ints beyond float range: no OverflowError
        with pytest.raises(ConfigurationError) as info:
            ClientConfig.build(THREE, max_ttl=86_400, **{parameter: value})  # type: ignore[arg-type]
        assert info.value.parameter == parameter, value


@pytest.mark.parametrize(
    ("settings", "shortest"),
    [
        ({"node_timeout": 30}, "61.229"),  # with the default max_ttl, 60 s
        ({"max_ttl": 0.05}, "0.107"),
        ({"drift_floor": 10, "max_ttl": 20}, "20.51"),
        ({"drift_factor": 0.49, "max_ttl": 5}, "5.2"),
    ],
)
def test_settings_that_leave_no_ttl_are_refused_when_the_client_is_made(
    settings: dict[str, float], shortest: str
) -> None:
    """Every TTL would be refused, each naming the other bound: said once, up front."""
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(THREE, **settings)  # type: ignore[arg-type]
    assert info.value.parameter == "max_ttl"
    assert f"the shortest TTL {shortest}" in str(info.value)
    assert f"raise max_ttl to at least {shortest}" in str(info.value)


def test_settings_that_leave_one_ttl_stand() -> None:
    # node_timeout 29.398 s makes the shortest TTL 60 s, the default max_ttl: one TTL
    # works, so the settings stand; a millisecond more and none does.
    cfg = ClientConfig.build(THREE, node_timeout=29.398)
    assert min_ttl(cfg) == 60.0
    assert LockSpec.build(cfg, "r", 60).ttl == 60.0
    with pytest.raises(ConfigurationError, match=re.escape("shortest TTL 60.003s")):
        ClientConfig.build(THREE, node_timeout=29.399)


@pytest.mark.parametrize(
    ("max_ttl", "max_ttl_ms"),
    [(0.1079, 107), (1, 1000), (1.001, 1001), (2.5, 2500), (60, 60_000), (86_400, 86_400_000)],
)
def test_max_ttl_in_whole_milliseconds(max_ttl: float, max_ttl_ms: int) -> None:
    cfg = ClientConfig.build(THREE, max_ttl=max_ttl)
    assert cfg.max_ttl_ms == max_ttl_ms
    assert type(cfg.max_ttl_ms) is int


@pytest.mark.parametrize(
    "max_ttl", [0, 0.0009, -1, 86_400.001, math.nan, math.inf, True, "60", None]
)
def test_bad_max_ttl_refused(max_ttl: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(THREE, max_ttl=max_ttl)  # type: ignore[arg-type]
    assert info.value.parameter == "max_ttl"


# --- lock specs ---------------------------------------------------------------------------


def test_lock_spec_fields() -> None:
    cfg = config(["redis://a", "redis://b", "redis://c", "redis://d", "redis://e"])
    spec = LockSpec.build(cfg, "orders:42", 10)
    assert spec.name == "orders:42"
    assert spec.key == lock_key("orders:42")
    assert spec.keys == LockKeys.of("orders:42")
    assert spec.keys.lock == spec.key
    assert spec.ttl == 10.0
    assert spec.ttl_ms == 10_000
    assert spec.drift == pytest.approx(10 * 0.01 + 0.002)
    assert spec.node_timeout == cfg.node_timeout
    assert spec.n_nodes == 5
    assert spec.quorum == 3


@pytest.mark.parametrize(
    ("ttl", "ttl_ms"),
    [(1, 1000), (1.0009, 1000), (2.5, 2500), (0.2999, 299), (30.0000001, 30000), (1.001, 1001)],
)
def test_ttl_rounds_down_to_whole_milliseconds(ttl: float, ttl_ms: int) -> None:
    spec = LockSpec.build(config(), "r", ttl)
    assert spec.ttl_ms == ttl_ms
    assert spec.ttl == ttl_ms / 1000
    assert spec.ttl <= ttl


@SETTINGS
@given(st.integers(min_value=200, max_value=10_000_000))
def test_ttl_of_whole_milliseconds_is_kept_exactly(ms: int) -> None:
    """A TTL the caller wrote in whole milliseconds (1.001 s) must not lose one."""
    spec = LockSpec.build(config(max_ttl=10_000), "r", ms / 1000)
    assert spec.ttl_ms == ms


@SETTINGS
@given(st.floats(min_value=0.2, max_value=86_400))
def test_ttl_never_rounds_up(ttl: float) -> None:
    spec = LockSpec.build(config(max_ttl=86_400), "r", ttl)
    # Milliseconds are rounded to 6 decimals before flooring, so that 1.001 s keeps its
    # last millisecond despite floating point: a TTL within 1 ns below a whole millisecond
    # is taken as that millisecond. What matters for safety is that validity is computed
    # from exactly what PX is given (ttl_ms), never from more.
    assert spec.ttl == spec.ttl_ms / 1000
    assert spec.ttl <= ttl + 1e-9
    assert ttl - spec.ttl < 0.001 + 1e-9 * ttl


@pytest.mark.parametrize(
    "ttl", [0, 0.0, -1, -0.5, 0.0009, math.nan, math.inf, -math.inf, True, False, "10", None]
)
def test_bad_ttl_refused(ttl: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), "r", ttl)
    assert info.value.parameter == "ttl"


@pytest.mark.parametrize("ttl", [60.001, 61, 3600, 2.0**40])
def test_ttl_above_max_ttl_refused(ttl: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), "r", ttl)
    assert info.value.parameter == "ttl"
    assert "max_ttl=60.0s" in str(info.value)


def test_ttl_up_to_max_ttl_accepted() -> None:
    assert LockSpec.build(config(), "r", 60).ttl_ms == 60_000
    assert LockSpec.build(config(), "r", 60.0009).ttl_ms == 60_000  # rounds down to the cap
    assert LockSpec.build(config(max_ttl=5), "r", 5).ttl_ms == 5_000
    with pytest.raises(ConfigurationError):
        LockSpec.build(config(max_ttl=5), "r", 5.001)
    assert LockSpec.build(config(max_ttl=3600), "r", 3600).ttl_ms == 3_600_000


@SETTINGS
@given(max_ttl_ms=st.integers(200, 86_400_000), ttl_ms=st.integers(200, 86_400_000))
def test_ttl_accepted_exactly_up_to_max_ttl(max_ttl_ms: int, ttl_ms: int) -> None:
    cfg = config(max_ttl=max_ttl_ms / 1000)
    assert cfg.max_ttl_ms == max_ttl_ms
    if ttl_ms <= max_ttl_ms:
        assert LockSpec.build(cfg, "r", ttl_ms / 1000).ttl_ms == ttl_ms
    else:
        with pytest.raises(ConfigurationError) as info:
            LockSpec.build(cfg, "r", ttl_ms / 1000)
        assert info.value.parameter == "ttl"


def test_ttl_too_small_for_node_timeout() -> None:
    cfg = config(node_timeout=0.5)
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(cfg, "r", 1.0)
    assert info.value.parameter == "ttl"
    assert "node_timeout" in str(info.value)
    # 2 x (node_timeout + drift) is the smallest accepted TTL.
    drift = 1.1 * 0.01 + 0.002
    assert 2 * (0.5 + drift) <= 1.1
    assert LockSpec.build(cfg, "r", 1.1).ttl == 1.1


def test_ttl_too_small_names_the_rule_the_minimum_and_the_fix() -> None:
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), "r", 0.1)
    assert info.value.parameter == "ttl"
    message = str(info.value)
    assert message.startswith("ttl: 0.1s is below the minimum of 0.107s for node_timeout=0.05s")
    assert "ttl >= 2 x (node_timeout + drift)" in message
    assert "Use ttl >= 0.107s, or a node_timeout of at most 0.047s" in message
    # Both fixes it proposes are accepted.
    assert LockSpec.build(config(), "r", 0.107).ttl == 0.107
    assert LockSpec.build(config(node_timeout=0.047), "r", 0.1).ttl == 0.1


@pytest.mark.parametrize("ttl", [0, -1, 0.0004])
def test_a_ttl_of_no_milliseconds_names_the_real_minimum(ttl: float) -> None:
    """It said "must be at least 0.001 seconds", a TTL the rule refuses as well."""
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), "r", ttl)
    assert info.value.parameter == "ttl"
    assert "is below the minimum of 0.107s" in str(info.value)
    assert "0.001 seconds" not in str(info.value)


def _no_ttl_fits(node_timeout: float, factor: float, floor: float, max_ttl: float) -> bool:
    """Settings whose shortest TTL is above ``max_ttl`` are refused when the client is
    made (checked here); True for them, and for those too near the edge to tell."""
    shortest = 2 * (node_timeout + floor) / (1 - 2 * factor)
    if shortest > max_ttl + 0.002:
        with pytest.raises(ConfigurationError) as info:
            config(
                node_timeout=node_timeout, drift_factor=factor, drift_floor=floor, max_ttl=max_ttl
            )
        assert info.value.parameter == "max_ttl"
    return shortest > max_ttl - 0.002


@SETTINGS
@given(
    node_timeout=st.floats(0.001, 5),
    factor=st.floats(0, 0.49),
    floor=st.floats(0, 1),
)
def test_min_ttl_is_the_shortest_accepted_ttl(
    node_timeout: float, factor: float, floor: float
) -> None:
    if _no_ttl_fits(node_timeout, factor, floor, 86_400):
        return
    cfg = config(node_timeout=node_timeout, drift_factor=factor, drift_floor=floor, max_ttl=86_400)
    shortest = min_ttl(cfg)
    assert LockSpec.build(cfg, "r", shortest).ttl == shortest
    if shortest >= 0.002:
        with pytest.raises(ConfigurationError, match=re.escape(f"minimum of {shortest:g}s")):
            LockSpec.build(cfg, "r", shortest - 0.001)


@SETTINGS
@given(
    node_timeout=st.floats(0.001, 5),
    factor=st.floats(0, 0.49),
    floor=st.floats(0, 1),
    ttl=st.floats(0.001, 100),
)
def test_accepted_ttl_leaves_half_after_the_slowest_round(
    node_timeout: float, factor: float, floor: float, ttl: float
) -> None:
    if _no_ttl_fits(node_timeout, factor, floor, 100):
        return
    cfg = config(node_timeout=node_timeout, drift_factor=factor, drift_floor=floor, max_ttl=100)
    ttl_ms = int(ttl * 1000)
    drift = ttl_ms / 1000 * factor + floor
    if ttl_ms / 1000 < 2 * (node_timeout + drift) * (1 - 1e-9):
        with pytest.raises(ConfigurationError) as info:
            LockSpec.build(cfg, "r", ttl)
        assert info.value.parameter == "ttl"
    elif ttl_ms / 1000 > 2 * (node_timeout + drift) * (1 + 1e-9):
        spec = LockSpec.build(cfg, "r", ttl)
        assert spec.ttl - spec.node_timeout - spec.drift >= spec.ttl / 2 - 1e-9


@pytest.mark.parametrize(
    "name",
    [
        "",
        None,
        1,
        b"name",
        ["x"],
        "caf\udce9.csv",  # os.fsdecode() of latin-1 bytes: not sendable as UTF-8
        "\ud800",
        "x" * (MAX_NAME_BYTES + 1),
        "é" * (MAX_NAME_BYTES // 2 + 1),  # short in characters, long in bytes
    ],
)
def test_bad_lock_name_refused(name: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), name, 10)
    assert info.value.parameter == "name"


def test_the_longest_name_and_any_unicode_text_are_accepted() -> None:
    for name in ("x" * MAX_NAME_BYTES, "é" * (MAX_NAME_BYTES // 2), "注文:42 🔒", "{}}{"):
        assert LockSpec.build(config(), name, 10).name == name


# --- lock keys ----------------------------------------------------------------------------


def _hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes (its rules: first '{', then the next '}')."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


@SETTINGS
@given(st.text(alphabet=st.characters(blacklist_characters="{}"), min_size=1))
def test_lock_key_carries_the_name_as_hash_tag(name: str) -> None:
    key = lock_key(name)
    assert f"{{{name}}}" in key
    assert _hash_tag(key) == name


@SETTINGS
@given(st.text(min_size=1), st.text(min_size=1))
def test_lock_keys_of_different_names_differ(a: str, b: str) -> None:
    assert (lock_key(a) == lock_key(b)) == (a == b)


def test_lock_key_shape() -> None:
    assert re.fullmatch(r"tenure:\{orders:42\}:lock", lock_key("orders:42"))


def test_lock_keys_shape() -> None:
    keys = LockKeys.of("orders:42")
    assert keys == LockKeys(
        lock="tenure:{orders:42}:lock",
        floor="tenure:node:floor",
        warm="tenure:node:warm",
        queue="tenure:{orders:42}:q",
    )
    assert (keys.floor, keys.warm) == (NODE_FLOOR, NODE_WARM)
    assert keys.lock == lock_key("orders:42")


@SETTINGS
@given(st.text(alphabet=st.characters(blacklist_characters="{}"), min_size=1))
def test_lock_keys_share_one_hash_tag(name: str) -> None:
    # A lock's own keys share its name's hash tag; the node's floor and warm-up marker
    # are the node's, the same for every lock.
    keys = LockKeys.of(name)
    assert {_hash_tag(keys.lock), _hash_tag(keys.queue)} == {name}
    assert len({keys.lock, keys.queue, keys.floor, keys.warm}) == 4


@SETTINGS
@given(st.text(min_size=1), st.text(min_size=1))
def test_lock_keys_of_different_names_share_only_the_node_keys(a: str, b: str) -> None:
    ka, kb = LockKeys.of(a), LockKeys.of(b)
    shared = {ka.lock, ka.queue} & {kb.lock, kb.queue}
    assert bool(shared) == (a == b)
    assert (ka.floor, ka.warm) == (kb.floor, kb.warm)


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster takes of a key's hash tag."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The slot Redis Cluster puts ``key`` in (redis-py sends keys as UTF-8)."""
    data = key.encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % 16384


def test_key_slot_agrees_with_redis() -> None:
    # The CRC's published check value, and slots Redis's CLUSTER KEYSLOT gives
    # (tests/integration/test_topologies.py asks a real cluster too).
    assert _crc16(b"123456789") == 0x31C3
    assert key_slot("somekey") == 11058
    assert key_slot("{}somekey") != key_slot("{}otherkey")
    assert key_slot("a{user}b") == key_slot("{user}") == key_slot("user")


def test_a_nodes_own_keys_are_in_two_slots() -> None:
    # What docs/errors.md says: every acquire touches both, so a Redis Cluster node listed
    # as a plain node answers CROSSSLOT whatever the lock name, never granting a name by
    # an accident of slots.
    assert (key_slot(NODE_FLOOR), key_slot(NODE_WARM)) == (9106, 5942)


# Names rich in braces, ``:`` and ``#``, where tags and prefixes could go wrong.
BRACY = st.text(alphabet="{}:#qa", min_size=1, max_size=8)
NAMES = st.one_of(st.text(min_size=1), BRACY)
ODD_NAMES = ["}", "}}", "}x", "}{x}", "{}", "{}x", "x}", "a}b", "{x}", "x{y}z", "#", "}:q"]


def _every_key(keys: LockKeys) -> list[str]:
    # The lock, its queue, a waiter's place and the reservation of a woken waiter.
    return [keys.lock, keys.queue, f"{keys.queue}:0f3a9c", f"{keys.queue}:next"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_every_key_of_an_odd_name_shares_one_slot(name: str) -> None:
    keys = LockKeys.of(name)
    assert len({key_slot(k) for k in _every_key(keys)}) == 1, _every_key(keys)
    assert keys.lock == lock_key(name)


@SETTINGS
@given(NAMES)
def test_every_key_of_a_lock_shares_one_slot(name: str) -> None:
    keys = LockKeys.of(name)
    assert len({key_slot(k) for k in _every_key(keys)}) == 1, _every_key(keys)
    assert keys.lock == lock_key(name)


@SETTINGS
@given(NAMES.filter(lambda name: not name.startswith("}")))
def test_ordinary_names_keep_their_keys(name: str) -> None:
    # The keys of every name not starting with "}" are what they always were, so
    # clients of an older release and of this one still contend on the same keys.
    keys = LockKeys.of(name)
    assert keys.lock == lock_key(name) == f"tenure:{{{name}}}:lock"
    assert keys.queue == f"tenure:{{{name}}}:q"


def test_a_name_starting_with_a_brace_gets_a_tag_of_its_own() -> None:
    keys = LockKeys.of("}x")
    assert re.fullmatch(r"tenure:#\{[0-9a-f]{16}\}:\}x:lock", keys.lock)
    assert keys.queue == keys.lock.removesuffix(":lock") + ":q"
    assert key_slot(keys.lock) != key_slot(LockKeys.of("}y").lock)  # spread, not one slot


@SETTINGS
@given(BRACY, BRACY)
def test_bracy_names_share_no_lock_keys(a: str, b: str) -> None:
    ka, kb = LockKeys.of(a), LockKeys.of(b)
    assert bool({ka.lock, ka.queue} & {kb.lock, kb.queue}) == (a == b)


# --- spec cache ---------------------------------------------------------------------------


def test_spec_cache_returns_the_same_spec() -> None:
    cache = SpecCache(config())
    spec = cache.get("r", 10)
    assert spec == LockSpec.build(config(), "r", 10)
    assert cache.get("r", 10) is spec
    assert cache.get("r", 10.5) is not spec


def test_spec_cache_validates_like_build() -> None:
    cache = SpecCache(config(max_ttl=5))
    with pytest.raises(ConfigurationError) as info:
        cache.get("r", 6)
    assert info.value.parameter == "ttl"
    with pytest.raises(ConfigurationError):
        cache.get(["unhashable"], 1)
    with pytest.raises(ConfigurationError):
        cache.get("r", [1])


def test_spec_cache_refuses_true_as_a_ttl_even_after_caching_one() -> None:
    # True == 1 and hash(True) == hash(1): a dict lookup of ("r", True) finds ("r", 1).
    # The cache's own comment says it must not; build() refuses a bool TTL.
    cache = SpecCache(config())
    with pytest.raises(ConfigurationError):
        cache.get("r", True)
    assert cache.get("r", 1).ttl == 1.0
    with pytest.raises(ConfigurationError) as info:
        cache.get("r", True)
    assert info.value.parameter == "ttl"


def test_spec_cache_is_bounded() -> None:
    cache = SpecCache(config())
    for i in range(SpecCache.LIMIT + 10):
        assert cache.get(f"r{i}", 1).name == f"r{i}"
    assert len(cache._specs) <= SpecCache.LIMIT


def test_spec_cache_keeps_no_long_name() -> None:
    # 1,024 specs of 64 KiB names would hold hundreds of megabytes for the client's life.
    cache = SpecCache(config())
    long = "x" * (CACHED_CHARS + 1)
    assert cache.get(long, 1).name == long
    assert cache.get("x" * CACHED_CHARS, 1).name == "x" * CACHED_CHARS
    assert [spec.name for spec in cache._specs.values()] == ["x" * CACHED_CHARS]


class Resource(str, enum.Enum):
    ORDER = "orders:42"


class Shouting(str):
    def __str__(self) -> str:
        return self.upper()


@pytest.mark.parametrize("name", [Resource.ORDER, Shouting("orders:42")])
def test_a_str_subclass_locks_the_text_it_equals(name: str) -> None:
    """A ``(str, Enum)`` member formats as ``Resource.ORDER`` on Python 3.11, and keys
    built from that would be another lock than the plain string it compares equal to."""
    plain = LockSpec.build(config(), "orders:42", 10)
    spec = LockSpec.build(config(), name, 10)
    assert type(spec.name) is str
    assert spec.name == "orders:42"
    assert spec.keys == plain.keys
    # Through the cache, in either order, one name is one lock.
    for first, second in ((name, "orders:42"), ("orders:42", name)):
        cache = SpecCache(config())
        assert cache.get(first, 10).keys == cache.get(second, 10).keys == plain.keys


def test_a_str_subclass_key_prefix_is_its_text() -> None:
    prefix = check_key_prefix(Shouting("app1:"))
    assert type(prefix) is str
    assert prefix == "app1:"


@pytest.mark.parametrize("huge", [2**1100, -(2**1100)])
def test_an_int_beyond_float_range_is_refused_by_name(huge: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockSpec.build(config(), "r", huge)
    assert info.value.parameter == "ttl"
    with pytest.raises(ConfigurationError) as info:
        check_acquire_args(True, huge)
    assert info.value.parameter == "timeout"
    for parameter in ("max_ttl", "recheck", "retention", "connect_timeout"):
        with pytest.raises(ConfigurationError) as info:
            ClientConfig.build(THREE, **{parameter: huge})  # type: ignore[arg-type]
        assert info.value.parameter == parameter


def test_a_retry_delay_beyond_float_range_is_refused_by_name() -> None:
    class Huge:
        def delay(self, attempt: int, rng: random.Random) -> float:
            return 2**1100

    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(THREE, retry=Huge())
    assert info.value.parameter == "retry"
    assert "returned 1" in str(info.value)


# --- acquire(blocking, timeout) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("blocking", "timeout", "expected"),
    [
        (True, None, None),
        (True, -1, None),
        (True, -1.0, None),
        (False, None, None),
        (False, -1, None),
        (True, 0, 0.0),
        (True, 2.5, 2.5),
        (True, 3, 3.0),
    ],
)
def test_check_acquire_args_accepts_threading_lock_forms(
    blocking: bool, timeout: float | None, expected: float | None
) -> None:
    assert check_acquire_args(blocking, timeout) == expected


@pytest.mark.parametrize(
    ("blocking", "timeout", "parameter"),
    [
        (False, 1.0, "timeout"),
        (False, 0, "timeout"),
        (True, -2, "timeout"),
        (True, -0.5, "timeout"),
        (True, math.nan, "timeout"),
        (True, math.inf, "timeout"),
        (True, "1", "timeout"),
        (True, True, "timeout"),
        (1, None, "blocking"),
        (None, None, "blocking"),
        ("yes", 1.0, "blocking"),
    ],
)
def test_check_acquire_args_refuses(blocking: object, timeout: object, parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_acquire_args(blocking, timeout)
    assert info.value.parameter == parameter
    assert isinstance(info.value, ValueError)


def test_negative_timeout_message_explains_forever() -> None:
    with pytest.raises(ConfigurationError, match=r"-1 \(forever\)"):
        check_acquire_args(True, -3)
    with pytest.raises(ConfigurationError, match="non-blocking"):
        check_acquire_args(False, 5)


# --- retry policies and flags ---------------------------------------------------------------


class _Fixed:
    """A user's own retry policy: any object with delay(attempt, rng)."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        return 0.01


class _Broken:
    def delay(self) -> float:  # the wrong signature
        return 0.01


class _Negative:
    def delay(self, attempt: int, rng: random.Random) -> float:
        return -1.0


class _NotANumber:
    def delay(self, attempt: int, rng: random.Random) -> object:
        return "soon"


class _Huge:
    def delay(self, attempt: int, rng: random.Random) -> float:
        return 1e300  # a finite number, past any clock


def test_retry_accepts_the_policies_and_any_object_with_delay() -> None:
    assert isinstance(ClientConfig.build(THREE, retry=None).retry, wait_random_exponential)
    policy = _Fixed()
    assert ClientConfig.build(THREE, retry=policy).retry is policy


@pytest.mark.parametrize(
    ("retry", "says"),
    [
        (5, "must be a retry policy"),
        ("exponential", "must be a retry policy"),
        (wait_random_exponential, "delay(1, rng) raised"),  # the class, not an instance
        (_Broken(), "delay(1, rng) raised"),
        (_Negative(), "returned -1.0"),
        (_NotANumber(), "returned 'soon'"),
        (_Huge(), "returned 1e+300, not a number of seconds in [0, 86,400]"),
    ],
)
def test_bad_retry_is_refused_at_construction(retry: object, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(THREE, retry=retry)  # type: ignore[arg-type]
    assert info.value.parameter == "retry"
    assert says in str(info.value)
    # Names what is accepted.
    assert "wait_random_exponential" in str(info.value)
    assert "delay(attempt, rng)" in str(info.value)


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_allow_even_must_be_a_bool(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(THREE, allow_even=value)  # type: ignore[arg-type]
    assert info.value.parameter == "allow_even"
    assert "True or False" in str(info.value)


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("redis://h:6379", "redis://user:password@host:port"),
        ("rediss://h:6380/2", "rediss://user:password@host:port"),
        ("unix:///run/redis.sock", "unix://user:password@/path/to/socket"),
        (
            "redis+sentinel://s1:26379,s2:26379/primary",
            "redis+sentinel://user:password@host:port[,host:port...]/service_name",
        ),
        (
            "redis+cluster://c1:7000,c2:7001",
            "redis+cluster://user:password@host:port[,host:port...]",
        ),
        ("rediss+cluster://c1:7000", "rediss+cluster://user:password@host:port[,host:port...]"),
    ],
)
def test_a_password_is_asked_for_in_the_form_of_url_the_user_wrote(url: str, form: str) -> None:
    address = parse_node_url(url)
    assert address.login_form == form
    if address.seeds:
        # A Cluster node's members are plain servers, but the password goes in the
        # cluster's URL: their advice shows its form (it showed a member's).
        member = address.member("c9", 7009)
        assert member.login_form == form
        assert member.url.split("://")[0] == url.split("+")[0]
        assert member == parse_node_url(member.url)  # not part of what makes it a server

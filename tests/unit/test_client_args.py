"""Every argument of ``Client`` and ``AsyncClient`` is checked at construction, without a
connection (the unit conftest fails any attempt to open one), and each error names the
parameter, what is accepted and the fix."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest

import tenure
from tenure import ConfigurationError

THREE = ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"]

Make = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Make:
    cls = tenure.Client if request.param == "sync" else tenure.AsyncClient

    def build(nodes: list[str] = THREE, **options: Any) -> Any:
        return cls(nodes, **options)

    return build


def _refused(make: Make, nodes: list[str] = THREE, **options: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        make(nodes, **options)
    assert isinstance(info.value, ValueError)
    return info.value


def test_good_connection_options_are_accepted(make: Make) -> None:
    make(connection_options={"password": "pw", "username": "u", "client_name": "app"})
    make(connection_options={"socket_keepalive": True, "protocol": 2})
    make(connection_options=None)
    make(["rediss://127.0.0.1:7001"], connection_options={"ssl_cert_reqs": "none"})
    make(["unix:///tmp/tenure-test.sock"], connection_options={"password": "pw"})


@pytest.mark.parametrize("options", ["x", ["password"], 3, ("a", 1)])
def test_connection_options_must_be_a_mapping(make: Make, options: object) -> None:
    error = _refused(make, connection_options=options)
    assert error.parameter == "connection_options"
    assert "must be a dict of redis-py connection keyword arguments" in str(error)
    assert f"got a {type(options).__name__}" in str(error)


def test_connection_options_not_a_mapping_are_not_shown(make: Make) -> None:
    # What was passed in their place may hold a password: only its type is named.
    error = _refused(make, connection_options=[("password", "s3cret-pw")])
    assert "s3cret-pw" not in str(error)
    assert "got a list" in str(error)


def test_connection_options_keys_must_be_str(make: Make) -> None:
    error = _refused(make, connection_options={1: "x"})
    assert error.parameter == "connection_options"
    assert "keys must be str" in str(error)


def test_unknown_connection_option_is_named_with_the_accepted_ones(make: Make) -> None:
    error = _refused(make, connection_options={"bogus": 1})
    assert error.parameter == "connection_options['bogus']"
    assert "not an option of redis-py's" in str(error)
    assert "accepted:" in str(error)
    assert "password" in str(error)


def test_a_misspelt_option_gets_a_suggestion(make: Make) -> None:
    error = _refused(make, connection_options={"pasword": "x"})
    assert "did you mean 'password'?" in str(error)


def test_tls_options_on_a_plain_node_point_at_rediss(make: Make) -> None:
    error = _refused(make, connection_options={"ssl_ca_certs": "/ca.pem"})
    assert error.parameter == "connection_options['ssl_ca_certs']"
    assert "rediss://" in str(error)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("retry", "tenure owns retries"),
        ("retry_on_timeout", "tenure owns retries"),
        ("socket_timeout", "node_timeout"),
        ("socket_connect_timeout", "connect_timeout"),
        ("health_check_interval", "health check"),
        ("host", "node URL"),
        ("port", "node URL"),
        ("db", "node URL"),
        ("redis_connect_func", "on-connect"),
        ("maint_notifications_config", "maintenance notifications"),
        ("orig_socket_timeout", "maintenance notifications"),
    ],
)
def test_options_tenure_owns_are_refused_with_what_to_use(make: Make, key: str, says: str) -> None:
    error = _refused(make, connection_options={key: 1})
    assert error.parameter == f"connection_options[{key!r}]"
    assert says in str(error)


def test_resp3_is_refused(make: Make) -> None:
    error = _refused(make, connection_options={"protocol": 3})
    assert error.parameter == "connection_options['protocol']"
    assert "must be 2" in str(error)


def test_a_value_redis_py_refuses_is_caught_at_construction(make: Make) -> None:
    # redis-py refuses client-side caching over RESP2 when it builds the connection.
    error = _refused(make, connection_options={"cache_config": object()})
    assert "connection_options" in error.parameter


def test_a_url_option_redis_py_refuses_names_the_node(make: Make) -> None:
    error = _refused(make, ["redis://127.0.0.1:7001?bogus=1", *THREE[1:]])
    assert "nodes[0]" in str(error) or error.parameter == "nodes[0]"


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("protocol=3", "RESP2"),
        ("socket_timeout=1", "node_timeout"),
        ("socket_connect_timeout=1", "connect_timeout"),
        ("retry_on_timeout=true", "tenure owns retries"),
        ("health_check_interval=5", "health check"),
        ("port=7009", "host:port"),
    ],
)
@pytest.mark.parametrize(
    "url",
    [
        "redis://u:s3cret-pw@127.0.0.1:7004",
        "unix:///tmp/tenure-test.sock",
        "redis+sentinel://127.0.0.1:26379/mymaster",
        "redis+cluster://127.0.0.1:7004,127.0.0.1:7005",
    ],
)
def test_url_query_options_tenure_owns_are_refused(
    make: Make, url: str, query: str, says: str
) -> None:
    # redis-py lets a URL's query override the keywords tenure gives it: the same
    # refusals as connection_options, or ?protocol=3 would make a RESP3 connection.
    error = _refused(make, [THREE[0], f"{url}?db=0&{query}", THREE[2]])
    key = query.partition("=")[0]
    assert error.parameter == "nodes[1]"
    assert f"its URL query sets {key}" in str(error)
    assert says in str(error)
    assert "Remove it from the URL" in str(error)
    assert "s3cret-pw" not in str(error)


def test_url_query_options_tenure_leaves_alone_are_accepted(make: Make) -> None:
    make(["redis://127.0.0.1:7001?protocol=2&db=1&client_name=app", *THREE[1:]])


@pytest.mark.parametrize("retry", [5, "x", object()])
def test_retry_must_be_a_policy(make: Make, retry: object) -> None:
    error = _refused(make, retry=retry)
    assert error.parameter == "retry"
    assert "wait_random_exponential" in str(error)


def test_allow_even_must_be_a_bool(make: Make) -> None:
    error = _refused(make, THREE[:2], allow_even="yes")
    assert error.parameter == "allow_even"


@pytest.mark.parametrize("method", ["lock", "acquire"])
def test_watchdog_must_be_a_bool(make: Make, method: str) -> None:
    call = getattr(make(), method)

    def attempt() -> None:
        result = call("name", 5.0, watchdog="yes")
        if inspect.iscoroutine(result):  # AsyncClient.acquire checks before any I/O
            asyncio.run(result)

    with pytest.raises(ConfigurationError) as info:
        attempt()
    assert info.value.parameter == "watchdog"


@pytest.mark.parametrize("method", ["lock", "acquire"])
@pytest.mark.parametrize("watchdog", [True, False])
@pytest.mark.parametrize("max_hold", ["30", [30], True, 0, -1.0, math.nan, math.inf, 2**1100])
def test_max_hold_must_be_a_number_of_seconds(
    make: Make, method: str, watchdog: bool, max_hold: object
) -> None:
    call = getattr(make(), method)

    def attempt() -> None:
        result = call("name", 5.0, watchdog=watchdog, max_hold=max_hold)
        if inspect.iscoroutine(result):  # AsyncClient.acquire checks before any I/O
            asyncio.run(result)

    with pytest.raises(ConfigurationError) as info:
        attempt()
    assert info.value.parameter == "max_hold"


@pytest.mark.parametrize("method", ["lock", "acquire"])
@pytest.mark.parametrize("watchdog", [True, False])
def test_max_hold_below_the_ttl_is_refused(make: Make, method: str, watchdog: bool) -> None:
    """A cap below the TTL could not hold: the grant alone holds the lease for its TTL
    (the lease ran its whole TTL and was reported lost "held for max_hold")."""
    call = getattr(make(), method)

    def attempt() -> None:
        result = call("name", 3.0, watchdog=watchdog, max_hold=0.5)
        if inspect.iscoroutine(result):  # AsyncClient.acquire checks before any I/O
            asyncio.run(result)

    with pytest.raises(ConfigurationError, match=r"at least the lock's ttl \(3 s\)") as info:
        attempt()
    assert info.value.parameter == "max_hold"
    if method == "lock" and watchdog:  # (acquire would go on to the nodes)
        call("name", 3.0, watchdog=watchdog, max_hold=3.0)


@pytest.mark.parametrize("method", ["lock", "acquire"])
def test_max_hold_without_the_watchdog_is_refused(make: Make, method: str) -> None:
    """It caps the watchdog's extensions: without ``watchdog=True`` it would do nothing,
    and the lease would run out at its TTL."""
    call = getattr(make(), method)

    def attempt() -> None:
        result = call("name", 3.0, max_hold=60.0)
        if inspect.iscoroutine(result):  # AsyncClient.acquire checks before any I/O
            asyncio.run(result)

    with pytest.raises(ConfigurationError, match="pass watchdog=True") as info:
        attempt()
    assert info.value.parameter == "max_hold"


@pytest.mark.parametrize("name", ["billing worker", "line\nbreak", "café", 5])
def test_a_client_name_redis_refuses_is_refused_when_the_client_is_made(
    make: Make, name: object
) -> None:
    """The server refuses it at every connect: the nodes looked down ("until they
    recover"), for a setting no wait fixes."""
    with pytest.raises(ConfigurationError, match="client_name") as info:
        make(connection_options={"client_name": name})
    assert info.value.parameter == "connection_options['client_name']"
    with pytest.raises(ConfigurationError, match="client_name="):
        make(["redis://127.0.0.1:7001?client_name=billing%20worker", *THREE[1:]])

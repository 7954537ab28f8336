"""redis-py clients and pools as nodes: which settings are taken from them, which are
ignored and which refused, without a connection (the unit conftest refuses any)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
import valkey
import valkey.asyncio
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import tenure
from tenure import ConfigurationError
from tenure._core.config import node_address
from tenure._driver.redis_compat import node_pool
from tenure._driver.redis_objects import node_addresses, settings_of

Make = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Make:
    return tenure.Client if request.param == "sync" else tenure.AsyncClient


def _options(obj: object, asyncio: bool = False) -> dict[str, Any]:
    return dict(settings_of(obj, "nodes[0]", asyncio=asyncio).options)


@pytest.mark.parametrize("flavour", [redis, redis.asyncio])
def test_address_database_and_credentials_are_taken(flavour: Any) -> None:
    client = flavour.Redis(
        host="10.1.2.3", port=6380, db=4, username="app", password="s3cret", client_name="w1"
    )
    address = settings_of(client, "nodes[0]", asyncio=False)
    assert (address.scheme, address.host, address.port, address.db) == (
        "redis",
        "10.1.2.3",
        6380,
        4,
    )
    assert address.display == "redis://10.1.2.3:6380/4"
    assert "s3cret" not in address.url
    assert "s3cret" not in repr(address)
    assert dict(address.options) == {"username": "app", "password": "s3cret", "client_name": "w1"}


@pytest.mark.parametrize("flavour", [redis, redis.asyncio])
def test_a_pool_from_a_url_gives_the_same_node(flavour: Any) -> None:
    pool = flavour.ConnectionPool.from_url("redis://app:pw@127.0.0.1:7001/2")
    address = settings_of(pool, "nodes[0]", asyncio=True)
    assert address.identity == ("127.0.0.1", 7001)
    assert address.db == 2
    assert dict(address.options) == {"username": "app", "password": "pw"}


def test_a_unix_socket_client() -> None:
    address = settings_of(redis.Redis(unix_socket_path="/run/r e.sock", db=3), "n", asyncio=False)
    assert (address.scheme, address.path, address.db) == ("unix", "/run/r e.sock", 3)
    assert address.display == "unix:///run/r e.sock?db=3"
    # redis-py reads the built URL back to the same socket and database
    pool = node_pool(address, tenure.Client(["redis://127.0.0.1:7001"]).config, {}, asyncio=False)
    assert pool.connection_kwargs["path"] == "/run/r e.sock"
    assert pool.connection_kwargs["db"] == 3


def test_a_relative_unix_socket_path_is_taken_from_the_working_directory() -> None:
    at: dict[str, Any] = {"host": None, "port": None, "db": 0, "tls": False, "options": {}}
    address = node_address(path="../run/./r.sock", cwd="/srv/app", **at)
    assert address.path == "/srv/run/r.sock"
    assert address.display == "unix:///srv/run/r.sock"
    # Without a working directory (it was removed), no node can be named.
    with pytest.raises(ConfigurationError, match=r"n: .*'r\.sock' is relative.*absolute"):
        node_address(path="r.sock", cwd=None, parameter="n", **at)


@pytest.mark.parametrize("asyncio", [False, True])
def test_tls_settings_are_taken(asyncio: bool) -> None:
    client = redis.Redis(
        host="h", port=6390, ssl=True, ssl_ca_certs="/ca.pem", ssl_cert_reqs="required"
    )
    address = settings_of(client, "nodes[0]", asyncio=asyncio)
    assert address.scheme == "rediss"
    assert address.display == "rediss://h:6390"
    options = dict(address.options)
    assert options["ssl_ca_certs"] == "/ca.pem"
    assert options["ssl_cert_reqs"] == "required"
    assert all(v is not None for v in options.values())


def test_a_credential_provider_is_taken() -> None:
    provider = redis.UsernamePasswordCredentialProvider("app", "pw")
    assert _options(redis.Redis(credential_provider=provider)) == {"credential_provider": provider}


def test_settings_tenure_owns_are_ignored() -> None:
    client = redis.Redis(
        socket_timeout=7,
        socket_connect_timeout=3,
        retry=Retry(ExponentialBackoff(), 5),
        health_check_interval=30,
        decode_responses=True,
        protocol=3,
    )
    assert _options(client) == {}
    # the object itself is left as it was
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 7


def test_an_encoding_other_than_redis_pys_default_is_carried() -> None:
    # It is how the object's AUTH sends a str password; the default is no setting at all.
    assert _options(redis.Redis(encoding="latin-1")) == {"encoding": "latin-1"}
    both = redis.Redis(encoding="cp1252", encoding_errors="replace")
    assert _options(both) == {"encoding": "cp1252", "encoding_errors": "replace"}


def test_connection_options_and_the_objects_settings_must_agree(make: Make) -> None:
    node = redis.Redis(host="127.0.0.1", port=7001, password="a")
    make([node], connection_options={"password": "a"})  # the same: fine
    with pytest.raises(ConfigurationError) as info:
        make([node], connection_options={"password": "b"})
    text = str(info.value)
    assert info.value.parameter == "connection_options['password']"
    assert "nodes[0] (redis://127.0.0.1:7001)" in text
    assert "one place" in text
    assert "'a'" not in text
    assert "'b'" not in text
    # one the object leaves unset still applies to it
    make([redis.Redis(host="127.0.0.1", port=7001)], connection_options={"password": "b"})


def test_a_node_given_twice_is_refused(make: Make) -> None:
    with pytest.raises(ConfigurationError, match=r"nodes\[1\]: .* same server as nodes\[0\]"):
        make(["redis://127.0.0.1:7001/0", redis.Redis(host="127.0.0.1", port=7001), "redis://x:1"])


def test_the_client_names_nodes_without_credentials(make: Make) -> None:
    nodes = [
        redis.Redis(host="127.0.0.1", port=7001, password="pw"),
        redis.ConnectionPool.from_url("redis://u:pw@127.0.0.1:7002/5"),
        "redis://127.0.0.1:7003",
    ]
    client = make(nodes)
    assert client.node_names == [
        "redis://127.0.0.1:7001",
        "redis://127.0.0.1:7002/5",
        "redis://127.0.0.1:7003",
    ]


class _Custom(redis.Connection):
    pass


def test_a_custom_connection_class_is_refused(make: Make) -> None:
    pool = redis.ConnectionPool(connection_class=_Custom, host="127.0.0.1", port=7001)
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*_Custom: not one of redis-py"):
        make([pool])


def _on_connect() -> None:
    pass


def test_a_custom_connect_function_is_refused(make: Make) -> None:
    client = redis.Redis(host="127.0.0.1", port=7001, redis_connect_func=_on_connect)
    with pytest.raises(ConfigurationError, match=r"sets redis_connect_func, which is refused"):
        make([client])


def test_a_tls_setting_the_asyncio_connections_lack_is_refused() -> None:
    client = redis.Redis(host="h", ssl=True, ssl_validate_ocsp=True)
    with pytest.raises(ConfigurationError, match=r"sets ssl_validate_ocsp, but redis-py's"):
        settings_of(client, "nodes[0]", asyncio=True)
    assert "ssl_validate_ocsp" in _options(client, asyncio=False)
    # off, it means what its absence means: dropped
    assert "ssl_validate_ocsp" not in _options(redis.Redis(host="h", ssl=True), asyncio=True)


def _sentinels() -> list[object]:
    sync = redis.sentinel.Sentinel([("127.0.0.1", 26379)])  # type: ignore[no-untyped-call,unused-ignore]
    lazy = redis.asyncio.sentinel.Sentinel([("127.0.0.1", 26379)])  # type: ignore[no-untyped-call,unused-ignore]
    return [sync, lazy]


@pytest.mark.parametrize("obj", _sentinels(), ids=["sync", "async"])
def test_a_sentinel_object_is_refused_naming_what_to_pass(make: Make, obj: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        make([obj])
    text = str(info.value)
    assert text.startswith("nodes[0]: ")
    assert "names no service" in text
    assert "master_for(service_name)" in text
    assert "redis+sentinel://" in text


@pytest.mark.parametrize("flavour", [redis.sentinel, redis.asyncio.sentinel])
def test_a_master_for_client_gives_its_service_sentinels_and_settings(flavour: Any) -> None:
    manager = flavour.Sentinel(
        [("10.0.0.1", 26379), ("10.0.0.2", 26380)],
        sentinel_kwargs={"password": "sentinel-pw"},
        password="s3cret",
        db=2,
    )
    for asyncio in (False, True):
        address = settings_of(manager.master_for("locks"), "nodes[0]", asyncio=asyncio)
        assert address.display == "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/locks/2"
        assert dict(address.options) == {"password": "s3cret"}
        assert address.sentinel is not None
        assert address.sentinel.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
        assert dict(address.sentinel.options) == {"password": "sentinel-pw"}
        assert "s3cret" not in repr(address)
        tls = settings_of(manager.master_for("locks", ssl=True), "nodes[0]", asyncio=asyncio)
        assert tls.display.startswith("rediss+sentinel://")
        assert not tls.sentinel.tls  # type: ignore[union-attr]  # sentinel_kwargs: no ssl


def test_a_replica_client_is_refused(make: Make) -> None:
    manager = redis.sentinel.Sentinel([("127.0.0.1", 26379)])  # type: ignore[no-untyped-call,unused-ignore]
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*replica client \(slave_for\)"):
        make([manager.slave_for("locks")])  # type: ignore[no-untyped-call,unused-ignore]


Cluster = Any  # the RedisCluster class of either flavour


@pytest.fixture(params=["sync", "async"])
def cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """A ``RedisCluster`` of either flavour, made without a connection. The asyncio one
    connects at its first command anyway; the sync one would at construction, to read
    the slot map and the command table, and those two steps are left out here."""
    if request.param == "async":
        return redis.asyncio.cluster.RedisCluster
    _no_connection(monkeypatch)
    return redis.cluster.RedisCluster


def _retry(cluster: Cluster, retries: int) -> Any:
    """A ``Retry`` of the cluster client's own flavour: redis-py 8.2 and later warn when
    an asyncio client is given the sync one (and warnings are errors here)."""
    if cluster is redis.asyncio.cluster.RedisCluster:
        return redis.asyncio.retry.Retry(ExponentialBackoff(), retries)
    return Retry(ExponentialBackoff(), retries)


def _no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis.cluster.NodesManager, "initialize", lambda self: None)
    monkeypatch.setattr(redis.cluster, "CommandsParser", lambda *args: None)


def _nodes(*ports: int) -> list[Any]:
    return [redis.cluster.ClusterNode("10.0.0.1", p) for p in ports]  # type: ignore[no-untyped-call]


def _learn(obj: Any, *ports: int) -> None:
    """Have ``obj``'s nodes manager know nodes at ``ports``, as after its slot map was
    read (the flavour's own ClusterNode; the constructors differ)."""
    node_cls = type(next(iter(obj.nodes_manager.startup_nodes.values())))
    for port in ports:
        node = node_cls("10.0.0.9", port)
        obj.nodes_manager.nodes_cache[node.name] = node


@pytest.mark.parametrize("asyncio", [False, True])
def test_a_cluster_client_is_the_whole_cluster_as_one_node(cluster: Cluster, asyncio: bool) -> None:
    obj = cluster(startup_nodes=_nodes(7002, 7001), username="app", password="s3cret")
    _learn(obj, 7003, 7001)
    address = settings_of(obj, "nodes[0]", asyncio=asyncio)
    # every node it knows, the startup nodes and the discovered ones, once each, sorted
    seeds = (("10.0.0.1", 7001), ("10.0.0.1", 7002), ("10.0.0.9", 7001), ("10.0.0.9", 7003))
    assert address.seeds == seeds
    assert address.display == "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in seeds)
    assert (address.scheme, address.db) == ("redis+cluster", 0)
    assert dict(address.options) == {"username": "app", "password": "s3cret"}
    assert "s3cret" not in address.url
    assert "s3cret" not in repr(address)
    # as the URL would be: the same node, and its members log in with the object's user
    url = "redis+cluster://app:s3cret@" + ",".join(f"{h}:{p}" for h, p in seeds)
    assert address.identity == tenure.Client([url]).config.nodes[0].identity
    member = address.member("10.0.0.1", 7001)
    assert member.display == "redis://10.0.0.1:7001"
    assert dict(member.options) == {"username": "app", "password": "s3cret"}


def test_a_cluster_client_is_a_node_of_either_client(make: Make, cluster: Cluster) -> None:
    obj = cluster(host="10.0.0.1", port=7001)
    client = make(["redis://127.0.0.1:7002", obj, "redis://127.0.0.1:7003"])
    assert client.node_names[1] == "redis+cluster://10.0.0.1:7001"
    assert client.config.per_slot  # a Cluster node: floors per slot, as for the URL
    with pytest.raises(ConfigurationError, match=r"nodes\[1\]: .* same server as nodes\[0\]"):
        make(["redis+cluster://10.0.0.1:7001", obj, "redis://127.0.0.1:7003"])


@pytest.mark.parametrize("asyncio", [False, True])
def test_a_tls_cluster_client_is_a_rediss_cluster_node(cluster: Cluster, asyncio: bool) -> None:
    obj = cluster(
        host="10.0.0.1", port=7001, ssl=True, ssl_ca_certs="/ca.pem", ssl_cert_reqs="optional"
    )
    address = settings_of(obj, "nodes[0]", asyncio=asyncio)
    assert address.display == "rediss+cluster://10.0.0.1:7001"
    options = dict(address.options)
    assert options["ssl_ca_certs"] == "/ca.pem"
    assert options["ssl_cert_reqs"] == "optional"
    assert all(v is not None for v in options.values())
    member = address.member("10.0.0.2", 7005)
    assert member.display == "rediss://10.0.0.2:7005"
    assert dict(member.options) == options


def test_a_cluster_client_from_a_rediss_url_is_a_tls_node(cluster: Cluster) -> None:
    obj = cluster.from_url("rediss://u:pw@10.0.0.1:7001/0")
    address = settings_of(obj, "nodes[0]", asyncio=False)
    assert address.display == "rediss+cluster://10.0.0.1:7001"
    assert {"username": "u", "password": "pw"}.items() <= dict(address.options).items()


def test_a_cluster_clients_credential_provider_is_taken(cluster: Cluster) -> None:
    provider = redis.UsernamePasswordCredentialProvider("app", "pw")
    obj = cluster(host="10.0.0.1", port=7001, credential_provider=provider)
    assert _options(obj) == {"credential_provider": provider}


@pytest.mark.filterwarnings("ignore:.*deprecated usage:DeprecationWarning")
def test_a_cluster_clients_timeouts_and_retries_are_ignored(cluster: Cluster) -> None:
    obj = cluster(
        host="10.0.0.1",
        port=7001,
        socket_timeout=7,
        socket_connect_timeout=3,
        retry=_retry(cluster, 5),
        decode_responses=True,
        cluster_error_retry_attempts=9,
        read_from_replicas=True,  # tenure only ever writes, to masters
        require_full_coverage=False,
        reinitialize_steps=1,
    )
    before = dict(obj.nodes_manager.connection_kwargs)
    assert _options(obj) == {}
    # the object itself is left as it was, its own on-connect function included
    assert obj.nodes_manager.connection_kwargs == before
    assert obj.nodes_manager.connection_kwargs["socket_timeout"] == 7


def test_a_cluster_client_that_remaps_addresses_is_refused(make: Make, cluster: Cluster) -> None:
    obj = cluster(
        host="10.0.0.1", port=7001, password="s3cret", address_remap=lambda a: ("proxy", a[1])
    )
    with pytest.raises(ConfigurationError) as info:
        make([obj])
    text = str(info.value)
    assert text.startswith("nodes[0]: ")
    assert "address_remap" in text
    assert "cluster-announce-ip" in text
    assert "s3cret" not in text


def _sync_cluster(**settings: Any) -> Any:
    """A sync ``RedisCluster`` made without a connection (see ``cluster``): the settings
    below are the sync flavour's alone."""
    with pytest.MonkeyPatch.context() as m:
        _no_connection(m)
        return redis.cluster.RedisCluster(host="10.0.0.1", port=7001, **settings)


def test_a_cluster_client_with_its_own_connect_function_is_refused(make: Make) -> None:
    obj = _sync_cluster(redis_connect_func=_on_connect)
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*sets redis_connect_func, which"):
        make([obj])


def test_a_cluster_client_with_a_custom_connection_class_is_refused(make: Make) -> None:
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*_Custom: not one of redis-py"):
        make([_sync_cluster(connection_class=_Custom)])


def test_a_cluster_client_over_a_unix_socket_is_refused(make: Make) -> None:
    # redis-py 8.2 and later refuse the setting at construction; earlier ones took it, and
    # a client changed since is refused here on any (as in the database test below).
    obj = _sync_cluster()
    obj.nodes_manager.connection_kwargs["unix_socket_path"] = "/run/r.sock"
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*unix socket.*host:port"):
        make([obj])


def test_a_cluster_client_sharing_one_pool_among_its_members_is_refused(make: Make) -> None:
    pool = redis.ConnectionPool(host="10.0.0.1", port=7001, password="s3cret")
    with pytest.raises(ConfigurationError) as info:
        make([_sync_cluster(connection_pool=pool)])
    assert str(info.value).startswith("nodes[0]: ")
    assert "one connection pool to every member" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_a_cluster_client_in_another_database_is_refused(cluster: Cluster) -> None:
    # redis-py refuses db at construction; a client changed since is refused here too
    obj = cluster(host="10.0.0.1", port=7001)
    obj.nodes_manager.connection_kwargs["db"] = 2
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*database 2: a Redis Cluster"):
        settings_of(obj, "nodes[0]", asyncio=False)


def test_a_cluster_client_that_knows_no_node_is_refused(cluster: Cluster) -> None:
    obj = cluster(host="10.0.0.1", port=7001)
    obj.nodes_manager.startup_nodes.clear()
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*knows no cluster node"):
        settings_of(obj, "nodes[0]", asyncio=False)


def test_anything_else_is_refused_saying_what_is_accepted(make: Make) -> None:
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: must be a node URL .*redis.Redis"):
        make([("127.0.0.1", 7001)])


@pytest.mark.parametrize("library", [valkey, valkey.asyncio])
def test_a_valkey_py_object_is_refused_naming_the_fix(make: Make, library: Any) -> None:
    # valkey-py forked redis-py: its objects have redis-py's shape, but are none of its
    # classes, and tenure reads only redis-py's settings.
    with pytest.raises(ConfigurationError, match=r"nodes\[0\]: .*a valkey-py object.*URL"):
        make([library.Valkey(host="10.0.0.1", password="s3cret")])


def test_urls_pass_through_untouched() -> None:
    assert node_addresses(["redis://h:1"], asyncio=False) == ["redis://h:1"]
    assert node_addresses("redis://h:1", asyncio=False) == "redis://h:1"  # refused later


def test_an_ssl_context_object_is_not_needed() -> None:
    # ssl_cert_reqs may be given as the ssl module's constant: carried as it is
    client = redis.Redis(host="h", ssl=True, ssl_cert_reqs=ssl.CERT_NONE, ssl_check_hostname=False)
    options = _options(client)
    assert options["ssl_cert_reqs"] == ssl.CERT_NONE
    assert options["ssl_check_hostname"] is False

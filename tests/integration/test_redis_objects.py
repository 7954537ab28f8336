"""Lock nodes given as redis-py clients, connection pools and cluster clients, both APIs,
on real servers: TCP, a unix socket, TLS, an ACL user whose credentials come from the
object, and a whole Redis Cluster given as a ``RedisCluster`` object.

tenure takes the node's settings from the object and opens connections of its own; the
object's own pool is never used (docs/connections.md, "Passing a redis-py client")."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

import tenure
from tenure._core.config import LockKeys
from tenure._core.slots import key_slot
from tenure.testing import LocalCluster, LocalNode, LocalRedisCluster

from .conftest import Api, holders
from .test_cluster_lock import _names_per_master
from .tls_proxy import CertificateAuthority, TLSProxy

TTL = 5.0

_USERS = itertools.count()


def _flavour(api: Api) -> Any:
    """The redis-py module of the client's own flavour (either would do)."""
    return redis if api.flavour == "sync" else redis.asyncio


def _unused(obj: Any) -> bool:
    """Whether the object's own pool never made a connection."""
    pool = getattr(obj, "connection_pool", obj)
    return not pool._available_connections and not pool._in_use_connections


@pytest.mark.parametrize("kind", ["client", "pool"])
def test_acquire_and_release_through_redis_py_objects(
    api: Api, shared5: LocalCluster, key: str, kind: str
) -> None:
    flavour = _flavour(api)
    cls = flavour.Redis if kind == "client" else flavour.ConnectionPool
    objects = [cls.from_url(url) for url in shared5.urls[:3]]
    client = api.client(objects)
    assert client.node_names == shared5.urls[:3]
    lease = client.acquire(key, ttl=TTL)
    assert set(lease.nodes) <= set(shared5.urls[:3])  # named by the objects' addresses
    assert len(lease.nodes) >= 2
    assert holders(shared5, lease.key)[:3].count(lease.token.encode()) >= 2
    assert client.lock(key, ttl=TTL).locked()
    lease.release()
    assert holders(shared5, lease.key)[:3] == [None] * 3
    assert all(_unused(o) for o in objects)  # tenure's connections are its own


@contextlib.contextmanager
def _user(cluster: Iterable[LocalNode], *rules: str) -> Iterator[str]:
    """A fresh ACL user on every node (password ``pw``)."""
    name = f"tenure-obj-{next(_USERS)}"
    for node in cluster:
        with node.client() as c:
            # resetchannels first: Redis 6.2 gives a new user every channel
            # (acl-pubsub-default allchannels), after which a channel pattern is an error.
            c.execute_command("ACL", "SETUSER", name, "on", ">pw", "resetchannels", *rules)
    try:
        yield name
    finally:
        for node in cluster:
            with node.client() as c:
                c.acl_deluser(name)


def _logged_in(cluster: Iterable[LocalNode], user: str, name: str) -> int:
    """How many connections on the first three nodes are logged in as ``user`` under
    the client name ``name``."""
    count = 0
    for node in list(cluster)[:3]:
        with node.client() as c:
            count += sum(
                1 for e in c.client_list() if e.get("user") == user and e.get("name") == name
            )
    return count


@pytest.mark.parametrize("how", ["password", "credential_provider"])
def test_credentials_are_carried_over(api: Api, shared5: LocalCluster, key: str, how: str) -> None:
    flavour = _flavour(api)
    with _user(shared5, "~tenure:*", "&tenure:wake:*", "+@all") as user:
        if how == "password":
            auth: dict[str, Any] = {"username": user, "password": "pw"}
        else:
            auth = {"credential_provider": redis.UsernamePasswordCredentialProvider(user, "pw")}
        label = f"{user}-{api.flavour}"
        objects = [
            flavour.Redis(host=n.host, port=n.port, client_name=label, **auth)
            for n in list(shared5)[:3]
        ]
        client = api.client(objects)
        lease = client.acquire(key, ttl=TTL)
        # tenure's own connections, logged in as the object's user, under its name
        assert _logged_in(shared5, user, label) >= 2
        lease.release()
        api.close_clients()


@pytest.mark.parametrize("how", ["password", "credential_provider"])
def test_credentials_are_sent_in_the_objects_encoding(
    api: Api, shared5: LocalCluster, key: str, how: str
) -> None:
    # redis-py sends a str password as bytes of the client's encoding; tenure dropped
    # the encoding and sent UTF-8, so a password outside ASCII that the application's
    # own object logs in with was refused (NodeMisconfigured, WRONGPASS).
    password = "p\u00e4sswort"
    flavour = _flavour(api)
    nodes = list(shared5)[:3]
    with _user(nodes, "~tenure:*", "&tenure:wake:*", "+@all") as user:
        for node in nodes:
            with node.client() as c:
                c.execute_command(
                    "ACL", "SETUSER", user, "resetpass", b">" + password.encode("latin-1")
                )
        if how == "password":
            auth: dict[str, Any] = {"username": user, "password": password}
        else:
            auth = {"credential_provider": redis.UsernamePasswordCredentialProvider(user, password)}
        objects = [
            flavour.Redis(host=n.host, port=n.port, encoding="latin-1", **auth) for n in nodes
        ]
        client = api.client(objects)
        host, port = nodes[0].host, nodes[0].port
        if api.flavour == "sync" and not _logs_in(
            flavour.Redis(host=host, port=port, encoding="latin-1", **auth)
        ):
            # redis-py before 8.2 packs a blocking connection's commands with hiredis, in
            # UTF-8 whatever the encoding: the application's own object is refused, and
            # tenure's connections, made as the object's, alike. (Its asyncio connections
            # use the encoding in every version tried, 5.2 to 8.2.)
            with pytest.raises(tenure.NodeMisconfigured, match="WRONGPASS"):
                client.acquire(key, ttl=TTL, blocking=False)
            return
        lease = client.acquire(key, ttl=TTL, blocking=False)
        assert holders(shared5, lease.key)[:3].count(lease.token.encode()) >= 2
        lease.release()
        api.close_clients()


def _logs_in(obj: redis.Redis) -> bool:
    """Whether a blocking redis-py object logs in with its own settings."""
    try:
        with obj:
            return bool(obj.ping())
    except redis.AuthenticationError:
        return False


def test_wrong_credentials_in_the_object_are_the_nodes_misconfiguration(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    flavour = _flavour(api)
    with _user(shared5, "~tenure:*", "&tenure:wake:*", "+@all") as user:
        objects = [
            flavour.Redis(host=n.host, port=n.port, username=user, password="wrong")
            for n in list(shared5)[:3]
        ]
        client = api.client(objects)
        with pytest.raises(tenure.NodeMisconfigured, match=r"redis://127\.0\.0\.1:"):
            client.acquire(key, ttl=TTL, blocking=False)


def test_a_unix_socket_node_given_as_a_client(api: Api, key: str) -> None:
    with LocalCluster(1, unix=True) as cluster:
        node = cluster[0]
        assert node.unix_path is not None
        obj = _flavour(api).Redis(unix_socket_path=str(node.unix_path), db=2)
        client = api.client([obj])
        assert client.node_names == [f"unix://{node.unix_path}?db=2"]
        lease = client.acquire(key, ttl=TTL)
        with node.client(db=2) as c:
            assert c.get(lease.key) == lease.token.encode()  # in the object's database
        with node.client() as c:
            assert c.get(lease.key) is None
        lease.release()
        assert _unused(obj)


@pytest.mark.parametrize("spelling", ["{name}", "./{name}", "../{dir}/{name}"])
def test_a_unix_socket_client_with_a_relative_path(
    api: Api, key: str, spelling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py connects a relative unix_socket_path from the working directory, but the
    # node's URL was built from it as it stood ('unix://redis.sock', 'unix://./redis.sock'),
    # which redis-py reads back as no path at all or as '/redis.sock': every connection
    # failed (QuorumUnreachable) while the application's own object worked.
    with LocalCluster(1, unix=True) as cluster:
        node = cluster[0]
        assert node.unix_path is not None
        socket = Path(node.unix_path)
        monkeypatch.chdir(socket.parent)
        relative = spelling.format(name=socket.name, dir=socket.parent.name)
        obj = _flavour(api).Redis(unix_socket_path=relative, db=1)
        client = api.client([obj])
        # Named by the socket it connects to: the path taken from the working directory
        # when the client was made, as the object would take it at its next connect.
        assert client.node_names == [f"unix://{socket}?db=1"]
        # The same socket spelled absolutely is the same server, listed twice.
        with pytest.raises(tenure.ConfigurationError, match=r"nodes\[1\]: .* same server"):
            api.client([obj, f"unix://{socket}", "redis://127.0.0.1:1"])
        monkeypatch.chdir(socket.parent.parent)  # later moves are the application's own
        lease = client.acquire(key, ttl=TTL, blocking=False)
        with node.client(db=1) as c:
            assert c.get(lease.key) == lease.token.encode()
        lease.release()


def test_a_tls_node_given_as_a_client(
    api: Api, shared5: LocalCluster, key: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    target = shared5[0]
    assert target.port is not None
    with TLSProxy((target.host, target.port), ca.issue(["127.0.0.1"])) as proxy:
        obj = _flavour(api).Redis(
            host="127.0.0.1", port=proxy.port, ssl=True, ssl_ca_certs=str(ca.ca_file)
        )
        client = api.client([obj])
        assert client.node_names == [proxy.url]
        lease = client.acquire(key, ttl=TTL)
        assert proxy.handshakes >= 1  # over TLS, the certificate verified with the object's CA
        assert holders(shared5, lease.key)[0] == lease.token.encode()
        lease.release()
        assert _unused(obj)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """Three cluster masters (no replicas: nothing here fails over), shared by the
    tests of this module that give a whole cluster as a ``RedisCluster`` object."""
    with LocalRedisCluster(replicas=0) as cluster:
        yield cluster


def _pools(obj: Any) -> dict[str, int]:
    """How many connections each member pool of a sync ``RedisCluster`` has made."""
    out = {}
    for node in obj.nodes_manager.nodes_cache.values():
        pool = node.redis_connection.connection_pool
        out[node.name] = len(pool._available_connections) + len(pool._in_use_connections)
    return out


# One worker runs every test on the cluster, so that it is started once (module scope
# is per worker).
@pytest.mark.xdist_group("redis_cluster_object")
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_redis_cluster_object_locks_on_every_master(
    api: Api, redis_cluster: LocalRedisCluster, key: str, flavour: str
) -> None:
    first = redis_cluster[0]
    assert first.port is not None
    with _user(redis_cluster, "~tenure:*", "&tenure:wake:*", "+@all") as user:
        label = f"{user}-{api.flavour}"
        auth: dict[str, Any] = {"username": user, "password": "pw", "client_name": label}
        # Given one startup node: the sync object reads the slot map as it is made, so it
        # knows every member; the asyncio one has not connected yet.
        if flavour == "sync":
            obj: Any = redis.cluster.RedisCluster(host=first.host, port=first.port, **auth)
            seeds = sorted(n.port for n in redis_cluster if n.port is not None)
            before = _pools(obj)
        else:
            obj = redis.asyncio.cluster.RedisCluster(host=first.host, port=first.port, **auth)
            seeds = [first.port]
        try:
            client = api.client([obj])
            assert client.node_names == [
                "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in seeds)
            ]
            names = _names_per_master(redis_cluster, key, each=2)
            for name in names:
                lease = client.acquire(name, ttl=TTL, blocking=False)
                owner = redis_cluster.slot_owner(key_slot(LockKeys.of(name, per_slot=True).lock))
                with owner.client() as c:  # on the master of its slot
                    assert c.get(lease.key) == lease.token.encode()
                assert client.lock(name, ttl=TTL).locked()
                lease.release()
                with owner.client() as c:
                    assert c.get(lease.key) is None
            # tenure's own connections to every master, logged in as the object's user
            for master in redis_cluster.masters():
                assert _logged_in([master], user, label) >= 1
            api.close_clients()
            # the object is untouched: the asyncio one never connected, the sync one made
            # no connection for tenure and still works after tenure's client closed
            if flavour == "sync":
                assert _pools(obj) == before
                own = f"tenure:own:{key}"  # a key the ACL user may write
                obj.set(own, "1")
                assert obj.get(own) == b"1"
                obj.delete(own)
            else:
                assert not obj.nodes_manager.nodes_cache
        finally:
            if flavour == "sync":
                obj.close()


@pytest.mark.xdist_group("redis_cluster_object")
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_redis_cluster_objects_pipeline_is_refused_naming_the_cluster_client(
    api: Api, redis_cluster: LocalRedisCluster, flavour: str
) -> None:
    # The sync pipeline was refused for an on-connect function it never set (its
    # cluster's), the asyncio one as not a redis-py object at all: neither said to pass
    # the RedisCluster the pipeline came from.
    first = redis_cluster[0]
    assert first.port is not None
    if flavour == "sync":
        obj: Any = redis.cluster.RedisCluster(host=first.host, port=first.port)
    else:
        obj = redis.asyncio.cluster.RedisCluster(host=first.host, port=first.port)
    try:
        with pytest.raises(tenure.ConfigurationError) as info:
            api.client([obj.pipeline()])
    finally:
        if flavour == "sync":
            obj.close()
    assert info.value.parameter == "nodes[0]"
    text = str(info.value)
    assert f"redis.{'' if flavour == 'sync' else 'asyncio.'}cluster.ClusterPipeline" in text
    assert "pipeline() of a RedisCluster" in text, text
    assert "pass the RedisCluster client itself" in text, text
    assert "redis_connect_func" not in text, text


# --- The same node given as a service already spells it -----------------------------------
#
# An application hands tenure what its configuration holds: URLs read from a file or an
# environment variable, redis-py objects made for its own use. Each spelling below locks
# on the node it names, in both clients, or is refused at construction naming the node.


@pytest.mark.parametrize(
    "spelling",
    ["REDIS://{host}:{port}", "Redis://{host}:{port}/2", "  redis://{host}:{port}/2  \n"],
)
def test_a_url_with_an_upper_case_scheme_or_whitespace_locks_on_its_node(
    api: Api, shared5: LocalCluster, key: str, spelling: str
) -> None:
    # redis-py's blocking client refused 'REDIS://' (which its asyncio client takes),
    # and a space after the port was read as part of it: the blocking client refused
    # the first, both refused the last, though each names the node plainly.
    node = shared5[0]
    url = spelling.format(host=node.host, port=node.port)
    client = api.client([url])
    assert client.node_names == [f"redis://{node.host}:{node.port}" + ("/2" if "/2" in url else "")]
    lease = client.acquire(key, ttl=TTL, blocking=False)
    with node.client(db=2 if "/2" in url else 0) as c:
        assert c.get(lease.key) == lease.token.encode()
    lease.release()


def test_a_url_naming_two_databases_is_refused(api: Api, shared5: LocalCluster, key: str) -> None:
    # redis-py takes the query's database over the path's: the node was named
    # '.../3' in lease.nodes and errors while its keys went to database 4.
    node = shared5[0]
    url = f"redis://{node.host}:{node.port}/3?db=4"
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client([url])
    assert info.value.parameter == "nodes[0]"
    assert "'3' in its path and '4' in its query" in str(info.value)
    # Named once, either way, it is that database.
    at = f"redis://{node.host}:{node.port}"
    for once, db in ((f"{at}/3?db=3", 3), (f"{at}?db=4", 4)):
        lease = api.client([once]).acquire(key, ttl=TTL, blocking=False)
        with node.client(db=db) as c:
            assert c.get(lease.key) == lease.token.encode()
        lease.release()


def test_an_on_connect_function_in_connection_options_is_refused(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    # Passed on to redis-py, it replaced the connection's set-up: one that skipped it
    # sent no SELECT, so a client of '.../3' locked in database 0 and a client without
    # it, on the same URL, got the same lock in database 3: two holders at once. A
    # redis-py object that sets one was refused already.
    node = shared5[0]
    url = f"redis://{node.host}:{node.port}/3"
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client([url], connection_options={"redis_connect_func": lambda conn: None})
    assert info.value.parameter == "connection_options['redis_connect_func']"
    assert "on-connect" in str(info.value)
    lease = api.client([url]).acquire(key, ttl=TTL, blocking=False)
    with node.client(db=3) as c:
        assert c.get(lease.key) == lease.token.encode()
    lease.release()


def test_a_password_holding_at_and_a_slash_is_refused_without_showing_it(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    # The password "Zq9x@Wv7k:Jm4/Ab3" unencoded: urllib takes the host part to end at
    # the '/', so it read host "Wv7k" and port "Jm4", and the refusal quoted "Jm4", a
    # piece of the password. Percent-encoded, the same password logs in.
    password = "Zq9x@Wv7k:Jm4/Ab3"
    node = shared5[0]
    with _user([node], "~tenure:*", "&tenure:wake:*", "+@all") as user:
        with node.client() as c:
            c.execute_command("ACL", "SETUSER", user, "resetpass", f">{password}")
        raw = f"redis://{user}:{password}@{node.host}:{node.port}"
        with pytest.raises(tenure.ConfigurationError) as info:
            api.client([raw])
        message = str(info.value)
        assert info.value.parameter == "nodes[0]"
        assert "percent-encode" in message, message
        for piece in ("Zq9x", "Wv7k", "Jm4", "Ab3"):
            assert piece not in message, message
        encoded = raw.replace("/Ab3", "%2FAb3")
        lease = api.client([encoded]).acquire(key, ttl=TTL, blocking=False)
        lease.release()


@pytest.mark.parametrize("name", ["my app", "caf\u00e9", "tab\there"])
def test_an_objects_client_name_the_server_refuses_is_a_configuration_error(
    api: Api, shared5: LocalCluster, name: str
) -> None:
    # Carried over as it was, CLIENT SETNAME failed every connection: the node looked
    # down (QuorumUnreachable after the acquire's attempts), not misconfigured, as the
    # same name in a URL's query or in connection_options is said to be.
    node = shared5[0]
    obj = _flavour(api).Redis(host=node.host, port=node.port, client_name=name)
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client([obj])
    assert info.value.parameter == "nodes[0]"
    assert "client_name" in str(info.value)
    assert "'-' or '_'" in str(info.value)
    # A name it accepts, str or bytes, is carried over.
    for good in ("my-app", b"my-app"):
        obj = _flavour(api).Redis(host=node.host, port=node.port, client_name=good)
        lease = api.client([obj]).acquire(f"client-name-{api.flavour}", ttl=TTL)
        lease.release()


@pytest.mark.xdist_group("redis_cluster_object")
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_one_cluster_given_as_an_object_and_as_a_url_is_refused(
    api: Api, redis_cluster: LocalRedisCluster, shared5: LocalCluster, flavour: str
) -> None:
    # The sync object names every member it discovered, the asyncio one its startup
    # node, the URL the members it lists: the seeds differed, so the one cluster was
    # accepted as two independent nodes, two votes of three.
    first, second = redis_cluster[0], redis_cluster[1]
    assert first.port is not None
    if flavour == "sync":
        obj: Any = redis.cluster.RedisCluster(host=first.host, port=first.port)
        url = f"redis+cluster://{second.host}:{second.port}"
    else:
        obj = redis.asyncio.cluster.RedisCluster(host=first.host, port=first.port)
        url = redis_cluster.url
    try:
        with pytest.raises(tenure.ConfigurationError) as info:
            api.client([obj, shared5[0].url, url])
        assert info.value.parameter == "nodes[2]"
        assert "is the same Redis Cluster as nodes[0]" in str(info.value)
    finally:
        if flavour == "sync":
            obj.close()

"""redis-py clients, connection pools and cluster clients given as lock nodes in place
of URLs.

tenure takes a node's *settings* from such an object (its address, database, TLS
settings, credentials) and opens its own connections with them, under its own timeouts
and without redis-py's retries; it never uses the object's connections, so the
application's own use of the object is untouched. What is carried over, what is
ignored and what is refused, setting by setting, is written in docs/connections.md
("Passing a redis-py client"); this module is that table.

It reads redis-py's ``connection_pool``, ``connection_class`` and ``connection_kwargs``
and, of a ``RedisCluster``, ``nodes_manager`` with its ``startup_nodes``,
``nodes_cache`` and ``connection_kwargs`` (each ``ClusterNode``'s ``host`` and
``port``), ``nodes_manager.address_remap`` and the sync client's
``user_on_connect_func``: all exist in redis-py 5 through 8, sync and asyncio (the last
two are read with a default all the same; tests/unit/test_redis_objects.py).

The fencing stores and the patterns take a redis-py client for commands of their own:
``check_client`` refuses what is none (a URL, a pool, another library's client, whose
errors tenure cannot read), one of the wrong flavour (blocking or asyncio), and one
that decodes replies where values are raw bytes.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.sentinel
import redis.client
import redis.cluster
import redis.connection
import redis.sentinel

from .._core.config import (
    NodeAddress,
    SentinelService,
    host_port,
    node_address,
    parse_node_url,
    redact_url,
)
from .._errors import ConfigurationError
from .redis_compat import client_name_ok, keywords

__all__ = [
    "CARRIED",
    "IGNORED",
    "check_client",
    "node_addresses",
    "reply_encoding",
    "settings_of",
]

_SYNC = redis.connection
_ASYNC = redis.asyncio.connection
_ASYNC_SENTINEL = redis.asyncio.sentinel

# redis-py's own connection classes, by what they connect to (sync, then asyncio). A
# subclass is refused: tenure cannot know what it changes (a handshake, a wrapped socket).
_TCP: tuple[type, type] = (_SYNC.Connection, _ASYNC.Connection)
_TLS: tuple[type, type] = (_SYNC.SSLConnection, _ASYNC.SSLConnection)
_UNIX: tuple[type, type] = (_SYNC.UnixDomainSocketConnection, _ASYNC.UnixDomainSocketConnection)
# A master_for() client's connection classes that speak TLS.
_SENTINEL_TLS: tuple[type, type] = (
    redis.sentinel.SentinelManagedSSLConnection,
    _ASYNC_SENTINEL.SentinelManagedSSLConnection,
)

_SENTINEL_HELP = (
    "a Sentinel object names no service: pass sentinel.master_for(service_name), or the "
    "node as 'redis+sentinel://host:port[,host:port...]/service_name' "
    "(docs/cluster-and-sentinel.md)"
)
_CLUSTERS: tuple[type, type] = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
# What a RedisCluster's pipeline() makes (the sync one a RedisCluster subclass whose
# on-connect function is its cluster's, the asyncio one no client class at all): it
# queues commands for its cluster, which is the object that holds the settings.
_CLUSTER_PIPELINES: tuple[type, type] = (
    redis.cluster.ClusterPipeline,
    redis.asyncio.cluster.ClusterPipeline,
)
# Every pipeline() of a client: a client class (the sync ones subclass it), whose
# commands are queued until execute(), each answered by the pipeline itself.
_PIPELINES: tuple[type, ...] = (
    redis.client.Pipeline,
    redis.asyncio.client.Pipeline,
    *_CLUSTER_PIPELINES,
)
# What to do instead when a RedisCluster object's settings cannot be carried over.
_CLUSTER_URL = (
    "give the cluster as 'redis+cluster://[user:password@]host:port[,host:port...]' "
    "('rediss+cluster://' for TLS; docs/cluster-and-sentinel.md)"
)

# The settings taken from the object (each only when set, i.e. not None), beside the
# address (host and port, or the unix socket path) and the database. Every ``ssl_*``
# setting the connection class has is carried too.
#
# ``encoding`` (with ``encoding_errors``) is how redis-py turns the str arguments of the
# commands it sends into bytes; on tenure's connections it sends only the set-up (AUTH,
# CLIENT SETNAME, SELECT, a Sentinel's question), so the object's encoding makes them
# log in as the object does (a password outside ASCII). tenure's own commands, lock
# names included, are UTF-8 whatever the object says, so every client names a lock alike.
CARRIED = (
    "username",
    "password",
    "credential_provider",
    "client_name",
    "socket_keepalive_options",
    "socket_type",
    "encoding",
    "encoding_errors",
)

# redis-py's defaults, which every object has (``encoding`` as redis-py spells it).
_DEFAULT_ENCODING = {"encoding": "utf-8", "encoding_errors": "strict"}

# Settings that are ignored, and why (docs/connections.md says the same). They concern
# how the object's own connections behave; tenure's connections are its own.
IGNORED: dict[str, str] = {
    "socket_timeout": "tenure owns time: node_timeout bounds every round",
    "socket_connect_timeout": "tenure owns time: connect_timeout bounds every set-up",
    "retry": "tenure owns retries; redis-py's would re-send SET NX after a timeout",
    "retry_on_timeout": "tenure owns retries",
    "retry_on_error": "tenure owns retries",
    "health_check_interval": "a health check is a hidden round trip inside a round",
    "protocol": "tenure speaks RESP2 on its connections and reads the replies itself",
    "decode_responses": "tenure reads its own replies, never through redis-py's decoder",
    "socket_read_size": "tenure reads its own replies",
    "parser_class": "tenure reads its own replies",
    "socket_keepalive": "always on in tenure's TCP connections",
    "lib_name": "tenure turns the CLIENT SETINFO handshake off (a round trip per connect)",
    "lib_version": "tenure turns the CLIENT SETINFO handshake off",
    "driver_info": "tenure turns the CLIENT SETINFO handshake off",
    "max_connections": "tenure keeps its own connections (one per node and round)",
    "cache": "tenure's commands are scripts and never read through a client-side cache",
}

# Settings that are refused when set, with what to do instead.
_REFUSED: dict[str, str] = {
    "redis_connect_func": "a custom on-connect function (as Sentinel and Cluster clients "
    "install) may send commands tenure cannot account for; give the node as a URL",
}


def settings_of(obj: object, parameter: str, *, asyncio: bool) -> NodeAddress:
    """The node a redis-py client or connection pool connects to, with the settings tenure
    carries over to its own connections (``CARRIED``, every ``ssl_*``).

    Args:
        obj: a ``redis.Redis`` or ``redis.asyncio.Redis`` client, a sync or asyncio
            ``ConnectionPool``, a Sentinel ``master_for()`` client, or a sync or asyncio
            ``RedisCluster`` (a whole cluster as one node). Either flavour suits either
            tenure client: only its settings are used.
        parameter: how errors name the entry (``nodes[2]``).
        asyncio: whether the settings are for the asyncio client's connections.

    Raises:
        ConfigurationError: a bare Sentinel object, a custom connection class, a setting
            tenure refuses, a TLS setting the target connections lack.
    """
    kind = _kind(obj)
    _refuse_topologies(obj, parameter, kind)
    if isinstance(obj, _CLUSTERS):
        return _cluster_client(obj, parameter, kind, asyncio=asyncio)
    pool = getattr(obj, "connection_pool", obj)
    sentinel_pools = (redis.sentinel.SentinelConnectionPool, _ASYNC_SENTINEL.SentinelConnectionPool)
    if isinstance(pool, sentinel_pools):
        return _sentinel_managed(pool, parameter, kind, asyncio=asyncio)
    cls = getattr(pool, "connection_class", None)
    raw = getattr(pool, "connection_kwargs", None)
    if not isinstance(cls, type) or not isinstance(raw, Mapping):
        raise ConfigurationError(
            parameter, f"{kind} has no connection settings tenure can read (connection_pool)"
        )
    if cls not in (*_TCP, *_TLS, *_UNIX):
        sentinel = "Sentinel" in cls.__name__
        raise ConfigurationError(
            parameter,
            f"{kind} connects through {cls.__module__}.{cls.__name__}: "
            + (
                "a Sentinel-managed connection outside its master_for() client; pass that "
                "client, or the node as 'redis+sentinel://host:port[,host:port...]/"
                "service_name'"
                if sentinel
                else "not one of redis-py's own connection classes, so tenure cannot know "
                "what it changes; give the node as a URL, with connection_options"
            ),
        )
    tls = cls in _TLS
    options = _carried(raw, _target_class(asyncio, tls=tls, unix=cls in _UNIX), parameter, kind)
    db = raw.get("db", 0)
    if isinstance(db, str) and db.isdigit():
        db = int(db)
    if cls in _UNIX:
        return node_address(
            host=None, port=None, path=raw.get("path"), db=db, tls=False, options=options,
            parameter=parameter, cwd=_working_directory(),
        )  # fmt: skip
    port = raw.get("port", 6379)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    return node_address(
        host=raw.get("host", "localhost"), port=port, path=None, db=db, tls=tls,
        options=options, parameter=parameter,
    )  # fmt: skip


def _working_directory() -> str | None:
    """Where redis-py would find a relative unix socket path now; None if the working
    directory is gone (removed, or out of this process's reach)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _carried(raw: Mapping[str, Any], target: type, parameter: str, kind: str) -> dict[str, Any]:
    """The settings of ``raw`` (an object's ``connection_kwargs``) tenure carries over to
    its own connections of class ``target``.

    Raises:
        ConfigurationError: a setting tenure refuses, or one ``target`` lacks.
    """
    for key, why in _REFUSED.items():
        if raw.get(key) is not None:
            raise ConfigurationError(parameter, f"{kind} sets {key}, which is refused: {why}")
    accepted = keywords(target)
    options: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None or not (key in CARRIED or key.startswith("ssl_")):
            continue
        if key == "socket_keepalive_options" and not (isinstance(value, Mapping) and value):
            continue  # redis-py's default is a sentinel object, not a mapping
        if key == "socket_type" and not value:
            continue
        if _DEFAULT_ENCODING.get(key) == value:
            continue  # what tenure's connections do anyway: nothing to carry
        if key == "client_name" and not client_name_ok(value):
            # The server refuses it at every connect (CLIENT SETNAME): the node would look
            # down (QuorumUnreachable) rather than misconfigured, as in a URL's query or
            # connection_options, where it is refused too.
            raise ConfigurationError(
                parameter,
                f"{kind} sets client_name={value!r}: Redis refuses client names with "
                "spaces or other than printable ASCII; use '-' or '_' for spaces",
            )
        if key not in accepted:
            if not value:
                continue  # off, as it is where the setting does not exist
            raise ConfigurationError(
                parameter,
                f"{kind} sets {key}, but redis-py's {target.__module__}.{target.__name__}, "
                "which tenure connects with here, has no such setting; leave it unset on "
                "the object, or give the node as a URL",
            )
        options[key] = value
    return options


def _sentinel_managed(pool: Any, parameter: str, kind: str, *, asyncio: bool) -> NodeAddress:
    """The node a ``master_for()`` client stands for: its service, its Sentinels (with
    the settings of the Sentinel object's clients: ``sentinel_kwargs``) and the master's
    connection settings (taken as from any client). ``min_other_sentinels`` and the
    Sentinel object's own timeouts and retries are not used.

    Raises:
        ConfigurationError: a ``slave_for()`` client, a Sentinel object without
            Sentinels, or a setting refused as for any client.
    """
    if not getattr(pool, "is_master", True):
        raise ConfigurationError(
            parameter,
            f"{kind} is a replica client (slave_for): a replica cannot hold locks; pass "
            "sentinel.master_for(service), or a redis+sentinel:// URL",
        )
    manager = pool.sentinel_manager
    clients = list(getattr(manager, "sentinels", ()))
    if not clients:
        raise ConfigurationError(parameter, f"{kind}: its Sentinel object lists no Sentinels")
    sentinels = []
    for client in clients:
        at = settings_of(client, parameter, asyncio=asyncio)
        assert at.host is not None
        assert at.port is not None
        sentinels.append((at.host, at.port))
    first = settings_of(clients[0], parameter, asyncio=asyncio)
    raw = pool.connection_kwargs
    tls = issubclass(pool.connection_class, _SENTINEL_TLS)
    options = _carried(raw, _target_class(asyncio, tls=tls, unix=False), parameter, kind)
    db = raw.get("db", 0)
    if isinstance(db, str) and db.isdigit():
        db = int(db)
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ConfigurationError(parameter, f"database must be an integer >= 0, got {db!r}")
    service = SentinelService(
        pool.service_name,
        tuple(sentinels),
        tls=first.scheme == "rediss",
        options=first.options,
        own_settings=True,
    )
    scheme = "rediss" if tls else "redis"
    url = f"{scheme}+sentinel://{service.hosts}/{quote(service.service)}/{db}"
    return NodeAddress(url, scheme, None, None, None, db, tuple(options.items()), service)


def _cluster_client(obj: Any, parameter: str, kind: str, *, asyncio: bool) -> NodeAddress:
    """The whole Redis Cluster a ``RedisCluster`` object stands for, as one node: the
    ``redis+cluster://`` (``rediss+cluster://``) node its seeds make, with the settings
    its nodes' connections are made with (``nodes_manager.connection_kwargs``), carried
    as for any client. The object is only read: never initialized, connected or closed.

    Raises:
        ConfigurationError: an ``address_remap``, a custom on-connect function or
            connection class, a unix socket, a shared connection pool, a database other
            than 0, no seeds, or a setting refused as for any client.
    """
    manager = getattr(obj, "nodes_manager", None)
    raw = getattr(manager, "connection_kwargs", None)
    if not isinstance(raw, Mapping):
        raise ConfigurationError(
            parameter,
            f"{kind} has no connection settings tenure can read (nodes_manager."
            f"connection_kwargs); {_CLUSTER_URL}",
        )
    if getattr(manager, "address_remap", None) is not None:
        raise ConfigurationError(
            parameter,
            f"{kind} sets address_remap, which is refused: tenure connects to the "
            "addresses the cluster announces (CLUSTER SLOTS) and cannot remap them; make "
            "the nodes announce addresses the client can reach (cluster-announce-ip, "
            "cluster-announce-port) and drop address_remap",
        )
    # A RedisCluster installs an on-connect function of its own (the sync one always, the
    # asyncio one for replica reads: READONLY), which tenure has no use for. One the
    # application gave the sync one is kept aside as ``user_on_connect_func``: refused
    # as for any client.
    settings = dict(raw)
    connect = settings.get("redis_connect_func")
    if connect is not None and getattr(connect, "__self__", None) is obj:
        del settings["redis_connect_func"]
    if getattr(obj, "user_on_connect_func", None) is not None:
        settings["redis_connect_func"] = obj.user_on_connect_func
    if settings.get("unix_socket_path") or settings.get("path"):
        raise ConfigurationError(
            parameter,
            f"{kind} connects through a unix socket: a Redis Cluster's members are reached "
            f"at the host:port each announces; set host and port on the object, or {_CLUSTER_URL}",
        )
    if settings.get("connection_pool") is not None:
        raise ConfigurationError(
            parameter,
            f"{kind} hands one connection pool to every member: tenure cannot know which "
            f"member's settings it holds; set them on the object itself, or {_CLUSTER_URL}",
        )
    cls = settings.get("connection_class")
    if cls is not None and cls not in (*_TCP, *_TLS):
        raise ConfigurationError(
            parameter,
            f"{kind} connects through {cls.__module__}.{cls.__name__}: not one of "
            "redis-py's own TCP or TLS connection classes, so tenure cannot know what it "
            f"changes; leave connection_class unset (ssl=True for TLS), or {_CLUSTER_URL}",
        )
    db = settings.get("db") or 0
    if db not in (0, "0"):
        raise ConfigurationError(
            parameter,
            f"{kind} sets database {db!r}: a Redis Cluster has database 0 only; leave db unset",
        )
    tls = bool(settings.get("ssl")) or cls in _TLS
    options = _carried(settings, _target_class(asyncio, tls=tls, unix=False), parameter, kind)
    seeds = _cluster_seeds(manager, parameter, kind)
    scheme = "rediss" if tls else "redis"
    address = parse_node_url(f"{scheme}+cluster://{','.join(seeds)}", parameter)
    return dataclasses.replace(address, options=tuple(options.items()))


def _cluster_seeds(manager: Any, parameter: str, kind: str) -> list[str]:
    """Every node a ``RedisCluster``'s nodes manager knows, the startup nodes it was
    given and those it has discovered (replicas too: any member answers ``CLUSTER
    SLOTS``), once each as ``host:port``, sorted, so that the node's name does not
    depend on the order in which the object happened to learn them.

    Raises:
        ConfigurationError: a node without a host or port, or no node at all.
    """
    found: set[tuple[str, int]] = set()
    for attribute in ("startup_nodes", "nodes_cache"):
        nodes = getattr(manager, attribute, None)
        for node in nodes.values() if isinstance(nodes, Mapping) else ():
            host, port = getattr(node, "host", None), getattr(node, "port", None)
            if isinstance(port, str) and port.isdigit():
                port = int(port)
            if not isinstance(host, str) or not host:
                raise ConfigurationError(
                    parameter, f"{kind} knows a cluster node without a host ({host!r})"
                )
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
                raise ConfigurationError(
                    parameter,
                    f"{kind} knows a cluster node whose port is not in 1..65535 ({port!r})",
                )
            found.add((host, port))
    if not found:
        raise ConfigurationError(
            parameter,
            f"{kind} knows no cluster node (nodes_manager.startup_nodes is empty); make it "
            f"with startup_nodes or host and port, or {_CLUSTER_URL}",
        )
    return [host_port(host, port) for host, port in sorted(found)]


def node_addresses(nodes: object, *, asyncio: bool) -> object:
    """``nodes`` with every redis-py client or pool turned into a ``NodeAddress``.

    URLs are left for ``ClientConfig.build`` to parse, and anything that is not a list is
    passed on for it to refuse.

    Raises:
        ConfigurationError: an entry that is neither a URL nor a usable redis-py object.
    """
    if isinstance(nodes, str) or not isinstance(nodes, (list, tuple)):
        return nodes
    out: list[object] = []
    for i, entry in enumerate(nodes):
        if isinstance(entry, (str, NodeAddress)):
            out.append(entry)
        elif _is_redis_object(entry):
            out.append(settings_of(entry, f"nodes[{i}]", asyncio=asyncio))
        else:
            library = _library_of(entry)
            raise ConfigurationError(
                f"nodes[{i}]",
                "must be a node URL ('redis://host:6379/0', 'rediss://...', "
                "'unix:///path/redis.sock', 'redis+cluster://...', 'redis+sentinel://...'), "
                "a redis.Redis or redis.asyncio.Redis client, a redis-py ConnectionPool, a "
                "Sentinel master_for() client or a RedisCluster client; got "
                f"{redact_url(repr(entry))}"
                + (
                    f", a {library} object, whose settings tenure does not read: give the "
                    "node's URL"
                    if library
                    else ""
                ),
            )
    return out


def _is_redis_object(obj: object) -> bool:
    return isinstance(obj, (*_OBJECTS, *_TOPOLOGIES))


def _kind(obj: object) -> str:
    cls = type(obj)
    return f"the {cls.__module__}.{cls.__qualname__} object"


def _refuse_topologies(obj: object, parameter: str, kind: str) -> None:
    if isinstance(obj, (redis.sentinel.Sentinel, redis.asyncio.sentinel.Sentinel)):
        raise ConfigurationError(parameter, f"{kind} is a Sentinel, but {_SENTINEL_HELP}")
    if isinstance(obj, _CLUSTER_PIPELINES):
        raise ConfigurationError(
            parameter,
            f"{kind} is the pipeline() of a RedisCluster, which queues commands for its "
            "cluster; tenure takes the cluster's settings from the cluster client: pass "
            f"the RedisCluster client itself (the one whose pipeline() this is), or "
            f"{_CLUSTER_URL}",
        )


def _target_class(asyncio: bool, *, tls: bool, unix: bool) -> type:
    """The connection class tenure's own connections to such a node are made of."""
    if unix:
        return _UNIX[asyncio]
    return _TLS[asyncio] if tls else _TCP[asyncio]


_OBJECTS: tuple[type, ...] = (
    redis.Redis,
    redis.asyncio.Redis,
    redis.ConnectionPool,
    redis.asyncio.ConnectionPool,
)
_TOPOLOGIES: tuple[type, ...] = (
    redis.sentinel.Sentinel,
    redis.asyncio.sentinel.Sentinel,
    *_CLUSTERS,
    *_CLUSTER_PIPELINES,  # refused, naming the cluster client to pass instead
)


# --- Clients the fencing stores and the patterns use for their own commands -------------
#
# redis-py's blocking and asyncio clients have the same methods, so the wrong flavour is
# not noticed where it is passed, only later and obscurely: a blocking object given an
# asyncio client gets coroutines back and drops them un-awaited (nothing is written, no
# error), and an asyncio object given a blocking client fails with a bare TypeError at its
# first await. So every tenure object that takes a redis-py client checks the flavour when
# it is made (a function, when it is called) and says which client it takes.
#
# A client made with decode_responses=True decodes every reply with its encoding (UTF-8
# unless it says otherwise) inside redis-py's parser, before the caller sees it: values
# come back as str, and one that is not text in that encoding makes the whole reply raise
# UnicodeDecodeError, which nothing the caller does can read. Objects whose values are
# any bytes (the stores here, the stream worker) refuse such a client too. An encoding
# that does not read ASCII as ASCII (utf-16) fails on the server's own replies ("OK",
# "PONG"), so such a client cannot run a command at all: every object refuses it.

_BLOCKING_CLIENTS = (redis.Redis, redis.RedisCluster)
_ASYNCIO_CLIENTS = (redis.asyncio.Redis, redis.asyncio.RedisCluster)
_CLIENTS = (*_BLOCKING_CLIENTS, *_ASYNCIO_CLIENTS)


def _is_asyncio(client: object) -> bool:
    """Whether ``client`` (a client, ``_refuse_no_client`` has seen to that) is an
    asyncio client."""
    if isinstance(client, _ASYNCIO_CLIENTS):
        return True
    if isinstance(client, _BLOCKING_CLIENTS):
        return False
    # Neither class (a wrapper, say): judge it by the method every command goes through.
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def _decodes(client: object) -> bool:
    """Whether ``client`` decodes replies (``decode_responses=True``)."""
    # get_encoder(): every redis-py client, single node or cluster, blocking or asyncio.
    get_encoder = getattr(client, "get_encoder", None)
    if not callable(get_encoder):
        return False
    # ``is True``: a test double's attribute is a truthy mock, not a setting.
    return getattr(get_encoder(), "decode_responses", False) is True


def reply_encoding(client: object) -> tuple[str, str]:
    """The encoding and error handler ``client`` turns str into bytes with, and, made
    with ``decode_responses=True``, decodes replies with (redis-py's defaults, UTF-8 and
    strict, for what does not say)."""
    get_encoder = getattr(client, "get_encoder", None)
    encoder = get_encoder() if callable(get_encoder) else None
    encoding = getattr(encoder, "encoding", None)
    errors = getattr(encoder, "encoding_errors", None)
    return (
        encoding if isinstance(encoding, str) else "utf-8",
        errors if isinstance(errors, str) else "strict",
    )


# Every byte a server's own replies are made of ("OK", "PONG", numbers, error texts).
_ASCII = bytes(range(128))


def _reads_ascii(encoding: str, errors: str) -> bool | None:
    """Whether ``encoding`` decodes and encodes ASCII as ASCII; None if Python has no such
    codec."""
    try:
        return (
            _ASCII.decode(encoding, errors) == _ASCII.decode("ascii")
            and _ASCII.decode("ascii").encode(encoding, errors) == _ASCII
        )
    except LookupError:
        return None
    except UnicodeError:
        return False


def _name(client: object) -> str:
    cls = type(client)
    return f"a {cls.__module__}.{cls.__qualname__}"


# Client libraries for Redis and Valkey other than redis-py, by their top-level package.
# Their clients have redis-py's shape (execute_command, pipeline, eval), so nothing
# failed where one was passed; but what they raise is their own (valkey-py forked
# redis-py and renamed its exceptions: valkey.exceptions.ConnectionError is no
# redis.ConnectionError), which tenure cannot classify, so a server that went away
# reached the caller as that library's raw exception, not as a StoreUnavailable.
_OTHER_LIBRARIES = {
    "valkey": "valkey-py",
    "aioredis": "aioredis",
    "coredis": "coredis",
    "glide": "valkey-glide",
}


def _library_of(obj: object) -> str | None:
    """The client library other than redis-py that ``obj``'s class (or a class it
    derives from) comes from; None for redis-py's and anything else."""
    for cls in type(obj).__mro__:
        library = _OTHER_LIBRARIES.get(cls.__module__.partition(".")[0])
        if library is not None:
            return library
    return None


def _refuse_no_client(client: object, parameter: str, owner: str, *, asyncio: bool) -> None:
    """Refuse what is no redis-py client: a URL, a connection pool, a Sentinel object, a
    tenure client, a client of another library, anything without ``execute_command``.

    Each was taken before and failed at its first command with a raw ``AttributeError``
    (a URL, a pool, None), or sent it somewhere else (a Sentinel object sends commands to
    the Sentinels), or let that library's exceptions reach the caller unclassified. A
    wrapper with redis-py's ``execute_command`` is still taken: it raises redis-py's
    errors, which tenure reads.
    """
    if isinstance(client, _CLIENTS):
        return  # nearly always: at once (optimistic checks its client on every call)
    made = "redis.asyncio.Redis" if asyncio else "redis.Redis"
    got = f"{owner} takes a redis-py client ({made}), but got"
    if isinstance(client, str):
        # Not shown: a URL may carry a password.
        raise ConfigurationError(
            parameter, f"{got} a str: make the client from the URL, {made}.from_url(url)"
        )
    if isinstance(client, (redis.ConnectionPool, redis.asyncio.ConnectionPool)):
        raise ConfigurationError(
            parameter,
            f"{got} {_name(client)}, a connection pool: pass a client over it, "
            f"{made}(connection_pool=pool)",
        )
    if isinstance(client, (redis.sentinel.Sentinel, redis.asyncio.sentinel.Sentinel)):
        raise ConfigurationError(
            parameter,
            f"{got} {_name(client)}, which sends its commands to the Sentinels: pass the "
            "master's client, sentinel.master_for(service_name)",
        )
    library = _library_of(client)
    if library is not None:
        raise ConfigurationError(
            parameter,
            f"{got} {_name(client)}, a {library} client: {owner} reads redis-py's errors, "
            f"and that client's failures would reach you as {library}'s own exceptions, "
            f"not as tenure's StoreError; pass a redis-py client of the same server, "
            f"{made}.from_url(url) (redis-py speaks to Valkey as to Redis)",
        )
    if type(client).__module__.partition(".")[0] == "tenure":
        raise ConfigurationError(
            parameter,
            f"{got} {_name(client)}, one of tenure's own objects, which runs no commands "
            f"for others: pass a redis-py client of the Redis that keeps {owner}'s data",
        )
    if not callable(getattr(client, "execute_command", None)):
        raise ConfigurationError(
            parameter,
            f"{got} {'None' if client is None else _name(client)}, which is not one (it "
            "has no execute_command, the method every redis-py command goes through)",
        )


def check_client(
    client: object,
    parameter: str,
    *,
    owner: str,
    asyncio: bool,
    twin: str | None = None,
    raw_bytes: bool = False,
) -> None:
    """Refuse what is no redis-py client (a URL, a pool, a client of another library:
    ``_refuse_no_client``), a pipeline, a redis-py client of the wrong flavour, one made
    with an encoding Python lacks, one that decodes replies with an encoding that cannot
    read the server's own (utf-16), or one that decodes replies where ``raw_bytes``
    values must be read.

    Args:
        client: what the caller passed.
        parameter: the parameter's name, as the caller spells it.
        owner: the class or function that takes it (``"FencedStore"``).
        asyncio: whether ``owner`` takes an asyncio client.
        twin: ``owner``'s counterpart of the other flavour, if it has one.
        raw_bytes: ``owner`` reads values that may be any bytes.

    Raises:
        ConfigurationError: (``parameter``) no redis-py client, a pipeline, the wrong
            flavour, a client with an encoding Python lacks, a client decoding with an
            encoding that does not read ASCII as ASCII, or a decoding client where
            ``raw_bytes``.
    """
    _refuse_no_client(client, parameter, owner, asyncio=asyncio)
    if isinstance(client, _PIPELINES):
        # Its commands answer with the pipeline, not a reply: the first reply read (a
        # token, a version) raised a raw TypeError, and a write was never sent.
        raise ConfigurationError(
            parameter,
            f"{owner} got {_name(client)}, a pipeline(), which queues its commands until "
            f"execute() and answers each with itself: pass the client it came from "
            f"({owner} sends its own commands, in the order they must run)",
        )
    flavour = _is_asyncio(client)
    if flavour and not asyncio:
        other = (
            f"for asyncio use {twin}"
            if twin
            else f"{owner} has no asyncio twin: give it a blocking client of its own"
        )
        raise ConfigurationError(
            parameter,
            f"{owner} is blocking, but got {_name(client)}, an asyncio client whose "
            f"commands return coroutines: pass a redis.Redis (or redis.RedisCluster); "
            f"{other}",
        )
    if not flavour and asyncio:
        raise ConfigurationError(
            parameter,
            f"{owner} is asyncio, but got {_name(client)}, a blocking client: pass a "
            "redis.asyncio.Redis (or redis.asyncio.RedisCluster)"
            + (f"; for a blocking client use {twin}" if twin else ""),
        )
    encoding, errors = reply_encoding(client)
    reads_ascii = _reads_ascii(encoding, errors)
    if reads_ascii is None:
        # With or without decode_responses: redis-py encodes every str argument (the
        # keys at least) with it, so the first command failed, with a raw LookupError.
        raise ConfigurationError(
            parameter,
            f"{owner} got {_name(client)} made with encoding {encoding!r}, which Python "
            "has no codec for: redis-py encodes every str argument with it (and decodes "
            "replies with it, made with decode_responses=True), so that client cannot "
            "send a key (LookupError inside redis-py); make it with an encoding Python "
            "has, such as 'utf-8', redis-py's default",
        )
    if not _decodes(client):
        return
    fix = "pass a client without it, e.g. redis.Redis(..., decode_responses=False), the default"
    if not reads_ascii:
        raise ConfigurationError(
            parameter,
            f"{owner} got {_name(client)} made with decode_responses=True and encoding "
            f"{encoding!r}, which does not read ASCII as ASCII: redis-py decodes every "
            "reply with it, the server's own (OK, PONG) too, so that client cannot run a "
            f"command (UnicodeDecodeError inside redis-py); {fix}, or with an encoding "
            "such as 'utf-8'",
        )
    if raw_bytes:
        raise ConfigurationError(
            parameter,
            f"{owner} reads values as raw bytes, but got {_name(client)} made with "
            f"decode_responses=True: redis-py decodes every reply with its encoding "
            f"{encoding!r} before {owner} sees it, so values come back as str rather than "
            "the bytes stored, and a value that is not text in that encoding fails the "
            f"whole reply (UnicodeDecodeError); {fix}",
        )

"""The few places where tenure depends on how redis-py (>= 5) is put together.

Kept in one module so that a change in redis-py breaks one file, and tests/integration
exercise every function here against the installed version.
"""

from __future__ import annotations

import difflib
import errno
import inspect
import os
import select
import socket
import ssl
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio
from redis import exceptions as rx
from redis.backoff import NoBackoff

from .._core import diagnosis
from .._core.config import ClientConfig, NodeAddress
from .._core.diagnosis import Diagnosis
from .._core.quorum import Failure
from .._core.resp import ErrorReply
from .._errors import ConfigurationError
from .acl import denial
from .clock import monotonic
from .ready import readable
from .replies import NOT_RESP, PullReader, pull_reader

__all__ = [
    "ClosedByNode",
    "Diagnosed",
    "NotRedis",
    "SocketReplies",
    "before_first_reply",
    "bound_tcp_connect",
    "check_connection_options",
    "client_name_ok",
    "connection_kwargs",
    "diagnose",
    "disconnect",
    "dropped",
    "has_unread",
    "kernel_timeouts",
    "keywords",
    "node_pool",
    "own_connection",
    "timed_out",
]


def keywords(cls: type) -> set[str]:
    """Every keyword ``cls(...)`` takes along its MRO (each ``__init__`` passes the rest on)."""
    names: set[str] = set()
    for c in cls.__mro__:
        init = c.__dict__.get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                names.add(p.name)
    return names


def _accepts(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` takes keyword ``name`` anywhere along its MRO."""
    return name in keywords(cls)


# redis-py 5-7 name the CLIENT SETINFO handshake lib_name/lib_version; 8 deprecates them
# for driver_info. Either way we switch it off: it costs two round trips per connect and
# would block a reconnect to a frozen node for the whole socket timeout.
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if _accepts(redis.Connection, "driver_info")
    else {"lib_name": None, "lib_version": None}
)


def connection_kwargs(
    node_timeout: float, *, asyncio: bool, unix: bool, connect_timeout: float | None = None
) -> dict[str, Any]:
    """Options for every connection tenure opens.

    redis-py's own retries are off: it would re-send ``SET NX`` after a timeout and stall
    for seconds, while tenure owns retries and time. Health checks are off for the same
    reason (they are a hidden round trip). The async driver reads replies in a background
    task, so it waits without a socket timeout and enforces deadlines itself.
    ``connect_timeout`` (default: ``node_timeout``) bounds the TCP connect; the clients'
    drivers bound the rest of the set-up (TLS handshake, AUTH) by it too.
    """
    retry_cls = redis.asyncio.retry.Retry if asyncio else redis.retry.Retry
    options: dict[str, Any] = {
        "socket_timeout": None if asyncio else node_timeout,
        "socket_connect_timeout": node_timeout if connect_timeout is None else connect_timeout,
        "retry": retry_cls(NoBackoff(), 0),
        "health_check_interval": 0,
        # RESP2: redis-py 8 defaults to RESP3, whose HELLO handshake is a blocking round
        # trip on every connect; our replies (OK, nil, integers) read the same in both.
        "protocol": 2,
        **_NO_SETINFO,
    }
    if not unix:
        # TCP keepalive lets the kernel notice a peer that vanished without a reset.
        options["socket_keepalive"] = True
    return options


def own_connection(pool: Any) -> Any:
    """A new connection with ``pool``'s settings (URL, TLS, credentials), not taken from
    the pool: its ``make_connection()`` counts each connection against
    ``max_connections`` (100) and is never told when one is closed, so after 100
    reconnects a node would stay unreachable for good (found by `tenure verify network
    --soak`); and ``get_connection``'s arguments differ between the redis-py versions
    tenure supports. Not connected yet."""
    return pool.connection_class(**pool.connection_kwargs)


def disconnect(conn: Any) -> None:
    """``conn.disconnect()``, its socket closed even if an interrupt (Ctrl-C) lands in
    it: redis-py lets go of the socket, then runs Python code (the shutdown among it)
    before it closes it, and a socket so dropped was left unclosed to the garbage
    collector (a ``ResourceWarning``, the file descriptor held until collected)."""
    sock = conn._sock
    try:
        conn.disconnect()
    finally:
        if sock is not None:
            sock.close()  # (nothing more once closed)


def node_pool(
    address: NodeAddress,
    config: ClientConfig,
    connection_options: Mapping[str, Any],
    *,
    asyncio: bool,
) -> Any:
    """The redis-py connection pool a driver connects to one node through: its URL, the
    options tenure owns (``connection_kwargs``), the user's checked options, then the
    settings taken from a redis-py object given as the node (``address.options``: the
    node's own, as a URL's credentials are, and never in conflict with the others, which
    ``check_connection_options`` made sure of). A Sentinel-managed node's connections
    find its master when they connect (``_driver.sentinel``)."""
    defaults = connection_kwargs(
        config.node_timeout,
        asyncio=asyncio,
        unix=address.path is not None,
        connect_timeout=config.connect_timeout,
    )
    cls = redis.asyncio.ConnectionPool if asyncio else redis.ConnectionPool
    settings = {**defaults, **connection_options, **dict(address.options)}
    pool = cls.from_url(address.redis_url, **settings)
    if address.sentinel is not None:
        # Its connections find the master through the Sentinels when they connect.
        from .sentinel import managed  # imports this module

        pool = managed(pool, address, config.connect_timeout, asyncio=asyncio)
    return pool


class NotRedis(rx.ConnectionError):
    """The node sent bytes that are not the Redis protocol (the asyncio driver's reader)."""


class ClosedByNode(rx.ConnectionError):
    """The node ended the connection (its end of the stream read)."""


class Diagnosed(rx.ConnectionError):
    """A connection that could not be set up, already diagnosed (a Sentinel-managed
    node whose Sentinels named no master: ``_core.sentinel.no_master``)."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(diagnosis.detail)
        self.diagnosis = diagnosis


# Error codes redis-py strips off the replies it maps to exception classes, for redis-py
# versions that do not keep them (``status_code`` came in redis-py 6).
_CODES: tuple[tuple[type[Exception], str], ...] = (
    (rx.ReadOnlyError, "READONLY"),
    (rx.NoPermissionError, "NOPERM"),
    (rx.NoScriptError, "NOSCRIPT"),
    (rx.MovedError, "MOVED"),
    (rx.AskError, "ASK"),
    (rx.ClusterCrossSlotError, "CROSSSLOT"),
    (rx.ClusterDownError, "CLUSTERDOWN"),
    (rx.TryAgainError, "TRYAGAIN"),
    (rx.BusyLoadingError, "LOADING"),
    (rx.OutOfMemoryError, "OOM"),
)


def _reply_text(exc: rx.RedisError) -> str:
    """An error reply's text as the node sent it, code first ("READONLY You can't ...")."""
    text = str(exc)
    code = getattr(exc, "status_code", None)
    if not isinstance(code, str) or not code:
        code = next((c for cls, c in _CODES if isinstance(exc, cls)), "")
        if not code and isinstance(exc, rx.AuthenticationError):
            code = "NOAUTH" if "required" in text.lower() else "WRONGPASS"
    return f"{code} {text}" if code and not text.startswith(code) else text


# Exceptions a reply that is not the Redis protocol raises in redis-py's parser (``int()``
# of a garbled length, a decoder fed random bytes) or in a command's reply reader.
_GARBLED = (rx.InvalidResponse, rx.DataError, NotRedis, ValueError, TypeError, IndexError)


def diagnose(exc: Exception, plain: str = "redis") -> Diagnosis:
    """Any exception a node's connection raised, as a per-node failure.

    ``plain`` is the scheme of the node's URL without TLS, which a TLS handshake that
    timed out names as the fix (``diagnosis.tls_handshake_timed_out``): a Cluster
    node's seed passes ``redis+cluster``, as its connection knows no URL.

    Error replies and authentication failures are classified by ``_core.diagnosis``;
    bytes that are not the Redis protocol make the node misconfigured (something else
    listens there); a TLS certificate that failed verification is a configuration
    failure too (``diagnosis.certificate_rejected``); network errors make the node
    unreachable. Nothing is raised.
    """
    if isinstance(exc, Diagnosed):
        return exc.diagnosis
    rejected = _certificate_error(exc)
    if rejected is not None:
        return diagnosis.certificate_rejected(
            getattr(rejected, "verify_code", None),
            getattr(rejected, "verify_message", None) or str(rejected),
        )
    if isinstance(exc, (rx.ResponseError, rx.AuthenticationError)):
        text = _reply_text(exc)
        # A command, key or channel refused by ACL inside one of our scripts: each Redis
        # version words it differently, and none of them starts the reply with NOPERM.
        # The whole text is kept: its script line names the refused command on 6.2.
        if denial(text) is not None:
            return diagnosis.acl_refused(text)
        return diagnosis.error_reply(text)
    if isinstance(exc, _GARBLED):
        return diagnosis.not_redis(str(exc) or type(exc).__name__)
    if _in_chain(exc, lambda e: isinstance(e, OSError) and e.errno == errno.ENOTDIR):
        return diagnosis.socket_path_not_a_directory(str(exc) or type(exc).__name__)
    if isinstance(exc, rx.BusyLoadingError):
        # The node's LOADING reply (in the connection's set-up), which redis-py raises
        # as a ConnectionError without its code: classified as the reply it was.
        return diagnosis.error_reply(f"LOADING {exc}")
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):
        said = str(exc) or type(exc).__name__
        if isinstance(exc, rx.ConnectionError) and diagnosis.at_connection_limit(said):
            # The node's own refusal, which redis-py raises as a ConnectionError: its
            # reply, classified as the asyncio driver's is, with the fix.
            return diagnosis.error_reply(said if said.startswith("ERR") else f"ERR {said}")
        if _in_chain(exc, _handshake_timeout) is not None:
            return diagnosis.tls_handshake_timed_out(said, plain)
        return Diagnosis(Failure.UNREACHABLE, said)
    return Diagnosis(Failure.ERROR, f"{type(exc).__name__}: {exc}")


def dropped(exc: BaseException) -> bool:
    """Did the node close or reset a connection it had taken (rather than refuse it, or
    stay silent)? tenure's readers raise ``ClosedByNode`` for a close, redis-py's (in
    the set-up) says "Connection closed by server.", and either wraps (or quotes, its
    errno kept) the socket's error of a reset."""
    if isinstance(exc, ClosedByNode):
        return True
    if _in_chain(exc, lambda e: isinstance(e, OSError) and e.errno in _DROPPED) is not None:
        return True
    return isinstance(exc, rx.ConnectionError) and "closed by server" in str(exc)


_DROPPED = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def before_first_reply(why: Diagnosis, exc: BaseException, form: str) -> Diagnosis:
    """``why``, the diagnosis of ``exc``, which ended a connection to a node before the
    node's first reply on it (in its set-up, or its first command's read): a close or
    reset by the node names the TLS port it may be
    (``diagnosis.closed_before_answering``; ``form``: the node's ``login_form``)."""
    return diagnosis.closed_before_answering(why, form) if dropped(exc) else why


def _handshake_timeout(exc: BaseException) -> bool:
    """The ``ssl`` module's timeout of a TLS handshake, which redis-py reports only as
    "Timeout connecting to server" (its cause kept in the chain)."""
    return isinstance(exc, TimeoutError) and "handshake operation timed out" in str(exc)


def _certificate_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind ``exc``, if any."""
    found = _in_chain(exc, lambda e: isinstance(e, ssl.SSLCertVerificationError))
    return cast("ssl.SSLCertVerificationError | None", found)


def _in_chain(exc: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception of ``exc``'s chain that is ``wanted``, if any: redis-py wraps
    the ``ssl`` or ``socket`` module's error in its own ConnectionError (sync: ``raise
    ... from``; asyncio: raised while handling it), or only quotes it (its errno kept)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain is short; the bound guards against a cycle
        if seen is None:
            return None
        if wanted(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


# connection_options that would take from tenure what it must own, and what to do instead.
_OWNED = {
    "retry": "tenure owns retries (redis-py's would re-send SET NX after a timeout and "
    "stall a round for seconds)",
    "retry_on_timeout": "tenure owns retries",
    "retry_on_error": "tenure owns retries",
    "socket_timeout": "tenure owns time: set Client(node_timeout=...) instead",
    "socket_connect_timeout": "tenure owns time: set Client(connect_timeout=...) instead",
    "health_check_interval": "a health check is a hidden round trip inside a round; "
    "tenure notices a dead node by itself",
    # It replaces redis-py's on_connect: one that skips it sends no AUTH and no SELECT,
    # so the client locks in database 0 of a node its URL names as /3 while other clients
    # lock in 3 (two holders), and one that sends commands of its own changes the wire.
    # A redis-py object that sets it is refused the same way (redis_objects._REFUSED).
    "redis_connect_func": "a custom on-connect function replaces the set-up tenure relies "
    "on (AUTH, SELECT of the URL's database) and may send commands tenure cannot account "
    "for; give credentials and the database in each node URL",
    # redis-py's handling of a managed service's maintenance notices (and the state it
    # keeps for them): during a notice it relaxes the connection's timeouts (10 s by
    # default) and reconnects elsewhere on its own, under a round that counts on
    # node_timeout and on knowing which server answered.
    **dict.fromkeys(
        (
            "maint_notifications_config",
            "maint_notifications_pool_handler",
            "maintenance_notification_hash",
            "maintenance_state",
            "oss_cluster_maint_notifications_handler",
            "orig_host_address",
            "orig_socket_timeout",
            "orig_socket_connect_timeout",
        ),
        "redis-py's maintenance notifications relax timeouts and reconnect behind tenure's "
        "back; tenure finds moved, failed and replaced nodes itself (leave it out)",
    ),
    "host": "give it in each node URL",
    "port": "give it in each node URL",
    "path": "give it in each node URL (unix:///path)",
    "unix_socket_path": "give it in each node URL (unix:///path)",
    "db": "give it in each node URL (redis://host:port/DB)",
}

# The same options in a node URL's query (redis-py reads them there too), with advice that
# fits a URL: ``_OWNED``'s points at the URL itself or at Client() arguments, and the URL
# may come from the command line. ``db`` is not here: a URL may name its database in the
# query.
_OWNED_IN_URL = {
    **_OWNED,
    "socket_timeout": "tenure sets its own timeouts (node_timeout, connect_timeout)",
    "socket_connect_timeout": "tenure sets its own timeouts (node_timeout, connect_timeout)",
    "host": "the URL's host:port names the node",
    "port": "the URL's host:port names the node",
    "path": "a unix:// URL's path names the socket",
    "unix_socket_path": "a unix:// URL's path names the socket",
}
del _OWNED_IN_URL["db"]


def client_name_ok(name: object) -> bool:
    """A name ``CLIENT SETNAME`` accepts: characters '!' to '~' only (redis-py sends a
    ``bytes`` name as it is)."""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    return isinstance(name, str) and all("!" <= c <= "~" for c in name)


def check_connection_options(
    options: object,
    nodes: Sequence[NodeAddress],
    node_timeout: float,
    *,
    asyncio: bool,
    listed: str = "nodes",
) -> dict[str, Any]:
    """Validate ``connection_options`` against the connections redis-py would make.

    For every node, redis-py builds its pool from the URL and these options and one
    connection object is made from it, exactly as a round would, without connecting.
    So a misspelt key, a TLS option on a ``redis://`` node or a value redis-py refuses
    fails here, naming the key, rather than at the first acquire. A node given as a
    redis-py object brings settings of its own (``address.options``); an option set
    both there and here to different values is refused rather than one silently
    winning.

    Raises:
        ConfigurationError: not a mapping of str keys; a key no connection of these
            nodes accepts, or one tenure must own; a value redis-py refuses; a key the
            node's object sets otherwise. A node is named ``<listed>[i]`` (the
            command line's ``--redis[i]``).
    """
    if options is None:
        options = {}  # the URLs are still checked: a query option may be one redis-py refuses
    param = "connection_options"
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            param,
            "must be a dict of redis-py connection keyword arguments, e.g. "
            # The type only: what was passed may hold a password.
            f"{{'password': '...', 'ssl_ca_certs': '/path/ca.pem'}}, got a "
            f"{type(options).__name__}",
        )
    result: dict[str, Any] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise ConfigurationError(param, f"keys must be str (keyword names), got {key!r}")
        if key in _OWNED:
            raise ConfigurationError(f"{param}[{key!r}]", f"not accepted: {_OWNED[key]}")
        if key == "client_name" and value is not None and not client_name_ok(value):
            # The server refuses it at every connect (CLIENT SETNAME): an outage to the
            # client, which no wait ends.
            raise ConfigurationError(
                f"{param}['client_name']",
                f"must be a str of printable ASCII without spaces, got {value!r}: Redis "
                "refuses other client names; use '-' or '_' for spaces",
            )
        if key == "protocol" and value not in (2, "2"):
            raise ConfigurationError(
                f"{param}['protocol']",
                f"must be 2 or left out, got {value!r}: tenure reads RESP2 replies and "
                "notifications itself",
            )
        result[key] = value
    pool_cls = redis.asyncio.ConnectionPool if asyncio else redis.ConnectionPool
    loaded: dict[tuple[object, ...], tuple[str, str] | None] = {}
    for i, address in enumerate(nodes):
        node = address  # named as listed: a Cluster by its seeds, not its first one
        if address.seeds:  # a Redis Cluster: checked as its first seed, a plain node
            address = address.member(*address.seeds[0])
        _check_url_query(address.redis_url, node.display, f"{listed}[{i}]")
        defaults = connection_kwargs(node_timeout, asyncio=asyncio, unix=address.path is not None)
        try:
            conn_cls = pool_cls.from_url(address.redis_url).connection_class
        except (TypeError, ValueError, rx.RedisError) as exc:
            raise ConfigurationError(
                f"{listed}[{i}]", f"redis-py refuses {address.display}: {exc}"
            ) from None
        accepted = keywords(conn_cls)
        own = dict(address.options)
        for key in result:
            if key not in accepted:
                raise ConfigurationError(
                    f"{param}[{key!r}]", _unknown(key, conn_cls, address, accepted)
                )
            if key in own and not _same(own[key], result[key]):
                raise ConfigurationError(
                    f"{param}[{key!r}]",
                    f"the redis-py object given as {listed}[{i}] ({address.display}) sets "
                    f"{key} to another value; set it in one place (the object's settings "
                    "are that node's own, connection_options apply to every node)",
                )
        try:
            pool = pool_cls.from_url(address.redis_url, **{**defaults, **result, **own})
            pool.connection_class(**pool.connection_kwargs)
        except (TypeError, ValueError, rx.RedisError) as exc:
            what = (
                "them"
                if result
                else ("the settings taken from its redis-py object" if own else "its URL")
            )
            raise ConfigurationError(
                param if result else f"{listed}[{i}]",
                f"redis-py refuses {what} for {address.display} ({listed}[{i}]): {exc}",
            ) from None
        refused = _tls_files_refused(pool.connection_kwargs, loaded)
        if refused is not None:
            key, why = refused
            given = f"{param}[{key!r}]" if key in result else f"{listed}[{i}]"
            raise ConfigurationError(
                given,
                f"{why}, so no TLS connection to {address.display} ({listed}[{i}]) could be "
                f"made. {_TLS_FIX[key]}",
            )
    return result


# What each TLS file option must name, for the errors of ``_tls_files_refused``.
_TLS_FIX = {
    "ssl_certfile": "Pass the path of this client's certificate (PEM), readable by this "
    "process, with its key in ssl_keyfile unless the file holds both",
    "ssl_keyfile": "Pass the path of the private key (PEM) of the certificate in "
    "ssl_certfile, readable by this process, and its passphrase as ssl_password if it "
    "has one",
    "ssl_ca_certs": "Pass the path of the CA certificate(s) (PEM) that signed the nodes' "
    "certificates, readable by this process",
    "ssl_ca_path": "Pass a directory of CA certificates prepared with c_rehash",
    "ssl_ca_data": "Pass the CA certificate(s) themselves, as PEM text",
}


def _tls_files_refused(
    kwargs: Mapping[str, Any], loaded: dict[tuple[object, ...], tuple[str, str] | None]
) -> tuple[str, str] | None:
    """(option, why) when the certificates and keys a TLS connection of these settings
    would load cannot be loaded; None when they can, or the connection is not TLS.

    redis-py loads them only when it connects, and a file that is missing, unreadable or
    not PEM then fails every connection to the node, which would look like a node
    outage (``QuorumUnreachable``) rather than the misconfiguration it is. So they are
    loaded here once, as redis-py will (``load_cert_chain``, then
    ``load_verify_locations``), into a context that is thrown away. ``loaded``: the
    answers for the settings seen so far (the nodes of one client mostly share them).
    """
    certfile, keyfile = kwargs.get("ssl_certfile"), kwargs.get("ssl_keyfile")
    ca_certs, ca_path = kwargs.get("ssl_ca_certs"), kwargs.get("ssl_ca_path")
    ca_data = kwargs.get("ssl_ca_data")
    if not (certfile or keyfile or ca_certs or ca_path or ca_data):
        return None
    # By repr: a value may not hash (a path object does, a list would not); the
    # passphrase by identity, never kept.
    seen = (
        *map(repr, (certfile, keyfile, ca_certs, ca_path, ca_data)),
        id(kwargs.get("ssl_password")),
    )
    if seen in loaded:
        return loaded[seen]
    loaded[seen] = refused = _load_refused(certfile, keyfile, ca_certs, ca_path, ca_data, kwargs)
    return refused


class _Encrypted(Exception):
    """The key file is encrypted and no passphrase was given."""


def _no_passphrase() -> str:
    # Without a callback, OpenSSL would ask for the passphrase on the terminal.
    raise _Encrypted


def _load_refused(
    certfile: Any, keyfile: Any, ca_certs: Any, ca_path: Any, ca_data: Any, kwargs: Any
) -> tuple[str, str] | None:
    """``_tls_files_refused`` for settings not seen before."""
    if keyfile and not certfile:
        return "ssl_keyfile", f"ssl_keyfile {keyfile!r} is set without ssl_certfile"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no system store: only these files
    if certfile:
        for key, path in (("ssl_certfile", certfile), ("ssl_keyfile", keyfile)):
            if path and not os.path.exists(path):
                return key, f"{key} {path!r} does not exist"
        named = f"{certfile!r}" + (f" with the key {keyfile!r}" if keyfile else "")
        try:
            context.load_cert_chain(certfile, keyfile, kwargs.get("ssl_password") or _no_passphrase)
        except _Encrypted:
            key = "ssl_keyfile" if keyfile else "ssl_certfile"
            return key, f"the key of {named} is encrypted and ssl_password is not set"
        except (OSError, ssl.SSLError, TypeError, ValueError) as exc:
            return "ssl_certfile", f"the certificate {named} cannot be loaded: {exc}"
    if ca_path and not os.path.isdir(ca_path):
        return "ssl_ca_path", f"ssl_ca_path {ca_path!r} is not a directory"
    if ca_certs and not os.path.exists(ca_certs):
        return "ssl_ca_certs", f"ssl_ca_certs {ca_certs!r} does not exist"
    # One at a time, so that the error names the one that failed.
    for key, where, load in (
        ("ssl_ca_certs", f"ssl_ca_certs {ca_certs!r}", {"cafile": ca_certs}),
        ("ssl_ca_data", "ssl_ca_data", {"cadata": ca_data}),
    ):
        if not any(load.values()):
            continue
        try:
            context.load_verify_locations(**load)
        except (OSError, ssl.SSLError, TypeError, ValueError) as exc:
            return key, f"{where} holds no CA certificate this client can load: {exc}"
    return None


def _check_url_query(url: str, display: str, parameter: str) -> None:
    """Refuse in a node URL's query what ``connection_options`` may not carry: redis-py
    lets a URL's query override every keyword it is given, so such an option would undo
    the timeouts, retries and RESP2 tenure sets (``connection_kwargs``).

    Raises:
        ConfigurationError: naming ``parameter`` (the node), ``display`` (its URL
            without credentials) and the option.
    """
    # Read as redis-py reads it (``redis.connection.parse_url``): the first value of
    # each key, blank values left out.
    for key, values in parse_qs(urlsplit(url).query).items():
        if key in _OWNED_IN_URL:
            what, why = key, _OWNED_IN_URL[key]
        elif key == "protocol" and values[0].strip() != "2":
            what, why = (
                f"protocol={values[0]!r}",
                "tenure reads RESP2 replies itself (2, or left out)",
            )
        elif key == "client_name" and not client_name_ok(values[0]):
            what, why = (
                f"client_name={values[0]!r}",
                "Redis refuses client names with spaces or other than printable ASCII "
                "(use '-' or '_')",
            )
        else:
            continue
        raise ConfigurationError(
            parameter,
            f"{display}: its URL query sets {what}, which is not accepted: {why}. "
            "Remove it from the URL",
        )


def _same(a: object, b: object) -> bool:
    """Whether two option values are the same (an object that cannot be compared is the
    same only as itself)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _unknown(key: str, cls: type, address: NodeAddress, accepted: set[str]) -> str:
    usable = sorted(accepted - set(_OWNED) - {"protocol"})
    close = difflib.get_close_matches(key, usable, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if key.startswith("ssl") and address.scheme == "redis":
        hint = f"TLS options need a rediss:// URL ({address.display} is redis://); " + hint
    return (
        f"not an option of redis-py's {cls.__module__}.{cls.__name__}, which connects to "
        f"{address.display}; {hint}accepted: {', '.join(usable)}"
    )


def bound_tcp_connect(conn: Any, seconds: float) -> None:
    """Let redis-py's connect of ``conn`` take up to ``seconds`` for its TCP connect (and
    TLS handshake), which it bounds by ``socket_connect_timeout`` on its own timer: the
    asyncio driver bounds the whole set-up itself, and gives it more time when its loop
    was too busy to run it (``_async.channels.Channel._connect``)."""
    conn.socket_connect_timeout = seconds


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, with its timeouts enforced by the kernel instead.

    A Python-level socket timeout costs a ``poll()`` before every send and every recv.
    The sync driver already ``select()``s before reading, so that poll is pure overhead
    on the hot path. ``SO_RCVTIMEO``/``SO_SNDTIMEO`` keep the safety net (a reply cut in
    half by a node freezing mid-write cannot hang us: the recv fails after ``seconds``
    with ``BlockingIOError``, see ``timed_out``) at no per-call cost.
    """
    if isinstance(sock, ssl.SSLSocket):
        # Not for TLS: on a blocking socket, Python's ssl module retries a read (or a
        # write) that the kernel timeout cut short, for ever, so a frozen node would hang
        # its caller. A TLS socket keeps Python's own timeout (the poll() before each
        # call), and a read that times out raises TimeoutError.
        sock.settimeout(seconds)
        return
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000) or 1)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def has_unread(sock: Any) -> bool:
    """Do bytes from the node wait in ``sock``, not yet read? A look that does not wait
    (``select()`` with no timeout), for the rare moment a connection seems stalled: a
    client that ran late (a blocked event loop, threads holding the interpreter, a
    starved process) finds its answers there, and the node is not to blame. False once
    the socket is closed."""
    try:
        return bool(readable((sock,), 0))
    except (OSError, ValueError):  # closed meanwhile
        return False


# Linux tells a peer's close apart from data waiting (POLLRDHUP); elsewhere, poll() says
# only "readable" until the data before the close has been read.
_PEER_CLOSED = getattr(select, "POLLRDHUP", 0)


def closed_by_peer(sock: Any) -> bool:
    """Has the node closed its end of ``sock`` (or reset it), even with replies still
    unread before that end? A look that neither reads nor waits; False where the system
    cannot tell (``_PEER_CLOSED``) or once the socket is closed."""
    if not _PEER_CLOSED:
        return False
    look = select.poll()
    try:
        look.register(sock, _PEER_CLOSED)
    except (OSError, ValueError):  # closed meanwhile
        return False
    return any(
        events & (_PEER_CLOSED | select.POLLHUP | select.POLLERR) for _, events in look.poll(0)
    )


def reply_text(exc: rx.RedisError) -> str:
    """An error reply's text as the node sent it, code first (``NOSCRIPT No matching``)."""
    return _reply_text(exc)


class SocketReplies:
    """A connected redis-py connection's socket, written (``sock.sendall``) and read
    without redis-py.

    The blocking driver's rounds send a few hundred bytes and read one short reply per
    node; redis-py's ``send_packed_command`` and ``read_response`` cost about 3 µs of
    Python each around the system call (checks, a host string formatted for every read),
    which on five nodes was a quarter of a client's whole cycle. redis-py still sets the
    connection up (TCP, TLS, AUTH, SELECT) and closes it; between the two, its socket is
    read here with the parser the drivers share (``replies.pull_reader``: hiredis, or
    ``_core.resp`` without it) and the exceptions redis-py would raise: an error reply
    raises redis-py's class for it (``ResponseError``, ``NoScriptError``,
    ``ReadOnlyError``...), bytes that are not RESP raise ``InvalidResponse``, a closed
    connection ``ConnectionError``, and a read that the kernel timeout
    (``kernel_timeouts``) cut short ``BlockingIOError`` (TLS, under Python's own timeout:
    ``TimeoutError``).
    """

    __slots__ = ("_ahead", "_reader", "_reply_error", "heard", "patience", "plain", "sock")

    def __init__(self, conn: redis.Connection) -> None:
        # Nothing is buffered in redis-py's parser: the set-up read every reply it asked for.
        self.sock = cast(socket.socket, conn._sock)  # set by connect()
        # Not TLS: written with send() flags (an SSL socket takes none).
        self.plain = not isinstance(self.sock, ssl.SSLSocket)
        self._reply_error = conn._parser.parse_error
        # The parser keeps what was received and not yet read (hiredis's own reader: one
        # call per reply and nothing in between, ``replies.pull_reader``).
        self._reader = pull_reader()
        self._ahead: object = False  # a reply ``ready()`` took out of the parser, or False
        # How long a reply that came in part is given to be whole (``_receive_whole``):
        # the socket's timeout (the node timeout, once set up).
        self.patience: float = conn.socket_timeout or 1.0
        # Bytes came from the node: a close before any is what a TLS port does to a
        # plain client (``before_first_reply``).
        self.heard = False

    def read(self) -> Any:
        """The next reply, waiting for it (up to the kernel timeout).

        Raises:
            ResponseError: the reply is an error (the subclass redis-py would raise).
            ConnectionError, OSError, InvalidResponse: as above.
        """
        reply = self._ahead
        if reply is False:
            reader = self._reader
            try:
                reply = reader.gets()
                if reply is False:
                    reply = self._receive_whole(reader)
            except NOT_RESP as exc:
                raise rx.InvalidResponse(str(exc)) from None
        else:
            self._ahead = False
        if isinstance(reply, ErrorReply):
            raise self._reply_error(reply.message)
        return reply

    def _receive_whole(self, reader: PullReader) -> object:
        """Receive until ``reader`` has a whole reply, within the socket's timeout.

        That timeout (the kernel's) bounds each wait for bytes only: a node sending its
        reply a byte at a time, each sooner than that (a stalled proxy, a server dying
        slowly, something that is not Redis), kept the read going for ever, and the
        round with it. So a reply that came in part is given as long again, from then,
        to be whole, and times out like a silent node's (``timed_out``): its reader
        keeps what came, and a later read goes on from there.
        """
        sock = self.sock
        give_up = 0.0
        while True:
            data = sock.recv(65536)
            if not data:
                raise ClosedByNode("Connection closed by server.")
            self.heard = True
            reader.feed(data)
            reply = reader.gets()
            if reply is not False:
                return reply
            now = monotonic()
            if not give_up:
                give_up = now + self.patience
            elif now >= give_up:
                raise TimeoutError(
                    f"no whole reply within the node timeout ({self.patience:g} s): "
                    "it came a little at a time"
                )

    def receive(self) -> bool:
        """Take in what the socket has, once ``select()`` said it is readable, without
        waiting for more (one ``recv``; on TLS, the data decrypted with it too); True
        once a whole reply is in, which ``read()`` then returns at once. For a reader
        with a deadline of its own: ``read()`` waits for the whole reply (once part of
        it came, up to one socket timeout more: ``_receive_whole``, whose loop this one
        repeats rather than call, as it runs for every reply of every round).

        Raises:
            ConnectionError: the node closed the connection.
        """
        reply = self._ahead
        if reply is False:
            reader = self._reader
            try:
                reply = reader.gets()
                if reply is False:
                    sock = self.sock
                    while True:
                        data = sock.recv(65536)
                        if not data:
                            raise ClosedByNode("Connection closed by server.")
                        self.heard = True
                        reader.feed(data)
                        if self.plain or not sock.pending():  # type: ignore[attr-defined]
                            break
                    reply = reader.gets()
            except NOT_RESP:
                return True  # read() raises it
            self._ahead = reply
        return reply is not False

    def ready(self) -> bool:
        """Can ``read()`` return without waiting? (a reply already received, or TLS
        data decrypted ahead that ``select()`` cannot see). A reply still on the wire
        is for the caller's next ``select()``."""
        if self._ahead is not False:
            return True
        try:
            self._ahead = self._reader.gets()
        except NOT_RESP:
            return True  # read() raises it
        if self._ahead is not False:
            return True
        sock = self.sock
        return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def timed_out(exc: BaseException) -> bool:
    """Did a ``SocketReplies.read`` end because the socket's timeout passed with nothing
    to read? (The kernel's on TCP and unix sockets, Python's on TLS: ``kernel_timeouts``.)"""
    return isinstance(exc, (BlockingIOError, TimeoutError))

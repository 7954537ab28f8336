"""Validated configuration: node addresses, timeouts, drift, and per-lock TTLs.

Every check raises ``ConfigurationError`` naming the parameter and the accepted range,
before any connection is made, so bad input loses nothing.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import math
import posixpath
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .._errors import ConfigurationError
from .caching import CACHED_CHARS
from .hosts import REDIS_PORT, parse_host
from .numbers import is_finite
from .policy import MAX_RETRY_DELAY, RetryPolicy, wait_random_exponential
from .quorum import drift_allowance, majority
from .slots import CLUSTER_FORM, cluster_url, key_slot, slot_tag

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "ClientConfig",
    "LockKeys",
    "LockSpec",
    "NodeAddress",
    "SentinelService",
    "SpecCache",
    "WaitMode",
    "check_acquire_args",
    "check_flag",
    "check_key_prefix",
    "check_one_server",
    "check_retry_policy",
    "host_port",
    "key_prefix_of",
    "lock_key",
    "min_ttl",
    "node_address",
    "node_keys",
    "parse_node_url",
    "redact_url",
    "refuse_twins",
    "replid_key",
]

SCHEMES = ("redis", "rediss", "unix")

# The port a Sentinel listens on unless its URL says otherwise.
SENTINEL_PORT = 26379

# The accepted form of a Sentinel-managed node's URL, for messages.
SENTINEL_FORM = (
    "redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db] "
    "(rediss+sentinel:// for TLS)"
)

# The host:port a Sentinel-managed node's connection settings are built with
# (``NodeAddress.redis_url``): every connection replaces it with the master the
# Sentinels name before connecting, and ``.invalid`` never resolves should one not.
_SENTINEL_STAND_IN = f"sentinel-master.invalid:{REDIS_PORT}"


@dataclass(frozen=True)
class SentinelService:
    """Where a Sentinel-managed node's master is found: a service name and its Sentinels.

    ``tls`` and ``options`` are how the Sentinels are asked: with a URL, over TLS for
    ``rediss+sentinel://`` and with the node's own credentials (``options`` empty); with
    a redis-py ``master_for()`` client, with the settings of its Sentinel clients.
    """

    service: str
    sentinels: tuple[tuple[str, int], ...]
    tls: bool = False
    options: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    # Whether ``options`` replace the node's own credentials for the Sentinels (a
    # redis-py object's sentinel settings) rather than the node's being used.
    own_settings: bool = field(default=False, compare=False)

    @property
    def hosts(self) -> str:
        """``host:port,host:port``: the Sentinels as a URL lists them."""
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)


@dataclass(frozen=True)
class NodeAddress:
    """A parsed node URL; ``identity`` is what makes two entries the same server.

    ``options`` are connection settings that belong to this node alone (credentials,
    TLS settings), taken from a redis-py client or pool given in place of a URL
    (``node_address``); a URL carries its own in ``url``. They never take part in
    comparisons: they may hold objects (a credential provider) and say nothing about
    which server it is.
    """

    url: str
    scheme: str
    host: str | None
    port: int | None
    path: str | None
    db: int
    options: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    # A Sentinel-managed master (``redis+sentinel://``): found through these Sentinels
    # at every connection, so it has no host or port of its own.
    sentinel: SentinelService | None = None
    # A whole Redis Cluster as one node (``redis+cluster://``): its seeds; host and port
    # are the first of them. Empty for every other node.
    seeds: tuple[tuple[str, int], ...] = ()
    # A Cluster node's member (``member``): the cluster node's ``login_form``, as the
    # password goes in the URL the user wrote, not in a member's. None for the others.
    member_of: str | None = field(default=None, compare=False, repr=False)

    def __repr__(self) -> str:
        # Not the dataclass's: that would quote ``url`` with its password (a client's
        # config, logged or shown in a traceback, holds these).
        return f"NodeAddress({redact_url(self.url)!r})"

    @property
    def identity(self) -> tuple[object, ...]:
        # Without the database number: two databases of one server are one process, so
        # its crash, pause or restart without data takes both votes at once.
        if self.sentinel is not None:
            # The same service through the same Sentinels, in any order, is one master.
            s = self.sentinel
            return ("sentinel", s.service, tuple(sorted(set(s.sentinels))))
        if self.seeds:
            return ("cluster", *sorted(self.seeds))
        return (self.path,) if self.path else (self.host, self.port)

    @property
    def redis_url(self) -> str:
        """The URL redis-py builds this node's connection settings from: ``url``, or
        for a Sentinel-managed node a ``redis://`` (``rediss://``) URL with its
        credentials, database and options and a placeholder host, which every
        connection replaces with the master the Sentinels name."""
        if self.sentinel is None:
            return self.url
        rest = self.url.partition("://")[2]
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        user = netloc.rpartition("@")[0]
        query = urlsplit(f"x://h/{rest[len(netloc) :]}").query
        return f"{self.scheme}://{user + '@' if user else ''}{_SENTINEL_STAND_IN}/{self.db}" + (
            f"?{query}" if query else ""
        )

    @property
    def display(self) -> str:
        """The URL without credentials, safe for logs and error messages."""
        if self.sentinel is not None:
            tail = f"/{self.db}" if self.db else ""
            return f"{self.scheme}+sentinel://{self.sentinel.hosts}/{self.sentinel.service}{tail}"
        if self.seeds:
            return f"{self.scheme}://" + ",".join(host_port(h, p) for h, p in self.seeds)
        if self.path:
            return f"unix://{self.path}" + (f"?db={self.db}" if self.db else "")
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}" + (f"/{self.db}" if self.db else "")

    @property
    def login_form(self) -> str:
        """This node's kind of URL with a user and password in it: the form advice to
        give a password in the node URL shows, so that it is the form the user wrote (a
        ``redis://`` form would tell a Sentinel node's user to list the master itself,
        and a Cluster node's member's user to list one member)."""
        if self.member_of is not None:
            return self.member_of
        if self.sentinel is not None:
            return f"{self.scheme}+sentinel://user:password@host:port[,host:port...]/service_name"
        if self.seeds:
            return f"{self.scheme}://user:password@host:port[,host:port...]"
        if self.path:
            return "unix://user:password@/path/to/socket"
        return f"{self.scheme}://user:password@host:port"

    def member(self, host: str, port: int) -> NodeAddress:
        """A member of this Cluster node at ``host:port``, as a plain node with the same
        credentials, TLS and query settings (what its connections are made from)."""
        base, user, _, query = cluster_url(self.url)
        url = f"{base}://{user}{host_port(host, port)}" + (f"?{query}" if query else "")
        return NodeAddress(url, base, host, port, None, 0, self.options, member_of=self.login_form)

    def server_at(self, host: str, port: int) -> NodeAddress:
        """The server at ``host:port`` of this Sentinel-managed or Cluster node, as a plain
        node with its credentials, TLS, database and query settings; a plain node is
        itself."""
        if self.seeds:
            return self.member(host, port)
        if self.sentinel is None:
            return self
        # The placeholder host that every connection replaces with the master found.
        url = self.redis_url.replace(_SENTINEL_STAND_IN, host_port(host, port), 1)
        return parse_node_url(url, "nodes")


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cluster_node(url: str, parameter: str) -> NodeAddress:
    """A ``redis+cluster://`` or ``rediss+cluster://`` URL: a whole Redis Cluster as one
    node (docs/cluster-and-sentinel.md)."""
    try:
        base, _, seeds, _ = cluster_url(url)
    except ValueError as exc:
        raise ConfigurationError(
            parameter, f"malformed URL {redact_url(url)!r}: {exc}; accepted: {CLUSTER_FORM}"
        ) from None
    host, port = seeds[0]
    return NodeAddress(url, f"{base}+cluster", host, port, None, 0, seeds=seeds)


def _is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in ("redis+cluster", "rediss+cluster")


# The longest lock name, in bytes of UTF-8. Every command of a round carries the name in
# several keys, and a round must be written, run and answered within the node timeout:
# names of megabytes were refused by healthy nodes as silent. An identifier longer than
# this can be locked by a digest of it.
MAX_NAME_BYTES = 65_536


def check_name(name: object, parameter: str = "name") -> str:
    """A lock name (or another name the nodes will hold, given as ``parameter``): a
    non-empty ``str`` that is UTF-8 text, at most ``MAX_NAME_BYTES`` long.

    Raises:
        ConfigurationError: on ``parameter``, saying what to send instead.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError(parameter, f"must be a non-empty string, got {name!r}")
    name = plain_text(name)
    if name.isascii():
        size = len(name)
    else:
        try:
            size = len(name.encode())
        except UnicodeEncodeError as exc:
            raise ConfigurationError(
                parameter,
                f"is not valid Unicode text: it holds a lone surrogate "
                f"({name[exc.start : exc.end]!r} at {exc.start}), as os.fsdecode() makes of "
                "bytes that are not UTF-8; names are sent as UTF-8, so decode such bytes as "
                "latin-1, or use their hex",
            ) from None
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            parameter,
            f"is {size:,} bytes of UTF-8; at most {MAX_NAME_BYTES:,} are accepted (every "
            "command carries it several times, within the node timeout): use a digest "
            "of a longer identifier, such as its SHA-256 in hex",
        )
    return name


def plain_text(text: str) -> str:
    """``text`` as a plain ``str``. A subclass (a member of a ``(str, Enum)``) compares
    equal to its text but may format as something else (``Res.ORDER_42``): the keys are
    built from the text it equals, so that it locks what an equal plain string locks, in
    every process and through every cache keyed by name."""
    return text if type(text) is str else str.__str__(text)


def _finite(parameter: str, value: object) -> float:
    if not is_finite(value):
        raise ConfigurationError(parameter, f"must be a finite number, got {value!r}")
    return float(value)


def redact_url(text: str) -> str:
    """``text`` with the password of the node URL in it hidden: ``redis://user:***@host``.

    The one way a node URL, or anything that may quote one (a repr, a value that should
    have been a list), reaches an error message or a log line. It errs on the side of
    hiding: everything from the first ``:`` after the first ``://`` to the last ``@`` is
    the secret. A password may hold ``@``, and ``/ ? #`` that urllib would take as the
    end of the host part (``parse_node_url`` refuses those unencoded), and a text may
    quote several URLs; any password of any URL in ``text`` lies in that span. A text
    without ``://``, or without a ``:`` before its last ``@``, is returned as it is.
    """
    start = text.find("://")
    at = text.rfind("@")
    if start < 0 or at < start:
        return text
    colon = text.find(":", start + 3, at)
    if colon < 0:
        return text  # a user name alone ("redis://app@host") is no secret
    return f"{text[: colon + 1]}***{text[at:]}"


def _quoted(value: object) -> str:
    """``value``'s repr, for a message, without the password of any URL in it."""
    return redact_url(repr(value))


def parse_node_url(url: object, parameter: str = "nodes") -> NodeAddress:
    """Parse ``redis://[user:pass@]host[:port][/db]``, ``rediss://...``, ``unix:///path[?db=N]``
    a Sentinel-managed master, ``redis+sentinel://[user:pass@]host:port[,host:port...]
    /service_name[/db]``, or a whole Redis Cluster, ``redis+cluster://[user:pass@]host:port
    [,host:port...]`` (``rediss+`` for TLS).

    Raises:
        ConfigurationError: naming ``parameter``: not such a URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(parameter, f"must be a non-empty URL string, got {_quoted(url)}")
    # Whitespace around a URL (read from a file or an environment variable) is no part of
    # it; kept, urllib reads a trailing space as part of the port.
    url = url.strip()
    # Before the URL is split: a list of hosts has no port urlsplit could read.
    if _is_cluster_url(url):
        return _cluster_node(url, parameter)
    if re.match(r"(?i)rediss?\+sentinel://", url):
        return _parse_sentinel_url(url, parameter)
    # A scheme is case-insensitive (RFC 3986), but redis-py's blocking client refuses
    # 'REDIS://' while its asyncio client takes it: the URL redis-py is given spells it
    # in lower case, so that both clients connect to what the URL says.
    scheme_text, sep, rest = url.partition("://")
    if sep:
        url = f"{scheme_text.lower()}{sep}{rest}"
    # Every message below quotes the URL as ``shown``: never its password.
    shown = repr(redact_url(url))
    secret = shown != repr(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        # urllib's reason may quote the user part (a bracket or a character that NFKC
        # normalization turns into '/' there): shown only for a URL without a password.
        why = (
            "urllib cannot split it (its reason is not shown: it would quote the "
            "password); check the brackets of an IPv6 host ([::1]) and any non-ASCII "
            "character"
            if secret
            else str(exc)
        )
        raise ConfigurationError(parameter, f"malformed URL {shown}: {why}") from None
    # The user part runs to the URL's last '@' (as redact_url hides it), but urllib ends
    # the host part at the first '/', '?' or '#'. "redis://app:pa/ss@host" is host "app",
    # port "pa" to urllib and to redis-py; "redis://app:p@ss:1?x@host" is host "ss", port
    # 1, and "redis://app:p@ss:pa/ss@host" has port "pa": another server, or part of the
    # password quoted as a port. (A unix socket's path may hold '@' of its own.)
    beyond = parts.scheme.lower() != "unix" and any(
        "@" in piece for piece in (parts.path, parts.query, parts.fragment)
    )
    if secret and ("@" not in parts.netloc or beyond):
        raise ConfigurationError(
            parameter,
            f"URL {shown}: its user or password holds '/', '?' or '#', which end the host "
            "part of a URL, so it would name another server; percent-encode them in the "
            "URL (%2F, %3F, %23; '@' and ':' in a password may stay, an '@' after the "
            "host is %40)",
        )
    # The scheme and the host list before the port: a misspelt "redis+sentinel://" or a
    # list of hosts under redis:// would otherwise be reported as a port that is not a
    # number ("43097,127.0.0.1:46757"), which names neither the mistake nor the fix.
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(parameter, _unknown_scheme(shown, parts.scheme))
    hosts = parts.netloc.rpartition("@")[2]  # after the user part: never the password
    if scheme != "unix" and "," in hosts:
        raise ConfigurationError(
            parameter,
            f"URL {shown} lists several hosts ({hosts}), but a {scheme}:// node is one "
            f"server: list a Sentinel-managed master as {scheme}+sentinel://host:port"
            f"[,host:port...]/service_name, a whole Redis Cluster as {scheme}+cluster://"
            f"host:port[,host:port...], or independent masters as one {scheme}:// URL each",
        )
    try:
        port = parts.port  # raises ValueError when out of 0..65535 or not a number
    except ValueError as exc:
        # The port is read after the user part's last '@': the reason quotes no password.
        raise ConfigurationError(parameter, f"malformed URL {shown}: {exc}") from None
    db_text = parse_qs(parts.query).get("db", [""])[0]
    if scheme == "unix":
        path = unquote(parts.path)
        if not path:
            raise ConfigurationError(
                parameter, f"URL {shown} names no socket path (unix:///path/to/sock)"
            )
        host, port_num = None, None
    else:
        if not parts.hostname:
            raise ConfigurationError(parameter, f"URL {shown} names no host ({scheme}://host:port)")
        if port == 0:
            raise ConfigurationError(parameter, f"URL {shown}: port must be in 1..65535")
        host, port_num, path = parts.hostname, port or REDIS_PORT, None
        in_path = parts.path.strip("/")
        if in_path and db_text and in_path != db_text:
            # redis-py takes the query's database over the path's: the node would be
            # named by one database and lock in the other.
            raise ConfigurationError(
                parameter,
                f"URL {shown} names database {in_path!r} in its path and {db_text!r} in "
                "its query (?db=); give the database once, as /db",
            )
        if in_path:
            db_text = in_path
    try:
        db = int(db_text) if db_text else 0
    except ValueError:
        raise ConfigurationError(
            parameter, f"URL {shown}: database must be an integer >= 0"
        ) from None
    if db < 0:
        raise ConfigurationError(parameter, f"URL {shown}: database must be an integer >= 0")
    return NodeAddress(url=url, scheme=scheme, host=host, port=port_num, path=path, db=db)


_ALL_SCHEMES = (*SCHEMES, "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")


def _unknown_scheme(shown: str, scheme: str) -> str:
    """The message for a URL whose scheme is none of ``_ALL_SCHEMES``, naming the
    accepted one it is closest to, if any (``redis+sentinal`` is ``redis+sentinel``)."""
    close = difflib.get_close_matches(scheme.lower(), _ALL_SCHEMES, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}://?)" if close else ""
    accepted = ", ".join(f"{s}://" for s in _ALL_SCHEMES)
    return f"URL {shown} has scheme {scheme!r}{hint}; accepted: {accepted}"


def _sentinel_host(item: str, shown: str, parameter: str) -> tuple[str, int]:
    """One ``host[:port]`` (``[v6]:port``) of a Sentinel URL's list."""
    try:
        return parse_host(item, SENTINEL_PORT)
    except ValueError as exc:
        raise ConfigurationError(
            parameter,
            f"URL {shown}: Sentinel {item!r} is not host:port ({exc}); the accepted form "
            f"is {SENTINEL_FORM}",
        ) from None


def _parse_sentinel_url(url: str, parameter: str) -> NodeAddress:
    """A ``redis+sentinel://`` (``rediss+sentinel://``) node (see ``parse_node_url``)."""
    shown = repr(redact_url(url))
    scheme_text, _, rest = url.partition("://")
    scheme = scheme_text.lower().partition("+")[0]
    # The host list ends at the first '/', '?' or '#'; a password holding one unencoded
    # would put part of it in the path (and leave no '@' before it).
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(netloc) :]
    if shown != repr(url) and "@" not in netloc:
        raise ConfigurationError(
            parameter,
            f"URL {shown}: its user or password holds '/', '?' or '#', which end the host "
            "part of a URL; percent-encode them in the URL (%2F, %3F, %23)",
        )
    hosts = netloc.rpartition("@")[2]
    if not hosts:
        raise ConfigurationError(
            parameter, f"URL {shown} names no Sentinel; the accepted form is {SENTINEL_FORM}"
        )
    sentinels = tuple(_sentinel_host(h.strip(), shown, parameter) for h in hosts.split(","))
    parts = urlsplit(f"x://h{tail}")
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if path and path[-1] == "":
        path.pop()  # a trailing slash
    if len(path) > 2:
        raise ConfigurationError(
            parameter,
            f"URL {shown}: its path must be /service_name or /service_name/db, got "
            f"{parts.path!r}; the accepted form is {SENTINEL_FORM}",
        )
    if not path or not path[0]:
        raise ConfigurationError(
            parameter,
            f"URL {shown} names no service: give the name the Sentinels monitor the master "
            f"by, as in {SENTINEL_FORM}",
        )
    service = path[0]
    if any(c.isspace() or not c.isprintable() for c in service):
        raise ConfigurationError(
            parameter, f"URL {shown}: service name {service!r} holds whitespace or a control "
            "character; Sentinel service names have none",
        )  # fmt: skip
    db_text = path[1] if len(path) == 2 else parse_qs(parts.query).get("db", [""])[0]
    try:
        db = int(db_text) if db_text else 0
    except ValueError:
        db = -1
    if db < 0:
        raise ConfigurationError(
            parameter,
            f"URL {shown}: database must be an integer >= 0 (the part after the service "
            f"name), got {db_text!r}",
        )
    return NodeAddress(
        url=url,
        scheme=scheme,
        host=None,
        port=None,
        path=None,
        db=db,
        sentinel=SentinelService(service, sentinels, tls=scheme == "rediss"),
    )


def check_one_server(address: NodeAddress, parameter: str, command: str) -> NodeAddress:
    """Refuse a node ``command`` cannot inspect: one whose connection settings are not all
    in its URL (a node built from a redis-py client or pool, or a ``master_for()``
    client's Sentinel settings). A plain node, a Sentinel-managed node (its master, found
    as the clients find it) and a whole Redis Cluster (every server of its slot map) are
    inspected.

    Raises:
        ConfigurationError: naming ``parameter``: ``address`` carries settings besides
            its URL.
    """
    if address.options or (address.sentinel is not None and address.sentinel.own_settings):
        raise ConfigurationError(
            parameter,
            f"{address.display} carries connection settings of a redis-py object, and "
            f"`{command}` reads nodes from URLs only: give it the node's URL "
            "(redis://, redis+sentinel:// or redis+cluster://) with its credentials",
        )
    return address


def node_address(
    *,
    host: str | None,
    port: int | None,
    path: str | None,
    db: int,
    tls: bool,
    options: Mapping[str, Any],
    parameter: str = "nodes",
    cwd: str | None = None,
) -> NodeAddress:
    """A node given by its settings rather than a URL (a redis-py client or pool).

    Its ``url`` is built from the address alone, without credentials, so it is safe to
    show; the credentials and TLS settings travel in ``options``.

    A relative unix socket ``path`` is taken from ``cwd`` (the working directory when
    the client is made): redis-py connects one from the working directory, but a URL
    can only name an absolute path, and ``unix://redis.sock`` reads back as no path at
    all, ``unix://./redis.sock`` as ``/redis.sock``.

    Raises:
        ConfigurationError: no host or path, a relative path without an absolute
            ``cwd``, a port outside 1..65535, a negative or non-integer database.
    """
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ConfigurationError(parameter, f"database must be an integer >= 0, got {db!r}")
    if path is not None:
        if not isinstance(path, str) or not path:
            raise ConfigurationError(
                parameter, f"unix socket path must be a non-empty str, got {path!r}"
            )
        if not posixpath.isabs(path):
            if cwd is None or not posixpath.isabs(cwd):
                raise ConfigurationError(
                    parameter,
                    f"unix socket path {path!r} is relative and the working directory "
                    "is unknown; give the socket's absolute path",
                )
            # As os.path.abspath would, so that one socket spelled two ways is one server.
            path = posixpath.normpath(posixpath.join(cwd, path))
        url = "unix://" + quote(path) + (f"?db={db}" if db else "")
        return NodeAddress(url, "unix", None, None, path, db, tuple(options.items()))
    if not isinstance(host, str) or not host:
        raise ConfigurationError(parameter, f"names no host (got host={host!r})")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
        raise ConfigurationError(parameter, f"port must be in 1..65535, got {port!r}")
    scheme = "rediss" if tls else "redis"
    where = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{where}:{port}/{db}"
    return NodeAddress(url, scheme, host, port, None, db, tuple(options.items()))


def refuse_twins(addresses: Sequence[NodeAddress], listed: str = "nodes") -> None:
    """Refuse a server (or a Redis Cluster) listed twice: its vote would count twice.

    Raises:
        ConfigurationError: naming ``listed[i]``, the second listing.
    """
    seen: dict[tuple[object, ...], int] = {}
    for i, a in enumerate(addresses):
        if a.identity in seen:
            first = addresses[seen[a.identity]]
            also = " (a different database, but the same server)" if a.db != first.db else ""
            raise ConfigurationError(
                f"{listed}[{i}]",
                f"{a.display} is the same server as {listed}[{seen[a.identity]}]{also}; "
                "listing a node twice would count its vote twice: a Redlock needs "
                "independent servers",
            )
        seen[a.identity] = i
        _refuse_one_cluster_twice(addresses, i, listed)


def _refuse_one_cluster_twice(
    addresses: Sequence[NodeAddress], i: int, listed: str = "nodes"
) -> None:
    """Refuse ``addresses[i]`` if it is a Redis Cluster node sharing a seed with an earlier
    one: the same cluster, whichever of its members each names. Its seeds are whatever
    the URL lists, or every member a ``RedisCluster`` object had discovered, so the same
    cluster given both ways (or by two URLs naming different members) has different
    seeds, and equal seeds alone would let it count two votes.

    Raises:
        ConfigurationError: naming ``nodes[i]`` and the seed both name.
    """
    mine = set(addresses[i].seeds)
    for j, other in enumerate(addresses[:i]):
        shared = sorted(mine & set(other.seeds))
        if shared:
            raise ConfigurationError(
                f"{listed}[{i}]",
                f"{addresses[i].display} is the same Redis Cluster as {listed}[{j}] "
                f"({other.display}): both name {host_port(*shared[0])}; listing a cluster "
                "twice would count its vote twice: list it once, as one node",
            )


@dataclass(frozen=True)
class ClientConfig:
    """Settings shared by every lock of one client.

    Args:
        nodes: node URLs (or addresses already built by ``node_address``). One node is
            a single-instance lock; three or more independent masters (no replication
            between them) make a Redlock quorum.
        node_timeout: seconds to wait for any one node in a round; much shorter than TTLs.
        connect_timeout: seconds a new connection to a node may take to be set up (TCP,
            TLS handshake, AUTH), apart from any round's ``node_timeout``.
        drift_factor: fraction of the TTL allowed for clock-rate drift between nodes and us.
        drift_floor: seconds added to the drift allowance (timer and scheduling granularity).
        retry: back-off policy between attempts of a blocking acquire.
        allow_even: accept an even number of nodes (see ``check_node_count``).
        max_ttl: the longest TTL any lease may have, in seconds. A node found to have
            lost its data (no floor, see docs/fencing.md) is kept out for this long, so
            every lease it might have granted has expired before it votes again.
        recheck: the fallback bound of a blocking acquire: a waiter re-checks the lock
            after a random delay in [recheck/2, recheck] even if no release
            notification came (see docs/waiting.md). 0 turns notifications off: waiters
            then poll with the ``retry`` back-off.
        retention: seconds that a node's floor (its fencing history: the highest token
            it granted) is kept after the last grant or extension on that node (default:
            one hour, or ``max_ttl`` if that is longer; at least ``max_ttl``). Nothing is
            kept per name beyond its lease and its waiters, so memory returns to its
            baseline. Safety does not depend on it while any lock of the node is
            used within it; when a whole node set sat idle for longer, tokens restart from
            the wall clocks, which keeps them increasing while clocks disagree by much
            less than the retention (docs/fencing.md).
        wait_replicas: for nodes that are replicated masters: a node's grant (or
            extension) counts only once this many of its replicas acknowledged it, by a
            ``WAIT`` pipelined behind the command on the same connection; otherwise the
            node's vote is "no" and our key there is released (fail closed). 0 (the
            default) for independent masters. See docs/safety.md for how far it goes.
        key_prefix: what every key tenure writes on a lock node and every notification
            channel starts with (default ``"tenure:"``); see ``check_key_prefix``.
    """

    nodes: tuple[NodeAddress, ...]
    node_timeout: float = 0.05
    connect_timeout: float = 1.0
    drift_factor: float = 0.01
    drift_floor: float = 0.002
    retry: RetryPolicy = field(default_factory=wait_random_exponential)
    allow_even: bool = False
    max_ttl_ms: int = 60_000
    recheck: float = 0.5
    wait_replicas: int = 0
    retention_ms: int = 3_600_000
    key_prefix: str = "tenure:"

    @classmethod
    def build(
        cls,
        nodes: object,
        *,
        node_timeout: float = 0.05,
        connect_timeout: float = 1.0,
        drift_factor: float = 0.01,
        drift_floor: float = 0.002,
        retry: RetryPolicy | None = None,
        allow_even: bool = False,
        max_ttl: float = 60.0,
        recheck: float = 0.5,
        wait_replicas: int = 0,
        retention: float | None = None,
        key_prefix: str = "tenure:",
    ) -> ClientConfig:
        if isinstance(nodes, str) or not isinstance(nodes, (list, tuple)):
            # A single node given bare (a URL, a redis-py client) is the likely slip; a
            # client's repr runs to a page, so it is named by its class.
            got = _quoted(nodes)
            if len(got) > 200:
                got = f"a {type(nodes).__module__}.{type(nodes).__qualname__}"
            raise ConfigurationError(
                "nodes",
                f"must be a list of nodes (node URLs or redis-py clients), got {got}; one "
                "node too goes in a list, e.g. ['redis://127.0.0.1:6379']",
            )
        addresses = tuple(
            u if isinstance(u, NodeAddress) else parse_node_url(u, f"nodes[{i}]")
            for i, u in enumerate(nodes)
        )
        check_flag("allow_even", allow_even)
        check_node_count(len(addresses), allow_even)
        refuse_twins(addresses)
        timeout = _finite("node_timeout", node_timeout)
        if not NODE_TIMEOUT_LOW <= timeout <= 60:
            # Below a millisecond no node answers a script in time, even on a unix
            # socket: every round would fail, every release be told unconfirmed.
            raise ConfigurationError(
                "node_timeout",
                f"must be in [{NODE_TIMEOUT_LOW:g}, 60] seconds, got {node_timeout}: the "
                "longest a round waits for one node's reply (the default, 0.05 s, fits "
                "nodes on one network)",
            )
        connect = _finite("connect_timeout", connect_timeout)
        if not 0 < connect <= 60:
            raise ConfigurationError(
                "connect_timeout",
                f"must be in (0, 60] seconds, got {connect_timeout} (the default, 1 s, "
                "covers a TLS handshake across regions)",
            )
        factor = _finite("drift_factor", drift_factor)
        if not 0 <= factor < 0.5:
            raise ConfigurationError("drift_factor", f"must be in [0, 0.5), got {drift_factor}")
        floor = _finite("drift_floor", drift_floor)
        if not 0 <= floor <= 10:
            raise ConfigurationError(
                "drift_floor", f"must be in [0, 10] seconds, got {drift_floor}"
            )
        longest = _finite("max_ttl", max_ttl)
        if not 0.001 <= longest <= 86_400:
            raise ConfigurationError("max_ttl", f"must be in [0.001, 86400] seconds, got {max_ttl}")
        every = _finite("recheck", recheck)
        if not (every == 0 or 0.01 <= every <= 60):
            raise ConfigurationError(
                "recheck", f"must be 0 (no notifications) or in [0.01, 60] seconds, got {recheck}"
            )
        kept = (
            max(DEFAULT_RETENTION, longest)
            if retention is None
            else _finite("retention", retention)
        )
        if not longest <= kept <= 30 * 86_400:
            raise ConfigurationError(
                "retention",
                f"must be in [max_ttl, 30 days] = [{longest:g}, 2592000] seconds, got "
                f"{retention}; a history shorter than the longest lease could be forgotten "
                "while that lease is held: raise retention or lower max_ttl",
            )
        config = cls(
            nodes=addresses,
            node_timeout=timeout,
            connect_timeout=connect,
            drift_factor=factor,
            drift_floor=floor,
            retry=_retry_policy(retry),
            allow_even=allow_even,
            max_ttl_ms=math.floor(round(longest * 1000, 6)),
            recheck=every,
            wait_replicas=_replicas(wait_replicas),
            retention_ms=math.floor(round(kept * 1000, 6)),
            key_prefix=check_key_prefix(key_prefix),
        )
        shortest = min_ttl(config)
        if shortest > config.max_ttl_ms / 1000:
            # Every TTL would be refused, each with a message pointing at the other bound:
            # say it once, here, where the settings are made.
            raise ConfigurationError(
                "max_ttl",
                f"is {config.max_ttl_ms / 1000:g}s, but node_timeout={timeout:g}s, "
                f"drift_factor={factor:g} and drift_floor={floor:g}s make the shortest TTL "
                f"{shortest:g}s (ttl >= 2 x (node_timeout + drift)), so no lock could be "
                f"taken: raise max_ttl to at least {shortest:g}s, or lower node_timeout or "
                "the drift settings",
            )
        return config

    @property
    def channel_prefix(self) -> str:
        """What every notification channel of these clients starts with."""
        return self.key_prefix + "wake:"

    @property
    def quorum(self) -> int:
        return majority(len(self.nodes))

    @property
    def per_slot(self) -> bool:
        """Whether node keys are kept per hash slot (``LockKeys.of``): on every node of a
        client that lists a whole Redis Cluster as one of its nodes."""
        return any(a.seeds for a in self.nodes)

    @property
    def wait_timeout_ms(self) -> int:
        """How long a node's ``WAIT`` may block: half the round, so its answer fits in it."""
        return max(1, math.floor(self.node_timeout * 500))


def check_flag(parameter: str, value: object) -> bool:
    """Refuse anything but True or False (a truthy string would silently mean True)."""
    if not isinstance(value, bool):
        raise ConfigurationError(parameter, f"must be True or False, got {value!r}")
    return value


_RETRY_HELP = (
    "tenure.wait_random_exponential(initial, maximum) (the default), "
    "tenure.wait_random(minimum, maximum), or an object whose delay(attempt, rng) returns "
    "the seconds to sleep before attempt number `attempt` (random.Random rng)"
)


def _retry_policy(value: object) -> RetryPolicy:
    """The client's ``retry``: the default for None, else a retry policy
    (``check_retry_policy``) tried once here, on a throwaway random source, so that a
    wrong one fails now rather than at the first contention, where a blocking acquire
    needs it."""
    if value is None:
        return wait_random_exponential()
    policy = check_retry_policy(value, "retry")
    retry_delay(policy, 1, random.Random(0))
    return policy


def check_retry_policy(value: object, parameter: str) -> RetryPolicy:
    """Refuse what has no ``delay(attempt, rng)``: no retry policy at all (each delay a
    policy gives is checked when it is asked, ``retry_delay``). ``parameter``: the name
    the caller gave the policy."""
    if not callable(getattr(value, "delay", None)):
        raise ConfigurationError(parameter, f"must be a retry policy: {_RETRY_HELP}; got {value!r}")
    return value  # type: ignore[return-value]  # it has a delay(): a RetryPolicy


def retry_delay(
    policy: RetryPolicy, attempt: int, rng: random.Random, parameter: str = "retry"
) -> float:
    """The seconds ``policy`` asks to sleep before ``attempt``, checked: a retry policy is
    the caller's code, asked at every contended attempt, not only when the client was made.
    ``parameter``: the name the caller gave the policy (the optimistic retry loops'
    ``backoff``, an idempotency store's ``poll``).

    Raises:
        ConfigurationError: on ``parameter``, when ``delay()`` raised or returned anything
            but a number of seconds in [0, ``MAX_RETRY_DELAY``].
    """
    try:
        sample = policy.delay(attempt, rng)
    except Exception as exc:
        raise ConfigurationError(
            parameter, f"{policy!r}.delay({attempt}, rng) raised {exc!r}; expected {_RETRY_HELP}"
        ) from None
    if not (is_finite(sample) and 0 <= sample <= MAX_RETRY_DELAY):
        raise ConfigurationError(
            parameter,
            f"{policy!r}.delay({attempt}, rng) returned {sample!r}, not a number of seconds "
            f"in [0, {MAX_RETRY_DELAY:,.0f}]; expected {_RETRY_HELP}",
        )
    return float(sample)


def _replicas(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ConfigurationError(
            "wait_replicas", f"must be an int in [0, 64] (replicas per node), got {value!r}"
        )
    return value


def check_node_count(n: int, allow_even: bool) -> None:
    """Refuse node counts that add risk without adding safety.

    Zero nodes cannot hold anything. An even count is not unsafe for mutual exclusion (a
    majority of 2k is k+1, and two majorities still overlap) but it is a trap: 2 nodes
    need both, so either failing stops all locking, and 2k nodes tolerate no more failures
    than 2k-1 while giving one more node to fail. We refuse it unless asked explicitly.
    """
    if n == 0:
        raise ConfigurationError("nodes", "is empty; give 1 node, or 3 or more independent masters")
    if n % 2 == 0 and not allow_even:
        raise ConfigurationError(
            "nodes",
            f"has {n} nodes: a majority is {majority(n)}, so it tolerates {n - majority(n)} "
            f"failed node(s), no more than {n - 1} nodes would; use an odd number "
            "(or pass allow_even=True)",
        )


# Seconds a node's floor is kept after its last grant or extension, unless set.
DEFAULT_RETENTION = 3600.0

# What every key and channel starts with unless the client is given another prefix.
DEFAULT_KEY_PREFIX = "tenure:"

# The shortest node_timeout accepted (seconds).
NODE_TIMEOUT_LOW = 0.001

# The node's own keys under the default prefix: its floor and warm-up marker, shared by
# every lock of that prefix on the node (``node_keys`` for another prefix).
NODE_FLOOR = "tenure:node:floor"
NODE_WARM = "tenure:node:warm"
# The replication ID the floor was written under (``replid_key``), next to the floor.
NODE_REPLID = "tenure:node:replid"

# Characters a key prefix may not hold, and why (``check_key_prefix``).
_PREFIX_REFUSED = (
    (
        "{}",
        "braces would break the hash tag that keeps a lock's keys in one Redis "
        "Cluster slot (the tag is the text between the first '{' and the next '}')",
    ),
    (
        "#",
        "'#{' marks the keys of names that start with '}', and a prefix ending in or "
        "holding '#' could make two prefixes' keys meet",
    ),
    (
        "*?[]\\",
        "the prefix is written into ACL key and channel patterns (~PREFIX*), "
        "where these are glob characters",
    ),
)


def check_key_prefix(prefix: object, parameter: str = "key_prefix") -> str:
    """Validate a key prefix: what every key and notification channel of a client starts
    with, so that applications sharing a Redis database (or an ACL key pattern) keep
    their locks apart.

    Accepted: a non-empty str of printable characters without whitespace, braces, ``#``
    or glob characters (``*?[]\\``), at most 128 characters. Whitespace and control
    characters would split the ACL rules written from it (``~PREFIX*``).

    Raises:
        ConfigurationError: naming ``key_prefix``, the character refused and why.
    """
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError(
            parameter, f"must be a non-empty str such as 'tenure:' or 'app1:', got {prefix!r}"
        )
    if len(prefix) > 128:
        raise ConfigurationError(
            parameter,
            f"must be at most 128 characters (every key carries it), got {len(prefix)}",
        )
    for ch in prefix:
        if ch.isspace() or not ch.isprintable():
            raise ConfigurationError(
                parameter,
                f"{prefix!r} holds {ch!r}: whitespace and control characters would split "
                "the ACL rules written from it (~PREFIX*); use e.g. 'app1:'",
            )
        for chars, why in _PREFIX_REFUSED:
            if ch in chars:
                raise ConfigurationError(
                    parameter,
                    f"{prefix!r} holds {ch!r}, which is refused: {why}; use e.g. 'app1:'",
                )
    return plain_text(prefix)


def node_keys(prefix: str = DEFAULT_KEY_PREFIX) -> tuple[str, str]:
    """The node's own keys under ``prefix``: its floor and its warm-up marker."""
    return f"{prefix}node:floor", f"{prefix}node:warm"


def replid_key(floor: str) -> str:
    """The key next to the floor key ``floor`` that keeps the replication ID the floor was
    written under: ``floor`` with its ending ``floor`` replaced by ``replid``, exactly as
    the scripts derive it (``_lua/history.lua.inc``), so it carries the floor's prefix."""
    return floor[: -len("floor")] + "replid"


def _key_prefix(name: str, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """What every key of lock ``name`` starts with, ending in its hash tag.

    Redis Cluster hashes only a key's *hash tag*, the text between its first ``{`` and
    the next ``}``, when that text is not empty. The usual start is ``<prefix>{<name>}``
    (``tenure:{<name>}`` by default): its tag is ``name``, or ``name`` up to its first
    ``}``, the same for every key of the lock either way (the prefix holds no brace). A
    name starting with ``}`` would leave the tag empty, so each key would hash whole and
    the lock's keys would land in different slots; such a name takes
    ``<prefix>#{<digest>}:<name>`` instead, whose tag is a digest of the name (a tag
    spread over the slots like names are, never empty, never holding a brace). The
    ``#`` keeps these keys apart from every ``<prefix>{...`` key of an ordinary name
    (the prefix holds no ``#``), and the name itself, in full after the tag, keeps them
    apart from each other.
    """
    if not name.startswith("}"):
        return f"{prefix}{{{name}}}"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}#{{{digest}}}:{name}"


def key_prefix_of(key: str) -> str:
    """The key prefix a lock's key was made under (``LockKeys.of``): what comes before
    its hash tag. A prefix holds neither ``{`` nor ``#`` (``check_key_prefix``), and every
    key of a lock has one of them right after it (``_key_prefix``); a key that has
    neither is not a lock's, and is taken to be under the default prefix."""
    found = [i for i in (key.find("{"), key.find("#")) if i > 0]
    return key[: min(found)] if found else DEFAULT_KEY_PREFIX


def lock_key(name: str, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The Redis key of a lock: ``tenure:{<name>}:lock`` (see :class:`LockKeys`)."""
    return f"{_key_prefix(name, prefix)}:lock"


@dataclass(frozen=True)
class LockKeys:
    """A lock's keys on every node, all of them in one Redis Cluster hash slot.

    ``lock`` is ``tenure:{<name>}:lock`` and ``queue`` ``tenure:{<name>}:q``: the wait
    queue of blocked acquirers (a sorted set, empty and so absent while nobody waits),
    each waiter's place being ``<queue>:<waiter id>``. A name starting with ``}``, which
    would leave that hash tag empty, takes ``tenure:#{<digest>}:<name>:lock`` and
    ``...:q`` instead, so that its keys too share one slot (``_key_prefix``).
    ``floor`` and ``warm`` belong to the node, not to the lock: the node's floor (the
    highest token it committed for any lock, the only fencing history it keeps, and the
    mark that it has not lost its data) and its warm-up marker (see ``_lua/acquire.lua``
    and docs/fencing.md); ``replid``, derived from ``floor``, the replication ID the
    floor was written under (the scripts find it by the floor's name). Nothing about a
    lock outlives its lease and its waiters. With another key prefix, ``tenure:`` is
    that prefix in every one of these keys, the node's included: each prefix has a
    fencing history of its own. ``per_slot`` (a client listing a whole Redis Cluster as
    a node): the node's floor, warm-up marker and stored replication ID are those of the
    lock's hash slot ``s``, ``tenure:{<T[s]>}:floor``, ``:warm`` and ``:replid``
    (``slots.slot_tag``), on every node of the client, so that a script touches one slot
    only.
    """

    lock: str
    floor: str = NODE_FLOOR
    warm: str = NODE_WARM
    queue: str = ""

    @property
    def replid(self) -> str:
        """The node's stored replication ID (``replid_key`` of the floor)."""
        return replid_key(self.floor)

    @classmethod
    def of(cls, name: str, prefix: str = DEFAULT_KEY_PREFIX, *, per_slot: bool = False) -> LockKeys:
        start = _key_prefix(name, prefix)
        if per_slot:
            # In a cluster a script touches one slot only: the node keys of the lock's
            # slot, <prefix>{T[s]}:floor and :warm (docs/cluster-and-sentinel.md).
            tag = slot_tag(key_slot(start))
            floor, warm = f"{prefix}{{{tag}}}:floor", f"{prefix}{{{tag}}}:warm"
        else:
            floor, warm = node_keys(prefix)
        return cls(lock=f"{start}:lock", floor=floor, warm=warm, queue=f"{start}:q")


class WaitMode(str, enum.Enum):
    """How waiters of a lock are queued and the lock passed on; the value is what the
    scripts read (``WaitArgs.mode``)."""

    NOTIFIED = "n"  # the next waiter is woken, and the free lock reserved for it briefly
    FAIR_ONE_NODE = "f"  # the lock is handed over inside the release, on the one node
    FAIR_QUORUM = "q"  # handed over on every node with one token (docs/waiting.md)


@dataclass(frozen=True)
class LockSpec:
    """Validated settings of one lock: everything a round needs to know.

    ``ttl`` is rounded down to whole milliseconds (what ``PX`` takes); validity is
    computed from that rounded value, never from a longer one.
    """

    name: str
    key: str
    keys: LockKeys
    ttl: float
    ttl_ms: int
    drift: float
    node_timeout: float
    n_nodes: int
    quorum: int
    fair: bool = False
    retention_ms: int = 3_600_000

    @cached_property  # read several times a round
    def wait_mode(self) -> WaitMode:
        """How waiters are queued and the lock passed on (``WaitArgs.mode``)."""
        if not self.fair:
            return WaitMode.NOTIFIED
        return WaitMode.FAIR_ONE_NODE if self.n_nodes == 1 else WaitMode.FAIR_QUORUM

    @cached_property  # an enum's ``value`` is a Python-level property: once per lock
    def mode(self) -> str:
        """``wait_mode`` as the scripts read it."""
        return self.wait_mode.value

    @cached_property  # read at every round
    def cached(self) -> bool:
        """Whether the caches keyed by names keep this lock's (``caching``)."""
        return len(self.name) <= CACHED_CHARS

    @classmethod
    def build(
        cls, config: ClientConfig, name: object, ttl: object, fair: object = None
    ) -> LockSpec:
        name = check_name(name)
        seconds = _finite("ttl", ttl)
        # round() first: 1.001 * 1000 is 1000.9999999999999 in floating point. Clamped
        # before it is counted in milliseconds: a finite float near the largest (1e308 s)
        # is infinite times 1000, which no integer holds (OverflowError, not the error
        # naming ``ttl``); whatever lies past either bound is refused below all the same.
        ttl_ms = math.floor(round(min(max(seconds, -1.0), config.max_ttl_ms) * 1000, 6))
        if ttl_ms < 1:
            # The same message as any TTL below the rule's minimum: it names that minimum.
            raise ConfigurationError("ttl", _ttl_too_small(config, seconds))
        if ttl_ms > config.max_ttl_ms:
            raise ConfigurationError(
                "ttl",
                f"{seconds}s exceeds max_ttl={config.max_ttl_ms / 1000}s, the longest lease a "
                "node that lost its data waits out before voting again; raise max_ttl on "
                "every client of these nodes to use longer leases",
            )
        effective = ttl_ms / 1000
        drift = drift_allowance(effective, config.drift_factor, config.drift_floor)
        # The TTL rule, ttl >= 2 x (node_timeout + drift): a round may take up to
        # node_timeout before it is decided, and the lease must still have at least half
        # its TTL left after such a slow round to be worth having (docs/architecture.md).
        if effective < 2 * (config.node_timeout + drift):
            raise ConfigurationError("ttl", _ttl_too_small(config, effective))
        if fair is None:
            # The default: fair wherever it can be had, since its hand-off (inside the
            # release, no round trip for the next holder) is also the fastest.
            fair = config.recheck > 0 and not config.wait_replicas and not config.per_slot
        if not isinstance(fair, bool):
            raise ConfigurationError("fair", f"must be True, False or None, got {fair!r}")
        if fair and config.per_slot:
            raise ConfigurationError(
                "fair",
                "cannot be used with a Redis Cluster node (redis+cluster://): a cluster "
                "delivers a release's PUBLISH to subscribers on every one of its nodes, "
                "while the release counts only the publishing node's, so a hand-off "
                "could reach a waiter and be undone (docs/cluster-and-sentinel.md); "
                "leave fair out (False)",
            )
        if fair and config.wait_replicas:
            raise ConfigurationError(
                "fair",
                "cannot be combined with wait_replicas: a fair hand-off is written by the "
                "releaser's script, where no WAIT of the new holder covers it",
            )
        if fair and config.recheck == 0:
            raise ConfigurationError("fair", "needs notifications (recheck > 0)")
        keys = LockKeys.of(name, config.key_prefix, per_slot=config.per_slot)
        return cls(
            name=name,
            key=keys.lock,
            keys=keys,
            ttl=effective,
            ttl_ms=ttl_ms,
            drift=drift,
            node_timeout=config.node_timeout,
            n_nodes=len(config.nodes),
            quorum=config.quorum,
            retention_ms=config.retention_ms,
            fair=fair,
        )


def min_ttl(config: ClientConfig) -> float:
    """The shortest TTL ``LockSpec.build`` accepts with ``config``, in whole milliseconds.

    The rule is ``ttl >= 2 * (node_timeout + drift)`` with ``drift = ttl * drift_factor +
    drift_floor``, so the bound is ``2 * (node_timeout + drift_floor) / (1 - 2 *
    drift_factor)``, rounded up to the millisecond (TTLs are whole milliseconds).
    """
    bound = 2 * (config.node_timeout + config.drift_floor) / (1 - 2 * config.drift_factor)
    ms = math.ceil(round(bound * 1000, 6))
    # Floating point may put the rounded bound a hair below the rule; step up until it holds.
    while ms / 1000 < 2 * (
        config.node_timeout + drift_allowance(ms / 1000, config.drift_factor, config.drift_floor)
    ):
        ms += 1
    return ms / 1000


def _ttl_too_small(config: ClientConfig, ttl: float) -> str:
    shortest = min_ttl(config)
    # The longest node_timeout that this ttl allows (none if the drift alone is too much).
    longest = ttl / 2 - drift_allowance(ttl, config.drift_factor, config.drift_floor)
    timeout_fix = (
        f", or a node_timeout of at most {math.floor(longest * 1000) / 1000:g}s"
        if longest >= 0.001
        else ""
    )
    return (
        f"{ttl:g}s is below the minimum of {shortest:g}s for node_timeout="
        f"{config.node_timeout:g}s, drift_factor={config.drift_factor:g} and drift_floor="
        f"{config.drift_floor:g}s. The rule is ttl >= 2 x (node_timeout + drift), with "
        "drift = ttl x drift_factor + drift_floor, so that a lease keeps at least half its "
        f"TTL after the slowest acquisition. Use ttl >= {shortest:g}s{timeout_fix}"
    )


def check_acquire_args(blocking: object, timeout: object) -> float | None:
    """Validate ``acquire(blocking, timeout)`` as ``threading.Lock`` does; None means forever."""
    if not isinstance(blocking, bool):
        raise ConfigurationError("blocking", f"must be True or False, got {blocking!r}")
    if timeout is None or timeout == -1:
        return None
    seconds = _finite("timeout", timeout)
    if seconds < 0:
        raise ConfigurationError(
            "timeout", f"must be >= 0 seconds, None or -1 (forever), got {timeout!r}"
        )
    if not blocking:
        raise ConfigurationError(
            "timeout", "cannot be given for a non-blocking acquire (blocking=False)"
        )
    return seconds


class SpecCache:
    """``LockSpec`` by (name, ttl) for one client: validation is pure but not free, and a
    program locks the same few names again and again. Bounded; cleared when full."""

    LIMIT = 1024

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._specs: dict[tuple[object, object, bool | None], LockSpec] = {}

    def get(self, name: object, ttl: object, fair: object = None) -> LockSpec:
        if isinstance(ttl, bool) or not isinstance(fair, (bool, type(None))):
            # True == 1 as a dict key: never let it find a spec
            return LockSpec.build(self._config, name, ttl, fair)  # raises ConfigurationError
        try:
            return self._specs[(name, ttl, fair)]
        except (KeyError, TypeError):  # TypeError: unhashable input, rejected by build()
            spec = LockSpec.build(self._config, name, ttl, fair)
        if not spec.cached:
            return spec  # kept by its locks and leases only (``caching``)
        if len(self._specs) >= self.LIMIT:
            self._specs.clear()
        self._specs[(name, ttl, fair)] = spec
        return spec

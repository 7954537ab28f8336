"""A key-value store on Redis that refuses writes from superseded lease holders.

Theory of operation
-------------------

A lock alone cannot stop a holder that paused (GC, swap, a frozen VM) past its lease
from writing late, after another client took the lock and wrote::

    client A  acquire (token 33) ...... pause .................... write(33)  -> refused
    client B                 lease A expires, acquire (token 34) -- write(34)

So the *storage* checks. Every lease carries a fencing token, strictly increasing in the
order leases are granted for a resource. The store remembers, per resource, the highest
token it has accepted, and:

* accepts a write whose token is **greater than or equal to** the highest seen. Equal is
  the same lease writing again (a holder writes many times with one token), and it makes
  a retry after an ambiguous failure (a timeout after sending) safe;
* refuses a write whose token is **lower**: raises :class:`~tenure.StaleToken` carrying
  the highest token, and writes nothing.

Check and write are one Lua script (``fenced_write.lua``), so no other write can land
between them. The value and the token live in two keys that share a ``{resource}`` hash
tag, ``<namespace>:{<resource>}:value`` and ``<namespace>:{<resource>}:token``, so the
script also works on Redis Cluster (a resource whose tag would be empty, one starting
with ``}``, takes a tag of its own: ``fenced_keys``). The Redis here is any Redis the
application stores data in; it need not be one of the lock's nodes.

Assumptions: the token key is only written by this module, and this Redis keeps its data
(a store that forgets the highest token it saw, e.g. restarted without persistence,
would accept a stale write once). Lua numbers are doubles, so tokens are checked to be
integers in ``[0, 2**53)``, where every integer is exact.

:class:`FencedStore` (blocking) and :class:`AsyncFencedStore` (asyncio) differ only in
their I/O: the commands are built and their replies read by the same functions. Each
refuses a redis-py client of the other flavour, and one made with
``decode_responses=True``: values are bytes, and such a client fails inside redis-py on
the first one that is not UTF-8 text (``_driver.redis_objects.check_client``).

What the client raises is raised as :class:`~tenure.StoreUnavailable` (not reached, no
answer in time) or :class:`~tenure.StoreRefused` (an error reply: a key of another type,
a full or read-only Redis, an ACL, a damaged token key), never raw. A write whose answer
was lost may have been applied; retrying it with the same token is safe, since equal
tokens are accepted.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

import redis
import redis.asyncio

from .._core.config import check_name as _checked_name
from .._driver.process_bound import ProcessBound as _ProcessBound
from .._driver.redis_objects import check_client as _check_client
from .._driver.store_errors import FAILURES as _FAILURES
from .._driver.store_errors import server_of as _server_of
from .._driver.store_errors import store_error as _store_error
from .._errors import ConfigurationError, StaleToken, StoreRefused
from .._lua import script

__all__ = [
    "MAX_TOKEN",
    "AsyncFencedStore",
    "FencedStore",
    "fenced_keys",
    "fenced_write_args",
]

MAX_TOKEN = 2**53
"""Tokens must be below this, since above it Lua's doubles no longer tell neighbours apart."""


def fenced_keys(resource: str, namespace: str = "tenure") -> tuple[str, str]:
    """The Redis keys of a fenced resource: ``(value key, token key)``, in one Redis
    Cluster hash slot whatever the resource and namespace.

    Usually ``<namespace>:{<resource>}:value`` and ``...:token``: Redis Cluster hashes
    the text between a key's first ``{`` and the next ``}``, which that prefix closes,
    so both keys hash alike. Unless that text is empty (a resource starting with ``}``):
    then each key would hash whole, into different slots, and the script could not run
    on a cluster. Such a resource takes ``<namespace>:#{<digest>}:<resource>`` instead,
    as lock names do (``LockKeys``): the digest of the resource is the tag, the ``#``
    keeps these keys apart from every ordinary resource's, and the resource in full
    keeps them apart from each other. A namespace whose own first braces are empty
    (``"x{}"``) leaves every resource's tag empty; its keys take the tag at the front,
    ``#{<digest>}:<namespace>:<resource>``. Every other key is what it always was, so
    data written before stays readable.

    Raises:
        ConfigurationError: (``resource``, ``namespace``) not a non-empty string.
    """
    _checked_name(resource, "resource")
    _checked_name(namespace, "namespace")
    prefix = f"{namespace}:{{{resource}}}"
    if not _hash_tag(prefix):
        prefix = f"{namespace}:#{{{_digest(resource)}}}:{resource}"
        if not _hash_tag(prefix):
            prefix = f"#{{{_digest(namespace, resource)}}}:{namespace}:{resource}"
    return f"{prefix}:value", f"{prefix}:token"


def _hash_tag(key: str) -> str:
    """What Redis Cluster hashes of a key starting with ``key``, if it is decided there:
    the text between the first ``{`` and the next ``}`` ("" if none or empty)."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else ""


def _digest(*parts: str) -> str:
    """A tag spread over the slots like names are, never empty, never holding a brace."""
    data = b"\0".join(p.encode("utf-8", "surrogatepass") for p in parts)
    return hashlib.sha256(data).hexdigest()[:16]


def _check_token(token: object) -> int:
    """``token`` itself, once checked to be an int in ``[0, MAX_TOKEN)``.

    Raises:
        ConfigurationError: (``token``) anything else, ``bool`` included.
    """
    # bool is an int, but True as a token is a bug in the caller.
    if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < MAX_TOKEN:
        raise ConfigurationError("token", f"must be an int in [0, 2**53), got {token!r}")
    return token


def fenced_write_args(
    resource: str, token: int, value: bytes | str, namespace: str = "tenure"
) -> tuple[str, int, str, str, str, bytes | str]:
    """The arguments of one fenced write for ``client.eval(*args)``.

    For callers that batch writes in their own pipeline (``pipe.eval(*args)``). Each
    reply is ``[1, highest]`` (written) or ``[0, highest]`` (refused: stale token).

    Raises:
        ConfigurationError: a bad ``resource``, ``namespace``, ``token`` or ``value``.
    """
    value_key, token_key = fenced_keys(resource, namespace)
    _check_token(token)
    if not isinstance(value, (bytes, str)):
        raise ConfigurationError("value", f"must be bytes or str, got {type(value).__name__}")
    # EVAL with the source, never EVALSHA: nothing to go missing after SCRIPT FLUSH or a
    # restart (docs/architecture.md, "EVALSHA where a NOSCRIPT is always answered").
    return (_source(), 2, value_key, token_key, str(token), value)


@cache
def _source() -> str:
    return script("fenced_write").source.decode()


def _raise_if_refused(resource: str, token: int, reply: Any) -> None:
    accepted, highest = int(reply[0]), int(reply[1])
    if not accepted:
        raise StaleToken(resource, token, highest)


def _read_reply(reply: list[bytes | str | None]) -> tuple[bytes | None, int | None]:
    value, token = reply
    return _as_bytes(value), _as_int(token)


def _as_int(reply: bytes | str | None) -> int | None:
    return None if reply is None else int(reply)


def _as_bytes(reply: bytes | str | None) -> bytes | None:
    # Both stores refuse a client made with decode_responses=True, but one whose decoding
    # they could not see (a wrapper without get_encoder) hands back str: bytes regardless.
    return reply.encode() if isinstance(reply, str) else reply


def _failed(exc: Exception, store: Any, operation: str, resource: str) -> Exception:
    """What ``store``'s command failing with ``exc`` raises (``from exc``)."""
    client, name = store.client, type(store).__name__
    if isinstance(exc, ValueError):
        # A token key holding no number, read back: written by something else.
        return StoreRefused(
            name,
            operation,
            resource,
            _server_of(client),
            str(exc),
            "its token key holds no number: something other than a fenced store wrote "
            "it; remove that key, or give the store a namespace of its own",
        )
    assert isinstance(exc, _FAILURES)
    writes = operation == "write"
    return _store_error(
        exc,
        client,
        name,
        operation,
        resource,
        maybe_applied=writes,
        retry="; retrying it with the same token is safe" if writes else "",
    )


class _Store(_ProcessBound):
    """What the blocking and the asyncio store share besides their commands: how they
    show themselves and what a worker process makes its own one from."""

    namespace: str

    def __repr__(self) -> str:
        # The namespace only: the client's URL may carry a password.
        return f"<{type(self).__name__} namespace={self.namespace!r}>"

    def _remade_from(self) -> tuple[str, str]:
        return (
            f"a redis client made there and namespace={self.namespace!r}",
            "the Redis URL rather than the store",
        )


class FencedStore(_Store):
    """Values on Redis guarded by fencing tokens, with a blocking redis-py client.

    Args:
        redis_client: a ``redis.Redis`` (or ``redis.RedisCluster``) that returns raw
            bytes, as it does unless made with ``decode_responses=True``: values are
            bytes, and a decoding client cannot read one that is not UTF-8 text. The
            store does not close it.
        namespace: the first part of every key this store writes.

    Raises:
        ConfigurationError: (``redis_client``) an asyncio client (use
            :class:`AsyncFencedStore`), or one with ``decode_responses=True``;
            (``namespace``) not a non-empty string.

    Example::

        store = FencedStore(redis.Redis())
        with client.lock("report", ttl=10) as lease:
            store.write("report", lease.fencing_token, render())
    """

    def __init__(self, redis_client: redis.Redis, namespace: str = "tenure") -> None:
        # Now, rather than at the first write (or, for a decoding client, the first read
        # of a value that is not UTF-8 text).
        _check_client(
            redis_client,
            "redis_client",
            owner="FencedStore",
            asyncio=False,
            twin="AsyncFencedStore",
            raw_bytes=True,
        )
        _checked_name(namespace, "namespace")
        self.client = redis_client
        self.namespace = namespace

    def write(self, resource: str, token: int, value: bytes | str) -> None:
        """Store ``value`` for ``resource`` unless a newer lease has written it.

        Args:
            resource: the fenced resource's name, usually the lock's name.
            token: the fencing token of the writer's lease.
            value: what to store.

        Raises:
            StaleToken: ``token`` is lower than the highest token this resource has seen
                (``.highest``); nothing was written.
            ConfigurationError: a bad argument (see :func:`fenced_write_args`).
            StoreUnavailable: the Redis was not reached or did not answer; the write may
                or may not have been applied (``.maybe_applied``), and retrying it with the
                same token is safe.
            StoreRefused: the Redis answered with an error (a key of another type, full,
                read-only, an ACL; a token key holding no number); nothing was written.
        """
        args = fenced_write_args(resource, token, value, self.namespace)
        try:
            reply = self.client.eval(*args)
        except _FAILURES as exc:
            raise _failed(exc, self, "write", resource) from exc
        _raise_if_refused(resource, token, reply)

    def read(self, resource: str) -> tuple[bytes | None, int | None]:
        """The stored value and the highest token seen, read at one instant.

        Returns:
            ``(value, highest)``; ``(None, None)`` if nothing was ever written.

        Raises:
            ConfigurationError: a bad ``resource``.
            StoreUnavailable: the Redis was not reached or did not answer.
            StoreRefused: the Redis answered with an error (an ACL, a key of another
                type, a token key holding no number).
        """
        keys = fenced_keys(resource, self.namespace)
        try:
            # MGET is atomic and both keys are in one slot: value and token of one instant.
            return _read_reply(self.client.mget(*keys))
        except (*_FAILURES, ValueError) as exc:
            raise _failed(exc, self, "read", resource) from exc

    def highest(self, resource: str) -> int | None:
        """The highest token ``resource`` has accepted, or ``None`` if none yet.

        Raises:
            As :meth:`read`.
        """
        key = fenced_keys(resource, self.namespace)[1]
        try:
            return _as_int(self.client.get(key))
        except (*_FAILURES, ValueError) as exc:
            raise _failed(exc, self, "highest", resource) from exc


class AsyncFencedStore(_Store):
    """The asyncio twin of :class:`FencedStore`, with a ``redis.asyncio.Redis`` client.

    Args:
        redis_client: a ``redis.asyncio.Redis`` (or ``redis.asyncio.RedisCluster``) that
            returns raw bytes (not ``decode_responses=True``); the store does not close it.
        namespace: the first part of every key this store writes.

    Raises:
        ConfigurationError: (``redis_client``) a blocking client (use
            :class:`FencedStore`), or one with ``decode_responses=True``;
            (``namespace``) not a non-empty string.
    """

    def __init__(self, redis_client: redis.asyncio.Redis, namespace: str = "tenure") -> None:
        _check_client(
            redis_client,
            "redis_client",
            owner="AsyncFencedStore",
            asyncio=True,
            twin="FencedStore",
            raw_bytes=True,
        )
        _checked_name(namespace, "namespace")
        self.client = redis_client
        self.namespace = namespace

    async def write(self, resource: str, token: int, value: bytes | str) -> None:
        """As :meth:`FencedStore.write`."""
        args = fenced_write_args(resource, token, value, self.namespace)
        try:
            reply = await self.client.eval(*args)
        except _FAILURES as exc:
            raise _failed(exc, self, "write", resource) from exc
        _raise_if_refused(resource, token, reply)

    async def read(self, resource: str) -> tuple[bytes | None, int | None]:
        """As :meth:`FencedStore.read`."""
        keys = fenced_keys(resource, self.namespace)
        try:
            return _read_reply(await self.client.mget(*keys))
        except (*_FAILURES, ValueError) as exc:
            raise _failed(exc, self, "read", resource) from exc

    async def highest(self, resource: str) -> int | None:
        """As :meth:`FencedStore.highest`."""
        key = fenced_keys(resource, self.namespace)[1]
        try:
            return _as_int(await self.client.get(key))
        except (*_FAILURES, ValueError) as exc:
            raise _failed(exc, self, "highest", resource) from exc

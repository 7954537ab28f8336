"""redis-py errors of the fenced stores and the patterns, as tenure errors.

The stores and patterns run their commands on a redis-py client the application gives
them; whatever it raises becomes a :class:`~tenure.StoreUnavailable` (not reached, no
answer in time) or a :class:`~tenure.StoreRefused` (an error reply, a setup that refuses
the client), classified as the lock client classifies a node's failure
(``redis_compat.diagnose``) and worded for a store (``diagnosis.store_problem``).

A function, not a context manager: callers wrap each command in ``try``/``except
redis.RedisError``, which costs nothing until something is raised, while a ``with``
costs about a microsecond and a half on every write. ``CancelledError`` and
``KeyboardInterrupt`` are no ``RedisError``, so they pass untouched.
"""

from __future__ import annotations

import re
from typing import Any

from redis import exceptions as rx

from .._core import diagnosis
from .._core.quorum import Failure
from .._errors import StoreError, StoreRefused, StoreUnavailable
from .redis_compat import diagnose, reply_text

__all__ = ["FAILURES", "Failed", "server_of", "store_error"]

# What a store's redis-py client raises for a failure of its Redis: its errors, and a
# cluster client's own (a slot no member serves, keys of one call in several slots),
# which are no ``RedisError``.
FAILURES = (rx.RedisError, rx.RedisClusterException)
Failed = rx.RedisError | rx.RedisClusterException


def store_error(
    exc: Failed,
    client: Any,
    store: str,
    operation: str,
    key: str,
    *,
    maybe_applied: bool = False,
    retry: str = "",
) -> StoreError:
    """The error to raise ``from exc``, which ``client`` raised for ``store``'s
    ``operation`` on ``key``.

    ``maybe_applied``: the command was a write that may have reached the Redis before the
    connection failed (``retry`` then says, after a semicolon, whether retrying is safe);
    False for reads and for failures before the write was sent.
    """
    server = server_of(client)
    if isinstance(exc, rx.RedisClusterException):
        said = str(exc) or type(exc).__name__
        if isinstance(exc, rx.SlotNotCoveredError):  # no member serves it: an outage
            return StoreUnavailable(
                store, operation, key, server, said, maybe_applied=maybe_applied, retry=retry
            )
        problem = (
            f"the Redis Cluster client refused the call ({said}): the keys of one call must "
            "share a hash slot (a hash tag, {...}, in each key)"
        )
        return StoreRefused(store, operation, key, server, said, problem, lasting=True)
    why = diagnose(exc)
    if why.failure in (Failure.UNREACHABLE, Failure.BACKING_OFF):
        # The lock client's words for it: the exception's own, or with the fix where
        # one is known (a Redis at its maxclients, a TLS handshake to a plain port).
        return StoreUnavailable(
            store, operation, key, server, why.detail, maybe_applied=maybe_applied, retry=retry
        )
    reply = None
    if isinstance(exc, (rx.ResponseError, rx.AuthenticationError)):
        reply = _unannotated(reply_text(exc))
    problem = diagnosis.store_problem(why, reply)
    # A key of another type is one key's, not the server's, so the lock client does
    # not set the node aside for it; to a store it is as lasting as a read-only replica.
    lasting = why.failure.configuration or diagnosis.wrong_type(reply)
    return StoreRefused(store, operation, key, server, reply or str(exc), problem, lasting=lasting)


# What redis-py makes of an error reply to a pipeline's command: "Command # 2 (HINCRBY k
# n 1) of pipeline caused error: ('WRONGTYPE Operation ...',)", its code (READONLY, OOM)
# put back in front by ``reply_text`` where redis-py stripped it.
_ANNOTATED = re.compile(
    r"^(?:(?P<code>[A-Z]+) )?Command # \d+ \(.*?\) of pipeline caused error: (?P<said>.*)$",
    re.DOTALL,
)


def _unannotated(text: str) -> str:
    """An error reply as the Redis sent it, from redis-py's note on a pipeline's command."""
    note = _ANNOTATED.match(text)
    if note is None:
        return text
    said = note["said"]
    if len(said) > 5 and said[:2] in ("('", '("') and said.endswith(",)"):
        said = said[2:-3]  # the repr of the error's args
    code = note["code"]
    return f"{code} {said}" if code and not said.startswith(code) else said


def server_of(client: Any) -> str | None:
    """The address a redis-py client (sync or asyncio) connects to, as ``host:port`` or
    a socket path; None for one that does not say in one place (a cluster client)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return str(kwargs["path"])
    host, port = kwargs.get("host"), kwargs.get("port")
    return None if host is None else f"{host}:{port}"

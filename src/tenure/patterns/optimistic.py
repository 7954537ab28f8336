"""Optimistic concurrency: read, compute, write only if nothing changed meanwhile.

Theory of operation
-------------------

A lock makes writers wait *before* they read. Optimistic concurrency lets them all read
and compute at once, and checks at write time that what they read is still current; the
losers of a race find out, throw their work away, and start again from a fresh read::

    client A  read stock=5 ........ write 4 if still 5 -> ok
    client B  read stock=5 ..... write 4 if still 5 --------> conflict: re-read 4, write 3

No update is lost, nobody holds anything while paused, and there is no lease to expire
under a slow client. The price is wasted work under contention, so every retry here waits
a random, growing delay (full jitter, :mod:`tenure._core.policy`), and the number of
attempts is **bounded**: when it runs out, :class:`ConflictError` says so. Nothing here
retries forever, and no other error is retried or swallowed.

Two back-ends, one retry loop:

* **Redis** (:func:`optimistic`, :func:`aoptimistic`): ``WATCH`` the keys, read them (one
  ``MGET``, plus any reads ``fn`` makes through the watched connection), let ``fn`` turn
  what it read into a :class:`Plan` (its writes and its result), and queue the writes in
  ``MULTI``/``EXEC``. Redis runs ``EXEC`` only if no watched key was written since
  ``WATCH`` (by anyone else, or expired); otherwise it runs nothing and the attempt is a
  conflict. ``EXEC`` runs even for a plan with no writes, so a result computed from the
  reads (e.g. "sold out") is confirmed to hold at one instant too.
* **SQL** (:func:`versioned_update`, SQLAlchemy): each row carries a version number; an
  update names the version it read and bumps it, in one statement::

      UPDATE items SET stock = :stock, version = version + 1
       WHERE items.id = :id AND version = :expected

  A database applies an UPDATE's WHERE and SET under the row's write lock, so of two
  writers that read the same version exactly one matches; the other updates no row and
  gets :class:`StaleVersion`. (PostgreSQL in READ COMMITTED re-checks the WHERE against
  the version committed while it waited; in REPEATABLE READ it raises a serialization
  failure instead, which is worth retrying too: pass it in ``retry_on``. SQLite lets one
  writer in at a time.)

:func:`retry_optimistic` / :func:`aretry_optimistic` are that loop on its own: they run a
read-compute-write function until it does not raise a conflict, at most ``retries + 1``
times. :func:`optimistic` is built on it.

What ``fn`` may do
------------------

``fn`` runs once per attempt, so **several times** under contention, and its last run is
the one whose writes land. It must therefore be free of side effects outside the
transaction (no e-mail, no charge, no write through ``reads.reader``): those would repeat,
or happen for an attempt that was thrown away. That is the caller's business; the
idempotency keys in :mod:`tenure.patterns.idempotency` are one answer. If ``fn`` raises,
the attempt ends, nothing is written, and the exception propagates unchanged: raising is
how ``fn`` refuses (e.g. stock would go below zero).

A connection lost during the transaction is **not** a conflict. redis-py reports it as a
``WatchError`` too ("A ConnectionError occurred while watching ..."), even when it
happened after ``EXEC`` was sent, when the writes may have been applied; retrying then
could apply them twice. Here it surfaces as :class:`~tenure.StoreUnavailable`, and the
caller decides: its ``maybe_applied`` is True only when ``EXEC`` had been sent. An error
reply (``WRONGTYPE``, ``OOM``, ``READONLY``, an ACL) is :class:`~tenure.StoreRefused`;
neither is retried. Every redis-py error of an attempt is translated so, those raised by
``fn``'s own reads through ``reads.reader`` included.

Redis Cluster: all keys of one transaction must share a hash slot (``{tag}``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import redis
import redis.asyncio
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline

from .._core.config import check_name as _checked_name
from .._core.config import retry_delay as _retry_delay
from .._core.policy import RetryPolicy, wait_random_exponential
from .._driver.guard import Guard as _Guard
from .._driver.redis_objects import check_client as _check_client
from .._driver.redis_objects import reply_encoding as _reply_encoding
from .._driver.store_errors import FAILURES as _FAILURES
from .._driver.store_errors import Failed as _Failed
from .._driver.store_errors import store_error as _store_error
from .._errors import ConfigurationError, TenureError

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Table
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_RETRIES",
    "ConflictError",
    "OptimisticStats",
    "Plan",
    "Reads",
    "RowMissing",
    "StaleVersion",
    "Writes",
    "aoptimistic",
    "aretry_optimistic",
    "optimistic",
    "retry_optimistic",
    "versioned_update",
]

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_RETRIES = 10
"""Retries after the first attempt, so at most 11 attempts."""

MAX_RETRIES = 10_000
"""The most retries accepted: nothing here retries for ever (``retries=10**20`` would)."""

DEFAULT_BACKOFF: RetryPolicy = wait_random_exponential(initial=0.002, maximum=0.1)
"""Full-jitter exponential back-off, uniform in [0, min(0.1, 0.002 * 2**(k-1))] seconds."""

# What a value in a Plan's write mapping may be; None deletes the key.
Value = bytes | str | int | float | None


# --- Errors -------------------------------------------------------------------------------


class ConflictError(TenureError, RuntimeError):
    """An optimistic update lost to a concurrent write, and (for a retry loop) kept losing.

    Raised by :func:`optimistic` and :func:`retry_optimistic` when the bound is reached;
    its ``__cause__`` is the last conflict. Nothing of the failed attempts was written.

    Attributes:
        keys: what was contended: the Redis keys, or the row (``items WHERE items.id = 1``).
        attempts: how many attempts were made, all of which conflicted.
    """

    def __init__(self, keys: Sequence[str], attempts: int, message: str | None = None) -> None:
        self.keys = tuple(keys)
        self.attempts = attempts
        what = ", ".join(self.keys) or "(unnamed)"
        plural = "" if attempts == 1 else "s"
        super().__init__(
            message or f"optimistic update of {what} conflicted on {attempts} attempt{plural}"
        )


class StaleVersion(ConflictError):
    """A version-checked UPDATE found the row at another version than the one read.

    Another writer updated the row since it was read; nothing was written. Re-read and
    try again (:func:`retry_optimistic` does).

    Attributes:
        row: the row, as ``table WHERE clause``.
        expected: the version the writer had read.
        actual: the row's version when the UPDATE ran.
    """

    def __init__(self, row: str, expected: int, actual: int) -> None:
        super().__init__(
            (row,), 1, f"{row}: version is {actual}, not {expected} as read; nothing written"
        )
        self.row = row
        self.expected = expected
        self.actual = actual


class RowMissing(TenureError, LookupError):
    """A version-checked UPDATE found no row to update (it was never there, or deleted).

    Not a conflict: re-reading would not help, so the retry helpers do not retry it.

    Attributes:
        row: the row, as ``table WHERE clause``.
    """

    def __init__(self, row: str) -> None:
        super().__init__(f"{row}: no such row; nothing written")
        self.row = row


# --- Statistics ---------------------------------------------------------------------------


@dataclass
class OptimisticStats:
    """Counters a retry loop adds to, for tests, benchmarks and metrics.

    One object may be shared by many calls and threads (updates take a lock). It pickles
    (without its lock), so worker processes can send theirs back to be merged.

    Attributes:
        attempts: attempts started (each ran ``fn`` once).
        conflicts: attempts that ended in a conflict.
        committed: calls that succeeded.
        gave_up: calls that raised :class:`ConflictError` because the bound was reached.
    """

    attempts: int = 0
    conflicts: int = 0
    committed: int = 0
    gave_up: int = 0
    _lock: _Guard = field(default_factory=_Guard, repr=False, compare=False)

    def merge(self, other: OptimisticStats) -> None:
        """Add ``other``'s counts to this one's (e.g. the stats of each worker process)."""
        self._add(
            attempts=other.attempts,
            conflicts=other.conflicts,
            committed=other.committed,
            gave_up=other.gave_up,
        )

    def _add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def __getstate__(self) -> dict[str, int]:
        with self._lock:
            return {
                "attempts": self.attempts,
                "conflicts": self.conflicts,
                "committed": self.committed,
                "gave_up": self.gave_up,
            }

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__dict__.update(state)
        self._lock = _Guard()


# --- The retry loop, written once ---------------------------------------------------------


class _Budget:
    """The decisions of one retry loop; the sync and async drivers only do the waiting."""

    def __init__(
        self,
        retries: int,
        backoff: RetryPolicy,
        rng: random.Random | None,
        stats: OptimisticStats | None,
    ) -> None:
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ConfigurationError("retries", f"must be an int >= 0, got {retries!r}")
        if retries > MAX_RETRIES:
            raise ConfigurationError(
                "retries",
                f"must be at most {MAX_RETRIES:,}, got {retries:,}: a key that conflicts that "
                "often wants a lock or a single writer (docs/patterns.md), not more retries",
            )
        self.retries = retries
        self.backoff = backoff
        self.rng = rng
        self.stats = stats
        self.attempts = 0

    def started(self) -> None:
        self.attempts += 1
        if self.stats is not None:
            self.stats._add(attempts=1)

    def committed(self) -> None:
        if self.stats is not None:
            self.stats._add(committed=1)

    def conflicted(self, conflict: BaseException) -> float:
        """How long to sleep before the next attempt; raises once the bound is reached."""
        if self.stats is not None:
            self.stats._add(conflicts=1)
        if self.attempts > self.retries:
            if self.stats is not None:
                self.stats._add(gave_up=1)
            keys = conflict.keys if isinstance(conflict, ConflictError) else ()
            raise ConflictError(keys, self.attempts) from conflict
        if self.rng is None:
            # Only a loop that conflicts pays for seeding one (from the OS).
            self.rng = random.Random()
        return _retry_delay(self.backoff, self.attempts, self.rng, "backoff")


def retry_optimistic(
    fn: Callable[[], T],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: RetryPolicy = DEFAULT_BACKOFF,
    retry_on: tuple[type[BaseException], ...] = (ConflictError,),
    rng: random.Random | None = None,
    stats: OptimisticStats | None = None,
) -> T:
    """Run a read-compute-write function until it does not conflict, at most ``retries + 1`` times.

    Args:
        fn: one whole attempt: read, compute, write (e.g. in its own transaction, with
            :func:`versioned_update`). Raises one of ``retry_on`` on a conflict.
        retries: how many times to try again after the first conflict.
        backoff: the delay before each retry (jittered: competing writers de-synchronise).
        retry_on: the exceptions that mean "conflict, re-read and retry".
        rng: the randomness for the back-off; default a fresh ``random.Random()``.
        stats: counters to add this call's attempts and conflicts to.

    Returns:
        What the successful attempt returned.

    Raises:
        ConflictError: every attempt conflicted; ``.attempts`` is ``retries + 1``.
        ConfigurationError: ``fn`` is no function; ``retry_on`` holds something other
            than exception classes; ``retries`` is not an int in 0..``MAX_RETRIES``;
            ``backoff`` raised or gave no number of seconds in [0, ``MAX_RETRY_DELAY``]
            for a retry.
        Exception: anything else ``fn`` raises, at once and unchanged.

    Example::

        def redeem() -> int:
            with engine.begin() as conn:
                row = conn.execute(select(coupons).where(coupons.c.code == "SPRING")).one()
                if row.left == 0:
                    raise SoldOut
                versioned_update(conn, coupons, coupons.c.code == "SPRING", row.version,
                                 {"left": row.left - 1})
                return row.left - 1

        left = retry_optimistic(redeem)
    """
    _check_fn(fn)
    _check_retry_on(retry_on)
    budget = _Budget(retries, backoff, rng, stats)
    while True:
        budget.started()
        try:
            result = fn()
        except retry_on as conflict:
            time.sleep(budget.conflicted(conflict))
        else:
            budget.committed()
            return result


async def aretry_optimistic(
    fn: Callable[[], Awaitable[T]],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: RetryPolicy = DEFAULT_BACKOFF,
    retry_on: tuple[type[BaseException], ...] = (ConflictError,),
    rng: random.Random | None = None,
    stats: OptimisticStats | None = None,
) -> T:
    """The asyncio twin of :func:`retry_optimistic`: ``fn`` is a coroutine function."""
    _check_fn(fn)
    _check_retry_on(retry_on)
    budget = _Budget(retries, backoff, rng, stats)
    while True:
        budget.started()
        try:
            result = await fn()
        except retry_on as conflict:
            await asyncio.sleep(budget.conflicted(conflict))
        else:
            budget.committed()
            return result


# --- Redis: WATCH / MULTI / EXEC ----------------------------------------------------------


class Reads(Mapping[str, bytes | None], Generic[R]):
    """What an attempt read: the watched keys' string values, read at one instant.

    A mapping from each watched key to its value (``bytes``), or ``None`` where the key
    is absent or holds no string (``MGET`` answers nil for a hash, a set, ...).

    Attributes:
        reader: the watched connection in immediate mode, for reads ``MGET`` cannot do
            (``reads.reader.hgetall(key)``). Every key read here should be watched.
            Do not write through it: such a write is applied at once, outside the
            transaction, and once per attempt.
    """

    def __init__(self, values: Mapping[str, bytes | None], reader: R) -> None:
        self._values = dict(values)
        self.reader = reader

    def __getitem__(self, key: str) -> bytes | None:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def int(self, key: str, default: int = 0) -> int:
        """The value of ``key`` as an integer, or ``default`` if it is absent."""
        value = self._values[key]
        return default if value is None else int(value)

    def __repr__(self) -> str:
        return f"Reads({self._values!r})"


Writes = Mapping[str, Value] | Callable[[Any], object] | None
"""A plan's writes, ``{key: value}`` or a function that queues commands on the pipeline."""


@dataclass(frozen=True)
class Plan(Generic[T]):
    """What an attempt decided: the writes to commit, and the result to return if they do.

    Attributes:
        result: returned by :func:`optimistic` once the writes are committed.
        writes: ``None`` (write nothing, but still confirm the reads at ``EXEC``); a
            mapping ``{key: value}`` (``SET key value``, or ``DEL key`` for ``None``;
            ``SET`` drops any TTL the key had); or a function that queues commands on
            the transaction, e.g. ``lambda tx: tx.hincrby("cart", "n", 1)``. Those
            commands are queued, not run: their replies are not available to ``fn``.
    """

    result: T
    writes: Writes = None


def _queue_writes(pipe: Any, writes: Writes) -> None:
    """Queue a plan's writes on a pipeline in MULTI mode (redis-py or redis.asyncio)."""
    if writes is None:
        return
    if callable(writes):
        writes(pipe)
        return
    if not isinstance(writes, Mapping):
        raise ConfigurationError(
            "writes", f"must be None, a mapping or a callable, got {type(writes).__name__}"
        )
    # All checked before any is queued: redis-py refuses a value it cannot send (a
    # bool, a list) raw, with the transaction half queued.
    for key, value in writes.items():
        _checked_name(key, "writes")
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (str, bytes, int, float))
        ):
            raise ConfigurationError(
                "writes",
                f"{key!r}: a value must be str, bytes, int, float or None (delete), "
                f"got {type(value).__name__}",
            )
    for key, value in writes.items():
        if value is None:
            pipe.delete(key)
        else:
            pipe.set(key, value)


def _checked_plan(plan: Plan[T]) -> Plan[T]:
    """``fn``'s answer, refused before anything is queued unless it is a Plan."""
    # Typed as a Plan, but fn is the caller's code: mypy cannot vouch for what it returns.
    if not isinstance(cast(object, plan), Plan):
        raise ConfigurationError(
            "fn",
            f"must return a Plan(result, writes), got {type(plan).__name__}: "
            "return Plan(result=..., writes=None) to write nothing",
        )
    return plan


def _check_keys(keys: Sequence[str]) -> list[str]:
    if isinstance(keys, (str, bytes)):
        raise ConfigurationError("keys", "must be a sequence of key names, not one string")
    try:
        checked = list(keys)
    except TypeError:
        raise ConfigurationError(
            "keys", f"must be a sequence of key names, e.g. ['stock:42'], got {keys!r}"
        ) from None
    if not checked or not all(isinstance(k, str) and k for k in checked):
        raise ConfigurationError("keys", f"must be non-empty strings, at least one: {keys!r}")
    for key in checked:
        _checked_name(key, "keys")
    return checked


def _check_fn(fn: object) -> None:
    # Else a raw TypeError from the first attempt (optimistic's: after WATCH and reads).
    if not callable(fn):
        raise ConfigurationError("fn", f"must be a function (one attempt), got {fn!r}")


def _check_retry_on(retry_on: object) -> None:
    # Else a raw TypeError at the first exception fn raised, its own lost in the context.
    classes = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
        raise ConfigurationError(
            "retry_on",
            f"must be a tuple of exception classes, e.g. (ConflictError,), got {retry_on!r}",
        )


def _values(
    client: object, keys: Sequence[str], replies: Sequence[bytes | str | None]
) -> dict[str, bytes | None]:
    """MGET's replies by key, as the bytes stored even from a client with
    ``decode_responses=True``: encoded back with the client's own encoding, which decoded
    them (UTF-8 would change every byte above 127 a latin-1 client read)."""
    encoding = _reply_encoding(client)
    return {
        key: reply.encode(*encoding) if isinstance(reply, str) else reply
        for key, reply in zip(keys, replies, strict=True)
    }


def _not_text(client: object, keys: Sequence[str]) -> ConfigurationError:
    """A client that decodes replies read a watched value that is not text in its
    encoding: redis-py failed inside its read, before ``fn`` saw anything."""
    encoding = _reply_encoding(client)[0]
    return ConfigurationError(
        "client",
        f"it decodes replies (decode_responses=True), and a value of {', '.join(keys)} is "
        f"not text in its encoding {encoding!r}: make the client with "
        "decode_responses=False (the values reach fn as bytes either way); nothing was "
        "written",
    )


def _watch_conflict(error: redis.WatchError, keys: Sequence[str]) -> redis.RedisError | None:
    """What a WatchError means: a conflict (None), or a lost connection in disguise.

    redis-py raises WatchError *from* a ConnectionError or TimeoutError when the
    connection died while keys were watched, EXEC included, where the writes may have
    been applied. That one must not be retried as a conflict: it is returned, to be
    raised as the store error it is.
    """
    context = error.__context__
    if isinstance(context, (redis.ConnectionError, redis.TimeoutError)):
        return context
    return None


def _failed(
    exc: _Failed, client: Any, who: str, keys: Sequence[str], *, exec_sent: bool
) -> Exception:
    """The error an attempt raises (``from exc``) for a redis-py error that is no conflict."""
    return _store_error(
        exc,
        client,
        who,
        "EXEC" if exec_sent else "WATCH/read",
        " ".join(keys),
        maybe_applied=exec_sent,
        retry="; read the keys to see which before trying again",
    )


def _attempt_failed(
    exc: _Failed, client: Any, who: str, keys: Sequence[str], *, exec_sent: bool
) -> Exception:
    """What an attempt raises for ``exc``: a conflict, or a store error (``from exc``)."""
    if isinstance(exc, redis.WatchError):
        lost = _watch_conflict(exc, keys)
        if lost is None:
            return ConflictError(keys, 1)
        exc = lost
    error = _failed(exc, client, who, keys, exec_sent=exec_sent)
    if exec_sent and isinstance(exc, redis.ResponseError):
        # Inside EXEC: Redis runs every queued write and does not roll back.
        error.args = (
            f"{error.args[0]} (a queued write failed inside EXEC; Redis does not roll back, "
            "so the other queued writes were applied)",
        )
    return error


def optimistic(
    client: redis.Redis | redis.RedisCluster,
    keys: Sequence[str],
    fn: Callable[[Reads[Pipeline]], Plan[T]],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: RetryPolicy = DEFAULT_BACKOFF,
    rng: random.Random | None = None,
    stats: OptimisticStats | None = None,
) -> T:
    """Run ``fn`` on ``WATCH``ed keys and commit its plan in ``MULTI``/``EXEC``; retry conflicts.

    Args:
        client: a blocking ``redis.Redis`` (or ``redis.RedisCluster``); one pooled
            connection is used per attempt. For a ``redis.asyncio.Redis``, use
            :func:`aoptimistic`.
        keys: the keys whose values ``fn`` depends on; watched, then read with one MGET.
        fn: turns what was read into a :class:`Plan`. Runs once per attempt (so maybe
            several times); raise from it to give up without writing.
        retries, backoff, rng, stats: as :func:`retry_optimistic`.

    Returns:
        The ``result`` of the plan whose writes were committed.

    Raises:
        ConflictError: a watched key changed during every one of ``retries + 1`` attempts.
        StoreUnavailable: the connection failed or timed out; not retried. If it failed
            after EXEC was sent (``.maybe_applied``), the writes may or may not have been
            applied; otherwise nothing was written.
        StoreRefused: the Redis answered with an error (WRONGTYPE, OOM, READONLY, an
            ACL). Before EXEC nothing was written; a queued write that failed inside EXEC
            does not roll back the others, which were applied (the message says so).
        ConfigurationError: bad ``keys``, ``retries`` or plan ``writes``; ``fn`` is
            no function or returned no :class:`Plan`; an asyncio ``client``, one that
            decodes replies with an encoding that cannot read the server's (utf-16), or
            one that decodes replies reading a value that is not text in its encoding.
        Exception: whatever ``fn`` raises, unchanged (but for a redis-py error, as
            above); nothing was written.

    Example (never sell below zero)::

        def sell(reads: Reads[Pipeline]) -> Plan[int]:
            stock = reads.int("stock:42")
            if stock == 0:
                raise SoldOut
            return Plan(result=stock - 1, writes={"stock:42": stock - 1})

        left = optimistic(r, ["stock:42"], sell)
    """
    # An asyncio client's pipeline is no context manager: a bare TypeError otherwise.
    _check_client(client, "client", owner="optimistic", asyncio=False, twin="aoptimistic")
    watched = _check_keys(keys)
    _check_fn(fn)
    cluster = isinstance(client, redis.RedisCluster)

    def attempt() -> T:
        exec_sent = False
        try:
            with client.pipeline(transaction=True) as pipe:
                pipe.watch(*watched)
                # A cluster client's pipeline refuses MGET (a multi-key command): one GET
                # per key, in the same watched connection.
                try:
                    values = [pipe.get(k) for k in watched] if cluster else pipe.mget(watched)
                except UnicodeDecodeError as exc:
                    raise _not_text(client, watched) from exc
                plan = _checked_plan(fn(Reads(_values(client, watched, values), pipe)))
                pipe.multi()
                _queue_writes(pipe, plan.writes)
                exec_sent = True
                pipe.execute()
                return plan.result
        except _FAILURES as error:
            raise _attempt_failed(
                error, client, "optimistic", watched, exec_sent=exec_sent
            ) from error

    return retry_optimistic(attempt, retries=retries, backoff=backoff, rng=rng, stats=stats)


async def aoptimistic(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
    keys: Sequence[str],
    fn: Callable[[Reads[AsyncPipeline]], Plan[T] | Awaitable[Plan[T]]],
    *,
    retries: int = DEFAULT_RETRIES,
    backoff: RetryPolicy = DEFAULT_BACKOFF,
    rng: random.Random | None = None,
    stats: OptimisticStats | None = None,
) -> T:
    """The asyncio twin of :func:`optimistic`.

    ``fn`` may be a plain function or a coroutine function (to ``await`` more reads
    through ``reads.reader``). A write function in the plan queues commands on the
    redis.asyncio pipeline without awaiting them.

    ``client`` is a ``redis.asyncio.Redis`` (or ``redis.asyncio.RedisCluster``); a
    blocking client raises :class:`~tenure.ConfigurationError` (use :func:`optimistic`).
    """
    _check_client(client, "client", owner="aoptimistic", asyncio=True, twin="optimistic")
    watched = _check_keys(keys)
    _check_fn(fn)
    cluster = isinstance(client, redis.asyncio.RedisCluster)

    async def attempt() -> T:
        exec_sent = False
        try:
            async with client.pipeline(transaction=True) as pipe:
                await pipe.watch(*watched)
                try:
                    if cluster:  # as in optimistic()
                        values = [await pipe.get(k) for k in watched]
                    else:
                        values = await pipe.mget(watched)
                except UnicodeDecodeError as exc:
                    raise _not_text(client, watched) from exc
                # (A cluster client's pipeline queues writes as a Pipeline does.)
                planned = fn(Reads(_values(client, watched, values), cast("AsyncPipeline", pipe)))
                plan = _checked_plan(await planned if inspect.isawaitable(planned) else planned)
                pipe.multi()  # type: ignore[no-untyped-call]
                _queue_writes(pipe, plan.writes)
                exec_sent = True
                await pipe.execute()
                return plan.result
        except _FAILURES as error:
            raise _attempt_failed(
                error, client, "aoptimistic", watched, exec_sent=exec_sent
            ) from error

    return await aretry_optimistic(attempt, retries=retries, backoff=backoff, rng=rng, stats=stats)


# --- SQL: version-checked UPDATE ----------------------------------------------------------


def versioned_update(
    connection: Connection | Session,
    table: Table,
    id_clause: ColumnElement[bool],
    expected_version: int,
    values: Mapping[str, Any],
    version_column: str = "version",
) -> int:
    """Update one row if it is still at the version read, and bump its version.

    Runs ``UPDATE table SET values, version = version + 1 WHERE id_clause AND version =
    expected_version`` in the caller's transaction (nothing here begins or commits one).

    Args:
        connection: a SQLAlchemy ``Connection`` or ORM ``Session``.
        table: the table; it needs an integer ``version_column``.
        id_clause: identifies exactly one row, e.g. ``items.c.id == 42``.
        expected_version: the version the caller read with the values it computed from.
        values: the columns to set, by name (not the version column).
        version_column: the name of the version column.

    Returns:
        The row's new version, ``expected_version + 1``.

    Raises:
        StaleVersion: the row is at another version (``.actual``); nothing was written.
        RowMissing: no row matches ``id_clause``; nothing was written.
        ConfigurationError: ``id_clause`` names another table's rows, or matched several
            rows (they were updated in the caller's transaction: roll it back),
            ``values`` sets the version column or one the table lacks, the table has no
            ``version_column``, the row's version is NULL or not an integer, or
            ``expected_version`` is not an int.
    """
    from sqlalchemy import select, update

    from ..fencing.sql import _check_values, _check_where, _sets_column

    if (
        not isinstance(expected_version, int)
        or isinstance(expected_version, bool)
        or not -(2**63) <= expected_version < 2**63 - 1
    ):
        # (The next version must fit a BIGINT too: SQLite and PostgreSQL refuse more.)
        raise ConfigurationError(
            "expected_version", f"must be an int in [-2**63, 2**63 - 1), got {expected_version!r}"
        )
    if _sets_column(values, version_column):
        raise ConfigurationError("values", f"{version_column!r} is set by versioned_update")
    try:
        version = table.c[version_column]
    except KeyError:
        raise ConfigurationError(
            "version_column", f"table {table.name!r} has no column {version_column!r}"
        ) from None
    _check_values(table, values)
    _check_where(table, [id_clause], "id_clause")
    try:
        python_type: type | None = version.type.python_type
    except NotImplementedError:  # a custom type that does not say: let the database judge
        python_type = None
    if python_type is not None and not issubclass(python_type, (int, Decimal)):
        # PostgreSQL refuses "version = 0" on a text column raw; SQLite compares and fails
        # on every row: say it before anything is sent.
        raise ConfigurationError(
            "version_column",
            f"{table.name}.{version_column} is {version.type}, not an integer column: "
            "declare it INTEGER (or BIGINT) NOT NULL",
        )
    stmt = (
        update(table)
        .where(id_clause, version == expected_version)
        .values({**values, version_column: version + 1})
    )
    updated: int = cast(Any, connection.execute(stmt)).rowcount
    if updated == 1:
        return expected_version + 1
    row = _describe(connection, table, id_clause)
    if updated > 1:
        raise ConfigurationError("id_clause", f"{row} matched {updated} rows, not one")
    # Read in the same transaction, to say why nothing matched.
    found = connection.execute(select(version).where(id_clause)).first()
    if found is None:
        raise RowMissing(row)
    actual = found[0]
    if isinstance(actual, (Decimal, float)) and math.isfinite(actual) and actual == int(actual):
        actual = int(actual)  # a NUMERIC (or REAL) version column holding a whole number
    # A NULL or non-integer version never equals an int, so no update could ever
    # succeed: that is the table's setup, not a conflict (and not a missing row).
    if isinstance(actual, bool) or not isinstance(actual, int):
        raise ConfigurationError(
            "version_column",
            f"{row}: {version_column} is {actual!r}, not an integer: give every row an "
            f"integer version (e.g. UPDATE ... SET {version_column} = 0 WHERE "
            f"{version_column} IS NULL) and declare the column INTEGER NOT NULL",
        )
    raise StaleVersion(row, expected_version, actual)


def _describe(connection: Connection | Session, table: Table, clause: ColumnElement[bool]) -> str:
    """``items WHERE items.id = 42``, to name a row in an error."""
    from sqlalchemy import exc
    from sqlalchemy.orm import Session

    bind = connection.get_bind() if isinstance(connection, Session) else connection
    try:
        text = clause.compile(dialect=bind.dialect, compile_kwargs={"literal_binds": True})
    except (exc.CompileError, NotImplementedError):  # a type with no literal form
        text = clause.compile(dialect=bind.dialect)
    return f"{table.name} WHERE {text}"

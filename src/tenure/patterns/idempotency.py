"""Idempotency keys: a repeated request is recognised, and its effect is not applied twice.

A client that sends "deduct 100 points", times out and sends it again cannot know
whether the first one happened. If both requests carry the same idempotency key, the
server applies the effect for the first and answers the second with the first one's
recorded result. The hard part is the word *atomically*: the record that says "done"
must appear together with the effect, or a crash between them either loses the record
(the effect repeats) or keeps a record of an effect that never happened.

Theory of operation: Redis
--------------------------

One key per idempotency key, ``<namespace>:{<key>}``, holding one of::

    p:<owner>    claimed by one attempt, in progress; PX = the claim's lease
    d:<result>   done; the encoded result; PX = the retention (default one day)
    n:           done, with no result (None); PX = the retention

An attempt runs ``idem_claim.lua``: if the key is absent it sets ``p:<owner>`` with the
lease (``SET NX PX``, the owner random per attempt) and the attempt proceeds; if it holds
a record, that is the answer; if it holds another claim, the attempt waits (polls with
jittered back-off, never past the holder's lease) up to ``wait`` seconds, then raises
:class:`InProgress`. A claim whose holder crashed simply expires with its lease, and the
next attempt takes the key over. When the effect is done, ``idem_record.lua`` replaces
our claim by the record, only if the key still holds *our* claim (or nothing): a
compare-and-set, so an attempt whose lease ran out cannot overwrite the attempt that
took over. If the block raises, ``idem_release.lua`` deletes our claim, so a retry need
not wait for the lease.

**What is atomic with what.** That depends on where the effect lives:

* Effect in this Redis: :meth:`RedisOnce.apply`. The effect's writes and the record are
  queued in **one** ``MULTI``/``EXEC``, under ``WATCH`` of the idempotency key and of the
  keys the effect reads (:func:`~tenure.patterns.optimistic.optimistic`), after checking
  that the key still holds our claim. ``EXEC`` applies all of them or none: a crash
  before it leaves no effect and an expiring claim (the retry applies the effect once);
  a crash after it leaves effect and record (the retry gets the record); a takeover in
  between makes ``EXEC`` fail, and the late attempt writes nothing
  (:class:`ClaimLost`). Exactly once. (As with any ``MULTI``, a command that fails
  inside ``EXEC``, e.g. on a key of the wrong type, does not roll back the others.)
* Effect anywhere else (an API call, another database): :meth:`RedisOnce.record` after
  the effect. Claim, effect and record are three steps, and there is a window::

      attempt 1  claim ---- effect ---- (crash) ................................
      attempt 2                              wait ... lease ends: claim, effect, record

  An effect done just before a crash is done again after the takeover: at least once.
  The same happens if the lease ends while attempt 1 is still working; attempt 1's
  record then raises :class:`ClaimLost` to say so. Such an effect should therefore be
  idempotent itself (pass the idempotency key on, e.g. to a payment API), or live in the
  same SQL transaction as its record (below). The lease must exceed the effect's
  longest duration.

Theory of operation: SQL
------------------------

A table ``idempotency_keys(key PRIMARY KEY, response, created_at)``
(:func:`idempotency_table`). :meth:`SqlIdempotency.once` inserts the key **in the
caller's transaction**, the effect's writes go in the same transaction, and the result
is written to the row before commit: effect and record commit together or roll back
together, and a crash at any point leaves both or neither. Exactly once, by the
database's unique constraint.

A concurrent duplicate's INSERT meets the first one's uncommitted row. PostgreSQL and
SQLite make it wait (the row lock; SQLite's single writer) until the first transaction
ends: committed, the duplicate reads the recorded response; rolled back, the duplicate
is the first. The INSERT is ``INSERT ... ON CONFLICT (key) DO NOTHING`` there, so the
duplicate's transaction stays usable. Other databases (or ``on_conflict="savepoint"``)
insert inside a SAVEPOINT and take an ``IntegrityError`` as "already there": roll back
to the savepoint, read the response. (Not on SQLite: pysqlite's SAVEPOINT opening a
transaction commits it at RELEASE.) Under REPEATABLE READ or SERIALIZABLE, the waiting
duplicate gets a serialization failure instead; retry its transaction.

The API
-------

``with store.once(key) as once:`` gives an attempt: if ``once.done`` a previous attempt
finished and ``once.result`` is its result; otherwise this attempt holds the key, does
the effect and records the result (leaving the block normally without recording
records ``None``). :func:`idempotent` wraps a request handler in exactly that. Results
are encoded with a :class:`Codec` (JSON by default). SQLAlchemy is imported only by the
SQL half, on first use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

import redis
from redis.client import Pipeline

from .._core.policy import RetryPolicy, wait_random_exponential
from .._errors import ConfigurationError, TenureError
from .._lua import script
from .optimistic import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRIES,
    OptimisticStats,
    Plan,
    Reads,
    _check_keys,
    _queue_writes,
    optimistic,
)

if TYPE_CHECKING:
    from sqlalchemy import MetaData, Table
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

__all__ = [
    "JSON",
    "ClaimLost",
    "Codec",
    "IdempotencyStore",
    "InProgress",
    "NotClaimed",
    "Once",
    "RedisIdempotency",
    "RedisOnce",
    "SqlIdempotency",
    "SqlOnce",
    "idempotency_table",
    "idempotent",
]

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_POLL: RetryPolicy = wait_random_exponential(initial=0.005, maximum=0.25)
"""How a duplicate polls a key in progress: full jitter, up to 0.25 s between looks."""


# --- Errors -------------------------------------------------------------------------------


class InProgress(TenureError, RuntimeError):
    """Another attempt holds the idempotency key and has not finished (HTTP: 409, retry later).

    Attributes:
        key: the idempotency key.
        retry_after: seconds left on the holder's lease when last seen (after it, a
            crashed holder is taken over), or None if unknown.
        waited: how long this attempt waited before giving up, in seconds.
    """

    def __init__(
        self, key: str, retry_after: float | None, waited: float, message: str | None = None
    ) -> None:
        hint = "" if retry_after is None else f"; its lease ends in {retry_after:.3f} s"
        super().__init__(
            message
            or f"idempotency key {key!r}: another attempt is in progress{hint} "
            f"(waited {waited:.3f} s)"
        )
        self.key = key
        self.retry_after = retry_after
        self.waited = waited


class ClaimLost(TenureError, RuntimeError):
    """Our claim on an idempotency key ended (its lease ran out) and another attempt took it.

    From :meth:`RedisOnce.record`: our effect happened, and the attempt that took over
    may do it again: it was not exactly once (see the module's theory of operation).
    From :meth:`RedisOnce.apply`: nothing of ours was applied.

    Attributes:
        key: the idempotency key.
        holder: what the key holds now: ``"claim"`` (another attempt in progress) or
            ``"record"`` (another attempt finished).
    """

    def __init__(self, key: str, holder: str, message: str) -> None:
        super().__init__(f"idempotency key {key!r}: {message}")
        self.key = key
        self.holder = holder


class NotClaimed(TenureError, RuntimeError):
    """``record`` or ``apply`` on an attempt that holds no claim.

    The attempt found the key ``done`` (answer its ``result`` instead), or it has
    recorded already, or its claim was lost.

    Attributes:
        key: the idempotency key.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"idempotency key {key!r}: {message}")
        self.key = key


# --- Results and the protocol the decorator needs ------------------------------------------


@dataclass(frozen=True)
class Codec:
    """How results are stored: ``dumps(result) -> bytes`` and ``loads(bytes) -> result``.

    ``None`` is stored without the codec (as "no result"), so a codec need not handle it.
    """

    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


def _json_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


JSON = Codec(dumps=_json_dumps, loads=json.loads)
"""The default codec. Results must be JSON-serialisable; tuples come back as lists."""


class Once(Protocol):
    """One attempt at an idempotent operation, as ``store.once(key)`` yields it."""

    @property
    def done(self) -> bool:
        """True if a previous attempt finished (skip the effect, answer ``result``)."""

    @property
    def result(self) -> Any:
        """The recorded result (when ``done``), or what this attempt recorded."""

    def record(self, result: Any) -> None:
        """Record this attempt's result: later duplicates will get it."""


class IdempotencyStore(Protocol):
    """Anything :func:`idempotent` can use: ``with store.once(key) as once: ...``."""

    def once(self, key: str) -> AbstractContextManager[Once]: ...


def idempotent(
    store: IdempotencyStore, *, key: Callable[P, str | None]
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Make a request handler run at most once per idempotency key; duplicates get its result.

    Args:
        store: where keys are claimed and results recorded, e.g. :class:`RedisIdempotency`.
        key: computes the idempotency key from the handler's arguments; ``None`` (e.g.
            the request carries no key) runs the handler without idempotency.

    Returns:
        A decorator. The wrapped handler claims the key, runs, records what it returns,
        and returns it; a duplicate returns the recorded result without running. If the
        handler raises, nothing is recorded and the claim is released.

    Example::

        @idempotent(store, key=lambda request: request.headers.get("Idempotency-Key"))
        def deduct_points(request: Request) -> dict[str, int]:
            balance = ledger.deduct(request.user, request.json["points"])
            return {"balance": balance}
    """

    def decorate(handler: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(handler)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            name = key(*args, **kwargs)
            if name is None:
                return handler(*args, **kwargs)
            with store.once(name) as once:
                if once.done:
                    return cast("T", once.result)
                result = handler(*args, **kwargs)
                once.record(result)
                return result

        return wrapper

    return decorate


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigurationError("key", f"must be a non-empty string, got {key!r}")
    return key


def _seconds_to_ms(parameter: str, seconds: float) -> int:
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not (number and math.isfinite(seconds) and seconds >= 0.001):
        raise ConfigurationError(
            parameter, f"must be a number of seconds >= 0.001, got {seconds!r}"
        )
    return round(seconds * 1000)


def _check_wait(wait: float) -> float:
    number = isinstance(wait, (int, float)) and not isinstance(wait, bool)
    if not (number and math.isfinite(wait) and wait >= 0):
        raise ConfigurationError("wait", f"must be a finite number of seconds >= 0, got {wait!r}")
    return float(wait)


# --- Redis --------------------------------------------------------------------------------

_CLAIMED, _DONE, _DONE_NO_RESULT, _BUSY = 1, 2, 3, 0


@functools.cache
def _source(name: str) -> str:
    # EVAL with the source, never EVALSHA: nothing to go missing after SCRIPT FLUSH or a
    # restart (docs/architecture.md, "EVAL, not EVALSHA").
    return script(name).source.decode()


def _as_bytes(value: bytes | str) -> bytes:
    # A client made with decode_responses=True hands back str.
    return value.encode() if isinstance(value, str) else value


def _holder(value: bytes) -> str:
    """What another attempt left in the key: its ``"claim"``, or its ``"record"``."""
    return "claim" if value.startswith(b"p:") else "record"


class RedisOnce:
    """One attempt at an idempotent operation on Redis, from :meth:`RedisIdempotency.once`.

    Attributes:
        key: the idempotency key.
        done: True if a previous attempt had finished when this one began.
        result: the recorded result when ``done``; after :meth:`record` or :meth:`apply`,
            this attempt's result.
    """

    def __init__(
        self,
        store: RedisIdempotency,
        key: str,
        *,
        marker: bytes | None = None,
        done: bool = False,
        result: Any = None,
    ) -> None:
        self.key = key
        self.done = done
        self.result = result
        self._store = store
        self._redis_key = store.redis_key(key)
        self._marker = marker  # our claim; None once recorded, released, or never held

    def __repr__(self) -> str:
        state = "done" if self.done else "claimed" if self._marker else "finished"
        return f"<RedisOnce {self.key!r} {state}>"

    def _require_claim(self, action: str) -> bytes:
        if self._marker is None:
            why = "a previous attempt finished it" if self.done else "recorded or lost already"
            raise NotClaimed(self.key, f"cannot {action}: this attempt holds no claim ({why})")
        return self._marker

    def record(self, result: Any) -> None:
        """Store ``result`` as the outcome; later duplicates get it instead of running.

        Call it after the effect. Only a record that replaces our own claim is stored.

        Raises:
            ClaimLost: our lease ran out and another attempt took the key; our effect
                happened and theirs may too. Nothing was recorded.
            NotClaimed: this attempt holds no claim (``done``, or recorded already).
        """
        marker = self._require_claim("record")
        store = self._store
        status, holding = store.client.eval(
            _source("idem_record"),
            1,
            self._redis_key,
            marker,
            store._record_value(result),
            store._retention_ms,
        )
        if status != 1:
            self._marker = None  # the claim is gone: leaving the block must not record
            holder = _holder(_as_bytes(holding))
            raise ClaimLost(
                self.key,
                holder,
                f"our claim's lease ({store.lease} s) ran out and another attempt "
                f"took the key (it holds a {holder}); our effect happened and may happen "
                "again: not recorded",
            )
        self._marker = None
        self.result = result

    def apply(
        self,
        keys: Sequence[str],
        fn: Callable[[Reads[Pipeline]], Plan[T]],
        *,
        retries: int = DEFAULT_RETRIES,
        backoff: RetryPolicy = DEFAULT_BACKOFF,
        stats: OptimisticStats | None = None,
    ) -> T:
        """Apply an effect on this Redis and record its result in the same ``MULTI``/``EXEC``.

        ``fn`` reads ``keys`` and returns a :class:`~tenure.patterns.optimistic.Plan`: its
        writes are the effect, its result is recorded. Runs as
        :func:`~tenure.patterns.optimistic.optimistic` over the idempotency key and
        ``keys``, so a concurrent write to ``keys`` is retried (up to ``retries``), and the
        effect is committed only while the key holds our claim.

        Args:
            keys: the keys the effect reads (watched; read with one MGET).
            fn: computes the effect from what it read; may run several times. Raising
                from it writes nothing (and the block's exit releases the claim).
            retries, backoff, stats: as :func:`~tenure.patterns.optimistic.optimistic`.

        Returns:
            The plan's result, now recorded.

        Raises:
            ClaimLost: another attempt took the key over; nothing of ours was applied.
            ConflictError: ``keys`` kept changing; nothing was applied, the claim is kept.
            NotClaimed: this attempt holds no claim.
            Exception: whatever ``fn`` raises.

        Example (one coupon, redeemed once per request)::

            with store.once(request_id) as once:
                if once.done:
                    return once.result
                return once.apply(["coupons:SPRING"], redeem)
        """
        marker = self._require_claim("apply")
        store = self._store
        own, effect_keys = self._redis_key, _check_keys(keys)

        def guarded(reads: Reads[Pipeline]) -> Plan[T]:
            holding = reads[own]
            # Absent: our lease ran out but nobody took over. As in record(), go ahead:
            # the key is watched, so a claim landing before EXEC makes EXEC fail.
            if holding is not None and holding != marker:
                self._marker = None  # the claim is gone: leaving the block must not record
                holder = _holder(holding)
                raise ClaimLost(
                    self.key,
                    holder,
                    f"our claim's lease ({store.lease} s) ran out before the effect; "
                    f"the key holds {holder}; nothing of ours was applied",
                )
            plan = fn(Reads({k: reads[k] for k in effect_keys}, reads.reader))
            record = store._record_value(plan.result)

            def writes(tx: Pipeline) -> None:
                _queue_writes(tx, plan.writes)
                tx.set(own, record, px=store._retention_ms)

            return Plan(result=plan.result, writes=writes)

        result = optimistic(
            store.client,
            [own, *effect_keys],
            guarded,
            retries=retries,
            backoff=backoff,
            stats=stats,
        )
        self._marker = None
        self.result = result
        return result

    def _release(self) -> None:
        """Give the claim up after a failed block, so a retry need not wait for the lease."""
        marker, self._marker = self._marker, None
        if marker is None:
            return
        # The block's own exception matters more than a failed release, and the lease
        # frees the key anyway.
        with contextlib.suppress(redis.RedisError):
            self._store.client.eval(_source("idem_release"), 1, self._redis_key, marker)


class RedisIdempotency:
    """Idempotency keys on Redis: claims with a lease, results kept for a retention time.

    Args:
        client: a ``redis.Redis`` (raw bytes replies recommended); not closed by the store.
        namespace: the first part of every key: ``<namespace>:{<key>}``.
        lease: seconds a claim lasts; after it, a crashed attempt is taken over. Must
            exceed the longest effect (see the module docstring for what happens if not).
        retention: seconds a result is kept; a duplicate arriving later runs again.
        wait: default seconds a duplicate waits for an attempt in progress before
            raising :class:`InProgress` (0: raise at once).
        poll: the back-off between looks while waiting.
        codec: how results are stored (JSON by default).

    Example::

        store = RedisIdempotency(redis.Redis(), lease=30, wait=5)
        with store.once(request.headers["Idempotency-Key"]) as once:
            if once.done:
                return once.result
            receipt = payments.charge(card, amount, idempotency_key=once.key)
            once.record(receipt)
            return receipt
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str = "tenure:idem",
        lease: float = 30.0,
        retention: float = 86400.0,
        wait: float = 0.0,
        poll: RetryPolicy = DEFAULT_POLL,
        codec: Codec = JSON,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError("namespace", f"must be a non-empty string, got {namespace!r}")
        self.client = client
        self.namespace = namespace
        self._lease_ms = _seconds_to_ms("lease", lease)
        self._retention_ms = _seconds_to_ms("retention", retention)
        self.lease = lease
        self.retention = retention
        self.wait = _check_wait(wait)
        self.poll = poll
        self.codec = codec
        self._rng = random.Random()

    def redis_key(self, key: str) -> str:
        """The Redis key that holds idempotency key ``key``'s claim or record."""
        return f"{self.namespace}:{{{_check_key(key)}}}"

    def _record_value(self, result: Any) -> bytes:
        return b"n:" if result is None else b"d:" + self.codec.dumps(result)

    @contextmanager
    def once(self, key: str, *, wait: float | None = None) -> Iterator[RedisOnce]:
        """Claim ``key`` for one attempt, or find the result of the attempt that finished.

        Args:
            key: the idempotency key (e.g. the request's ``Idempotency-Key`` header).
            wait: seconds to wait for an attempt in progress; default the store's.

        Yields:
            A :class:`RedisOnce`: ``done`` with the recorded ``result``, or holding the
            claim. Leaving the block normally records ``None`` if nothing was recorded;
            leaving it with an exception releases the claim (nothing is recorded).

        Raises:
            InProgress: another attempt held the key for all of ``wait``.
            ConfigurationError: a bad ``key`` or ``wait``.
            redis.ResponseError: the key holds something that is not idempotency state.
        """
        attempt = self._claim(_check_key(key), _check_wait(self.wait if wait is None else wait))
        try:
            yield attempt
        except BaseException:
            attempt._release()
            raise
        if attempt._marker is not None:
            attempt.record(None)

    def _claim(self, key: str, wait: float) -> RedisOnce:
        """Run the claim script until it claims or finds a record, or ``wait`` runs out."""
        marker = b"p:" + secrets.token_hex(16).encode()
        started = time.monotonic()
        polls = 0
        while True:
            status, payload = self.client.eval(
                _source("idem_claim"), 1, self.redis_key(key), marker, self._lease_ms
            )
            if status == _CLAIMED:
                return RedisOnce(self, key, marker=marker)
            if status == _DONE:
                return RedisOnce(self, key, done=True, result=self.codec.loads(_as_bytes(payload)))
            if status == _DONE_NO_RESULT:
                return RedisOnce(self, key, done=True)
            lease_left = int(payload) / 1000 if int(payload) >= 0 else None
            waited = time.monotonic() - started
            if waited >= wait:
                raise InProgress(key, lease_left, waited)
            polls += 1
            delay = self.poll.delay(polls, self._rng)
            if lease_left is not None:
                # Look again no later than the holder's lease ends: if it crashed, we are
                # the one to take over.
                delay = min(delay, lease_left)
            time.sleep(max(min(delay, wait - waited), 0.001))


# --- SQL ----------------------------------------------------------------------------------


def idempotency_table(
    metadata: MetaData, name: str = "idempotency_keys", key_length: int = 255
) -> Table:
    """The table :class:`SqlIdempotency` records keys in, added to ``metadata``.

    Columns: ``key`` (VARCHAR, the primary key: the unique constraint that makes a
    duplicate fail), ``response`` (binary, the encoded result; NULL for None) and
    ``created_at`` (UTC, for :meth:`SqlIdempotency.purge`). Create it with
    ``metadata.create_all(engine)`` or your migrations.
    """
    from sqlalchemy import Column, DateTime, LargeBinary, String, Table

    return Table(
        name,
        metadata,
        Column("key", String(key_length), primary_key=True),
        Column("response", LargeBinary, nullable=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
    )


class SqlOnce:
    """One attempt at an idempotent operation in a SQL transaction (:meth:`SqlIdempotency.once`).

    Attributes:
        key: the idempotency key.
        done: True if a previous attempt's transaction had committed.
        result: the recorded result when ``done``; after :meth:`record`, this attempt's.
    """

    def __init__(
        self,
        store: SqlIdempotency,
        connection: Connection | Session,
        key: str,
        *,
        done: bool = False,
        result: Any = None,
    ) -> None:
        self.key = key
        self.done = done
        self.result = result
        self._store = store
        self._connection = connection
        self._recorded = False

    def __repr__(self) -> str:
        return f"<SqlOnce {self.key!r} {'done' if self.done else 'claimed'}>"

    def record(self, result: Any) -> None:
        """Write ``result`` to the key's row, in the caller's transaction.

        It becomes visible to duplicates when the transaction commits, together with the
        effect; if the transaction rolls back, neither happened.

        Raises:
            NotClaimed: ``done`` (a previous attempt's row), or recorded already.
        """
        if self.done or self._recorded:
            why = "a previous attempt finished it" if self.done else "it was already recorded"
            raise NotClaimed(self.key, f"cannot record: this attempt holds no claim ({why})")
        from sqlalchemy import update

        table = self._store.table
        response = None if result is None else self._store.codec.dumps(result)
        self._connection.execute(
            update(table).where(table.c.key == self.key).values(response=response)
        )
        self._recorded = True
        self.result = result


class SqlIdempotency:
    """Idempotency keys in a SQL table, inserted in the same transaction as the effect.

    Args:
        table: from :func:`idempotency_table`; default ``idempotency_keys`` in a
            ``MetaData`` of its own (``store.table.create(engine, checkfirst=True)``).
        codec: how results are stored (JSON by default).
        on_conflict: how a duplicate INSERT is detected. ``"auto"``: ``"insert"`` on
            PostgreSQL and SQLite, ``"savepoint"`` elsewhere. ``"insert"``: ``INSERT ...
            ON CONFLICT (key) DO NOTHING`` (PostgreSQL, SQLite). ``"savepoint"``: a plain
            INSERT in a SAVEPOINT, an ``IntegrityError`` rolled back to it (not SQLite).

    Example (the point deduction and its record commit together)::

        keys = SqlIdempotency()
        with engine.begin() as conn, keys.once(conn, request_key) as once:
            if once.done:
                return once.result
            conn.execute(update(accounts).where(accounts.c.id == user)
                         .values(points=accounts.c.points - 100))
            once.record({"deducted": 100})
            return once.result
    """

    def __init__(
        self, table: Table | None = None, *, codec: Codec = JSON, on_conflict: str = "auto"
    ) -> None:
        if on_conflict not in ("auto", "insert", "savepoint"):
            raise ConfigurationError(
                "on_conflict", f"must be 'auto', 'insert' or 'savepoint', got {on_conflict!r}"
            )
        if table is None:
            from sqlalchemy import MetaData

            table = idempotency_table(MetaData())
        self.table = table
        self.codec = codec
        self.on_conflict = on_conflict

    @contextmanager
    def once(self, connection: Connection | Session, key: str) -> Iterator[SqlOnce]:
        """Insert ``key`` in the caller's transaction, or find the committed result.

        Nothing here begins, commits or rolls back the caller's transaction: an exception
        from the block must roll it back (``engine.begin()`` and ``Session`` blocks do),
        which removes the key together with the effect.

        Args:
            connection: a ``Connection`` or ORM ``Session`` in the effect's transaction.
            key: the idempotency key; at most the ``key`` column's length.

        Yields:
            A :class:`SqlOnce`: ``done`` with the recorded ``result``, or new (do the
            effect on ``connection`` and :meth:`~SqlOnce.record` its result).

        Raises:
            InProgress: the key's row exists but is not visible to this transaction (a
                REPEATABLE READ snapshot older than its commit): retry the transaction.
            ConfigurationError: a bad ``key``, or ``on_conflict`` unusable on this database.
        """
        _check_key(key)
        if self._insert(connection, key):
            yield SqlOnce(self, connection, key)
            return
        yield self._recorded(connection, key)

    def _insert(self, connection: Connection | Session, key: str) -> bool:
        """Insert the key's row; False if a committed row (a duplicate) is already there."""
        from sqlalchemy import exc

        dialect = _dialect_name(connection)
        mode = self.on_conflict
        if mode == "auto":
            mode = "insert" if dialect in _ON_CONFLICT_DIALECTS else "savepoint"
        row = {"key": key, "response": None, "created_at": datetime.now(timezone.utc)}
        if mode == "insert":
            inserted: int = cast(
                Any, connection.execute(_insert_or_nothing(self.table, dialect, row))
            ).rowcount
            return inserted == 1
        if dialect == "sqlite":
            raise ConfigurationError(
                "on_conflict", "'savepoint' is unreliable with pysqlite: use 'insert'"
            )
        try:
            with connection.begin_nested():
                connection.execute(self.table.insert().values(row))
        except exc.IntegrityError:
            return False
        return True

    def _recorded(self, connection: Connection | Session, key: str) -> SqlOnce:
        from sqlalchemy import select

        table = self.table
        row = connection.execute(select(table.c.response).where(table.c.key == key)).first()
        if row is None:
            raise InProgress(
                key,
                None,
                0.0,
                f"idempotency key {key!r}: its row exists but is not visible to this "
                "transaction's snapshot; retry the transaction",
            )
        response = row[0]
        result = None if response is None else self.codec.loads(bytes(response))
        return SqlOnce(self, connection, key, done=True, result=result)

    def purge(self, connection: Connection | Session, before: datetime) -> int:
        """Delete the keys created before ``before`` (an aware datetime); returns how many.

        A duplicate of a purged key runs again: purge only keys older than any retry.
        """
        from sqlalchemy import delete

        if before.tzinfo is None:
            raise ConfigurationError("before", "must be timezone-aware (UTC)")
        # Stored in UTC (SQLite keeps no offset): compare in UTC too.
        stmt = delete(self.table).where(self.table.c.created_at < before.astimezone(timezone.utc))
        deleted: int = cast(Any, connection.execute(stmt)).rowcount
        return deleted


_ON_CONFLICT_DIALECTS = ("postgresql", "sqlite")


def _dialect_name(connection: Connection | Session) -> str:
    from sqlalchemy.orm import Session

    bind = connection.get_bind() if isinstance(connection, Session) else connection
    return bind.dialect.name


def _insert_or_nothing(table: Table, dialect: str, row: dict[str, Any]) -> Any:
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` in the dialect's spelling."""
    from sqlalchemy.dialects import postgresql, sqlite

    if dialect == "postgresql":
        return (
            postgresql.insert(table)
            .values(row)
            .on_conflict_do_nothing(index_elements=[table.c.key])
        )
    if dialect == "sqlite":
        return sqlite.insert(table).values(row).on_conflict_do_nothing(index_elements=[table.c.key])
    raise ConfigurationError(
        "on_conflict", f"'insert' needs PostgreSQL or SQLite, not {dialect}: use 'savepoint'"
    )

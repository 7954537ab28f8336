"""Idempotency keys in SQL: a unique key inserted in the effect's own transaction.

Part of :mod:`tenure.patterns.idempotency` (its module docstring is the theory of
operation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from ..._errors import ConfigurationError
from ._errors import InProgress, NotClaimed
from ._protocol import JSON, Codec, _check_codec, _check_key, _decoded, _encoded

if TYPE_CHECKING:
    from sqlalchemy import MetaData, Table
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session


def idempotency_table(
    metadata: MetaData, name: str = "idempotency_keys", key_length: int = 255
) -> Table:
    """The table :class:`SqlIdempotency` records keys in, added to ``metadata``.

    Columns: ``key`` (VARCHAR, the primary key: the unique constraint that makes a
    duplicate fail), ``response`` (binary, the encoded result; NULL for None) and
    ``created_at`` (UTC, for :meth:`SqlIdempotency.purge`). Create it with
    ``metadata.create_all(engine)`` or your migrations.

    Raises:
        ConfigurationError: ``metadata`` is no SQLAlchemy ``MetaData``, ``name`` no
            table name, ``key_length`` not an int >= 1.
    """
    from sqlalchemy import Column, DateTime, LargeBinary, MetaData, String, Table

    if not isinstance(metadata, MetaData):
        raise ConfigurationError(
            "metadata", f"must be a sqlalchemy.MetaData, e.g. MetaData(), got {metadata!r}"
        )
    if not isinstance(name, str) or not name:
        raise ConfigurationError("name", f"must be a table name (a non-empty str), got {name!r}")
    if not isinstance(key_length, int) or isinstance(key_length, bool) or key_length < 1:
        # Else taken, and the table refused only at CREATE TABLE (VARCHAR(0)).
        raise ConfigurationError("key_length", f"must be an int >= 1, got {key_length!r}")

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
            ConfigurationError: (``result``) the codec cannot encode ``result``; nothing
                was written: roll the transaction back, with the effect.
        """
        if self.done or self._recorded:
            why = "a previous attempt finished it" if self.done else "it was already recorded"
            raise NotClaimed(self.key, f"cannot record: this attempt holds no claim ({why})")
        from sqlalchemy import update

        table = self._store.table
        response = None if result is None else _encoded(self._store.codec, result)
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
        self.codec = _check_codec(codec)
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
            ConfigurationError: a bad ``key``, or ``on_conflict`` unusable on this database;
                or (``codec``) the key's row holds a record the codec cannot read
                (written by another codec): it is left alone, and the block does not run.
        """
        _check_key(key)
        # What the database would refuse with an error that aborts the caller's
        # transaction (or, on SQLite, store whatever the column says): said here.
        length = getattr(self.table.c.key.type, "length", None)
        if length is not None and len(key) > length:
            raise ConfigurationError(
                "key",
                f"is {len(key):,} characters; the table's key column holds {length}: use a "
                "digest of a longer key (or a wider column, idempotency_table(key_length=))",
            )
        if "\x00" in key:
            raise ConfigurationError("key", "holds a NUL character, which SQL text refuses")
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
        row = {"key": key, "response": None, "created_at": datetime.now(UTC)}
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
        result = (
            None
            if response is None
            else _decoded(
                self.codec,
                bytes(response),
                key,
                f"delete its row from the table {self.table.name!r}",
            )
        )
        return SqlOnce(self, connection, key, done=True, result=result)

    def purge(self, connection: Connection | Session, before: datetime) -> int:
        """Delete the keys created before ``before`` (an aware datetime); returns how many.

        A duplicate of a purged key runs again: purge only keys older than any retry.
        """
        from sqlalchemy import delete

        if before.tzinfo is None:
            raise ConfigurationError("before", "must be timezone-aware (UTC)")
        # Stored in UTC (SQLite keeps no offset): compare in UTC too.
        stmt = delete(self.table).where(self.table.c.created_at < before.astimezone(UTC))
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

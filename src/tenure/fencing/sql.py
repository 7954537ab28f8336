"""Fencing for SQL databases through SQLAlchemy: an UPDATE that checks and records the token.

Theory of operation
-------------------

A fenced row carries the highest fencing token that has written it, in a nullable
BIGINT column (``fence_token`` by default; NULL means no fenced write yet). A fenced
write is a single UPDATE that admits itself and records its token::

    UPDATE accounts SET balance = :balance, fence_token = :token
     WHERE accounts.id = :id AND (fence_token IS NULL OR fence_token <= :token)

The rule is the one of the Redis store (:mod:`tenure.fencing.redis_store`): a token
**greater than or equal to** the row's is accepted (equal is the same lease writing
again), a **lower** one is refused with :class:`~tenure.StaleToken` and nothing is
written. Tokens are ints in ``[0, 2**63)``, the range of BIGINT.

One statement is enough because a database evaluates an UPDATE's WHERE and applies its
SET under the row's write lock, and keeps that lock until the transaction ends. A
writer that queues behind a newer one is still refused: PostgreSQL in READ COMMITTED
re-checks the WHERE against the row version committed meanwhile; in REPEATABLE READ or
SERIALIZABLE it raises a serialization failure instead (retrying it then gets the
StaleToken). SQLite lets one writer in at a time.

When the UPDATE matches no row, :func:`fenced_execute` reads the row's token back in the
same transaction to tell why: a newer token holds it (``StaleToken``, with ``highest``),
or no row matched ``where`` (it returns 0, as a plain UPDATE reports, and raises nothing).
Each row matched by ``where`` is fenced on its own; name one row (its primary key) per
resource, or a multi-row update may apply to the rows that admit it and skip the rest.

The ORM: :class:`FencedMixin` and :func:`fence`
-----------------------------------------------

SQLAlchemy's ``version_id_col`` only compares for equality with the value loaded, so it
cannot express ``<=``. Instead, inside ``with fence(session, token):`` every flush runs,
on the flush's own connection and before the ORM's statements for the object:

* for each modified or deleted :class:`FencedMixin` object, a *claim*: the fenced UPDATE
  above, setting only the token, by the primary key the object was loaded with. Once it
  succeeds our transaction holds the row's write lock, so the ORM's own UPDATE or DELETE
  that follows cannot be overtaken by another writer;
* for each new one, the token goes into its INSERT.

A refused claim raises ``StaleToken`` out of the flush (out of ``flush()``, ``commit()``,
an autoflush, or the end of the ``with`` block). SQLAlchemy then rolls back the session's
transaction, as after any failed flush, so nothing of it is written, and the session
needs ``session.rollback()`` before it is used again. The cost is one extra UPDATE per
fenced object per flush.

The claim keeps the ORM's statement in order only while our transaction holds the row
lock, so a flush whose connection autocommits each statement (``isolation_level=
"AUTOCOMMIT"``, on the engine, the connection or the driver) is refused with
``ConfigurationError`` before its first claim: there a newer writer could land between
the claim and the ORM's UPDATE, and be overwritten with an older token.
:func:`fenced_execute` needs no transaction: its check and write are one statement.
With SQLAlchemy's asyncio extension, do the fenced work inside ``run_sync``.

Transactions are the caller's: nothing here begins or commits one. Writes outside a
``fence`` block, and ORM bulk statements (``session.execute(update(Model))``, which skip
the flush), are not checked: use :func:`fenced_update` / :func:`fenced_execute` for the
latter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import BigInteger, Column, ColumnElement, Table, and_, event, func, or_, select
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import update as sa_update
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.orm import (
    InstanceState,
    Mapped,
    Mapper,
    Session,
    mapped_column,
    object_session,
    scoped_session,
)
from sqlalchemy.orm.exc import StaleDataError
from sqlalchemy.sql.dml import Update

from .._errors import ConfigurationError, StaleToken

__all__ = ["MAX_SQL_TOKEN", "FencedMixin", "fence", "fenced_execute", "fenced_update"]

MAX_SQL_TOKEN = 2**63
"""Tokens must be below this, as the largest BIGINT is ``2**63 - 1``."""

_SESSION_KEY = "tenure.fence_token"  # in Session.info: the token of the active fence()


def _check_token(token: object) -> int:
    # bool is an int, but True as a token is a bug in the caller.
    if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < MAX_SQL_TOKEN:
        raise ConfigurationError("token", f"must be an int in [0, 2**63), got {token!r}")
    return token


def _admits(column: ColumnElement[Any], token: int) -> ColumnElement[bool]:
    """The fencing condition: the row has no token yet, or one no newer than ours."""
    return or_(column.is_(None), column <= token)


def _token_column(table: Table, token_column: str) -> Column[Any]:
    try:
        return table.c[token_column]
    except KeyError:
        raise ConfigurationError(
            "token_column", f"table {table.name!r} has no column {token_column!r}"
        ) from None


def _sets_column(values: Mapping[Any, Any], name: str) -> bool:
    """Whether ``values`` of an UPDATE set the column ``name``: keyed by its name, or by
    a column object, which SQLAlchemy's ``.values()`` takes too (and which would win
    over the name a fence or a version check sets)."""
    return any(
        key == name if isinstance(key, str) else getattr(key, "name", None) == name
        for key in values
    )


def _check_values(table: Table, values: Mapping[Any, Any]) -> None:
    """Refuse values for columns ``table`` lacks, before SQLAlchemy's raw CompileError
    ("Unconsumed column names") or, for another table's column object, a multi-table
    UPDATE."""
    unknown = [
        repr(key)
        if isinstance(key, str)
        else f"{getattr(getattr(key, 'table', None), 'name', '?')}.{getattr(key, 'name', key)}"
        for key in values
        if not (
            key in table.c
            if isinstance(key, str)
            else isinstance(key, Column) and key.table is table
        )
    ]
    if unknown:
        raise ConfigurationError(
            "values",
            f"table {table.name!r} has no column {', '.join(unknown)}: set only its columns "
            f"({', '.join(table.c.keys())}), by name",
        )


def _check_where(table: Table, where: Sequence[ColumnElement[bool]], parameter: str) -> None:
    """Refuse a clause on other tables: the UPDATE would become a multi-table one
    (``UPDATE t ... FROM other``), applied to every row of ``t`` whenever any row of the
    other table matched, instead of the one row meant. (A subquery on another table,
    ``t.c.owner.in_(select(...))``, stays inside the clause and is fine.)"""
    try:
        # What each clause reads FROM (a subquery's tables stay inside it): what a SELECT
        # of the clauses would list, without making one, which cost about 120 µs a write
        # (as much as the fenced UPDATE itself on SQLite).
        froms = [f for clause in where for f in clause._from_objects]
    except AttributeError:  # not a clause: let SQLAlchemy coerce it, or say why not
        froms = list(select(*table.c).where(*where).get_final_froms())
    others = list(
        dict.fromkeys(getattr(f, "name", None) or str(f) for f in froms if f is not table)
    )
    if others:
        raise ConfigurationError(
            parameter,
            f"names rows of {', '.join(map(repr, others))}, not only of {table.name!r}: "
            f"identify the row by {table.name!r}'s own columns, e.g. "
            f"{table.name}.c.id == 42 (a condition on another table goes in a subquery)",
        )


def fenced_update(
    table: Table,
    token: int,
    *where: ColumnElement[bool],
    values: Mapping[str, Any],
    token_column: str = "fence_token",
) -> Update:
    """An UPDATE of ``values`` that applies only where the row admits ``token``, and records it.

    Args:
        table: the table holding the fenced rows.
        token: the fencing token of the writer's lease.
        *where: what identifies the fenced row, e.g. ``table.c.id == 42``.
        values: the columns to set, by name.
        token_column: the BIGINT column that keeps each row's highest token.

    Returns:
        ``UPDATE table SET values, token_column = token WHERE *where AND
        (token_column IS NULL OR token_column <= token)``. Executed directly, a rowcount
        of 0 does not tell a stale token from a missing row: :func:`fenced_execute` does.

    Raises:
        ConfigurationError: a bad ``token``, no ``where`` or one that names another
            table's rows, ``values`` that set the token column or a column the table
            lacks, or a ``token_column`` the table lacks.
    """
    _check_token(token)
    column = _token_column(table, token_column)
    if not where:
        raise ConfigurationError("where", "name the fenced row, e.g. table.c.id == 42")
    if _sets_column(values, token_column):
        raise ConfigurationError("values", f"{token_column!r} is set by the fence")
    _check_values(table, values)
    _check_where(table, where, "where")
    return (
        sa_update(table)
        .where(*where, _admits(column, token))
        .values({**values, token_column: token})
    )


def fenced_execute(
    connection: Connection | Session,
    table: Table,
    token: int,
    *where: ColumnElement[bool],
    values: Mapping[str, Any],
    token_column: str = "fence_token",
) -> int:
    """Run :func:`fenced_update` in the caller's transaction and say why nothing changed.

    Args:
        connection: a ``Connection`` or ORM ``Session``, inside the caller's transaction.
        table, token, where, values, token_column: as :func:`fenced_update`.

    Returns:
        The number of rows updated; 0 if no row matched ``where`` when the update ran.

    Raises:
        StaleToken: the row holds a newer token (``.highest``); nothing was written.
        ConfigurationError: as :func:`fenced_update`; (``connection``) neither a
            ``Connection`` nor a ``Session`` (an asyncio one: call this function inside
            its ``run_sync``).
    """
    _check_runner(connection, "connection", (Connection, Session, scoped_session))
    stmt = fenced_update(table, token, *where, values=values, token_column=token_column)
    updated = _rowcount(connection.execute(stmt))
    if updated:
        return updated
    highest = _newer_token(connection, table.c[token_column], where, token)
    if highest is not None:
        raise StaleToken(_describe(connection, table, where), token, highest)
    return 0


def _check_runner(value: object, parameter: str, accepted: tuple[type, ...]) -> None:
    """Refuse what cannot run the fenced statements, before anything is sent.

    An asyncio ``AsyncSession`` or ``AsyncConnection`` would get as far as a coroutine
    nobody awaits: fenced_execute() would fail on it with an AttributeError, and fence()
    would flush nothing, leaving the block's changes to a later flush outside the fence,
    which checks no token.
    """
    if isinstance(value, accepted):
        return
    names = " or ".join(kind.__name__ for kind in accepted)
    if hasattr(value, "run_sync"):  # sqlalchemy.ext.asyncio's AsyncSession, AsyncConnection
        raise ConfigurationError(
            parameter,
            f"got an asyncio {type(value).__name__}, which runs nothing until awaited: "
            f"do the fenced work in a function of the synchronous {names} and run it with "
            f"`await {parameter}.run_sync(function)`",
        )
    raise ConfigurationError(parameter, f"must be a SQLAlchemy {names}, got {value!r}")


def _rowcount(result: Any) -> int:
    # Connection.execute and Session.execute both answer a DML statement with a
    # CursorResult; only the latter's annotation is the generic Result.
    return cast("CursorResult[Any]", result).rowcount


def _newer_token(
    connection: Connection | Session,
    column: ColumnElement[Any],
    where: Sequence[ColumnElement[bool]],
    token: int,
) -> int | None:
    """The highest token among the rows ``where`` names, if it is newer than ``token``.

    Read in the same transaction as the refused UPDATE. A row with an older (or no) token
    here appeared after the UPDATE ran, so it proves nothing stale: answer None.
    """
    highest = connection.execute(select(func.max(column)).where(*where)).scalar()
    return highest if highest is not None and highest > token else None


def _describe(
    connection: Connection | Session, table: Table, where: Sequence[ColumnElement[bool]]
) -> str:
    """``accounts WHERE accounts.id = 42``: the resource named in a StaleToken."""
    clause = and_(*where)
    dialect = (
        connection.get_bind().dialect if isinstance(connection, Session) else connection.dialect
    )
    try:
        text = clause.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
    except (sa_exc.CompileError, NotImplementedError):  # a type with no literal form
        text = clause.compile(dialect=dialect)
    return f"{table.name} WHERE {text}"


class FencedMixin:
    """Adds the ``fence_token`` column (BIGINT, nullable) that :func:`fence` checks and sets.

    Example::

        class Account(FencedMixin, Base):
            __tablename__ = "accounts"
            id: Mapped[int] = mapped_column(primary_key=True)
            balance: Mapped[int]
    """

    fence_token: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)


@contextmanager
def fence(session: Session, token: int) -> Iterator[Session]:
    """Fence every write of :class:`FencedMixin` objects that ``session`` flushes in the block.

    The block's changes are flushed when it ends (so none escapes unchecked to a later
    flush); if the block raises, nothing more is flushed, and the caller should roll the
    session back. Blocks may nest: the innermost token applies.

    Args:
        session: the ORM session; its transaction stays the caller's.
        token: the fencing token of the writer's lease.

    Yields:
        ``session``.

    Raises:
        StaleToken: a modified or deleted object's row holds a newer token. Raised by the
            flush that found it; the session's transaction has been rolled back.
        ConfigurationError: a bad ``token``; (``session``) not a ``Session`` (an
            asyncio one: use ``fence`` on the session ``run_sync`` passes its function),
            or, at the first flush of a changed or deleted object, a session whose
            connection autocommits each statement: the claim and the ORM's own UPDATE
            are two statements, and only a transaction keeps a newer writer out from
            between them.

    Example::

        with client.lock("account:42") as lease, Session(engine) as session:
            with fence(session, lease.fencing_token):
                session.get(Account, 42).balance += 10
            session.commit()
    """
    _check_runner(session, "session", (Session, scoped_session))
    _check_token(token)
    previous = session.info.get(_SESSION_KEY)
    session.info[_SESSION_KEY] = token
    try:
        yield session
        session.flush()
    finally:
        if previous is None:
            session.info.pop(_SESSION_KEY, None)
        else:
            session.info[_SESSION_KEY] = previous


def _active_token(target: object) -> int | None:
    session = object_session(target)
    return None if session is None else cast("int | None", session.info.get(_SESSION_KEY))


def _autocommits(connection: Connection) -> bool:
    """Whether each statement on ``connection`` commits on its own (no transaction)."""
    # The driver's own setting first: it also sees autocommit switched on behind
    # SQLAlchemy's back (a pool "connect" event, a creator). Asked without a round trip;
    # dialects that cannot tell raise NotImplementedError, and SQLAlchemy before 2.1
    # lacks the method.
    dbapi_connection = connection.connection.dbapi_connection
    if getattr(dbapi_connection, "in_transaction", False) is True:
        # sqlite3 inside a BEGIN of its own, as SQLAlchemy's SQLite recipe for SAVEPOINT
        # support emits on a connection whose driver-level autocommit is on.
        return False
    detect = getattr(connection.dialect, "detect_autocommit_setting", None)
    if detect is not None and dbapi_connection is not None:
        with contextlib.suppress(NotImplementedError):
            if detect(dbapi_connection):
                return True
    # What SQLAlchemy was told: execution_options(isolation_level=...) on the engine,
    # connection or session bind, or create_engine(isolation_level=...).
    level = connection.get_execution_options().get("isolation_level")
    if level is None:
        level = getattr(connection.dialect, "_on_connect_isolation_level", None)
    return level == "AUTOCOMMIT"


def _claim(mapper: Mapper[Any], connection: Connection, target: object, token: int) -> None:
    """Run the fenced UPDATE of the token alone on ``target``'s row, by its loaded key."""
    if _autocommits(connection):
        # The claim and the ORM's UPDATE are two statements, kept in order only by the
        # row lock the claim takes until the transaction ends. In autocommit the claim
        # commits at once: a newer writer's claim and write can land between the two,
        # and the ORM's UPDATE then overwrites its value and lowers the token.
        raise ConfigurationError(
            "session",
            "fence() needs the flush to run in a transaction, and this session's "
            "connection autocommits each statement (isolation_level='AUTOCOMMIT'): a "
            "newer writer could land between the fenced claim and the ORM's UPDATE and "
            "be overwritten. Bind the session to an engine or connection without "
            "AUTOCOMMIT, or use fenced_execute(), whose check and write are one statement",
        )
    column = mapper.columns["fence_token"]
    table = column.table
    if any(col.table is not table for col in mapper.primary_key):
        raise ConfigurationError(
            "FencedMixin",
            f"{mapper.class_.__name__}: fence_token must be in the primary key's table",
        )
    # The loaded identity, not the current attributes: the primary key may be changing in
    # this very flush, and the ORM's UPDATE targets the row it loaded.
    key = cast("InstanceState[Any]", sa_inspect(target)).identity or ()
    where = [col == value for col, value in zip(mapper.primary_key, key, strict=True)]
    stmt = sa_update(table).where(*where, _admits(column, token)).values({column: token})
    if _rowcount(connection.execute(stmt)):
        return
    highest = _newer_token(connection, column, where, token)
    if highest is not None:
        raise StaleToken(_describe(connection, table, where), token, highest)
    # The row vanished; SQLAlchemy would say the same about its own UPDATE.
    raise StaleDataError(f"fenced {table.name} row {key!r} matched no row")


@event.listens_for(FencedMixin, "before_insert", propagate=True)
def _stamp_new_row(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    token = _active_token(target)
    if token is not None:
        target.fence_token = token


@event.listens_for(FencedMixin, "before_update", propagate=True)
def _claim_before_update(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    token = _active_token(target)
    session = object_session(target)
    # before_update fires for every dirty object, even one with no net column change
    # (only a collection changed): such an object writes nothing to its row.
    if (
        token is None
        or session is None
        or not session.is_modified(target, include_collections=False)
    ):
        return
    _claim(mapper, connection, target, token)
    target.fence_token = token


@event.listens_for(FencedMixin, "before_delete", propagate=True)
def _claim_before_delete(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    token = _active_token(target)
    if token is not None:
        _claim(mapper, connection, target, token)

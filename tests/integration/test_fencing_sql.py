"""Fenced SQL writes on real databases: SQLite (a file) and PostgreSQL (embedded).

Every behavioural test runs on both, through the ``engine`` fixture. PostgreSQL is started
once per session on a unix socket in a temporary directory (``tenure.testing._postgres``)
and stopped at the end; tables are created and dropped around each test.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    String,
    Table,
    create_engine,
    event,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from tenure import ConfigurationError, StaleToken
from tenure.fencing.sql import MAX_SQL_TOKEN, FencedMixin, fence, fenced_execute, fenced_update
from tenure.testing._postgres import EmbeddedPostgres

THREADS = 8
WRITES = 200  # tokens 1..WRITES, shuffled and dealt to the threads


class Base(DeclarativeBase):
    pass


class Account(FencedMixin, Base):
    __tablename__ = "fencing_accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(String(50))
    balance: Mapped[int] = mapped_column(BigInteger)


# A Core table whose token column has its own name.
documents = Table(
    "fencing_documents",
    Base.metadata,
    Column("id", Integer, primary_key=True),
    Column("body", String(50)),
    Column("fence", BigInteger, nullable=True),
)

# Another table, for a where clause or a value that names the wrong one.
owners = Table("fencing_owners", Base.metadata, Column("id", Integer, primary_key=True))


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'fencing.db'}"
    else:
        url = request.getfixturevalue("postgres").url
    eng = create_engine(url)
    Base.metadata.create_all(eng)
    try:
        yield eng
    finally:
        Base.metadata.drop_all(eng)
        eng.dispose()


def insert_document(engine: Engine, body: str = "v0") -> None:
    with engine.begin() as conn:
        conn.execute(documents.insert().values(id=1, body=body, fence=None))


def write_document(engine: Engine, token: int, body: str) -> int:
    with engine.begin() as conn:
        return fenced_execute(
            conn, documents, token, documents.c.id == 1, values={"body": body}, token_column="fence"
        )


def document(engine: Engine) -> tuple[str, int | None]:
    with engine.connect() as conn:
        row = conn.execute(select(documents.c.body, documents.c.fence)).one()
    return row.body, row.fence


def insert_account(engine: Engine, account_id: int = 1, balance: int = 0) -> None:
    with Session(engine) as session:
        session.add(Account(id=account_id, owner="ada", balance=balance))
        session.commit()


def account(engine: Engine, account_id: int = 1) -> tuple[int, int | None] | None:
    with Session(engine) as session:
        acct = session.get(Account, account_id)
        return None if acct is None else (acct.balance, acct.fence_token)


def set_balance(engine: Engine, token: int, balance: int) -> None:
    """One fenced ORM unit of work: load, change, flush under the fence, commit."""
    with Session(engine) as session:
        acct = session.get(Account, 1)
        assert acct is not None
        with fence(session, token):
            acct.balance = balance
        session.commit()


# --- Core -------------------------------------------------------------------------------


def test_a_where_clause_on_another_table_is_refused_before_anything_is_written(
    engine: Engine,
) -> None:
    # "where" naming the wrong table's column compiled to a multi-table UPDATE (UPDATE
    # ... FROM fencing_owners), which fenced every row of the table at once: both
    # documents were overwritten, one write reported as two rows.
    with engine.begin() as conn:
        conn.execute(documents.insert(), [{"id": 1, "body": "a"}, {"id": 2, "body": "b"}])
        conn.execute(owners.insert().values(id=1))
    with engine.begin() as conn, pytest.raises(ConfigurationError) as info:
        fenced_execute(
            conn, documents, 5, owners.c.id == 1, values={"body": "x"}, token_column="fence"
        )
    assert info.value.parameter == "where"
    assert "fencing_owners" in str(info.value)
    assert "fencing_documents" in str(info.value)
    with engine.connect() as conn:
        rows = conn.execute(select(documents.c.body, documents.c.fence).order_by(documents.c.id))
        assert [tuple(row) for row in rows] == [("a", None), ("b", None)]


def test_a_value_for_no_column_is_refused_naming_it(engine: Engine) -> None:
    insert_document(engine)
    with engine.begin() as conn, pytest.raises(ConfigurationError) as info:
        fenced_execute(
            conn, documents, 5, documents.c.id == 1, values={"bodyy": "x"}, token_column="fence"
        )
    assert info.value.parameter == "values"
    assert "'bodyy'" in str(info.value)
    assert "fencing_documents" in str(info.value)
    assert "body" in str(info.value)  # the columns it has


def test_core_accepts_newer_and_equal_tokens(engine: Engine) -> None:
    insert_document(engine)
    assert write_document(engine, 5, "a") == 1
    assert document(engine) == ("a", 5)
    assert write_document(engine, 5, "b") == 1  # the same lease writes again
    assert document(engine) == ("b", 5)
    assert write_document(engine, 9, "c") == 1
    assert document(engine) == ("c", 9)
    top = MAX_SQL_TOKEN - 1  # the largest BIGINT round-trips exactly
    assert write_document(engine, top, "d") == 1
    assert document(engine) == ("d", top)


def test_core_refuses_older_token_and_keeps_the_row(engine: Engine) -> None:
    insert_document(engine)
    write_document(engine, 9, "newer")
    with pytest.raises(StaleToken) as info:
        write_document(engine, 8, "late")
    assert (info.value.token, info.value.highest) == (8, 9)
    assert info.value.resource.startswith("fencing_documents WHERE")
    assert "id = 1" in info.value.resource
    assert document(engine) == ("newer", 9)


def test_core_missing_row_updates_nothing(engine: Engine) -> None:
    assert write_document(engine, 3, "nobody home") == 0


def test_core_through_an_orm_session(engine: Engine) -> None:
    insert_document(engine)
    with Session(engine) as session:
        where = documents.c.id == 1
        assert (
            fenced_execute(session, documents, 4, where, values={"body": "s"}, token_column="fence")
            == 1
        )
        with pytest.raises(StaleToken):
            fenced_execute(session, documents, 3, where, values={"body": "x"}, token_column="fence")
        session.commit()
    assert document(engine) == ("s", 4)


def test_core_statement_admits_null_or_not_newer_token() -> None:
    stmt = fenced_update(
        documents, 7, documents.c.id == 1, values={"body": "x"}, token_column="fence"
    )
    sql = str(stmt.compile(compile_kwargs={"literal_binds": True}))
    head, where = sql.split(" WHERE ", 1)
    # The whole condition: a substring check also passed a WHERE that admitted more
    # (an extra "OR fence > 7" left it in place).
    assert where == (
        "fencing_documents.id = 1 AND "
        "(fencing_documents.fence IS NULL OR fencing_documents.fence <= 7)"
    )
    assert "fence=7" in head.replace(" ", "")


@pytest.mark.parametrize(
    ("change", "parameter"),
    [
        ({"token": True}, "token"),
        ({"token": -1}, "token"),
        ({"token": MAX_SQL_TOKEN}, "token"),
        ({"token": 1.0}, "token"),
        ({"where": ()}, "where"),
        ({"values": {"fence": 3}}, "values"),
        # The column object, which SQLAlchemy's .values() takes too, and which would win
        # over the token the fence sets.
        ({"values": {documents.c.fence: 2**62, "body": "x"}}, "values"),
        ({"token_column": "fence_token"}, "token_column"),
        # A raw CompileError ("Unconsumed column names") when executed, before.
        ({"values": {"bodyy": "x"}}, "values"),
        ({"values": {owners.c.id: 3}}, "values"),
        # A multi-table UPDATE: every row of the table that admits the token (below).
        ({"where": (owners.c.id == 1,)}, "where"),
        ({"where": (documents.c.id == 1, owners.c.id == documents.c.id)}, "where"),
    ],
)
def test_core_rejects_bad_arguments(change: dict[str, object], parameter: str) -> None:
    args: dict[str, object] = {
        "token": 1,
        "where": (documents.c.id == 1,),
        "values": {"body": "x"},
        "token_column": "fence",
    }
    args.update(change)
    with pytest.raises(ConfigurationError) as info:
        fenced_update(
            documents,
            args["token"],  # type: ignore[arg-type]
            *args["where"],  # type: ignore[misc]
            values=args["values"],  # type: ignore[arg-type]
            token_column=args["token_column"],  # type: ignore[arg-type]
        )
    assert info.value.parameter == parameter


# --- ORM --------------------------------------------------------------------------------


def test_orm_accepts_newer_and_equal_tokens(engine: Engine) -> None:
    insert_account(engine)
    assert account(engine) == (0, None)  # written outside any fence: no token yet
    set_balance(engine, 5, 10)
    assert account(engine) == (10, 5)
    set_balance(engine, 5, 20)
    assert account(engine) == (20, 5)
    set_balance(engine, 6, 30)
    assert account(engine) == (30, 6)


def test_orm_stale_write_raises_and_its_transaction_writes_nothing(engine: Engine) -> None:
    insert_account(engine)
    set_balance(engine, 5, 10)
    with Session(engine) as session:
        acct = session.get(Account, 1)  # holder A (token 5) reads ...
        assert acct is not None
        set_balance(engine, 6, 20)  # ... holder B (token 6) writes meanwhile ...
        session.add(Account(id=2, owner="bob", balance=1))  # (same transaction as A's write)
        with pytest.raises(StaleToken) as info, fence(session, 5):
            acct.balance = 999  # ... and A's late write is refused when it is flushed.
        assert (info.value.token, info.value.highest) == (5, 6)
        assert info.value.resource == "fencing_accounts WHERE fencing_accounts.id = 1"
        session.rollback()
    assert account(engine) == (20, 6)
    assert account(engine, 2) is None  # nothing of the failed flush was written


def test_orm_stale_delete_is_refused(engine: Engine) -> None:
    insert_account(engine)
    set_balance(engine, 6, 20)
    with Session(engine) as session:
        acct = session.get(Account, 1)
        with pytest.raises(StaleToken), fence(session, 5):
            session.delete(acct)
        session.rollback()
        with fence(session, 6):
            session.delete(session.get(Account, 1))
        session.commit()
    assert account(engine) is None


def test_orm_insert_records_the_token(engine: Engine) -> None:
    with Session(engine) as session:
        with fence(session, 7):
            session.add(Account(id=3, owner="cy", balance=0))
        session.commit()
    assert account(engine, 3) == (0, 7)


def test_orm_unchanged_object_is_not_claimed(engine: Engine) -> None:
    insert_account(engine)
    set_balance(engine, 6, 20)
    with Session(engine) as session:
        acct = session.get(Account, 1)
        assert acct is not None
        with fence(session, 1):  # stale, but it writes nothing
            acct.balance = acct.balance
        session.commit()
    assert account(engine) == (20, 6)


def test_orm_writes_outside_a_fence_are_not_checked(engine: Engine) -> None:
    insert_account(engine)
    set_balance(engine, 6, 20)
    with Session(engine) as session:
        acct = session.get(Account, 1)
        assert acct is not None
        acct.balance = 21
        session.commit()
    assert account(engine) == (21, 6)


# --- Concurrent writers -----------------------------------------------------------------


def run_writers(write: Callable[[int], object]) -> None:
    """``write(token)`` for tokens 1..WRITES, shuffled, from THREADS threads at once.

    Every write must be accepted or refused with a StaleToken naming a higher token.
    """
    tokens = list(range(1, WRITES + 1))
    random.shuffle(tokens)
    start = threading.Barrier(THREADS)
    accepted: list[int] = []  # list.append is atomic
    refused: list[tuple[int, int | None]] = []

    def worker(mine: list[int]) -> None:
        start.wait()
        for token in mine:
            try:
                write(token)
            except StaleToken as stale:
                refused.append((token, stale.highest))
            else:
                accepted.append(token)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(worker, [tokens[i::THREADS] for i in range(THREADS)]))
    assert len(accepted) + len(refused) == WRITES
    assert refused  # shuffled tokens: some writes must come too late
    assert all(highest is not None and highest > token for token, highest in refused)


def test_core_concurrent_writers_end_with_the_highest_token(engine: Engine) -> None:
    insert_document(engine)
    run_writers(lambda token: write_document(engine, token, f"v{token}"))
    # The value is the one written together with the highest token: one statement.
    assert document(engine) == (f"v{WRITES}", WRITES)


def test_orm_concurrent_writers_end_with_the_highest_token(engine: Engine) -> None:
    insert_account(engine)
    run_writers(lambda token: set_balance(engine, token, token))
    assert account(engine) == (WRITES, WRITES)


# --- Sessions that cannot keep the fence --------------------------------------------


def _autocommit_engine(engine: Engine, how: str) -> Engine:
    """``engine``'s database, with every statement committed on its own, set ``how``."""
    if how == "execution_options":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    if how == "create_engine":
        return create_engine(engine.url, isolation_level="AUTOCOMMIT")
    # Behind SQLAlchemy's back: the driver's own switch, flipped as each connection opens.
    driver = create_engine(engine.url)

    @event.listens_for(driver, "connect")
    def autocommit(dbapi_connection: Any, record: object) -> None:
        if engine.dialect.name == "sqlite":
            dbapi_connection.isolation_level = None
        else:
            dbapi_connection.autocommit = True

    return driver


@pytest.mark.parametrize("how", ["execution_options", "create_engine", "driver"])
def test_orm_fence_refuses_an_autocommit_session(engine: Engine, how: str) -> None:
    # Holder A (token 5) flushes in autocommit; holder B (token 6) writes between A's
    # claim and A's own UPDATE, which nothing then holds back. Before the refusal, A's
    # UPDATE overwrote B's balance and set the token back to 5.
    insert_account(engine)
    set_balance(engine, 4, 10)
    autocommit = _autocommit_engine(engine, how)
    newer_wrote = threading.Event()

    def newer_writer(conn: Any, cursor: Any, statement: str, *rest: object) -> None:
        if statement.startswith("UPDATE fencing_accounts SET balance") and not newer_wrote.is_set():
            newer_wrote.set()
            worker = threading.Thread(target=set_balance, args=(engine, 6, 600))
            worker.start()
            worker.join(10)

    event.listen(autocommit, "before_cursor_execute", newer_writer)
    refused: ConfigurationError | None = None
    try:
        with Session(autocommit) as session:
            acct = session.get(Account, 1)
            assert acct is not None
            try:
                with fence(session, 5):
                    acct.balance = 500
                session.commit()
            except ConfigurationError as exc:
                refused = exc
                session.rollback()
    finally:
        event.remove(autocommit, "before_cursor_execute", newer_writer)
        if autocommit is not engine:
            autocommit.dispose()
    # Refused before its claim: nothing written, and B never had to run. (Unrefused, the
    # row ended as (500, 5): A's balance over B's, and the token gone back from 6 to 5.)
    assert account(engine) == (10, 4)
    assert refused is not None
    assert refused.parameter == "session"
    assert "AUTOCOMMIT" in str(refused)
    assert "fenced_execute" in str(refused)


def test_core_fenced_execute_works_in_autocommit(engine: Engine) -> None:
    # One statement: no transaction is needed to keep the check and the write together.
    insert_document(engine)
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        where = documents.c.id == 1
        fenced_execute(conn, documents, 6, where, values={"body": "b"}, token_column="fence")
        with pytest.raises(StaleToken):
            fenced_execute(conn, documents, 5, where, values={"body": "a"}, token_column="fence")
    assert document(engine) == ("b", 6)


def test_orm_fence_accepts_sqlite_in_a_begin_of_its_own(tmp_path: Path) -> None:
    # SQLAlchemy's SQLite recipe for SAVEPOINT support: the driver's autocommit on, and
    # a BEGIN emitted by SQLAlchemy. That is a transaction, so the fence holds there.
    eng = create_engine(f"sqlite:///{tmp_path / 'recipe.db'}")

    @event.listens_for(eng, "connect")
    def driver_autocommit(dbapi_connection: Any, record: object) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(eng, "begin")
    def begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    Base.metadata.create_all(eng)
    try:
        insert_account(eng)
        set_balance(eng, 6, 20)
        with pytest.raises(StaleToken):
            set_balance(eng, 5, 10)
        assert account(eng) == (20, 6)
    finally:
        eng.dispose()


class _AsyncLike:
    """What fence() and fenced_execute() see of an AsyncSession or AsyncConnection
    (sqlalchemy.ext.asyncio needs greenlet and an asyncio driver): ``run_sync``, and
    methods that return coroutines."""

    def __init__(self) -> None:
        self.info: dict[str, object] = {}

    async def run_sync(self, fn: Callable[..., object]) -> object:  # pragma: no cover
        return fn(self)


@pytest.mark.parametrize("runner", [_AsyncLike(), None, "sqlite://"])
def test_sql_helpers_refuse_what_cannot_run_them(runner: object) -> None:
    with pytest.raises(ConfigurationError) as info, fence(runner, 5):  # type: ignore[arg-type]
        pass
    assert info.value.parameter == "session"
    with pytest.raises(ConfigurationError) as info:
        fenced_execute(runner, documents, 5, documents.c.id == 1, values={}, token_column="fence")  # type: ignore[arg-type]
    assert info.value.parameter == "connection"
    if isinstance(runner, _AsyncLike):
        assert "run_sync" in str(info.value)


def test_sql_helpers_refuse_an_engine(engine: Engine) -> None:
    with pytest.raises(ConfigurationError, match="Session"), fence(engine, 5):  # type: ignore[arg-type]
        pass
    with pytest.raises(ConfigurationError, match="Connection or Session"):
        fenced_execute(engine, documents, 5, documents.c.id == 1, values={}, token_column="fence")  # type: ignore[arg-type]

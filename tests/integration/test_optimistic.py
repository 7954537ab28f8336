"""Optimistic concurrency on real servers: Redis WATCH/MULTI/EXEC and versioned SQL updates.

Redis behaviour runs through both drivers (``optimistic`` and ``aoptimistic``) with one
test body (the ``run`` fixture). SQL behaviour runs on SQLite (a file) and PostgreSQL
(embedded, ``tenure.testing._postgres``) through the ``sql_url`` fixture.

The contention tests run K processes (forkserver, started once per module) that each,
many times, increment one counter and try to sell one unit of a limited stock, all
through the pattern under test.
An update lost to a race would show as a final counter below the number of successful
increments, or as more units sold than there were; the conflicts the retry loops absorbed
are counted and must be there (K processes on one key do collide).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import traceback
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session
from sqlalchemy.orm.exc import StaleDataError

from tenure import ConfigurationError, StoreRefused, StoreUnavailable, wait_random
from tenure.patterns import (
    ConflictError,
    OptimisticStats,
    Plan,
    Reads,
    RowMissing,
    StaleVersion,
    aoptimistic,
    aretry_optimistic,
    optimistic,
    retry_optimistic,
    versioned_update,
)
from tenure.testing import LocalCluster, LocalRedisCluster
from tenure.testing._postgres import EmbeddedPostgres

K = 6  # processes
ROUNDS = 30  # per process: one increment and one sale attempt each
STOCK = 100  # fewer units than K * ROUNDS sale attempts: some must find it sold out
RETRIES = 200  # generous: contention tests check exact totals, not the bound

# forkserver: fork() from a possibly multi-threaded pytest process is unsafe.
_ctx = multiprocessing.get_context("forkserver")

metadata = MetaData()
items = Table(
    "optimistic_items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(40)),
    Column("value", Integer, nullable=False),
    Column("version", Integer, nullable=False),
)
# Another table, for an id_clause or a value that names the wrong one.
shelves = Table("optimistic_shelves", metadata, Column("id", Integer, primary_key=True))


class SoldOut(Exception):
    pass


# --- Fixtures -----------------------------------------------------------------------------


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key no other test uses (the node is shared by the module)."""
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


class Run:
    """``run(keys, fn, **options)``: optimistic() or aoptimistic(), called the same way."""

    def __init__(self, flavour: str, url: str, raw: redis.Redis) -> None:
        self.flavour = flavour
        self.raw = raw
        self.loop = asyncio.new_event_loop() if flavour == "async" else None
        self.client = redis.asyncio.Redis.from_url(url) if flavour == "async" else None

    def __call__(self, keys: Any, fn: Callable[[Reads[Any]], Any], **options: Any) -> Any:
        if self.loop is None:
            return optimistic(self.raw, keys, fn, **options)
        assert self.client is not None
        return self.loop.run_until_complete(aoptimistic(self.client, keys, fn, **options))

    def close(self) -> None:
        if self.loop is not None:
            assert self.client is not None
            self.loop.run_until_complete(self.client.aclose())
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest, node: LocalCluster, raw: redis.Redis) -> Iterator[Run]:
    runner = Run(request.param, node.urls[0], raw)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'optimistic.db'}"
    url: str = request.getfixturevalue("postgres").url
    return url


@pytest.fixture
def engine(sql_url: str) -> Iterator[Engine]:
    eng = create_engine(sql_url)
    metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            insert(items),
            [
                {"id": 1, "name": "counter", "value": 0, "version": 0},
                {"id": 2, "name": "stock", "value": STOCK, "version": 0},
            ],
        )
    try:
        yield eng
    finally:
        metadata.drop_all(eng)
        eng.dispose()


# --- Plans used by the tests and the worker processes -------------------------------------


def increment(key: str) -> Callable[[Reads[Any]], Plan[int]]:
    def plan(reads: Reads[Any]) -> Plan[int]:
        value = reads.int(key) + 1
        return Plan(result=value, writes={key: value})

    return plan


def sell(key: str) -> Callable[[Reads[Any]], Plan[int]]:
    """Take one unit; never below zero: refuse by raising."""

    def plan(reads: Reads[Any]) -> Plan[int]:
        left = reads.int(key)
        if left <= 0:
            raise SoldOut
        return Plan(result=left - 1, writes={key: left - 1})

    return plan


def interfering(
    other: redis.Redis, key: str, calls: list[int]
) -> Callable[[Reads[Any]], Plan[int]]:
    """A plan whose key is written by another client between the read and EXEC: a real conflict."""

    def plan(reads: Reads[Any]) -> Plan[int]:
        calls.append(1)
        other.incr(key)
        return Plan(result=0, writes={key: -1})

    return plan


# --- Redis: behaviour (sync and async) ----------------------------------------------------


def test_commits_the_plan_and_returns_its_result(run: Run, raw: redis.Redis, key: str) -> None:
    stats = OptimisticStats()
    assert [run([key], increment(key), stats=stats) for _ in range(3)] == [1, 2, 3]
    assert raw.get(key) == b"3"
    assert (stats.attempts, stats.conflicts, stats.committed, stats.gave_up) == (3, 0, 3, 0)


def test_fn_raising_writes_nothing_and_propagates(run: Run, raw: redis.Redis, key: str) -> None:
    raw.set(key, 0)
    stats = OptimisticStats()
    with pytest.raises(SoldOut):
        run([key], sell(key), stats=stats)
    assert raw.get(key) == b"0"
    assert (stats.attempts, stats.conflicts) == (1, 0)  # never retried


@pytest.mark.parametrize("retries", [0, 3])
def test_the_bound_is_respected(run: Run, node: LocalCluster, key: str, retries: int) -> None:
    calls: list[int] = []
    stats = OptimisticStats()
    with node[0].client() as other, pytest.raises(ConflictError) as info:
        run([key], interfering(other, key, calls), retries=retries, stats=stats)
    assert info.value.attempts == retries + 1 == len(calls)
    assert info.value.keys == (key,)
    assert isinstance(info.value.__cause__, ConflictError)
    assert (stats.attempts, stats.conflicts, stats.committed, stats.gave_up) == (
        retries + 1,
        retries + 1,
        0,
        1,
    )


def test_a_conflict_is_retried_from_a_fresh_read(
    run: Run, node: LocalCluster, raw: redis.Redis, key: str
) -> None:
    raw.set(key, 10)
    seen: list[int] = []

    with node[0].client() as other:

        def plan(reads: Reads[Any]) -> Plan[int]:
            seen.append(reads.int(key))
            if len(seen) == 1:
                other.incr(key)  # someone else's update lands during our first attempt
            return Plan(result=reads.int(key) + 1, writes={key: reads.int(key) + 1})

        stats = OptimisticStats()
        assert run([key], plan, backoff=wait_random(0, 0.001), stats=stats) == 12
    assert seen == [10, 11]
    assert raw.get(key) == b"12"  # both updates survive
    assert (stats.attempts, stats.conflicts) == (2, 1)


class _Broken:
    """A back-off policy whose delay is no number of seconds."""

    def __init__(self, value: object) -> None:
        self.value = value

    def delay(self, attempt: int, rng: Any) -> float:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value  # type: ignore[return-value]


@pytest.mark.parametrize("value", [float("nan"), -1.0, 1e300, "0.1", RuntimeError("bug")])
def test_a_backoff_that_gives_no_delay_is_a_clear_error(
    run: Run, node: LocalCluster, key: str, value: object
) -> None:
    # It was a raw ValueError or OverflowError from the sleep, or the policy's own error.
    calls: list[int] = []
    with node[0].client() as other, pytest.raises(ConfigurationError) as info:
        run([key], interfering(other, key, calls), retries=3, backoff=_Broken(value))
    assert info.value.parameter == "backoff"
    assert len(calls) == 1  # nothing retried after the policy failed


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_retry_optimistic_refuses_what_is_no_function_or_exception_class(twin: str) -> None:
    # Both were raw TypeErrors: fn's at its first call, retry_on's only at the first
    # exception fn raised (which it then hid).
    def call(fn: Any, **options: Any) -> object:
        if twin == "sync":
            return retry_optimistic(fn, **options)
        return asyncio.run(aretry_optimistic(fn, **options))

    for fn in (None, "redeem"):
        with pytest.raises(ConfigurationError, match="must be a function") as info:
            call(fn)
        assert info.value.parameter == "fn"
    for retry_on in ("ConflictError", (ConflictError, 42), None):
        with pytest.raises(ConfigurationError, match="exception classes") as info:
            call(lambda: None, retry_on=retry_on)
        assert info.value.parameter == "retry_on"
    assert call(_async_one if twin == "async" else lambda: 1, retry_on=ValueError) == 1


async def _async_one() -> int:
    return 1


def test_a_plan_without_writes_is_still_confirmed(run: Run, node: LocalCluster, key: str) -> None:
    """A result computed from the reads (here: "sold out") must hold at EXEC too."""
    calls: list[int] = []
    with node[0].client() as other:

        def plan(reads: Reads[Any]) -> Plan[str]:
            calls.append(1)
            if len(calls) == 1:
                other.set(key, 5)
            return Plan(result="sold out" if reads.int(key) == 0 else "in stock")

        assert run([key], plan) == "in stock"
    assert len(calls) == 2


def test_writes_may_be_a_function_and_delete(run: Run, raw: redis.Redis, key: str) -> None:
    raw.set(f"{key}:gone", 1)

    def plan(reads: Reads[Any]) -> Plan[None]:
        def writes(tx: Any) -> None:
            tx.hincrby(f"{key}:cart", "n", 2)
            tx.delete(f"{key}:gone")

        return Plan(result=None, writes=writes)

    run([key], plan)
    run([key], lambda reads: Plan(result=None, writes={f"{key}:x": "y", f"{key}:cart": None}))
    assert raw.exists(f"{key}:cart", f"{key}:gone") == 0
    assert raw.get(f"{key}:x") == b"y"


def test_reads_of_other_types_go_through_the_reader(run: Run, raw: redis.Redis, key: str) -> None:
    raw.hset(key, mapping={"points": 7})

    def sync_plan(reads: Reads[Any]) -> Plan[int]:
        assert reads[key] is None  # MGET answers nil for a hash
        points = int(reads.reader.hget(key, "points"))
        return Plan(result=points, writes=lambda tx: tx.hset(key, "points", points - 1))

    async def async_plan(reads: Reads[Any]) -> Plan[int]:
        points = int(await reads.reader.hget(key, "points"))
        return Plan(result=points, writes=lambda tx: tx.hset(key, "points", points - 1))

    assert run([key], sync_plan if run.flavour == "sync" else async_plan) == 7
    assert raw.hget(key, "points") == b"6"


def test_bad_arguments_are_refused(run: Run, key: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        run(key, increment(key))  # one string, not a sequence of keys
    assert info.value.parameter == "keys"
    for retries in (-1, 10**20):  # (the second, accepted, was an endless loop in practice)
        with pytest.raises(ConfigurationError) as info:
            run([key], increment(key), retries=retries)
        assert info.value.parameter == "retries"
    with pytest.raises(ConfigurationError) as info:
        run([key], lambda reads: Plan(result=None, writes=[("a", 1)]))  # type: ignore[arg-type]
    assert info.value.parameter == "writes"
    # A value redis-py refuses (raw, the transaction half queued), and a key that is not
    # UTF-8 text (a lone surrogate, as os.fsdecode() makes): said before anything is sent.
    with pytest.raises(ConfigurationError) as info:
        run([key], lambda reads: Plan(result=None, writes={key: True}))
    assert info.value.parameter == "writes"
    with pytest.raises(ConfigurationError) as info:
        run([key, "caf\udce9"], increment(key))
    assert info.value.parameter == "keys"
    # No sequence, no function: a raw TypeError, the second from inside the first attempt.
    for keys in (None, 42):
        with pytest.raises(ConfigurationError, match="sequence of key names") as info:
            run(keys, increment(key))
        assert info.value.parameter == "keys"
    for fn in (None, "increment"):
        with pytest.raises(ConfigurationError, match="must be a function") as info:
            run([key], fn)  # type: ignore[arg-type]
        assert info.value.parameter == "fn"


def _on_a_decoding_client(
    url: str, flavour: str, keys: list[str], plan: Callable[[Reads[Any]], Plan[Any]], **options: Any
) -> None:
    """``optimistic`` (or ``aoptimistic``) of ``keys`` through a client made with
    ``decode_responses=True`` and ``options``."""
    if flavour == "sync":
        with redis.Redis.from_url(url, decode_responses=True, **options) as client:
            optimistic(client, keys, plan)
        return

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(url, decode_responses=True, **options)
        try:
            await aoptimistic(client, keys, plan)
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_decoding_client_on_bytes_that_are_not_text_is_a_clear_error(
    node: LocalCluster, raw: redis.Redis, key: str, flavour: str
) -> None:
    """A client made with ``decode_responses=True`` reads a watched value that is not
    UTF-8 text: redis-py's raw ``UnicodeDecodeError`` escaped from the read."""
    raw.set(key, b"\xff\xfe")
    ran: list[object] = []

    def plan(reads: Reads[Any]) -> Plan[None]:
        ran.append(reads[key])
        return Plan(None, {key: b"x"})

    with pytest.raises(ConfigurationError) as info:
        _on_a_decoding_client(node.urls[0], flavour, [key], plan)
    assert info.value.parameter == "client"
    assert "decode_responses=False" in str(info.value)
    assert ran == []  # fn never saw a value, and nothing was written
    assert raw.get(key) == b"\xff\xfe"


def test_fn_that_returns_no_plan_is_a_clear_error(run: Run, raw: redis.Redis, key: str) -> None:
    # It was a raw AttributeError ("'int' object has no attribute 'writes'").
    raw.set(key, 5)
    for answer in (4, None, {key: 4}):
        with pytest.raises(ConfigurationError) as info:
            run([key], lambda reads, answer=answer: answer)  # type: ignore[misc]
        assert info.value.parameter == "fn"
        assert "Plan" in str(info.value)
    assert raw.get(key) == b"5"


def test_a_lost_connection_is_not_a_conflict() -> None:
    """redis-py reports a connection lost while watching as a WatchError; it is not retried.

    Retrying it would be wrong: had EXEC been sent, the writes may have been applied.
    """
    with LocalCluster(1) as doomed:
        calls: list[int] = []

        def plan(reads: Reads[Any]) -> Plan[int]:
            calls.append(1)
            doomed[0].kill()
            return Plan(result=1, writes={"k": 1})

        sync = redis.Redis.from_url(doomed.urls[0])
        aclient = redis.asyncio.Redis.from_url(doomed.urls[0])
        loop = asyncio.new_event_loop()
        try:
            with pytest.raises(StoreUnavailable) as info:
                optimistic(sync, ["k"], plan)
            assert calls == [1]
            # Killed before EXEC was sent, which then failed: it may have reached Redis.
            assert (info.value.operation, info.value.maybe_applied) == ("EXEC", True)
            assert isinstance(info.value.__cause__, redis.WatchError)
            doomed[0].start()
            calls.clear()
            with pytest.raises(StoreUnavailable) as info:
                loop.run_until_complete(aoptimistic(aclient, ["k"], plan))
            assert calls == [1]
            assert (info.value.operation, info.value.maybe_applied) == ("EXEC", True)
            # Down before the call: nothing was sent, nothing written.
            doomed[0].kill()
            with pytest.raises(StoreUnavailable, match="nothing was written") as info:
                optimistic(sync, ["k"], plan)
            assert (info.value.operation, info.value.maybe_applied) == ("WATCH/read", False)
            assert isinstance(info.value.__cause__, redis.ConnectionError)
            with pytest.raises(StoreUnavailable, match="nothing was written") as info:
                loop.run_until_complete(aoptimistic(aclient, ["k"], plan))
            assert not info.value.maybe_applied
            assert calls == [1]
        finally:
            sync.close()
            loop.run_until_complete(aclient.aclose())
            loop.close()


def test_a_write_refused_inside_exec_is_a_store_refusal(
    run: Run, raw: redis.Redis, key: str
) -> None:
    # It was a raw redis.ResponseError (WRONGTYPE), retried by nobody, with the other
    # queued write applied: the error says so.
    other = f"{key}-other"
    raw.set(key, "a string")

    def plan(reads: Reads[Any]) -> Plan[int]:
        return Plan(result=1, writes=lambda tx: (tx.set(other, 1), tx.hincrby(key, "n", 1)))

    with pytest.raises(StoreRefused, match="does not roll back") as info:
        run([key], plan)
    assert info.value.reply.startswith("WRONGTYPE")
    assert info.value.lasting
    assert info.value.operation == "EXEC"
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert raw.get(other) == b"1"


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_client_decoding_with_an_encoding_that_is_not_ascii_is_refused(
    node: LocalCluster, raw: redis.Redis, key: str, flavour: str
) -> None:
    """redis-py decodes every reply with the client's encoding, the server's own "OK"
    too: with utf-16 not even a PING works, and redis-py's raw UnicodeDecodeError
    escaped from the first read."""
    ran: list[object] = []

    def plan(reads: Reads[Any]) -> Plan[None]:
        ran.append(reads[key])
        return Plan(None, {key: b"x"})

    with pytest.raises(ConfigurationError) as info:
        _on_a_decoding_client(node.urls[0], flavour, [key], plan, encoding="utf-16")
    assert info.value.parameter == "client"
    text = str(info.value)
    assert "encoding 'utf-16'" in text, text
    assert "decode_responses=False" in text, text  # the fix
    assert ran == []
    assert raw.get(key) is None


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_client_decoding_latin_1_hands_fn_the_bytes_stored(
    node: LocalCluster, raw: redis.Redis, key: str, flavour: str
) -> None:
    """fn gets the watched values as bytes from a decoding client too: they were
    re-encoded as UTF-8 whatever the client had decoded them with, so a latin-1 client
    handed fn b"\xc3\xa9\xc3\xbf" for the b"\xe9\xff" stored."""
    raw.set(key, b"\xe9\xff")
    seen: list[bytes | None] = []

    def plan(reads: Reads[Any]) -> Plan[None]:
        seen.append(reads[key])
        return Plan(None, {})

    _on_a_decoding_client(node.urls[0], flavour, [key], plan, encoding="latin-1")
    assert seen == [b"\xe9\xff"]


def test_a_cluster_clients_own_refusal_is_a_store_refusal() -> None:
    # redis-py's cluster client refuses keys of one transaction in several slots with a
    # RedisClusterException, which is no RedisError: it escaped raw.
    with LocalRedisCluster(replicas=0) as cluster:
        master = cluster.masters()[0]
        port = master.port
        assert port is not None  # a TCP node
        client = redis.RedisCluster(host=master.host, port=port)
        try:
            with pytest.raises(StoreRefused, match="hash tag") as info:
                optimistic(client, ["stock:a", "stock:b"], lambda reads: Plan(result=1))
            assert info.value.lasting
            assert isinstance(info.value.__cause__, redis.exceptions.RedisClusterException)
            # Keys that share a slot go through on the same client: read (a cluster
            # pipeline refuses MGET: that refusal alone stopped every optimistic() on a
            # cluster), written, committed.
            keys = ["{stock}:a", "{stock}:b"]
            client.set("{stock}:a", 5)

            def sell(reads: Reads[Any]) -> Plan[int]:
                left = int(reads["{stock}:a"] or 0) - 1
                return Plan(result=left, writes={"{stock}:a": left, "{stock}:b": "sold"})

            assert optimistic(client, keys, sell) == 4
            assert client.get("{stock}:a") == b"4"
            assert client.get("{stock}:b") == b"sold"

            async def sell_async() -> int:
                aclient = redis.asyncio.RedisCluster(host=master.host, port=port)
                try:
                    return await aoptimistic(aclient, keys, sell)
                finally:
                    await aclient.aclose()

            assert asyncio.run(sell_async()) == 3
        finally:
            client.close()


# --- SQL: versioned_update ----------------------------------------------------------------


def read_item(conn: Any, item_id: int) -> tuple[int, int]:
    row = conn.execute(select(items.c.value, items.c.version).where(items.c.id == item_id)).one()
    return row.value, row.version


def test_versioned_update_bumps_the_version(engine: Engine) -> None:
    with engine.begin() as conn:
        assert versioned_update(conn, items, items.c.id == 1, 0, {"value": 5}) == 1
        assert versioned_update(conn, items, items.c.id == 1, 1, {"value": 6}) == 2
    with engine.connect() as conn:
        assert read_item(conn, 1) == (6, 2)


def test_versioned_update_refuses_a_stale_version(engine: Engine) -> None:
    with engine.begin() as conn:
        versioned_update(conn, items, items.c.id == 1, 0, {"value": 5})
    with engine.begin() as conn, pytest.raises(StaleVersion) as info:
        versioned_update(conn, items, items.c.id == 1, 0, {"value": 99})
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert info.value.row == "optimistic_items WHERE optimistic_items.id = 1"
    assert info.value.keys == (info.value.row,)
    assert isinstance(info.value, ConflictError)
    with engine.connect() as conn:
        assert read_item(conn, 1) == (5, 1)


def test_versioned_update_reports_a_missing_row(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(RowMissing) as info:
        versioned_update(conn, items, items.c.id == 42, 0, {"value": 1})
    assert "optimistic_items.id = 42" in info.value.row
    assert isinstance(info.value, LookupError)
    assert not isinstance(info.value, ConflictError)  # not retried


def test_versioned_update_refuses_bad_arguments(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, items.c.id == 1, 0, {"version": 7})
        assert info.value.parameter == "values"
        # The column object, which SQLAlchemy's .values() takes too, and which would win
        # over the version the check sets (a lost update for the next writer).
        with pytest.raises(ConfigurationError) as info:
            versioned_update(
                conn,
                items,
                items.c.id == 1,
                0,
                {items.c.version: 0, "value": 1},  # type: ignore[dict-item]  # untyped callers
            )
        assert info.value.parameter == "values"
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, items.c.id == 1, 0, {"value": 1}, version_column="rev")
        assert info.value.parameter == "version_column"
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, items.c.id == 1, "0", {"value": 1})  # type: ignore[arg-type]
        assert info.value.parameter == "expected_version"
        with pytest.raises(ConfigurationError) as info:  # past a BIGINT: raw, before
            versioned_update(conn, items, items.c.id == 1, 2**70, {"value": 1})
        assert info.value.parameter == "expected_version"
        # A column the table lacks: a raw CompileError ("Unconsumed column names"), before.
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, items.c.id == 1, 0, {"valeu": 1})
        assert info.value.parameter == "values"
        assert "'valeu'" in str(info.value)
        assert "optimistic_items" in str(info.value)
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, items.c.id == 1, 0, {shelves.c.id: 1})  # type: ignore[dict-item]
        assert info.value.parameter == "values"
        # Another table's row: an UPDATE ... FROM, reported as RowMissing before (or
        # applied to every row at that version, if the other table had such a row).
        conn.execute(shelves.insert().values(id=1))
        with pytest.raises(ConfigurationError) as info:
            versioned_update(conn, items, shelves.c.id == 1, 0, {"value": 1})
        assert info.value.parameter == "id_clause"
        assert "optimistic_shelves" in str(info.value)
        assert read_item(conn, 1) == (0, 0)
    # Several rows matched: refused, and the caller's transaction is rolled back with it.
    with pytest.raises(ConfigurationError) as info, engine.begin() as conn:
        versioned_update(conn, items, items.c.version == 0, 0, {"value": 1})
    assert info.value.parameter == "id_clause"
    with engine.connect() as conn:
        assert read_item(conn, 1) == (0, 0)


def test_versioned_update_refuses_a_null_or_non_integer_version(engine: Engine) -> None:
    # A NULL version was reported as RowMissing ("no such row"); a text version column
    # raised a raw ValueError from int() (SQLite) or a raw ProgrammingError (PostgreSQL).
    # Neither is a missing row or a conflict, and no retry would help.
    loose = Table(
        "optimistic_loose",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("value", Integer),
        Column("version", Integer, nullable=True),
        Column("label", String(10), nullable=True),
    )
    loose.create(engine)
    try:
        with engine.begin() as conn:
            conn.execute(loose.insert(), [{"id": 1, "version": None, "label": "a"}])
        with engine.begin() as conn, pytest.raises(ConfigurationError) as info:
            versioned_update(conn, loose, loose.c.id == 1, 0, {"value": 1})
        assert info.value.parameter == "version_column"
        assert "version is None, not an integer" in str(info.value)
        with engine.begin() as conn, pytest.raises(ConfigurationError) as info:
            versioned_update(conn, loose, loose.c.id == 1, 0, {"value": 1}, version_column="label")
        assert info.value.parameter == "version_column"
        assert "not an integer column" in str(info.value)
        with engine.connect() as conn:
            assert conn.execute(select(loose.c.value)).scalar_one() is None
    finally:
        loose.drop(engine)


def test_versioned_update_works_in_an_orm_session(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        assert versioned_update(session, items, items.c.id == 1, 0, {"value": 3}) == 1
        with pytest.raises(StaleVersion):
            versioned_update(session, items, items.c.id == 1, 0, {"value": 4})


def test_sql_retry_bound_with_a_forced_conflict(engine: Engine) -> None:
    """retries=0: one attempt, whose row another transaction bumps before the update."""
    calls: list[int] = []

    def attempt() -> int:
        calls.append(1)
        with engine.begin() as conn:
            value, version = read_item(conn, 1)
        with engine.begin() as other:  # a concurrent writer commits first
            versioned_update(other, items, items.c.id == 1, version, {"value": value + 10})
        with engine.begin() as conn:
            return versioned_update(conn, items, items.c.id == 1, version, {"value": value + 1})

    stats = OptimisticStats()
    with pytest.raises(ConflictError) as info:
        retry_optimistic(attempt, retries=0, stats=stats)
    assert calls == [1]
    assert info.value.attempts == 1
    assert isinstance(info.value.__cause__, StaleVersion)
    assert (stats.attempts, stats.conflicts, stats.gave_up) == (1, 1, 1)
    with engine.connect() as conn:
        assert read_item(conn, 1) == (10, 1)  # the other writer's update, and only it


class Base(DeclarativeBase):
    pass


class Item(Base):
    """The same table through the ORM, with SQLAlchemy's own version counter."""

    __table__ = items
    __mapper_args__ = {"version_id_col": items.c.version}  # noqa: RUF012
    if TYPE_CHECKING:
        id: Mapped[int]
        value: Mapped[int]


def test_orm_version_id_col_retries_with_retry_optimistic(engine: Engine) -> None:
    """The ORM's version_id_col raises StaleDataError; retry_optimistic retries it too."""
    calls: list[int] = []

    def attempt() -> int:
        calls.append(1)
        with Session(engine) as session, session.begin():
            item = session.get(Item, 1)
            assert item is not None
            if len(calls) == 1:  # another writer commits between our read and our flush
                with engine.begin() as other:
                    other.execute(
                        update(items)
                        .where(items.c.id == 1)
                        .values(value=items.c.value + 10, version=items.c.version + 1)
                    )
            item.value += 1
            return item.value  # read before the commit expires it

    assert retry_optimistic(attempt, retry_on=(StaleDataError,)) == 11
    assert len(calls) == 2


# --- Contention: K processes --------------------------------------------------------------


class Workers:
    """K worker processes, started once per module, that run jobs all at the same moment.

    Starting K interpreters costs seconds on a small machine, so the module's contention
    tests share one set. ``run(target, *args)`` sends the job to every worker; each waits
    on a barrier, then calls ``target(*args)`` and sends back what it returned.
    """

    def __init__(self) -> None:
        # Kept referenced: collecting it in the parent unlinks the semaphore the workers use.
        self.ready = ready = _ctx.Barrier(K)
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(K):
            parent_end, child_end = _ctx.Pipe()
            proc = _ctx.Process(target=_serve, args=(ready, child_end), daemon=True)
            proc.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.procs.append(proc)

    def run(self, target: Callable[..., Any], *args: Any) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((target, args))
        results = []
        for pipe in self.pipes:
            assert pipe.poll(60), "a worker made no progress"
            ok, value = pipe.recv()
            assert ok, f"a worker failed:\n{value}"
            results.append(value)
        return results

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
            pipe.close()
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _serve(ready: Barrier, jobs: Connection) -> None:
    """A worker's loop: run each job after the barrier, send back (ok, result or traceback)."""
    while (job := jobs.recv()) is not None:
        target, args = job
        ready.wait()
        try:
            jobs.send((True, target(*args)))
        except Exception:
            jobs.send((False, traceback.format_exc()))


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    pool = Workers()
    try:
        yield pool
    finally:
        pool.close()


Tally = tuple[int, int, OptimisticStats]  # (increments, units sold, stats)


def _redis_worker(url: str, counter: str, stock: str) -> Tally:
    stats, sold = OptimisticStats(), 0
    with redis.Redis.from_url(url) as client:
        for _ in range(ROUNDS):
            optimistic(client, [counter], increment(counter), retries=RETRIES, stats=stats)
            try:
                optimistic(client, [stock], sell(stock), retries=RETRIES, stats=stats)
                sold += 1
            except SoldOut:
                pass
    return ROUNDS, sold, stats


def _sql_worker(url: str) -> Tally:
    engine = create_engine(url)
    stats, sold = OptimisticStats(), 0

    def bump(item_id: int) -> int:
        with engine.begin() as conn:
            value, version = read_item(conn, item_id)
            if item_id == 2 and value <= 0:
                raise SoldOut
            new = value + 1 if item_id == 1 else value - 1
            versioned_update(conn, items, items.c.id == item_id, version, {"value": new})
            return new

    try:
        for _ in range(ROUNDS):
            retry_optimistic(lambda: bump(1), retries=RETRIES, stats=stats)
            try:
                retry_optimistic(lambda: bump(2), retries=RETRIES, stats=stats)
                sold += 1
            except SoldOut:
                pass
    finally:
        engine.dispose()
    return ROUNDS, sold, stats


def check_tallies(tallies: list[Tally], counter: int, stock: int) -> OptimisticStats:
    increments = sum(t[0] for t in tallies)
    sold = sum(t[1] for t in tallies)
    total = OptimisticStats()
    for _, _, stats in tallies:
        total.merge(stats)
    assert counter == increments == K * ROUNDS  # no lost update
    assert sold == STOCK  # sold exactly what there was...
    assert stock == 0  # ...and never went below zero
    assert total.gave_up == 0
    assert total.attempts == total.committed + total.conflicts + (K * ROUNDS - STOCK)
    assert total.conflicts > 0  # K processes on one key do collide
    return total


def test_redis_processes_lose_no_update(
    workers: Workers, node: LocalCluster, raw: redis.Redis, key: str
) -> None:
    counter, stock = f"{key}:counter", f"{key}:stock"
    raw.set(stock, STOCK)
    tallies = workers.run(_redis_worker, node.urls[0], counter, stock)
    stats = check_tallies(tallies, int(raw.get(counter) or 0), int(raw.get(stock) or 0))
    print(f"redis: {stats}")


def test_redis_tasks_lose_no_update(node: LocalCluster, raw: redis.Redis, key: str) -> None:
    counter = f"{key}:counter"

    async def main() -> OptimisticStats:
        client = redis.asyncio.Redis.from_url(node.urls[0])
        stats = OptimisticStats()

        async def task() -> None:
            for _ in range(ROUNDS):
                await aoptimistic(
                    client, [counter], increment(counter), retries=RETRIES, stats=stats
                )

        try:
            await asyncio.gather(*(task() for _ in range(K)))
        finally:
            await client.aclose()
        return stats

    stats = asyncio.run(main())
    assert raw.get(counter) == str(K * ROUNDS).encode()
    assert stats.committed == K * ROUNDS
    assert stats.conflicts > 0
    assert stats.attempts == stats.committed + stats.conflicts


def test_sql_processes_lose_no_update(workers: Workers, engine: Engine, sql_url: str) -> None:
    tallies = workers.run(_sql_worker, sql_url)
    with engine.connect() as conn:
        (counter, _), (stock, _) = read_item(conn, 1), read_item(conn, 2)
    stats = check_tallies(tallies, counter, stock)
    print(f"{engine.dialect.name}: {stats}")

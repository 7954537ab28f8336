"""Idempotency keys on real servers: Redis claims with a lease, SQL unique keys.

The effects are the documents' examples: points deducted from an account, units of stock
sold. "Exactly once" is checked by the effect itself (the balance, the stock), not by
what the library says about it.

* Concurrent duplicates: K processes (forkserver, started once per module) send the same
  request at once; the effect happens once and every one of them gets the same answer.
* A crashed first attempt: a worker process is SIGKILLed at a chosen point (after its
  claim, after its effect, after its record); the retry takes over after the lease (or
  finds the record). Which points give exactly-once and which give at-least-once is the
  difference between the Redis single-MULTI mode and an effect outside Redis, as the
  module docstring of ``tenure.patterns.idempotency`` says; the tests pin it down.
* SQL: the same on SQLite (a file) and PostgreSQL (embedded, ``tenure.testing._postgres``).

No test orders events with ``time.sleep``: workers report each point they reach on a
pipe, and a waiting duplicate is observed through its poll policy.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.client import Pipeline
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    create_engine,
    select,
    text,
    update,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tenure import ConfigurationError, StoreRefused, StoreUnavailable
from tenure.patterns import (
    ClaimLost,
    Codec,
    InProgress,
    NotClaimed,
    Plan,
    Reads,
    RedisIdempotency,
    SqlIdempotency,
    current_claim,
    idempotency_table,
    idempotent,
)
from tenure.testing import LocalCluster, LocalRedisCluster
from tenure.testing._postgres import EmbeddedPostgres

K = 6
LEASE = 0.5  # seconds: short, so a takeover after a crash costs little test time
POINTS = 1000
COST = 100

# forkserver: fork() from a possibly multi-threaded pytest process is unsafe.
_ctx = multiprocessing.get_context("forkserver")


class SoldOut(Exception):
    pass


# --- Fixtures -----------------------------------------------------------------------------


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key no other test uses (the node is shared by the module)."""
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'idempotency.db'}"
    url: str = request.getfixturevalue("postgres").url
    return url


metadata = MetaData()
keys_table = idempotency_table(metadata, "test_idempotency_keys")
accounts = Table(
    "test_idempotency_accounts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("points", BigInteger, nullable=False),
)


@contextmanager
def fresh_tables(url: str) -> Iterator[Engine]:
    """An engine on ``url`` with the tables created (one account) and dropped after."""
    eng = create_engine(url)
    metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(accounts.insert().values(id=1, points=POINTS))
    try:
        yield eng
    finally:
        metadata.drop_all(eng)
        eng.dispose()


@pytest.fixture
def engine(sql_url: str) -> Iterator[Engine]:
    with fresh_tables(sql_url) as eng:
        yield eng


# --- The effects ---------------------------------------------------------------------------


def deduct_in_redis(client: redis.Redis, account: str) -> dict[str, Any]:
    """An effect outside the record's transaction: a separate command on the account key."""
    return {"balance": int(client.decrby(account, COST)), "by": os.getpid()}


def sell_one(stock: str) -> Callable[[Reads[Pipeline]], Plan[dict[str, Any]]]:
    """An effect for RedisOnce.apply: one unit of stock, in the record's MULTI."""

    def plan(reads: Reads[Pipeline]) -> Plan[dict[str, Any]]:
        left = reads.int(stock)
        if left <= 0:
            raise SoldOut
        return Plan(result={"left": left - 1, "by": os.getpid()}, writes={stock: left - 1})

    return plan


def deduct_in_sql(conn: Any) -> dict[str, Any]:
    conn.execute(update(accounts).where(accounts.c.id == 1).values(points=accounts.c.points - COST))
    balance = conn.execute(select(accounts.c.points).where(accounts.c.id == 1)).scalar_one()
    return {"balance": balance, "by": os.getpid()}


def balance(engine: Engine) -> int:
    with engine.connect() as conn:
        points: int = conn.execute(select(accounts.c.points).where(accounts.c.id == 1)).scalar_one()
        return points


class Noticing:
    """A poll policy that tells the test when a duplicate has seen the key in progress."""

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def delay(self, attempt: int, rng: Any) -> float:
        self.waiting.set()
        return 0.005


# --- Redis: one process -------------------------------------------------------------------


def test_a_duplicate_gets_the_recorded_result(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, retention=3600)
    account = f"{key}:points"
    raw.set(account, POINTS)
    answers = []
    for _ in range(3):
        with store.once(key) as once:
            if once.done:
                answers.append(once.result)
                continue
            once.record(deduct_in_redis(raw, account))
            answers.append(once.result)
    assert raw.get(account) == b"900"
    assert answers == [answers[0]] * 3
    assert answers[0]["balance"] == 900
    assert 3_590_000 < raw.pttl(store.redis_key(key)) <= 3_600_000  # the retention


def test_the_decorator_runs_a_handler_once_per_key(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw)
    account = f"{key}:points"
    raw.set(account, POINTS)

    @idempotent(store, key=lambda request: request.get("Idempotency-Key"))
    def handle(request: dict[str, str]) -> dict[str, Any]:
        return deduct_in_redis(raw, account)

    first = handle({"Idempotency-Key": key})
    assert handle({"Idempotency-Key": key}) == first
    assert raw.get(account) == b"900"
    handle({})  # no key: no idempotency, the handler runs
    assert raw.get(account) == b"800"
    assert handle.__name__ == "handle"


def test_a_decorated_handler_extends_its_own_claim(raw: redis.Redis, key: str) -> None:
    # A handler whose effect may outlast the lease reaches its claim through
    # current_claim(), as a `with store.once(key)` block has it; the innermost handler's,
    # and None where there is no claim (outside, or no idempotency key).
    store = RedisIdempotency(raw, lease=30)
    seen: list[object] = []

    @idempotent(store, key=lambda request: request)
    def inner(request: str) -> str:
        seen.append(current_claim())
        return "inner"

    @idempotent(store, key=lambda request: request)
    def handle(request: str | None) -> str:
        claim = current_claim()
        seen.append(claim)
        if claim is not None:
            claim.extend(600)  # longer than the store's lease
            assert 590_000 < raw.pttl(store.redis_key(key)) <= 600_000
            with pytest.raises(InProgress), store.once(key):
                pytest.fail("the key is in progress: a duplicate must not run")
            inner(f"{key}-inner")
            assert current_claim() is claim  # its own again after the inner handler
        return "done"

    assert current_claim() is None
    assert handle(key) == "done"
    outer, nested = seen
    assert outer is not None
    assert nested is not None
    assert nested is not outer
    assert getattr(nested, "key", None) == f"{key}-inner"
    assert current_claim() is None
    with store.once(key) as again:
        assert (again.done, again.result) == (True, "done")
    seen.clear()
    assert handle(None) == "done"  # no key: no claim
    assert seen == [None]


def test_in_progress_is_reported_at_once_by_default(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, lease=30)
    with store.once(key) as first:
        assert not first.done
        with pytest.raises(InProgress) as info, store.once(key):
            pass
        assert info.value.key == key
        assert info.value.retry_after is not None
        assert 29 < info.value.retry_after <= 30
        first.record("ok")
    with store.once(key) as again:
        assert (again.done, again.result) == (True, "ok")


def test_a_waiting_duplicate_gets_the_result(raw: redis.Redis, key: str) -> None:
    poll = Noticing()
    store = RedisIdempotency(raw, lease=30, wait=10, poll=poll)
    got: list[Any] = []

    def duplicate() -> None:
        with store.once(key) as once:
            got.append((once.done, once.result))

    with store.once(key) as first:
        waiter = threading.Thread(target=duplicate)
        waiter.start()
        assert poll.waiting.wait(10)  # it saw the key in progress and is polling
        first.record({"balance": 900})
    waiter.join(10)
    assert got == [(True, {"balance": 900})]


def test_waiting_gives_up_after_its_timeout(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, lease=30)
    with store.once(key), pytest.raises(InProgress) as info, store.once(key, wait=0.05):
        pass
    assert info.value.waited >= 0.05


class _NoDelay:
    """A poll policy whose delay is no number of seconds."""

    def delay(self, attempt: int, rng: Any) -> float:
        return float("nan")


def test_a_poll_that_gives_no_delay_is_a_clear_error(raw: redis.Redis, key: str) -> None:
    # It was a raw ValueError from the sleep.
    store = RedisIdempotency(raw, lease=30, wait=5, poll=_NoDelay())
    with store.once(key), pytest.raises(ConfigurationError) as info, store.once(key):
        pass
    assert info.value.parameter == "poll"


def test_an_exception_releases_the_claim(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, lease=30)
    with pytest.raises(RuntimeError), store.once(key):
        raise RuntimeError("payment gateway down")
    assert raw.exists(store.redis_key(key)) == 0
    with store.once(key) as retry:  # no need to wait for the lease
        assert not retry.done
        retry.record(1)


def test_leaving_without_recording_records_none(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw)
    with store.once(key) as once:
        assert not once.done
    with store.once(key) as again:
        assert (again.done, again.result) == (True, None)
        with pytest.raises(NotClaimed):
            again.record("late")


def test_recording_after_a_takeover_is_refused(raw: redis.Redis, key: str) -> None:
    """Our lease ran out (here: the key is deleted) and another attempt took the key."""
    store = RedisIdempotency(raw, lease=30)
    with store.once(key) as slow:
        raw.delete(store.redis_key(key))  # as if our lease had run out...
        with store.once(key) as fast:  # ...and a duplicate took over and finished
            fast.record({"by": "fast"})
        with pytest.raises(ClaimLost) as info:
            slow.record({"by": "slow"})  # our effect happened too: say so
    assert info.value.holder == "record"
    assert isinstance(info.value, RuntimeError)
    assert info.value.key == key
    with store.once(key) as later:
        assert later.result == {"by": "fast"}


def test_recording_after_the_lease_with_no_takeover_is_kept(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, lease=30)
    stock = f"{key}:stock"
    raw.set(stock, 3)
    with store.once(f"{key}:record") as slow:
        raw.delete(store.redis_key(f"{key}:record"))  # the lease ran out; nobody came
        slow.record("done late")
    with store.once(f"{key}:apply") as slow:
        raw.delete(store.redis_key(f"{key}:apply"))
        late = slow.apply([stock], sell_one(stock))
    with store.once(f"{key}:record") as later:
        assert later.result == "done late"
    with store.once(f"{key}:apply") as later:
        assert later.result == late
    assert raw.get(stock) == b"2"


def test_a_takeover_that_left_nothing_behind_is_not_reported(raw: redis.Redis, key: str) -> None:
    """The documented limit of ClaimLost: it sees what the key holds, not its history."""
    store = RedisIdempotency(raw, lease=30)
    account = f"{key}:points"
    raw.set(account, POINTS)

    def take_over_and_fail() -> None:
        with store.once(key) as fast:  # a duplicate takes over,
            assert not fast.done
            deduct_in_redis(raw, account)  # does the effect again, and fails after it:
            raise RuntimeError("after the effect")  # its claim is released

    with store.once(key) as slow:
        deduct_in_redis(raw, account)  # our effect; then our lease runs out
        raw.delete(store.redis_key(key))
        with pytest.raises(RuntimeError):
            take_over_and_fail()
        slow.record("deducted")  # no ClaimLost: the key was empty again
    assert raw.get(account) == str(POINTS - 2 * COST).encode()  # twice, unreported


def test_extending_sets_the_claims_end_from_now(raw: redis.Redis, key: str) -> None:
    """For an effect longer than the lease: the claim ends ``lease`` after the call."""
    store = RedisIdempotency(raw, lease=30)
    own = store.redis_key(key)
    with store.once(key) as once:
        once.extend(600)
        assert 590_000 < raw.pttl(own) <= 600_000  # longer than the store's lease
        with pytest.raises(InProgress) as busy, store.once(key):
            pytest.fail("the key is in progress: a duplicate must not run")
        assert busy.value.retry_after is not None
        assert busy.value.retry_after > 590
        once.extend(5)
        assert 0 < raw.pttl(own) <= 5_000  # shorter: set, not added
        once.extend()
        assert 25_000 < raw.pttl(own) <= 30_000  # the store's lease
        once.record("done")
    with store.once(key) as again:
        assert (again.done, again.result) == (True, "done")
        with pytest.raises(NotClaimed, match="cannot extend"):
            again.extend()
    with store.once(f"{key}-recorded") as once:
        once.record(1)
        with pytest.raises(NotClaimed, match="cannot extend"):
            once.extend()


@pytest.mark.parametrize("finished", [False, True], ids=["in-progress", "recorded"])
def test_extending_after_a_takeover_is_refused(raw: redis.Redis, key: str, finished: bool) -> None:
    store = RedisIdempotency(raw, lease=30)
    own = store.redis_key(key)
    with store.once(key) as slow:
        slow.extend(0.5)
        raw.delete(own)  # as if our lease had run out...
        with store.once(key) as fast:  # ...and a duplicate took the key over
            if finished:
                fast.record({"by": "fast"})
            holding = raw.get(own)
            with pytest.raises(ClaimLost) as info:
                slow.extend()
            assert info.value.holder == ("record" if finished else "claim")
            assert info.value.key == key
            # The lease that ran out is the one the claim was last given.
            assert "our claim's lease (0.5 s) ran out" in str(info.value), info.value
            assert raw.get(own) == holding  # left alone: PX untouched too
            assert raw.pttl(own) > (25_000 if not finished else 86_000_000)
            with pytest.raises(NotClaimed):
                slow.record("late")  # the claim is gone
            if not finished:
                fast.record({"by": "fast"})
        # Leaving the slow block records nothing.
    with store.once(key) as later:
        assert later.result == {"by": "fast"}


def test_extending_after_the_lease_with_no_takeover_claims_again(
    raw: redis.Redis, key: str
) -> None:
    store = RedisIdempotency(raw, lease=30)
    own = store.redis_key(key)
    with store.once(key) as slow:
        claim = raw.get(own)
        raw.delete(own)  # the lease ran out; nobody came
        slow.extend(60)
        assert raw.get(own) == claim
        assert 55_000 < raw.pttl(own) <= 60_000
        with pytest.raises(InProgress), store.once(key):
            pytest.fail("the key is ours again: a duplicate must not run")
        slow.record("done late")
    with store.once(key) as later:
        assert later.result == "done late"


@pytest.mark.parametrize("lease", [0, -1, float("nan"), float("inf"), 1e16])
def test_a_bad_extension_is_refused_and_changes_nothing(
    raw: redis.Redis, key: str, lease: float
) -> None:
    store = RedisIdempotency(raw, lease=30)
    with store.once(key) as once:
        with pytest.raises(ConfigurationError) as info:
            once.extend(lease)
        assert info.value.parameter == "lease"
        assert "0.001" in str(info.value)
        assert 25_000 < raw.pttl(store.redis_key(key)) <= 30_000
        once.record("still ours")
    with store.once(key) as later:
        assert later.result == "still ours"


def test_apply_puts_effect_and_record_in_one_multi(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw)
    stock = f"{key}:stock"
    raw.set(stock, 3)
    with store.once(key) as once:
        result = once.apply([stock], sell_one(stock))
    assert result["left"] == 2
    assert raw.get(stock) == b"2"
    with store.once(key) as again:
        assert again.done
        assert again.result == result
    assert raw.get(stock) == b"2"


def test_apply_after_a_takeover_applies_nothing(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, lease=30)
    stock = f"{key}:stock"
    raw.set(stock, 3)
    with store.once(key) as slow:
        raw.delete(store.redis_key(key))  # our lease ran out...
        with store.once(key) as fast:  # ...and a duplicate took over and finished
            fast.apply([stock], sell_one(stock))
        with pytest.raises(ClaimLost) as info:
            slow.apply([stock], sell_one(stock))
    assert info.value.holder == "record"
    assert raw.get(stock) == b"2"


def test_apply_refusing_writes_nothing_and_releases(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw)
    stock = f"{key}:stock"
    raw.set(stock, 0)
    with pytest.raises(SoldOut), store.once(key) as once:
        once.apply([stock], sell_one(stock))
    assert raw.get(stock) == b"0"
    assert raw.exists(store.redis_key(key)) == 0


def test_a_custom_codec_and_namespace(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw, namespace="shop", codec=Codec(dumps=bytes, loads=bytes))
    assert store.redis_key(key) == f"shop:{{{key}}}"
    with store.once(key) as once:
        once.record(b"\x00receipt")
    with store.once(key) as again:
        assert again.result == b"\x00receipt"


def test_a_damaged_key_is_never_taken_as_free(raw: redis.Redis, key: str) -> None:
    store = RedisIdempotency(raw)
    raw.set(store.redis_key(key), "something else")
    with pytest.raises(StoreRefused, match="no idempotency state") as info, store.once(key):
        pass
    assert (info.value.operation, info.value.key) == ("claim", key)
    assert isinstance(info.value.__cause__, redis.ResponseError)


def test_a_record_the_codec_cannot_read_is_a_clear_error(raw: redis.Redis, key: str) -> None:
    # A record written by another codec (a deploy that changed it) or by hand: every
    # duplicate got the codec's raw exception (a json.JSONDecodeError, a
    # UnicodeDecodeError), no TenureError, and nothing said which key or why.
    store = RedisIdempotency(raw, retention=3600)
    for stored in (b"d:not json", b"d:\x80\x04pickled"):
        raw.set(store.redis_key(key), stored, px=3_600_000)
        with pytest.raises(ConfigurationError) as info, store.once(key):
            pytest.fail("a record was found: the block must not run")
        assert info.value.parameter == "codec"
        assert repr(key) in str(info.value)
        assert isinstance(info.value.__cause__, ValueError)
        assert "receipt" not in str(info.value)  # the payload is not quoted: results
        assert b"pickled" not in str(info.value).encode()  # may hold private data
        assert raw.get(store.redis_key(key)) == stored  # left alone: never run again

    @idempotent(store, key=lambda request: request)
    def handle(request: str) -> str:
        pytest.fail("the handler ran for a request that was recorded")

    with pytest.raises(ConfigurationError):
        handle(key)


def test_a_client_decoding_latin_1_reads_a_record_as_stored(node: LocalCluster, key: str) -> None:
    # A record's bytes went through the client's decoding (latin-1) and back through
    # UTF-8, so a record written with text outside ASCII (JSON without ensure_ascii, by
    # another store's codec) came back as mojibake: "café" read as "cafÃ©".
    with (
        redis.Redis.from_url(node.urls[0], decode_responses=True, encoding="latin-1") as c,
        node[0].client() as raw,
    ):
        store = RedisIdempotency(c, retention=3600)
        raw.set(store.redis_key(key), 'd:{"receipt":"café"}'.encode(), px=3_600_000)
        with store.once(key) as once:
            assert (once.done, once.result) == (True, {"receipt": "café"})


def test_a_client_that_decodes_replies_never_fails_raw(node: LocalCluster, key: str) -> None:
    # A redis-py client made with decode_responses=True decodes every reply as UTF-8
    # inside redis-py: a record that is not UTF-8 text raised a raw UnicodeDecodeError
    # from once() (every duplicate, with a bytes codec) and from record(), and leaving
    # the block recorded again and raised it once more.
    with node[0].client(decode_responses=True) as decoding, node[0].client() as raw:
        # A codec of raw bytes with it: refused when the store is made, before any effect.
        with pytest.raises(ConfigurationError) as info:
            RedisIdempotency(decoding, codec=Codec(dumps=bytes, loads=bytes))
        assert info.value.parameter == "client"
        assert "decode_responses=False" in str(info.value)
        # JSON records are UTF-8 text: that client reads them.
        store = RedisIdempotency(decoding, retention=3600)
        with store.once(key) as once:
            once.record({"receipt": "caf\u00e9"})
        with store.once(key) as again:
            assert (again.done, again.result) == (True, {"receipt": "caf\u00e9"})
        # A record another codec wrote: a clear error on codec, the block not run.
        other = f"{key}-pickled"
        stored = b"d:\x80\x04pickled"
        raw.set(store.redis_key(other), stored, px=3_600_000)
        with pytest.raises(ConfigurationError) as info, store.once(other):
            pytest.fail("a record was found: the block must not run")
        assert info.value.parameter == "codec"
        assert repr(other) in str(info.value)
        assert "decode_responses" in str(info.value)
        assert raw.get(store.redis_key(other)) == stored  # left alone
        # Such a record taking the key over from us: ClaimLost, as for any record.
        taken = f"{key}-taken"

        def record_after_a_takeover() -> None:
            with store.once(taken) as slow:
                raw.set(store.redis_key(taken), stored, px=3_600_000)
                slow.record("charged")

        with pytest.raises(ClaimLost) as lost:
            record_after_a_takeover()
        assert lost.value.holder == "record"
        assert raw.get(store.redis_key(taken)) == stored
        # And extending, the same way.
        extended = f"{key}-extended"
        with store.once(extended) as slow:
            raw.set(store.redis_key(extended), stored, px=3_600_000)
            with pytest.raises(ClaimLost) as lost:
                slow.extend()
        assert lost.value.holder == "record"
        assert raw.get(store.redis_key(extended)) == stored


def test_a_key_of_another_type_is_a_store_refusal(raw: redis.Redis, key: str) -> None:
    # It was a raw redis.ResponseError (WRONGTYPE), from once() and from the decorator.
    store = RedisIdempotency(raw)
    raw.hset(store.redis_key(key), "by", "another application")
    with pytest.raises(StoreRefused, match="namespace") as info, store.once(key):
        pass
    assert info.value.lasting
    # As the server sent it: Redis 6.2 wraps a script's error ("ERR Error running script").
    assert "WRONGTYPE Operation against a key" in info.value.reply

    @idempotent(store, key=lambda request: request)
    def handle(request: str) -> str:
        return "done"

    with pytest.raises(StoreRefused, match="namespace"):
        handle(key)


def test_a_key_without_a_hash_tag_of_its_own_is_refused_before_the_effect(key: str) -> None:
    # ``<namespace>:{<key>}`` with a key that starts with "}" has an empty hash tag, so
    # Redis Cluster hashed the whole key, and its receipt (the same plus ":receipt")
    # went to another slot: every attempt claimed, ran the effect, then failed to record
    # (a StoreRefused) and released the claim, and every retry ran the effect AGAIN.
    # The key comes from the request (a header): any client could send one.
    with LocalRedisCluster(replicas=0) as cluster:
        master = cluster.masters()[0]
        assert master.port is not None  # a TCP node
        client = redis.RedisCluster(host=master.host, port=master.port)
        try:
            store = RedisIdempotency(client)
            charged: list[str] = []

            @idempotent(store, key=lambda request: request)
            def charge(request: str) -> str:
                charged.append(request)
                return "charged"

            for _ in range(3):  # a client retrying
                with pytest.raises(ConfigurationError) as info:
                    charge(f"}}{key}")
                assert info.value.parameter == "key"
                assert "hash tag" in str(info.value)
            assert charged == []  # refused before the claim, not after the effect
            # Every key the store takes, braces and all: its claim and its receipt in
            # one slot, as Redis itself computes it, and recorded.
            for name in (key, f"a{{b}}c-{key}", f"{{}}{key}", f"{key}}}", f"{{{key}", "}", "{"):
                if name.startswith("}"):
                    continue
                slots = {
                    client.cluster_keyslot(store.redis_key(name)),
                    client.cluster_keyslot(store._receipt_key(name)),
                }
                assert len(slots) == 1, name
                assert charge(name) == "charged"
                assert charge(name) == "charged"
            assert len(charged) == 6  # once each
            # A namespace whose hash tag is empty would do that to every key.
            with pytest.raises(ConfigurationError) as info:
                RedisIdempotency(client, namespace="pay{}")
            assert info.value.parameter == "namespace"
            # A namespace with a tag of its own puts every key in its slot: "}" is fine.
            tagged = RedisIdempotency(client, namespace="pay{shard-1}")
            with tagged.once(f"}}{key}") as once:
                once.record("charged")
            with tagged.once(f"}}{key}") as again:
                assert (again.done, again.result) == (True, "charged")
        finally:
            client.close()


def test_a_cluster_release_that_fails_leaves_the_blocks_own_exception(key: str) -> None:
    # The block's exception releases the claim. When the claim's slot is served by no
    # master any more, redis-py's cluster client raises a RedisClusterException, which
    # is no redis.RedisError: it escaped the release raw and replaced the block's own
    # exception (the payment gateway's error became "All slots are not covered").
    with LocalRedisCluster(replicas=0) as cluster:
        master = cluster.masters()[0]
        assert master.port is not None  # a TCP node
        client = redis.RedisCluster(host=master.host, port=master.port)
        try:
            store = RedisIdempotency(client, lease=30)
            slot = client.cluster_keyslot(store.redis_key(key))

            def unserved_then_failed() -> None:
                with store.once(key):
                    for node in cluster.masters():  # every master forgets who serves it
                        cluster._command(node, "CLUSTER", "DELSLOTS", slot)
                    raise RuntimeError("payment gateway down")

            with pytest.raises(RuntimeError, match="gateway down"):
                unserved_then_failed()
        finally:
            client.close()


def test_an_idempotency_store_whose_redis_is_down_is_unavailable(key: str) -> None:
    # Each call raised a raw redis.ConnectionError.
    with LocalCluster(1) as doomed, doomed[0].client() as client:
        store = RedisIdempotency(client, lease=5)
        block = store.once(key)
        once = block.__enter__()
        doomed[0].kill()
        with pytest.raises(StoreUnavailable, match="record\\(\\) again is safe") as info:
            once.record("receipt")
        assert (info.value.operation, info.value.maybe_applied) == ("record", True)
        assert isinstance(info.value.__cause__, redis.ConnectionError)
        with pytest.raises(StoreUnavailable, match="extend\\(\\) again is safe") as info:
            once.extend()
        assert (info.value.operation, info.value.maybe_applied) == ("extend", True)
        with pytest.raises(StoreUnavailable) as info:
            once.apply([f"{key}-stock"], lambda reads: Plan(result=1))
        assert not info.value.maybe_applied  # nothing was sent: the WATCH failed
        # Leaving the block records None: that fails the same way.
        with pytest.raises(StoreUnavailable, match="record of"):
            block.__exit__(None, None, None)
        with pytest.raises(StoreUnavailable, match="lease \\(5 s\\)") as info, store.once(key):
            pass
        assert (info.value.operation, info.value.key) == ("claim", key)

        @idempotent(store, key=lambda request: request)
        def handle(request: str) -> str:
            return "done"

        with pytest.raises(StoreUnavailable):
            handle(key)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease", 0),
        ("retention", -1),
        ("wait", float("nan")),
        ("namespace", ""),
        # Past what Redis takes as an expiry: refused raw at the first use, before.
        ("lease", 1e16),
        ("retention", 1e300),
        ("namespace", "caf\udce9"),
    ],
)
def test_bad_options_are_refused(raw: redis.Redis, option: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisIdempotency(raw, **{option: value})  # type: ignore[arg-type]
    assert info.value.parameter == option


def test_a_codec_that_is_no_codec_is_refused(raw: redis.Redis) -> None:
    # It was taken, and failed only at the first record, after the effect.
    for make in (lambda: RedisIdempotency(raw, codec=None), lambda: SqlIdempotency(codec="json")):  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError) as info:
            make()
        assert info.value.parameter == "codec"


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ((None,), "metadata"),  # a raw AttributeError, before
        ((MetaData(), None), "name"),  # a raw AssertionError inside SQLAlchemy
        ((MetaData(), ["keys"]), "name"),
        ((MetaData(), "keys", 0), "key_length"),  # refused only at CREATE TABLE
        ((MetaData(), "keys", "255"), "key_length"),
    ],
)
def test_a_bad_idempotency_table_is_refused(arguments: tuple[Any, ...], parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        idempotency_table(*arguments)
    assert info.value.parameter == parameter


def test_a_poll_that_is_no_retry_policy_is_refused(raw: redis.Redis) -> None:
    # It was taken, and failed only when a duplicate first waited for a key in progress.
    for poll in (None, 0.1, "fast"):
        with pytest.raises(ConfigurationError) as info:
            RedisIdempotency(raw, poll=poll)  # type: ignore[arg-type]
        assert info.value.parameter == "poll"


def test_the_decorator_refuses_what_it_cannot_run(raw: redis.Redis, key: str) -> None:
    # An async handler's coroutine was recorded (a raw TypeError, never awaited: the
    # effect never ran); SqlIdempotency.once needs the transaction's connection (a raw
    # TypeError at the first call).
    store = RedisIdempotency(raw)
    decorate = idempotent(store, key=lambda request: request)

    async def handler(request: str) -> int:
        return 1

    with pytest.raises(ConfigurationError) as info:
        decorate(handler)
    assert info.value.parameter == "handler"
    assert "async" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        idempotent(SqlIdempotency(), key=lambda request: request)  # type: ignore[arg-type]
    assert info.value.parameter == "store"
    assert "keys.once(connection, key)" in str(info.value)
    assert raw.exists(store.redis_key(key)) == 0


def test_a_result_the_codec_cannot_encode_is_a_clear_error(raw: redis.Redis, key: str) -> None:
    # It was the codec's raw TypeError; through the decorator, every retry ran the effect
    # again and failed the same way.
    store = RedisIdempotency(raw)
    account, stock = f"{key}:points", f"{key}:stock"
    raw.set(stock, 3)
    with pytest.raises(ConfigurationError) as info, store.once(key) as once:
        once.record(object())
    assert info.value.parameter == "result"
    assert "object value cannot be stored by the codec" in str(info.value)
    assert raw.exists(store.redis_key(key)) == 0  # nothing recorded, the claim released
    with pytest.raises(ConfigurationError) as info, store.once(key) as once:
        once.apply([stock], lambda reads: Plan(result={1, 2}, writes={stock: 2}))
    assert info.value.parameter == "result"
    assert raw.get(stock) == b"3"  # nothing applied
    with pytest.raises(ConfigurationError) as info, store.once(key) as once:
        once.apply([stock], lambda reads: 2)  # type: ignore[arg-type,return-value]
    assert info.value.parameter == "fn"
    runs: list[int] = []

    @idempotent(store, key=lambda request: request)
    def deduct(request: str) -> object:
        runs.append(int(raw.decrby(account, COST)))
        return object()

    with pytest.raises(ConfigurationError) as info:
        deduct(key)
    assert info.value.parameter == "result"
    assert runs == [-COST]


def test_scripts_name_their_keys_and_arguments() -> None:
    for name in ("idem_claim", "idem_record", "idem_release"):
        source = files("tenure._lua").joinpath(f"{name}.lua").read_text()
        header = "\n".join(line for line in source.splitlines() if line.startswith("--"))
        for word in ("KEYS[1]", "ARGV[1]", "Returns"):
            assert word in header, f"{name}.lua: {word}"


# --- Redis: K processes at once -----------------------------------------------------------


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


def _redis_duplicate(url: str, key: str) -> tuple[Any, Any]:
    """Send the same two requests as every other worker: a point deduction, a sale."""
    with redis.Redis.from_url(url) as client:
        store = RedisIdempotency(client, lease=10, wait=20)

        @idempotent(store, key=lambda request_id: request_id)
        def deduct(request_id: str) -> dict[str, Any]:
            return deduct_in_redis(client, f"{key}:points")

        deducted = deduct(f"{key}:deduct")
        with store.once(f"{key}:sell") as once:
            sold = (
                once.result if once.done else once.apply([f"{key}:stock"], sell_one(f"{key}:stock"))
            )
        return deducted, sold


def test_concurrent_duplicates_apply_the_effect_once(
    workers: Workers, node: LocalCluster, raw: redis.Redis, key: str
) -> None:
    raw.set(f"{key}:points", POINTS)
    raw.set(f"{key}:stock", 10)
    answers = workers.run(_redis_duplicate, node.urls[0], key)
    assert raw.get(f"{key}:points") == b"900"  # deducted once...
    assert raw.get(f"{key}:stock") == b"9"  # ...sold once
    assert answers == [answers[0]] * K  # ...and every caller got the same answer
    assert answers[0][0]["balance"] == 900
    assert answers[0][1]["left"] == 9


# --- Redis: a worker killed mid-request ---------------------------------------------------


def _redis_victim(
    url: str, key: str, mode: str, effects: str, stop_after: str, out: Connection
) -> None:
    """One attempt that reports each point it reaches, and halts (to be killed) at one."""

    def reached(point: str) -> None:
        if point == stop_after:
            out.send(point)
            threading.Event().wait()  # until SIGKILL

    with redis.Redis.from_url(url) as client:
        store = RedisIdempotency(client, lease=LEASE)
        with store.once(key) as once:
            reached("claim")
            if mode == "atomic":
                once.apply([f"{key}:stock"], sell_one(f"{key}:stock"))
                reached("record")  # effect and record are one step: there is no "effect"
            else:
                with Path(effects).open("a") as log:  # an effect outside Redis
                    log.write("shipped\n")
                reached("effect")
                once.record("shipped")
                reached("record")


def kill_at(target: Callable[..., None], *args: Any, point: str) -> None:
    """Run ``target(*args, point, out)`` in a process and SIGKILL it once it reaches ``point``."""
    parent_end, child_end = _ctx.Pipe(duplex=False)
    proc = _ctx.Process(target=target, args=(*args, point, child_end))
    proc.start()
    child_end.close()
    try:
        assert parent_end.poll(60), f"the worker never reached {point!r}"
        assert parent_end.recv() == point
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        parent_end.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("mode", "point", "effects"),
    [
        # Effect and record in one MULTI: exactly once wherever the crash falls.
        ("atomic", "claim", 1),  # nothing applied; the retry takes over after the lease
        ("atomic", "record", 1),  # applied and recorded; the reply was lost; retry reads it
        # Effect outside Redis: the window between effect and record is at-least-once.
        ("outside", "claim", 1),  # nothing done; the retry takes over and does it
        ("outside", "effect", 2),  # done, not recorded: the retry does it AGAIN
        ("outside", "record", 1),  # done and recorded; retry reads it
    ],
)
def test_a_retry_after_the_worker_was_killed(
    node: LocalCluster,
    raw: redis.Redis,
    key: str,
    tmp_path: Path,
    mode: str,
    point: str,
    effects: int,
) -> None:
    raw.set(f"{key}:stock", 10)
    shipped = tmp_path / "shipped.log"
    shipped.touch()
    kill_at(_redis_victim, node.urls[0], key, mode, os.fspath(shipped), point=point)

    store = RedisIdempotency(raw, lease=LEASE, wait=10)
    with store.once(key) as retry:
        took_over = not retry.done
        if took_over and mode == "atomic":
            retry.apply([f"{key}:stock"], sell_one(f"{key}:stock"))
        elif took_over:
            with shipped.open("a") as log:
                log.write("shipped\n")
            retry.record("shipped")
    assert took_over == (point != "record")
    if mode == "atomic":
        assert raw.get(f"{key}:stock") == str(10 - effects).encode()
    else:
        assert shipped.read_text().count("shipped") == effects


# --- SQL ----------------------------------------------------------------------------------


def test_sql_a_duplicate_gets_the_recorded_result(engine: Engine, key: str) -> None:
    store = SqlIdempotency(keys_table)
    answers = []
    for _ in range(3):
        with engine.begin() as conn, store.once(conn, key) as once:
            if not once.done:
                once.record(deduct_in_sql(conn))
            answers.append(once.result)
    assert balance(engine) == POINTS - COST
    assert answers == [answers[0]] * 3
    with engine.begin() as conn, store.once(conn, key) as once, pytest.raises(NotClaimed):
        once.record("late")


def test_sql_works_in_an_orm_session(engine: Engine, key: str) -> None:
    store = SqlIdempotency(keys_table)
    for _ in range(2):
        with Session(engine) as session, session.begin(), store.once(session, key) as once:
            if not once.done:
                once.record(deduct_in_sql(session))
    assert balance(engine) == POINTS - COST


def test_sql_an_exception_rolls_back_effect_and_key(engine: Engine, key: str) -> None:
    store = SqlIdempotency(keys_table)

    def crash_before_commit() -> None:
        with engine.begin() as conn, store.once(conn, key) as once:
            assert not once.done
            deduct_in_sql(conn)
            raise RuntimeError("crash before commit")

    with pytest.raises(RuntimeError):
        crash_before_commit()
    assert balance(engine) == POINTS
    with engine.begin() as conn, store.once(conn, key) as retry:
        assert not retry.done  # the key went with the effect
        retry.record(deduct_in_sql(conn))
    assert balance(engine) == POINTS - COST


def test_sql_leaving_without_recording_records_none(engine: Engine, key: str) -> None:
    store = SqlIdempotency(keys_table)
    with engine.begin() as conn, store.once(conn, key):
        pass
    with engine.begin() as conn, store.once(conn, key) as again:
        assert (again.done, again.result) == (True, None)


def test_sql_a_result_the_codec_cannot_encode_is_a_clear_error(engine: Engine, key: str) -> None:
    keys = SqlIdempotency(keys_table)

    def attempt() -> None:
        with engine.begin() as conn, keys.once(conn, key) as once:
            deduct_in_sql(conn)
            once.record(object())

    with pytest.raises(ConfigurationError) as info:
        attempt()
    assert info.value.parameter == "result"
    assert balance(engine) == POINTS  # rolled back with the effect
    with engine.connect() as conn:
        assert conn.execute(select(keys_table).where(keys_table.c.key == key)).first() is None


def test_sql_a_record_the_codec_cannot_read_is_a_clear_error(engine: Engine, key: str) -> None:
    # It was the codec's raw exception (a UnicodeDecodeError here), no TenureError.
    keys = SqlIdempotency(keys_table)
    with engine.begin() as conn:
        conn.execute(
            keys_table.insert().values(
                key=key, response=b"\x80\x04pickled", created_at=datetime.now(UTC)
            )
        )
    with pytest.raises(ConfigurationError) as info, engine.begin() as conn, keys.once(conn, key):
        pytest.fail("a record was found: the block must not run")
    assert info.value.parameter == "codec"
    assert repr(key) in str(info.value)
    assert "pickled" not in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_sql_purge_forgets_old_keys(engine: Engine, key: str) -> None:
    store = SqlIdempotency(keys_table)
    with engine.begin() as conn, store.once(conn, key) as once:
        once.record(1)
    with engine.begin() as conn:
        assert store.purge(conn, datetime.now(UTC) - timedelta(hours=1)) == 0
        assert store.purge(conn, datetime.now(UTC) + timedelta(seconds=1)) == 1
        with pytest.raises(ConfigurationError):
            store.purge(conn, datetime.now())  # naive: ambiguous
    with engine.begin() as conn, store.once(conn, key) as once:
        assert not once.done


def test_sql_keys_the_table_cannot_hold_are_refused(tmp_path: Path) -> None:
    # PostgreSQL refused them with an error that aborted the caller's transaction;
    # SQLite stored a key of any length whatever the column said.
    eng = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        metadata.create_all(eng)
        store = SqlIdempotency(keys_table)
        for key in ("k" * 256, "a\x00b", "caf\udce9"):
            with (
                pytest.raises(ConfigurationError) as info,
                eng.begin() as conn,
                store.once(conn, key),
            ):
                pass
            assert info.value.parameter == "key"
        with eng.begin() as conn, store.once(conn, "k" * 255) as once:
            once.record(1)
    finally:
        eng.dispose()


def test_sql_savepoint_mode_is_refused_on_sqlite(tmp_path: Path) -> None:
    eng = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        metadata.create_all(eng)
        store = SqlIdempotency(keys_table, on_conflict="savepoint")
        with pytest.raises(ConfigurationError) as info, eng.begin() as conn, store.once(conn, "k"):
            pass
        assert info.value.parameter == "on_conflict"
    finally:
        eng.dispose()
    with pytest.raises(ConfigurationError):
        SqlIdempotency(on_conflict="sometimes")


def test_sql_default_table() -> None:
    store = SqlIdempotency()
    assert store.table.name == "idempotency_keys"
    assert {c.name for c in store.table.c} == {"key", "response", "created_at"}
    assert [c.name for c in store.table.primary_key] == ["key"]


def _sql_duplicate(url: str, key: str, on_conflict: str) -> Any:
    engine = create_engine(url)
    store = SqlIdempotency(keys_table, on_conflict=on_conflict)
    try:
        with engine.begin() as conn, store.once(conn, key) as once:
            if not once.done:
                once.record(deduct_in_sql(conn))
            answer = once.result
    finally:
        engine.dispose()
    return answer


def test_sql_concurrent_duplicates_apply_the_effect_once(
    workers: Workers, engine: Engine, sql_url: str, key: str
) -> None:
    answers = workers.run(_sql_duplicate, sql_url, key, "auto")
    assert balance(engine) == POINTS - COST
    assert answers == [answers[0]] * K
    assert answers[0]["balance"] == POINTS - COST


def test_sql_savepoint_mode_on_postgresql(
    workers: Workers, postgres: EmbeddedPostgres, key: str
) -> None:
    """A plain INSERT in a SAVEPOINT; a duplicate's IntegrityError is rolled back to it."""
    with fresh_tables(postgres.url) as eng:
        store = SqlIdempotency(keys_table, on_conflict="savepoint")
        for _ in range(2):  # the second INSERT fails at once: the row is committed
            with eng.begin() as conn, store.once(conn, f"{key}:seq") as once:
                if not once.done:
                    once.record(deduct_in_sql(conn))
                # The caller's transaction survived the IntegrityError and is usable.
                assert conn.execute(select(accounts.c.points)).scalar_one() == POINTS - COST
        # Concurrent: the duplicates' INSERTs wait for the first commit, then fail.
        answers = workers.run(_sql_duplicate, postgres.url, f"{key}:par", "savepoint")
        assert balance(eng) == POINTS - 2 * COST
        assert answers == [answers[0]] * K


def await_blocked_backend(engine: Engine) -> None:
    """Return once some backend of this database waits on a lock (polled, 10 s at most)."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    deadline = time.monotonic() + 10
    with engine.connect() as conn:
        while conn.execute(query).scalar_one() == 0:
            assert time.monotonic() < deadline, "the duplicate never blocked"
            time.sleep(0.01)
            conn.rollback()  # a fresh snapshot of pg_stat_activity


@pytest.mark.parametrize("on_conflict", ["insert", "savepoint"])
@pytest.mark.parametrize("first_commits", [True, False])
def test_sql_a_duplicate_blocks_until_the_first_ends(
    postgres: EmbeddedPostgres, key: str, on_conflict: str, first_commits: bool
) -> None:
    """The race itself: the duplicate's INSERT meets the first one's uncommitted row.

    It waits for the first transaction; if that commits, the duplicate gets its result;
    if it rolls back, the duplicate is the first and does the effect.
    """
    with fresh_tables(postgres.url) as eng:
        store = SqlIdempotency(keys_table, on_conflict=on_conflict)
        got: list[tuple[bool, Any]] = []

        def duplicate() -> None:
            with eng.begin() as conn, store.once(conn, key) as once:
                if not once.done:
                    once.record(deduct_in_sql(conn))
                got.append((once.done, once.result))

        first = eng.connect()
        try:
            transaction = first.begin()
            with store.once(first, key) as once:
                once.record(deduct_in_sql(first))
            waiter = threading.Thread(target=duplicate)
            waiter.start()
            await_blocked_backend(eng)
            if first_commits:
                transaction.commit()
            else:
                transaction.rollback()
            waiter.join(10)
        finally:
            first.close()
        assert len(got) == 1
        done, result = got[0]
        assert done == first_commits
        assert balance(eng) == POINTS - COST
        assert result["balance"] == POINTS - COST


def _sql_victim(url: str, key: str, point: str, out: Connection) -> None:
    """Claim the key and deduct the points in one transaction, then halt before commit."""
    engine = create_engine(url)
    store = SqlIdempotency(keys_table)
    with engine.begin() as conn, store.once(conn, key) as once:
        once.record(deduct_in_sql(conn))
        out.send(point)
        threading.Event().wait()  # until SIGKILL: the transaction never commits


def test_sql_on_sqlite_a_duplicate_waits_at_most_the_busy_timeout(tmp_path: Path, key: str) -> None:
    """The documented limit: SQLite's busy timeout, not the first attempt, ends the wait."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    with fresh_tables(url) as first_engine:
        impatient = create_engine(url, connect_args={"timeout": 0.2})
        keys = SqlIdempotency(keys_table)
        inside, finish = threading.Event(), threading.Event()

        def first() -> None:
            with first_engine.begin() as conn, keys.once(conn, key) as once:
                once.record(deduct_in_sql(conn))
                inside.set()
                finish.wait(30)

        worker = threading.Thread(target=first)
        worker.start()
        try:
            assert inside.wait(30)
            with (
                pytest.raises(OperationalError, match="locked"),
                impatient.begin() as conn,
                keys.once(conn, key),
            ):
                pytest.fail("the duplicate ran while the first was in progress")
        finally:
            finish.set()
            worker.join(30)
        with impatient.begin() as conn, keys.once(conn, key) as again:
            assert again.done  # once the first committed
        impatient.dispose()
        assert balance(first_engine) == POINTS - COST


def test_sql_a_retry_after_the_worker_was_killed(engine: Engine, sql_url: str, key: str) -> None:
    """Killed after effect and record but before commit: the database drops both."""
    kill_at(_sql_victim, sql_url, key, point="before-commit")
    store = SqlIdempotency(keys_table)
    with engine.begin() as conn, store.once(conn, key) as retry:
        assert not retry.done
        retry.record(deduct_in_sql(conn))
    assert balance(engine) == POINTS - COST

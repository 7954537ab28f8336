"""Single-writer streams on real processes: workers crash, join and pause while
thousands of keyed writes flow; every write is applied exactly once, in per-key order, by
one worker per partition at a time, and a superseded worker writes nothing.

The workers' handler applies ``seq`` to its key only if ``seq == last + 1`` (a duplicate
delivery is counted and skipped; a gap would mean lost order), fenced per partition by
the lease's token, and logs every apply with the store's own order number, all in one
Lua script: the history the assertions read is exactly the order of effects.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import CodeType, FrameType
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tenure
from tenure import StoreRefused, StoreUnavailable
from tenure._driver.guard import EnterGuarded
from tenure._lua import script
from tenure.patterns import streams
from tenure.patterns.streams import (
    KEY_FIELD,
    Handler,
    Partitioner,
    StreamProducer,
    StreamWorker,
    fair_share,
    partition_lock_name,
    partition_stream,
)
from tenure.testing import LocalCluster
from tenure.verify.proxy import Proxy

from ..locks import free_to_another_thread
from .conftest import Interrupted

# Partition leases: a dead worker's partitions move after about this long. 2 s, not 1 s:
# a live worker's watchdog (every TTL/3, in a process among many on a loaded 2-core
# machine) must not lose a lease as paused, which the tests would read as a fault of the
# worker (a write refused, a lost lease counted, a partition handled twice).
TTL = 2.0
GROUP = "appliers"
_ctx = multiprocessing.get_context("forkserver")


@pytest.fixture(scope="module")
def lock_nodes() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def data_node() -> Iterator[LocalCluster]:
    """The streams and the applied data (not a lock node)."""
    with LocalCluster(1) as node:
        yield node


@pytest.fixture
def prefix() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


# --- the data store ------------------------------------------------------------------

# KEYS: fence (partition -> highest token), last (key -> last seq), order counter,
# history, refused, duplicates counter, gaps.
# ARGV: partition, key, seq, token, worker, monotonic_ns.
_APPLY = """
local highest = redis.call("HGET", KEYS[1], ARGV[1])
if highest and tonumber(highest) > tonumber(ARGV[4]) then
    redis.call("RPUSH", KEYS[5], table.concat({ARGV[5], ARGV[4], ARGV[2], ARGV[3]}, " "))
    return {"stale", highest}
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[4])
local last = tonumber(redis.call("HGET", KEYS[2], ARGV[2]) or "0")
local seq = tonumber(ARGV[3])
if seq <= last then
    redis.call("INCR", KEYS[6])
    return {"duplicate", tostring(last)}
end
if seq ~= last + 1 then
    redis.call("RPUSH", KEYS[7], table.concat({ARGV[2], last, seq}, " "))
    return {"gap", tostring(last)}
end
redis.call("HSET", KEYS[2], ARGV[2], ARGV[3])
local order = redis.call("INCR", KEYS[3])
redis.call("RPUSH", KEYS[4],
           table.concat({order, ARGV[1], ARGV[5], ARGV[4], ARGV[2], ARGV[3], ARGV[6]}, " "))
return {"applied", tostring(order)}
"""


@dataclass(frozen=True)
class Applied:
    order: int  # the store's own sequence: the true order of effects
    partition: int
    worker: str
    token: int
    key: str
    seq: int
    monotonic_ns: int  # the worker's clock just before the write, for reading a failure


class Store:
    """Per-key sequence numbers, fenced per partition, with an apply history."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        names = ("fence", "last", "order", "history", "refused", "duplicates", "gaps")
        self.keys = [f"{prefix}:data:{name}" for name in names]

    def apply(self, partition: int, key: str, seq: int, token: int, worker: str) -> str:
        """``"applied"``, ``"duplicate"`` or ``"gap"``.

        Raises:
            tenure.StaleToken: a newer lease has written this partition.
        """
        args: list[str | int] = [partition, key, seq, token, worker, time.monotonic_ns()]
        outcome, detail = self.client.eval(_APPLY, len(self.keys), *self.keys, *args)
        if _s(outcome) == "stale":
            raise tenure.StaleToken(f"partition {partition}", token, int(detail))
        return _s(outcome)

    def applied(self) -> int:
        return int(self.client.get(self.keys[2]) or 0)

    def history(self) -> list[Applied]:
        rows = (_s(line).split() for line in self.client.lrange(self.keys[3], 0, -1))
        return [
            Applied(int(o), int(p), w, int(t), k, int(s), int(ns)) for o, p, w, t, k, s, ns in rows
        ]

    def refused(self) -> list[str]:
        return [_s(line) for line in self.client.lrange(self.keys[4], 0, -1)]

    def duplicates(self) -> int:
        return int(self.client.get(self.keys[5]) or 0)

    def gaps(self) -> list[str]:
        return [_s(line) for line in self.client.lrange(self.keys[6], 0, -1)]

    def last(self) -> dict[str, int]:
        return {_s(k): int(v) for k, v in self.client.hgetall(self.keys[1]).items()}

    # A worker stalls inside its handler until the test says "go" (or kills it).
    def stall(self, worker: str) -> None:
        self.client.set(f"{self.prefix}:trapped", worker)
        while not self.client.exists(f"{self.prefix}:go"):
            time.sleep(0.005)

    def trapped(self) -> str | None:
        value = self.client.get(f"{self.prefix}:trapped")
        return None if value is None else _s(value)

    def go(self) -> None:
        self.client.set(f"{self.prefix}:go", 1)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- worker processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Trap:
    """Where a worker stalls in its handler, once: on an entry whose payload has a
    ``trap`` field, or on its ``nth`` handler call."""

    where: str  # "before_write" (lease checked, write not done) or "after_write"
    nth: int | None = None


def _worker_main(
    lock_urls: list[str],
    data_url: str,
    prefix: str,
    partitions: int,
    name: str,
    trap: Trap | None,
    control: Connection,
) -> None:
    stop = PipeSignal(control)
    with tenure.Client(lock_urls) as locks, redis.Redis.from_url(data_url) as client:
        store = Store(client, prefix)
        partition_of = Partitioner(partitions)
        calls, armed = 0, trap

        def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
            nonlocal calls, armed
            calls += 1
            where = None
            if armed is not None and (calls == armed.nth if armed.nth else "trap" in payload):
                where, armed = armed.where, None
            if where == "before_write":
                store.stall(name)
            store.apply(partition_of(key), key, int(payload["seq"]), token, name)
            if where == "after_write":
                store.stall(name)

        worker = StreamWorker(
            locks, client, prefix, partitions, GROUP, name, handler, lease_ttl=TTL, batch_size=50
        )

        def report_holdings() -> None:
            while not stop.wait(0.05):
                client.hset(f"{prefix}:held", name, ",".join(map(str, sorted(worker.held))))

        reporter = threading.Thread(target=report_holdings, daemon=True)
        reporter.start()
        worker.run(stop)
        reporter.join()
        control.send(asdict(worker.stats))


class PipeSignal:
    """A stop signal that survives SIGKILLed waiters: set by a message on a pipe.

    (A ``multiprocessing.Event`` does not: its ``set()`` waits for every sleeper to
    acknowledge the wake-up, and a killed sleeper never does.)
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def is_set(self) -> bool:
        return self.conn.poll()

    def wait(self, timeout: float | None = None) -> bool:
        return self.conn.poll(timeout)


class Fleet:
    """Worker processes of one test; ``finish()`` stops them and collects their stats."""

    def __init__(self, lock_urls: list[str], data_url: str, prefix: str, partitions: int) -> None:
        self.args = (lock_urls, data_url, prefix, partitions)
        self.procs: dict[str, BaseProcess] = {}
        self.pipes: dict[str, Connection] = {}

    def start(self, name: str, trap: Trap | None = None) -> None:
        ours, theirs = _ctx.Pipe()
        proc = _ctx.Process(target=_worker_main, args=(*self.args, name, trap, theirs), name=name)
        proc.start()
        theirs.close()
        self.procs[name], self.pipes[name] = proc, ours

    def signal(self, name: str, sig: signal.Signals) -> None:
        pid = self.procs[name].pid
        assert pid is not None
        os.kill(pid, sig)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        self.procs[name].join(10)

    def finish(self) -> dict[str, dict[str, int]]:
        """Stop every live worker (they release their leases); their final stats."""
        live = {name: proc for name, proc in self.procs.items() if proc.exitcode is None}
        for name in live:
            self.pipes[name].send("stop")
        stats = {}
        for name, proc in live.items():
            assert self.pipes[name].poll(20), f"worker {name} did not stop"
            stats[name] = self.pipes[name].recv()
            proc.join(10)
            assert proc.exitcode == 0, f"worker {name} exited with {proc.exitcode}"
        return stats

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(10)
        for pipe in self.pipes.values():
            pipe.close()


@pytest.fixture
def fleet(
    lock_nodes: LocalCluster, data_node: LocalCluster, prefix: str
) -> Iterator[Callable[[int], Fleet]]:
    made: list[Fleet] = []

    def make(partitions: int) -> Fleet:
        made.append(Fleet(lock_nodes.urls, data_node.urls[0], prefix, partitions))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.fixture
def data(data_node: LocalCluster, prefix: str) -> Iterator[Store]:
    with data_node[0].client() as client:
        yield Store(client, prefix)


def _wait_until(what: str, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


def _rounds(keys: Sequence[str], seqs: range) -> list[list[tuple[str, Mapping[str, int]]]]:
    """One round per sequence number: every key's next write."""
    return [[(key, {"seq": seq}) for key in keys] for seq in seqs]


# --- what every run must show ------------------------------------------------------------


def _assert_exactly_once_in_order(store: Store, keys: Sequence[str], n: int) -> None:
    history = store.history()
    assert store.gaps() == []  # no write was ever offered ahead of its predecessor
    per_key: dict[str, list[int]] = defaultdict(list)
    for h in history:
        per_key[h.key].append(h.seq)
    assert dict(per_key) == {key: list(range(1, n + 1)) for key in keys}
    assert store.last() == dict.fromkeys(keys, n)


def _assert_one_writer_per_partition(history: Sequence[Applied]) -> None:
    """The applies of one lease form one run in the store's order: never interleaved
    with another lease's on the same partition, and tokens only go up.

    Compared on the store's order (taken inside the atomic script), not on the workers'
    monotonic_ns: a timestamp is read before its write is sent, so two adjacent writes
    of a hand-over could carry stamps in either order without overlapping at all.
    """
    runs: dict[int, list[tuple[int, str]]] = defaultdict(list)  # partition -> (token, worker)
    for h in sorted(history, key=lambda h: h.order):
        run = runs[h.partition]
        if not run or run[-1] != (h.token, h.worker):
            run.append((h.token, h.worker))
    for partition, run in runs.items():
        tokens = [token for token, _ in run]
        # Strictly increasing: a lease's applies are contiguous, and one token is one
        # worker's (a token shared by two workers would show as two runs with one token).
        assert tokens == sorted(set(tokens)), f"partition {partition}: {run}"


def _assert_nothing_pending(client: redis.Redis, prefix: str, partitions: int) -> None:
    for p in range(partitions):
        assert client.xpending(partition_stream(prefix, p), GROUP)["pending"] == 0


# --- the tests -------------------------------------------------------------------------------


def test_a_crash_and_a_join_lose_nothing_and_keep_order(
    fleet: Callable[[int], Fleet], data: Store, data_node: LocalCluster, prefix: str
) -> None:
    partitions, keys, n = 8, [f"acct-{i}" for i in range(200)], 15
    workers = fleet(partitions)
    workers.start("w0", Trap("after_write", nth=150))  # stalls with a batch unacknowledged
    workers.start("w1")
    workers.start("w2")
    # Whoever came up first took all 8; the others' heartbeats make it hand some over.
    _wait_until("an even spread", lambda: _holdings(data, ["w0", "w1", "w2"]) == [2, 3, 3])

    w3_in, cancelled = threading.Event(), threading.Event()

    def may_append(i: int) -> bool:
        # Keep about three rounds in flight, so the crash happens mid-stream; hold the last
        # rounds back until w3 owns partitions, so that it must write some.
        if cancelled.is_set():
            return True
        held_back = i >= n - 3 and not w3_in.is_set()
        return not held_back and data.applied() >= (i - 3) * len(keys)

    def produce() -> None:
        with data_node[0].client() as client:
            producer = StreamProducer(client, prefix, partitions)
            for i, writes in enumerate(_rounds(keys, range(1, n + 1))):
                _wait_until(f"room for round {i + 1}", functools.partial(may_append, i))
                producer.append_many(writes)

    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(produce)
        try:
            _wait_until("w0 to stall", lambda: data.trapped() == "w0")
            workers.kill("w0")  # mid-batch: one write applied but not acknowledged
            workers.start("w3")  # joins: the others must hand partitions over
            _wait_until("w3 to get partitions", lambda: _holds(data, "w3") != set())
            w3_in.set()
            producing.result()
        finally:
            cancelled.set()
        _wait_until("every write", lambda: data.applied() == len(keys) * n, timeout=30)
        elapsed = time.monotonic() - started
    # Spread: once the dead worker's heartbeat is gone, shares of 3, 3 and 2, covering all.
    _wait_until("an even spread", lambda: _holdings(data, ["w1", "w2", "w3"]) == [2, 3, 3])
    stats = workers.finish()

    _assert_exactly_once_in_order(data, keys, n)
    history = data.history()
    _assert_one_writer_per_partition(history)
    _assert_nothing_pending(data.client, prefix, partitions)
    assert data.refused() == []  # nobody even tried to write with a superseded lease
    assert data.duplicates() >= 1  # w0's last write was delivered again, and skipped
    assert sum(s["claimed"] for s in stats.values()) >= 1
    assert {h.worker for h in history} == {"w0", "w1", "w2", "w3"}  # w3 got partitions
    print(f"\n{len(history)} writes in {elapsed:.1f} s; stats {stats}")


def _holds(store: Store, name: str) -> set[int]:
    """The partitions worker ``name`` reported holding last (every 50 ms)."""
    raw = _s(store.client.hget(f"{store.prefix}:held", name) or b"")
    return {int(p) for p in raw.split(",") if p}


def _holdings(store: Store, names: Sequence[str]) -> list[int] | None:
    """How many partitions each named worker holds, sorted; None unless all 8 are held
    exactly once."""
    sets = [_holds(store, name) for name in names]
    if len(set().union(*sets)) != 8 or sum(map(len, sets)) != 8:
        return None
    return sorted(map(len, sets))


@pytest.mark.parametrize("where", ["before_write", "after_write"])
def test_a_paused_worker_writes_nothing_after_it_resumes(
    fleet: Callable[[int], Fleet], data: Store, data_node: LocalCluster, prefix: str, where: str
) -> None:
    """Timeline (partition 0 of 2)::

    alpha  takes both ... trap entry: stall ... SIGSTOP ............ SIGCONT: check or write
    bravo                                  join, take over, claim, apply rounds 2-3
    """
    partitions, keys = 2, [f"acct-{i}" for i in range(20)]
    partition_of = Partitioner(partitions)
    trap_key = next(key for key in keys if partition_of(key) == 0)
    workers = fleet(partitions)
    producer = StreamProducer(data.client, prefix, partitions)
    workers.start("alpha", Trap(where))
    producer.append_many(_rounds(keys, range(1, 2))[0])
    _wait_until("round 1", lambda: data.applied() == len(keys))

    # Round 2 in one MULTI, so alpha reads the trap entry with others behind it.
    round2: list[tuple[str, Mapping[str, int]]] = [
        (key, {"seq": 2, "trap": 1} if key == trap_key else {"seq": 2}) for key in keys
    ]
    producer.append_many(round2, atomic=True)
    _wait_until("alpha to stall", lambda: data.trapped() == "alpha")
    workers.signal("alpha", signal.SIGSTOP)
    workers.start("bravo")
    _wait_until("bravo to finish round 2", lambda: data.applied() == 2 * len(keys))
    producer.append_many(_rounds(keys, range(3, 4))[0])
    _wait_until("round 3", lambda: data.applied() == 3 * len(keys))
    resumed_at = data.applied()
    alpha_tokens = {h.token for h in data.history() if h.worker == "alpha"}

    data.go()
    workers.signal("alpha", signal.SIGCONT)
    if where == "before_write":
        # It had passed its check; the write it makes on waking carries the old token.
        _wait_until("alpha's late write", lambda: data.refused() != [])
    producer.append_many(_rounds(keys, range(4, 5))[0])
    _wait_until("round 4", lambda: data.applied() == 4 * len(keys))
    stats = workers.finish()

    history = data.history()
    late = [h for h in history if h.order > resumed_at and h.token in alpha_tokens]
    assert late == []  # nothing applied with alpha's old leases after it woke
    _assert_exactly_once_in_order(data, keys, 4)
    _assert_one_writer_per_partition(history)
    _assert_nothing_pending(data.client, prefix, partitions)
    refused = data.refused()
    if where == "before_write":
        (line,) = refused
        worker, token, key, seq = line.split()
        assert (worker, key, seq) == ("alpha", trap_key, "2")
        assert int(token) in alpha_tokens
        assert stats["alpha"]["fenced"] >= 1
    else:
        assert refused == []  # its lease check stopped it before any write
        assert stats["alpha"]["lost"] >= 1
        assert data.duplicates() >= 1  # bravo got the trap entry again and skipped it


# --- one worker, in this process ---------------------------------------------------------


def test_the_partition_is_the_same_in_every_process() -> None:
    keys = [f"orders:{i}" for i in range(64)]
    ours = [Partitioner(8)(key) for key in keys]
    assert ours == [zlib.crc32(key.encode()) % 8 for key in keys]
    code = "from tenure.patterns.streams import Partitioner; print([Partitioner(8)(f'orders:{i}') for i in range(64)])"  # noqa: E501
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # another salt for hash(): not used
    theirs = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert theirs.stdout.strip() == str(ours)


@pytest.mark.parametrize("bad", ["", "caf\udce9", 7, None])
def test_a_key_the_nodes_cannot_hold_has_no_partition(bad: object) -> None:
    # A lone surrogate raised a raw UnicodeEncodeError, a number an AttributeError.
    with pytest.raises(tenure.ConfigurationError) as info:
        Partitioner(8)(bad)  # type: ignore[arg-type]
    assert info.value.parameter == "key"


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ((None, ["a"], "a"), "partitions"),  # each a raw TypeError, before
        ((0, ["a"], "a"), "partitions"),
        ((4, None, "a"), "live"),
        ((4, "ab", "a"), "live"),
        ((4, ["a", 2], "a"), "live"),
        ((4, ["a"], None), "me"),
    ],
)
def test_fair_share_refuses_what_it_cannot_share(
    arguments: tuple[Any, ...], parameter: str
) -> None:
    with pytest.raises(tenure.ConfigurationError) as info:
        fair_share(*arguments)
    assert info.value.parameter == parameter


def test_shares_add_up_and_none_exceeds_the_ceiling() -> None:
    for partitions in range(1, 20):
        for workers in range(1, 12):
            names = [f"w{i}" for i in range(workers)]
            shares = [fair_share(partitions, names, name) for name in names]
            assert sum(shares) == partitions
            assert max(shares) == math.ceil(partitions / workers)


@pytest.mark.parametrize(
    "payload",
    [{KEY_FIELD: "x"}, {"flag": True}, {"ratio": 0.5}, {"nested": {"a": 1}}],
)
def test_a_bad_payload_is_refused_before_anything_is_sent(payload: Any) -> None:
    producer = StreamProducer(redis.Redis(), "orders", 4)  # never connects
    with pytest.raises(tenure.ConfigurationError):
        producer.append("k", payload)
    producer.client.close()


def test_a_payload_or_batch_of_the_wrong_shape_is_refused() -> None:
    # A payload that is no mapping raised a raw AttributeError, a write that is no pair a
    # raw ValueError.
    producer = StreamProducer(redis.Redis(), "orders", 4)  # never connects
    for bad in ([("a", 1)], None):
        with pytest.raises(tenure.ConfigurationError) as info:
            producer.append("k", bad)  # type: ignore[arg-type]
        assert info.value.parameter == "payload"
    with pytest.raises(tenure.ConfigurationError) as info:
        producer.append_many(["abc"])  # type: ignore[list-item]
    assert info.value.parameter == "writes"
    producer.client.close()


def test_a_client_decoding_with_an_encoding_that_is_not_ascii_is_refused(
    data_node: LocalCluster, prefix: str
) -> None:
    # redis-py decodes every reply with the client's encoding: with utf-16 the producer
    # raised redis-py's raw UnicodeDecodeError from its first command, and the worker's
    # refusal said "not UTF-8 text" of a client that does not decode UTF-8.
    url = data_node.urls[0]
    with (
        redis.Redis.from_url(url, decode_responses=True, encoding="utf-16") as client,
        tenure.Client(data_node.urls) as locks,
    ):
        with pytest.raises(tenure.ConfigurationError) as info:
            StreamProducer(client, prefix, 2).append("k", {"v": b"x"})
        assert info.value.parameter == "redis_client"
        assert "encoding 'utf-16'" in str(info.value)
        assert "decode_responses=False" in str(info.value)
        with pytest.raises(tenure.ConfigurationError) as info:
            StreamWorker(locks, client, prefix, 2, "g", "w", lambda *entry: None)
        assert info.value.parameter == "redis_client"
        assert "encoding 'utf-16'" in str(info.value)
        assert "UTF-8" not in str(info.value)
    with data_node[0].client() as raw:
        assert raw.keys(f"{prefix}*") == []


def test_a_worker_refuses_a_lock_client_or_handler_it_cannot_use(data_node: LocalCluster) -> None:
    # A redis.Redis as the lock client (it has a lock() of its own) failed only in run(),
    # with a raw AttributeError; a handler that is not callable failed on every entry,
    # retried every retry_delay: its partition stopped, with nothing but a log line.
    with data_node[0].client() as client, tenure.Client(data_node.urls) as locks:
        with pytest.raises(tenure.ConfigurationError) as info:
            StreamWorker(client, client, "orders", 4, "g", "w", lambda *entry: None)
        assert info.value.parameter == "lock_client"
        for handler in (None, "apply"):
            with pytest.raises(tenure.ConfigurationError) as info:
                StreamWorker(locks, client, "orders", 4, "g", "w", handler)  # type: ignore[arg-type]
            assert info.value.parameter == "handler"


@pytest.mark.parametrize("parameter", ["stream_prefix", "group", "consumer_name"])
@pytest.mark.parametrize("bad", ["", "caf\udce9", 7])
def test_worker_names_are_refused_before_anything_is_sent(parameter: str, bad: object) -> None:
    # A lone surrogate (os.fsdecode() of bytes that are not UTF-8) cannot be sent: it
    # raised a raw UnicodeEncodeError from run(), after a partition lease was taken.
    names: dict[str, Any] = {"stream_prefix": "orders", "group": "g", "consumer_name": "w"}
    names[parameter] = bad
    with pytest.raises(tenure.ConfigurationError) as info:
        StreamWorker(
            tenure.Client(["redis://127.0.0.1:1"]),  # never connects
            redis.Redis(),
            names["stream_prefix"],
            4,
            names["group"],
            names["consumer_name"],
            lambda *entry: None,
        )
    assert info.value.parameter == parameter


@pytest.fixture
def solo(
    lock_nodes: LocalCluster, data_node: LocalCluster, prefix: str
) -> Iterator[Callable[..., StreamWorker]]:
    """Makes in-process workers; stops them and closes their clients afterwards."""
    made: list[StreamWorker] = []
    with tenure.Client(lock_nodes.urls) as locks, data_node[0].client() as client:

        def make(name: str, handler: Handler, partitions: int = 1, **options: Any) -> StreamWorker:
            worker = StreamWorker(
                locks, client, prefix, partitions, GROUP, name, handler, lease_ttl=TTL, **options
            )
            made.append(worker)
            return worker

        yield make
        for worker in made:
            worker.stop()


def _drain(worker: StreamWorker, until: Callable[[], bool]) -> None:
    _wait_until("the worker to catch up", lambda: worker.run_once() >= 0 and until())


def test_a_failing_handler_retries_the_entry_before_anything_newer(
    solo: Callable[..., StreamWorker], data: Store, prefix: str
) -> None:
    applied: list[tuple[str, int]] = []
    failures = iter([RuntimeError("database hiccup")])

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        seq = int(payload["seq"])
        if (key, seq) == ("k1", 2):
            failure = next(failures, None)
            if failure is not None:
                raise failure
        applied.append((key, seq))

    worker = solo("solo", handler, retry_delay=0.05)
    writes = [(key, seq) for seq in range(1, 6) for key in ("k1", "k2")]
    StreamProducer(data.client, prefix, 1).append_many((k, {"seq": s}) for k, s in writes)
    _drain(worker, lambda: len(applied) == len(writes))
    assert applied == writes  # the failed entry first on retry, nothing twice
    assert (worker.stats.failed, worker.stats.handled) == (1, len(writes))
    assert worker.stats.claimed >= 1  # what followed it was claimed back, in order
    _assert_nothing_pending(data.client, prefix, 1)


def test_a_poison_entry_stops_its_partition_until_it_is_deleted(
    solo: Callable[..., StreamWorker], data: Store, prefix: str
) -> None:
    # A handler that always raises on one entry: nothing behind it in its partition is
    # handled (other keys of the partition wait too), however long; deleting the entry
    # (XDEL) lets the partition go on, in order, with nothing lost or pending.
    applied: list[tuple[str, int]] = []

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        if "poison" in payload:
            raise ValueError("cannot parse this write")
        applied.append((key, int(payload["seq"])))

    worker = solo("solo", handler, retry_delay=0.05)
    producer = StreamProducer(data.client, prefix, 1)
    producer.append_many([("k1", {"seq": 1}), ("k2", {"seq": 1})])
    poison = producer.append("k1", {"seq": 2, "poison": 1})
    producer.append_many([("k1", {"seq": 2}), ("k2", {"seq": 2})])
    _run_until(worker, lambda: worker.stats.failed >= 5, within=5.0)
    assert worker.stats.failed >= 5  # retried, every retry_delay, for as long as it runs
    assert applied == [("k1", 1), ("k2", 1)]  # nothing behind it, not even k2's
    data.client.xdel(partition_stream(prefix, 0), poison)
    _run_until(worker, lambda: len(applied) == 4)
    assert applied == [("k1", 1), ("k2", 1), ("k1", 2), ("k2", 2)]
    _assert_nothing_pending(data.client, prefix, 1)


def test_an_entry_deleted_while_pending_is_acknowledged_and_skipped(
    solo: Callable[..., StreamWorker], data: Store, prefix: str
) -> None:
    client, stream = data.client, partition_stream(prefix, 0)
    ids = StreamProducer(client, prefix, 1).append_many([(f"k{i}", {"seq": 1}) for i in range(3)])
    # A worker that died after reading all three; then the middle one was deleted.
    client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    client.xreadgroup(GROUP, "ghost", {stream: ">"})
    client.xdel(stream, ids[1])
    seen: list[str] = []
    worker = solo("heir", lambda key, payload, token: seen.append(key))
    _drain(worker, lambda: client.xpending(stream, GROUP)["pending"] == 0)
    assert seen == ["k0", "k2"]
    # Redis 6.2 reports it as a nil entry (acknowledged by the read script); 7 drops it.
    major = int(_s(client.info("server")["redis_version"]).split(".")[0])
    assert worker.stats.skipped == (1 if major < 7 else 0)


def _seqs(applied: list[tuple[str, int]]) -> Callable[[str, Mapping[str, bytes], int], None]:
    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        applied.append((key, int(payload["seq"])))

    return handler


def _run_until(worker: StreamWorker, done: Callable[[], bool], within: float = 3.0) -> None:
    """Passes of ``worker`` until ``done()`` or ``within`` seconds; the caller asserts."""
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:
        if worker.run_once() == 0:
            time.sleep(0.01)


def test_a_read_run_again_hands_out_the_lost_batch_first(
    solo: Callable[..., StreamWorker], data: Store, prefix: str
) -> None:
    # The read script ran (its XREADGROUP moved 6..10 into the worker's pending list)
    # but the worker never saw the reply: a timeout, or redis-py's own retry running the
    # read again. The next read for new entries must hand out 6..10 first, not 11..15.
    applied: list[tuple[str, int]] = []
    worker = solo("solo", _seqs(applied), batch_size=5)
    producer = StreamProducer(data.client, prefix, 1)
    ids = producer.append_many(("k", {"seq": s}) for s in range(1, 16))
    _run_until(worker, lambda: len(applied) == 5)
    assert applied == [("k", s) for s in range(1, 6)]
    stream = partition_stream(prefix, 0)
    keys = [stream, f"{stream}:owner:{GROUP}"]
    token = data.client.get(keys[1])  # the worker's: the script serves its owner only
    assert token is not None
    lost = data.client.eval(
        script("stream_read").source.decode(), 2, *keys, _s(token), GROUP, "solo", 5, ""
    )
    assert [_s(entry_id) for entry_id, _ in lost[2]] == ids[5:10]
    _run_until(worker, lambda: len(applied) == 15)
    assert applied == [("k", s) for s in range(1, 16)]
    _assert_nothing_pending(data.client, prefix, 1)


def test_a_lost_read_reply_skips_nothing_and_keeps_order(
    lock_nodes: LocalCluster, data_node: LocalCluster, data: Store, prefix: str
) -> None:
    # The stream node runs a read but its reply is lost on the way back (the worker's
    # socket times out); then the network heals. The batch that read moved into the
    # worker's pending list comes next, before anything newer.
    node = data_node[0]
    assert node.port is not None
    applied: list[tuple[str, int]] = []
    with (
        Proxy(node.host, node.port, name="stream-node") as proxy,
        tenure.Client(lock_nodes.urls) as locks,
        redis.Redis(
            host=proxy.address[0],
            port=proxy.address[1],
            socket_timeout=0.2,
            retry=Retry(NoBackoff(), 1),  # after the heal, reconnect at once
        ) as client,
    ):
        worker = StreamWorker(
            locks,
            client,
            prefix,
            1,
            GROUP,
            "behind-proxy",
            _seqs(applied),
            lease_ttl=TTL,
            batch_size=5,
            rebalance_interval=60.0,  # no heartbeat inside the fault: only the read
            heartbeat_ttl=120.0,
            retry_delay=0.05,
        )
        try:
            producer = StreamProducer(data.client, prefix, 1)
            producer.append_many(("k", {"seq": s}) for s in range(1, 31))
            _run_until(worker, lambda: len(applied) == 5)
            assert applied == [("k", s) for s in range(1, 6)]
            proxy.drop_replies()
            assert worker.run_once() == 0
            proxy.heal()
            assert proxy.stats.bytes_dropped > 0
            # Without a rewind: 6..10 stay pending, and 11..30 are handled first.
            _run_until(worker, lambda: len(applied) == 30)
            assert applied == [("k", s) for s in range(1, 31)]
        finally:
            worker.stop()
    _assert_nothing_pending(data.client, prefix, 1)


def test_an_entry_whose_key_is_not_text_is_skipped(
    solo: Callable[..., StreamWorker], data: Store, prefix: str
) -> None:
    # Written by a producer other than StreamProducer: a key that is not UTF-8 raised a
    # raw UnicodeDecodeError from every worker's run(), and the partition was stuck.
    client, stream = data.client, partition_stream(prefix, 0)
    producer = StreamProducer(client, prefix, 1)
    producer.append("k1", {"v": "1"})
    client.xadd(stream, {KEY_FIELD.encode(): b"\xffbad", b"v": b"2"})
    client.xadd(stream, {KEY_FIELD.encode(): b"k1", b"\xfename": b"x", b"v": b"3"})
    producer.append("k1", {"v": "4"})
    seen: list[tuple[str, dict[str, bytes]]] = []
    worker = solo("tolerant", lambda key, payload, token: seen.append((key, dict(payload))))
    _run_until(worker, lambda: len(seen) == 3 and client.xpending(stream, GROUP)["pending"] == 0)
    # A field name that is not UTF-8 arrives decoded with surrogateescape: nothing lost.
    assert seen == [
        ("k1", {"v": b"1"}),
        ("k1", {b"\xfename".decode(errors="surrogateescape"): b"x", "v": b"3"}),
        ("k1", {"v": b"4"}),
    ]
    assert worker.stats.skipped == 1
    _assert_nothing_pending(client, prefix, 1)


@pytest.mark.parametrize("where", ["before_write", "after_write"])
def test_a_hung_handler_lets_its_partition_go_after_handler_timeout(
    solo: Callable[..., StreamWorker], data: Store, prefix: str, where: str
) -> None:
    """Timeline (one partition, in-process workers, each running ``run`` in a thread)::

    hung  takes it, reads 1..3, applies 1..2, hangs on 3 (an Event) ...... released: returns
    heir        joins; after handler_timeout + about lease_ttl takes it, applies 3..9

    The watchdog used to extend the hung worker's lease for as long as the process
    lived, so no other worker got the partition however long the call hung. The hung
    entry is the last of its batch: on returning, the worker must not acknowledge it.
    """
    hang, release, calls = threading.Event(), threading.Event(), []

    def handler(name: str) -> Handler:
        def apply(key: str, payload: Mapping[str, bytes], token: int) -> None:
            seq = int(payload["seq"])
            calls.append((name, seq))
            stuck = (name, seq) == ("hung", 3)
            if stuck and where == "after_write":
                data.apply(0, key, seq, token, name)
            if stuck:
                hang.set()
                release.wait(30)  # a database call with no timeout
            if not (stuck and where == "after_write"):
                data.apply(0, key, seq, token, name)

        return apply

    # "heir" sorts first: its fair share of the one partition is 1 whether or not the
    # hung worker still counts as live, so the partition stays with it afterwards.
    options = {"handler_timeout": 0.5, "rebalance_interval": 0.05, "batch_size": 3}
    hung = solo("hung", handler("hung"), **options)
    heir = solo("heir", handler("heir"), **options)
    producer = StreamProducer(data.client, prefix, 1)
    producer.append_many(("k", {"seq": s}) for s in range(1, 7))
    stop = threading.Event()
    threads = [threading.Thread(target=hung.run, args=(stop,), daemon=True)]
    threads[0].start()
    try:
        _wait_until("the handler to hang", hang.is_set)
        hung_at = time.monotonic()
        threads.append(threading.Thread(target=heir.run, args=(stop,), daemon=True))
        threads[1].start()
        _wait_until("the heir to take the partition", lambda: heir.held == {0}, timeout=10)
        # The lease ran out after handler_timeout plus at most about lease_ttl.
        assert time.monotonic() - hung_at < 0.5 + 2 * TTL + 2
        _wait_until("the heir to apply 3..6", lambda: data.last() == {"k": 6})
        producer.append_many(("k", {"seq": s}) for s in range(7, 10))
        _wait_until("the heir to apply 7..9", lambda: data.last() == {"k": 9})
        assert hung.held == {0}  # its thread is still in the handler: it knows nothing yet

        release.set()  # the hung call returns at last
        _wait_until("the hung worker to let go", lambda: hung.held == frozenset())
        time.sleep(0.3)  # it goes on with its loop, and must handle nothing else
    finally:
        release.set()
        stop.set()
        for thread in threads:
            thread.join(10)

    assert [seq for name, seq in calls if name == "hung"] == [1, 2, 3]  # nothing again
    assert [seq for name, seq in calls if name == "heir"] == list(range(1, 10))
    history = data.history()
    late = [("hung", 3)] if where == "after_write" else []
    first_of_heir = 4 if where == "after_write" else 3
    assert [(h.worker, h.seq) for h in history] == [
        ("hung", 1),
        ("hung", 2),
        *late,
        *(("heir", seq) for seq in range(first_of_heir, 10)),
    ]
    _assert_exactly_once_in_order(data, ["k"], 9)
    _assert_one_writer_per_partition(history)
    if where == "before_write":
        # Its late write carried the old token: the fenced store refused it.
        (line,) = data.refused()
        assert line.split()[::3] == ["hung", "3"]
        assert (hung.stats.fenced, hung.stats.lost, hung.stats.handled) == (1, 0, 2)
    else:
        # It wrote before it hung; on returning it found its lease lost and acknowledged
        # nothing (the heir's claim delivered 1..3 again, and the store skipped them).
        assert data.refused() == []
        assert (hung.stats.fenced, hung.stats.lost, hung.stats.handled) == (0, 1, 3)
        assert data.duplicates() == 3
    _assert_nothing_pending(data.client, prefix, 1)


def test_run_once_after_stop_takes_no_partition(solo: Callable[..., StreamWorker]) -> None:
    # stop() says "stop for good"; a caller driving its own loop that called run_once
    # once more took every partition again, kept alive by their watchdogs.
    worker = solo("solo", lambda *entry: None, partitions=2, rebalance_interval=0.01)
    worker.run_once()
    assert worker.held == {0, 1}
    worker.stop()
    assert worker.held == frozenset()
    time.sleep(0.05)  # a balance is due
    assert worker.run_once() == 0
    assert worker.held == frozenset()
    name = partition_lock_name(worker.stream_prefix, 0, worker.group)
    assert not worker.lock_client.lock(name, ttl=TTL).locked()


def test_stop_from_another_thread_during_run_once_gives_back_at_the_end_of_the_pass(
    solo: Callable[..., StreamWorker], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller driving run_once in its own thread, stopped from another (a signal
    # handler, a supervisor): stop() released the leases under the handler that was
    # still running, so another worker could take its partition while it wrote, its
    # batch went unacknowledged, and the two threads changed the held partitions at once.
    # Now the pass gives them back when it ends, each lease exactly once.
    released: list[str] = []
    quiet_release = streams._quiet_release

    def counting(lease: tenure.Lease) -> None:
        released.append(lease.name)
        quiet_release(lease)

    monkeypatch.setattr(streams, "_quiet_release", counting)
    entered, go = threading.Event(), threading.Event()
    handled: list[str] = []

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        entered.set()
        assert go.wait(20)
        handled.append(key)

    worker = solo("stopped", handler, partitions=2)
    keys = [f"k{i}" for i in range(8)]
    assert {Partitioner(2)(key) for key in keys} == {0, 1}
    producer = StreamProducer(worker.client, prefix, 2)
    for key in keys:
        producer.append(key, {"seq": b"1"})
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            # The first pass takes the partitions and claims their (empty) pending lists.
            deadline = time.monotonic() + 20
            while not entered.is_set() and time.monotonic() < deadline:
                worker.run_once()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    loop = threading.Thread(target=drive)
    loop.start()
    try:
        assert entered.wait(20)
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        stopper.join(20)
        assert not stopper.is_alive()  # stop() returns while the handler still runs
        names = [partition_lock_name(prefix, p, GROUP) for p in range(2)]
        # Still the single writer of its partitions until its pass ends.
        assert worker.held == {0, 1}
        assert all(worker.lock_client.lock(name, ttl=TTL).locked() for name in names)
        assert released == []
    finally:
        go.set()
        loop.join(20)
    assert not loop.is_alive()
    assert errors == []
    assert sorted(handled) == sorted(keys)  # the batch it had read, handled once
    assert worker.held == frozenset()
    assert sorted(released) == sorted(names)  # each lease given back exactly once
    _assert_nothing_pending(worker.client, prefix, 2)  # and acknowledged
    assert worker.run_once() == 0
    worker.stop()  # a second stop finds nothing to give back
    assert sorted(released) == sorted(names)
    # Given back, not left to expire: another worker takes both at once.
    other = solo("other", lambda *entry: None, partitions=2)
    other.run_once()
    assert other.held == {0, 1}


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX signals")
def test_stop_from_a_signal_handler_while_the_worker_gives_back_does_not_deadlock(
    solo: Callable[..., StreamWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGTERM handler that calls stop() runs in the main thread, between two bytecodes
    # of whatever it runs, perhaps while that thread gives its partitions back under the
    # worker's lock (a second SIGTERM during shutdown): with a plain lock, stop() waited
    # for itself for ever. The lease release here raises the signal at that very moment;
    # an alarm turns a hang into a failure.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")
    worker = solo("signalled", lambda *entry: None, partitions=2)
    worker.run_once()
    assert worker.held == {0, 1}
    quiet_release = streams._quiet_release
    signalled: list[int] = []

    def release_and_signal(lease: tenure.Lease) -> None:
        if not signalled:
            signal.raise_signal(signal.SIGUSR1)
        quiet_release(lease)

    def on_usr1(signum: int, frame: object) -> None:
        signalled.append(signum)
        worker.stop()

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError("stop() from the signal handler deadlocked")

    monkeypatch.setattr(streams, "_quiet_release", release_and_signal)
    previous = signal.signal(signal.SIGUSR1, on_usr1), signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 10)
        worker.stop()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGALRM, previous[1])
    assert signalled == [signal.SIGUSR1]
    assert worker.held == frozenset()
    names = [partition_lock_name(worker.stream_prefix, p, GROUP) for p in range(2)]
    assert not any(worker.lock_client.lock(name, ttl=TTL).locked() for name in names)


def test_workers_split_partitions_and_take_over_when_one_stops(
    solo: Callable[..., StreamWorker],
) -> None:
    first = solo("first", lambda *entry: None, partitions=4, rebalance_interval=0.02)
    second = solo("second", lambda *entry: None, partitions=4, rebalance_interval=0.02)
    first.run_once()
    assert first.held == {0, 1, 2, 3}  # alone: everything
    _wait_until(
        "a 2/2 split",
        lambda: (
            [first.run_once(), second.run_once()] != []
            and (len(first.held), len(second.held)) == (2, 2)
        ),
    )
    assert first.held.isdisjoint(second.held)
    first.stop()  # releases at once: no waiting for the TTL
    _wait_until(
        "the survivor to take all", lambda: second.run_once() >= 0 and len(second.held) == 4
    )


def test_two_consumer_groups_each_handle_the_whole_stream(
    lock_nodes: LocalCluster, data_node: LocalCluster, prefix: str
) -> None:
    # A ledger and an audit trail of the same writes: each group's workers own the
    # partitions for their group alone (their leases, fence and registry are the
    # group's), so neither takes partitions from the other and both see every entry.
    keys = [f"k{i}" for i in range(40)]
    seen: dict[str, set[str]] = {"ledger": set(), "audit": set()}
    with tenure.Client(lock_nodes.urls) as locks, data_node[0].client() as client:
        producer = StreamProducer(client, prefix, 4)
        for key in keys:
            producer.append(key, {"seq": b"1"})

        def worker(group: str) -> StreamWorker:
            def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
                seen[group].add(key)

            return StreamWorker(
                locks, client, prefix, 4, group, f"{group}-1", handler, lease_ttl=TTL
            )

        ledger, audit = worker("ledger"), worker("audit")
        try:
            _wait_until(
                "both groups to handle every entry",
                lambda: (
                    [ledger.run_once(), audit.run_once()] != []
                    and seen["ledger"] == seen["audit"] == set(keys)
                ),
            )
            assert ledger.held == audit.held == {0, 1, 2, 3}
        finally:
            ledger.stop()
            audit.stop()


def test_a_partition_whose_take_over_failed_is_not_kept(
    solo: Callable[..., StreamWorker],
) -> None:
    # The lease is acquired (with its watchdog) before the stream is fenced: an error
    # there that is not the data node's must not leave it held, or its watchdog would
    # keep the partition from every other worker while the process lives.
    first = solo("first", lambda *entry: None)

    def broken(number: int, token: int) -> bool:
        raise RuntimeError("a bug between the lease and the fence")

    first._fence_stream = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        first.run_once()
    assert first.held == frozenset()
    name = partition_lock_name(first.stream_prefix, 0, first.group)
    assert not first.lock_client.lock(name, ttl=TTL).locked()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("poll_interval", 1e300),
        ("retry_delay", math.inf),
        ("lease_ttl", 120.0),
        ("handler_timeout", 0),
        ("handler_timeout", math.nan),
        ("handler_timeout", "300"),
    ],
)
def test_worker_options_are_checked_when_it_is_made(
    lock_nodes: LocalCluster, option: str, value: float
) -> None:
    # A sleep of 1e300 s overflowed inside run(); a lease_ttl past the lock client's
    # max_ttl (60 s by default) was refused only there, as "ttl".
    with tenure.Client(lock_nodes.urls) as locks:
        with pytest.raises(tenure.ConfigurationError) as info:
            StreamWorker(
                locks,
                redis.Redis(),
                "orders",
                4,
                "g",
                "w",
                lambda *entry: None,
                **{option: value},  # type: ignore[arg-type]
            )
        assert info.value.parameter == option


@pytest.mark.parametrize(
    ("rebalance_interval", "heartbeat_ttl"),
    [(3.0, None), (1.0, 0.5)],  # None: heartbeat_ttl defaults to lease_ttl (3 s here)
)
def test_a_heartbeat_that_expires_between_beats_is_refused(
    lock_nodes: LocalCluster, rebalance_interval: float, heartbeat_ttl: float | None
) -> None:
    # A worker's registry entry lived heartbeat_ttl and was refreshed every
    # rebalance_interval: with the TTL no longer than the interval, a live worker was
    # missing from the registry between its beats, the others counted one worker fewer
    # and took more than their share of every partition freed meanwhile.
    with (
        tenure.Client(lock_nodes.urls) as locks,
        pytest.raises(tenure.ConfigurationError) as info,
    ):
        StreamWorker(
            locks,
            redis.Redis(),
            "orders",
            4,
            "g",
            "w",
            lambda *entry: None,
            lease_ttl=3.0,
            rebalance_interval=rebalance_interval,
            heartbeat_ttl=heartbeat_ttl,
        )
    assert info.value.parameter == "heartbeat_ttl"
    assert "rebalance_interval" in str(info.value)


def test_producers_and_workers_agree_on_the_partition_count(
    lock_nodes: LocalCluster, data_node: LocalCluster, prefix: str
) -> None:
    # A worker with P=2 beside producers with P=4 read streams 0 and 1 and never 2 and 3:
    # half the writes never handled, and nothing said. The first producer or worker
    # records P; every other one with another P refuses to start.
    keys = [f"k{i}" for i in range(20)]
    seen: set[str] = set()

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        seen.add(key)

    with tenure.Client(lock_nodes.urls) as locks, data_node[0].client() as client:
        producer = StreamProducer(client, prefix, 4)
        for key in keys:
            producer.append(key, {"seq": b"1"})
        assert client.get(f"{prefix}:partitions") == b"4"
        fewer = StreamWorker(locks, client, prefix, 2, "g", "fewer", handler, lease_ttl=TTL)
        with pytest.raises(tenure.ConfigurationError) as info:
            fewer.run_once()
        assert info.value.parameter == "partitions"
        assert "this worker has partitions=2" in str(info.value)
        assert "have 4" in str(info.value)
        assert fewer.held == frozenset()
        fewer.stop()
        with pytest.raises(tenure.ConfigurationError) as info:
            StreamProducer(client, prefix, 8).append_many([("k", {"seq": b"1"})])
        assert "this producer has partitions=8" in str(info.value)
        assert client.xlen(f"{prefix}:{{0}}") + client.xlen(f"{prefix}:{{1}}") < len(keys)
        agreed = StreamWorker(locks, client, prefix, 4, "g", "agreed", handler, lease_ttl=TTL)
        try:
            _wait_until(
                "every entry handled",
                lambda: agreed.run_once() >= 0 and seen == set(keys),
            )
        finally:
            agreed.stop()


# --- the streams' Redis failing --------------------------------------------------------


def test_a_stream_key_of_another_type_is_refused_not_logged_forever(
    solo: Callable[..., StreamWorker], data_node: LocalCluster, prefix: str
) -> None:
    # The producer raised a raw redis.ResponseError (WRONGTYPE); the worker logged a
    # warning on every pass, for as long as it ran, and never took the partition.
    with data_node[0].client() as client:
        client.set(partition_stream(prefix, 0), "another application's value")
        producer = StreamProducer(client, prefix, 1)
        for append in (
            lambda: producer.append("k1", {"seq": 1}),
            lambda: producer.append_many([("k1", {"seq": 1})]),
        ):
            with pytest.raises(StoreRefused, match="namespace") as info:
                append()
            assert info.value.lasting
            assert info.value.key == partition_stream(prefix, 0)
            assert isinstance(info.value.__cause__, redis.ResponseError)
    worker = solo("solo", lambda *entry: None)
    with pytest.raises(StoreRefused, match="namespace") as refused:
        worker.run_once()
    assert (refused.value.store, refused.value.operation) == ("StreamWorker", "take")
    assert refused.value.lasting
    assert worker.held == frozenset()
    name = partition_lock_name(prefix, 0, GROUP)
    assert not worker.lock_client.lock(name, ttl=TTL).locked()  # the lease was released


def test_streams_whose_redis_is_down_are_unavailable(lock_nodes: LocalCluster) -> None:
    # Each call raised a raw redis.ConnectionError.
    with LocalCluster(1) as doomed, doomed[0].client() as client:
        producer = StreamProducer(client, "down", 2)
        producer.append("k", {"seq": 1})
        doomed[0].kill()
        for append in (
            lambda: producer.append("k", {"seq": 2}),
            lambda: producer.append_many([("k", {"seq": 2})]),
        ):
            with pytest.raises(StoreUnavailable, match="append it twice") as info:
                append()
            assert info.value.maybe_applied
            assert isinstance(info.value.__cause__, redis.ConnectionError)
        # A new producer checks the partition count at its first write.
        with pytest.raises(StoreUnavailable):
            StreamProducer(client, "down", 2).append("k", {"seq": 2})


def test_a_worker_started_while_its_redis_is_down_waits_and_then_works(
    lock_nodes: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The partition-count check of the first pass raised StoreUnavailable out of run(),
    # so a worker started while its Redis restarted died, where a running one rides out
    # the same outage.
    keys = [f"k{i}" for i in range(10)]
    handled: set[str] = set()
    died: list[BaseException] = []
    stop = threading.Event()

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        handled.add(key)

    with (
        LocalCluster(1) as doomed,
        doomed[0].client() as client,
        tenure.Client(lock_nodes.urls) as locks,
    ):
        doomed[0].kill()
        worker = StreamWorker(locks, client, "late", 2, GROUP, "w", handler, lease_ttl=TTL)

        def run() -> None:
            try:
                worker.run(stop)
            except BaseException as exc:
                died.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            _wait_until(
                "the worker to find its Redis down",
                lambda: bool(died) or "cannot check the partition count" in caplog.text,
            )
            assert died == []
            assert worker.held == frozenset()  # nothing taken before P is checked
            doomed[0].restart()
            producer = StreamProducer(client, "late", 2)
            for key in keys:
                producer.append(key, {"seq": 1})
            _wait_until("every entry handled", lambda: bool(died) or handled == set(keys))
            assert died == []
            assert worker.held == {0, 1}
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
        assert died == []


def test_a_stream_node_restarted_empty_is_taken_again_and_consumed(
    lock_nodes: LocalCluster,
) -> None:
    # The writes it held are lost; the owner keys with them. The worker's reads are
    # refused as stale, it drops its partitions, takes them again (the group is made
    # again at "0") and handles what is appended from then on, in order.
    applied: list[tuple[str, int]] = []
    with (
        LocalCluster(1) as streams,
        streams[0].client() as client,
        tenure.Client(lock_nodes.urls) as locks,
    ):
        worker = StreamWorker(
            locks, client, "wiped", 2, GROUP, "w", _seqs(applied), lease_ttl=TTL, retry_delay=0.05
        )
        try:
            producer = StreamProducer(client, "wiped", 2)
            producer.append_many(("k", {"seq": s}) for s in range(1, 4))
            _run_until(worker, lambda: len(applied) == 3)
            streams[0].restart(keep_data=False)
            producer.append_many(("k", {"seq": s}) for s in range(4, 7))
            _run_until(worker, lambda: len(applied) == 6, within=10.0)
            assert applied == [("k", s) for s in range(1, 7)]
            assert worker.held == {0, 1}
            assert worker.stats.fenced == 2  # both dropped once, as stale
            _assert_nothing_pending(client, "wiped", 2)
        finally:
            worker.stop()


def test_a_partition_count_key_of_another_type_still_stops_the_worker(
    solo: Callable[..., StreamWorker], data_node: LocalCluster, prefix: str
) -> None:
    # Waiting out an outage at the first pass must not wait out a refusal no wait ends.
    with data_node[0].client() as client:
        client.rpush(f"{prefix}:partitions", "another application's list")
    worker = solo("solo", lambda *entry: None)
    for attempt in (worker.run_once, worker.run):
        with pytest.raises(StoreRefused) as refused:
            attempt()
        assert (refused.value.store, refused.value.operation) == (
            "StreamWorker",
            "partition count check",
        )
        assert refused.value.lasting
        assert refused.value.key == f"{prefix}:partitions"
        assert worker.held == frozenset()


def test_workers_churning_under_load_keep_one_writer_and_every_write_once(
    fleet: Callable[[int], Fleet], data: Store, data_node: LocalCluster, prefix: str
) -> None:
    """Workers join, crash (SIGKILL), pause past their leases (SIGSTOP) and leave while
    writes flow: every write is applied once, in per-key order, one lease at a time per
    partition, and at the end the survivors own every partition, evenly."""
    partitions, keys, n = 8, [f"sku-{i}" for i in range(60)], 25
    workers = fleet(partitions)
    for name in ("c0", "c1", "c2"):
        workers.start(name)

    def produce() -> None:
        with data_node[0].client() as client:
            producer = StreamProducer(client, prefix, partitions)
            for i, writes in enumerate(_rounds(keys, range(1, n + 1))):
                # About five rounds in flight, so that every fault lands mid-stream.
                room = functools.partial(_applied_at_least, data, (i - 5) * len(keys))
                _wait_until(f"room for round {i + 1}", room)
                producer.append_many(writes)
                time.sleep(0.02)

    # Each step: (what, worker); a paused worker stays stopped past its leases.
    steps = [
        ("start", "c3"),
        ("pause", "c0"),
        ("kill", "c1"),
        ("start", "c4"),
        ("resume", "c0"),
        ("stop", "c2"),
        ("start", "c5"),
        ("pause", "c3"),
        ("kill", "c4"),
        ("resume", "c3"),
    ]
    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(produce)
        for what, name in steps:
            time.sleep(0.7)
            if what == "start":
                workers.start(name)
            elif what == "pause":
                workers.signal(name, signal.SIGSTOP)
                time.sleep(TTL + 0.5)  # past the TTL: its partitions move
            elif what == "resume":
                workers.signal(name, signal.SIGCONT)
            elif what == "kill":
                workers.kill(name)
            else:
                workers.pipes[name].send("stop")
                workers.procs[name].join(20)
                assert workers.procs[name].exitcode == 0
        producing.result()
    _wait_until("every write", lambda: data.applied() == len(keys) * n, timeout=60)
    survivors = ["c0", "c3", "c5"]
    _wait_until("an even spread", lambda: _holdings(data, survivors) == [2, 3, 3], timeout=30)
    workers.finish()

    _assert_exactly_once_in_order(data, keys, n)
    _assert_one_writer_per_partition(data.history())
    _assert_nothing_pending(data.client, prefix, partitions)
    # A late write, if a pause fell between a lease check and a write, was a paused one's.
    assert {line.split()[0] for line in data.refused()} <= {"c0", "c3"}


def _applied_at_least(store: Store, count: int) -> bool:
    return store.applied() >= count


def _interrupt_at(codes: set[CodeType], nth: int) -> Callable[..., None]:
    """A profile hook raising ``Interrupted`` at the ``nth`` point (from 0) where CPython
    may run a signal handler for a frame of ``codes``: the start of a Python function it
    calls, the return of a C one. (Not the return of a Python function, which runs
    none.)"""
    reached = [0]

    def hook(frame: FrameType, event: str, arg: object) -> None:
        caller = frame if event == "c_return" else frame.f_back
        if event not in ("call", "c_return") or caller is None:
            return
        if caller.f_code in codes:
            reached[0] += 1
            if reached[0] - 1 == nth:
                sys.setprofile(None)
                raise Interrupted

    return hook


@pytest.mark.parametrize("method", ["run_once", "run"])
def test_an_interrupt_anywhere_in_a_pass_or_a_run_leaves_the_worker_usable(
    solo: Callable[..., StreamWorker], method: str
) -> None:
    """A Ctrl-C at any point of ``run_once`` or ``run`` leaves the worker neither
    passing nor running, and its guard free: a pass left counted made ``stop()`` leave
    the leases to a pass that never came, a run left counted refused every later one.
    The guard here is the one Python 3.14 gets (a Python ``__enter__``, whose start may
    run a handler), on every Python."""
    worker = solo(f"interrupted-{method}", lambda *entry: None, partitions=2)
    worker._guard = EnterGuarded()
    code = getattr(StreamWorker, method).__code__
    stopped = threading.Event()
    stopped.set()  # run() goes straight to its finally

    def call() -> None:
        if method == "run":
            worker.run(stopped)
        else:
            worker.run_once()

    for nth in range(100):
        sys.setprofile(_interrupt_at({code}, nth))
        try:
            call()
        except Interrupted:
            pass
        else:
            break
        finally:
            sys.setprofile(None)
        assert not worker._passing, f"a pass left counted at point {nth}"
        assert not worker._running, f"a run left counted at point {nth}"
        assert free_to_another_thread(worker._guard, timeout=2.0), (
            f"the guard left held at point {nth}"
        )
    else:
        pytest.fail("interrupted at every one of 100 points")
    assert nth >= 5  # (the points were reached)
    call()  # and it still works

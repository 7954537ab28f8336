"""Fenced writes on Redis: FencedStore and AsyncFencedStore on a real redis-server.

Behavioural tests run against both classes through the ``store`` fixture: the asyncio
store is driven by an event loop of its own, so one test body serves both.

Concurrent writers are separate processes (and, for the asyncio store, tasks). Each write
is recorded with its [start, end] on the machine-wide monotonic clock, so writes can be
ordered in real time: if an accepted write ended before another write started, the later
one may be accepted only if its token is not lower. The history check below asserts
exactly that, plus that every refusal names a token that some write had really stored.
"""

from __future__ import annotations

import asyncio
import bisect
import multiprocessing
import random
import time
import uuid
from collections.abc import Callable, Iterator
from importlib.resources import files
from itertools import accumulate
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import NamedTuple, Protocol

import pytest
import redis
import redis.asyncio

from tenure import ConfigurationError, StaleToken, StoreRefused, StoreUnavailable
from tenure.fencing import (
    MAX_TOKEN,
    AsyncFencedStore,
    FencedStore,
    fenced_keys,
    fenced_write_args,
)
from tenure.testing import LocalCluster

PROCESSES = 4
WRITES = 800  # tokens 1..WRITES, shuffled and dealt to the writers
TASKS = 8

# forkserver: fork() from a possibly multi-threaded pytest process is unsafe.
_ctx = multiprocessing.get_context("forkserver")


class Store(Protocol):
    """What the tests call: FencedStore, or AsyncFencedStore behind Blocking."""

    def write(self, resource: str, token: int, value: bytes | str) -> None: ...
    def read(self, resource: str) -> tuple[bytes | None, int | None]: ...
    def highest(self, resource: str) -> int | None: ...


class Blocking:
    """Runs an AsyncFencedStore's coroutines to completion on a private event loop."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = redis.asyncio.Redis.from_url(url)
        self.store = AsyncFencedStore(self.client)

    def write(self, resource: str, token: int, value: bytes | str) -> None:
        self.loop.run_until_complete(self.store.write(resource, token, value))

    def read(self, resource: str) -> tuple[bytes | None, int | None]:
        return self.loop.run_until_complete(self.store.read(resource))

    def highest(self, resource: str) -> int | None:
        return self.loop.run_until_complete(self.store.highest(resource))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def store(request: pytest.FixtureRequest, node: LocalCluster, raw: redis.Redis) -> Iterator[Store]:
    if request.param == "sync":
        yield FencedStore(raw)
        return
    blocking = Blocking(node.urls[0])
    try:
        yield blocking
    finally:
        blocking.close()


@pytest.fixture
def resource(request: pytest.FixtureRequest) -> str:
    """A resource name no other test uses (the node is shared by the module)."""
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


# --- One writer -------------------------------------------------------------------------


def test_accepts_increasing_and_equal_tokens(store: Store, resource: str) -> None:
    assert store.read(resource) == (None, None)
    assert store.highest(resource) is None
    store.write(resource, 3, b"a")
    assert store.read(resource) == (b"a", 3)
    store.write(resource, 3, "b")  # the same lease writes again
    assert store.read(resource) == (b"b", 3)
    store.write(resource, 10, b"c")
    assert store.read(resource) == (b"c", 10)
    assert store.highest(resource) == 10


def test_refuses_older_token_and_keeps_the_value(store: Store, resource: str) -> None:
    store.write(resource, 10, b"newer")
    with pytest.raises(StaleToken) as info:
        store.write(resource, 9, b"late")
    assert (info.value.resource, info.value.token, info.value.highest) == (resource, 9, 10)
    assert store.read(resource) == (b"newer", 10)


def test_tokens_are_exact_up_to_two_to_the_53(store: Store, resource: str) -> None:
    top = MAX_TOKEN - 1
    store.write(resource, top, b"top")
    # As doubles, 2**53 - 2 and 2**53 - 1 are still distinct: the refusal is exact.
    with pytest.raises(StaleToken) as info:
        store.write(resource, top - 1, b"late")
    assert info.value.highest == top
    assert store.read(resource) == (b"top", top)


@pytest.mark.parametrize("token", [-1, MAX_TOKEN, True, 1.0, "3", None])
def test_rejects_tokens_that_are_not_small_ints(store: Store, resource: str, token: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        store.write(resource, token, b"x")  # type: ignore[arg-type]
    assert info.value.parameter == "token"
    assert store.read(resource) == (None, None)


def test_keys_share_the_resource_hash_tag(raw: redis.Redis, resource: str) -> None:
    store = FencedStore(raw, namespace="app")
    store.write(resource, 7, b"v")
    value_key, token_key = fenced_keys(resource, "app")
    assert (value_key, token_key) == (f"app:{{{resource}}}:value", f"app:{{{resource}}}:token")
    assert raw.get(value_key) == b"v"
    assert raw.get(token_key) == b"7"
    assert FencedStore(raw).read(resource) == (None, None)  # another namespace


def test_a_damaged_token_key_refuses_every_write(
    store: Store, raw: redis.Redis, resource: str
) -> None:
    # The write was a raw redis.ResponseError, and the read a raw ValueError from int().
    value_key, token_key = fenced_keys(resource)
    raw.set(token_key, b"not a number")
    with pytest.raises(StoreRefused, match="holds no number") as info:
        store.write(resource, 1, b"x")
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert (info.value.operation, info.value.key) == ("write", resource)
    for read in (store.read, store.highest):
        with pytest.raises(StoreRefused, match="token key holds no number") as info:
            read(resource)
        assert isinstance(info.value.__cause__, ValueError)
    assert raw.get(value_key) is None


def test_a_key_of_another_type_is_a_lasting_refusal(
    store: Store, raw: redis.Redis, resource: str
) -> None:
    # It was a raw redis.ResponseError (WRONGTYPE ...).
    value_key, token_key = fenced_keys(resource)
    raw.hset(token_key, "by", "another application")
    calls: list[Callable[[], object]] = [
        lambda: store.write(resource, 1, b"x"),
        lambda: store.highest(resource),
    ]
    for call in calls:
        with pytest.raises(StoreRefused, match="namespace") as info:
            call()
        error = info.value
        assert error.lasting
        # The server's words as it sent them: Redis 6.2 wraps a script's error ("ERR Error
        # running script ... WRONGTYPE ..."), Valkey and Redis 7 and later do not.
        assert "WRONGTYPE Operation against a key" in error.reply
        assert error.key == resource
        assert isinstance(error.__cause__, redis.ResponseError)
        assert f"127.0.0.1:{raw.connection_pool.connection_kwargs['port']}" in str(error)
    assert raw.get(value_key) is None


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_store_whose_redis_is_down_is_unavailable(flavour: str, resource: str) -> None:
    # Each call raised a raw redis.ConnectionError.
    with LocalCluster(1) as doomed:
        client = redis.Redis.from_url(doomed.urls[0])
        store: Store = FencedStore(client) if flavour == "sync" else Blocking(doomed.urls[0])
        try:
            store.write(resource, 1, b"x")
            doomed[0].kill()
            with pytest.raises(StoreUnavailable, match="same token is safe") as info:
                store.write(resource, 2, b"y")
            assert info.value.maybe_applied
            assert isinstance(info.value, ConnectionError)
            assert isinstance(info.value.__cause__, redis.ConnectionError)
            for read in (store.read, store.highest):
                with pytest.raises(StoreUnavailable, match="nothing was written") as info:
                    read(resource)
                assert not info.value.maybe_applied
                assert info.value.operation in ("read", "highest")
        finally:
            client.close()
            if isinstance(store, Blocking):
                store.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_store_whose_redis_is_at_its_connection_limit_says_the_fix(
    flavour: str, resource: str
) -> None:
    # It said redis-py's words alone ("max number of clients reached").
    with LocalCluster(1) as full:
        client = redis.Redis.from_url(full.urls[0])
        store: Store = FencedStore(client) if flavour == "sync" else Blocking(full.urls[0])
        with full[0].client() as admin:
            admin.config_set("maxclients", admin.info("clients")["connected_clients"])
            try:
                for call in (store.read, store.highest):
                    with pytest.raises(StoreUnavailable, match="nothing was written") as info:
                        call(resource)
                    said = str(info.value)
                    assert "(ERR max number of clients reached); raise its maxclients" in said
            finally:
                admin.config_set("maxclients", 10_000)
                client.close()
                if isinstance(store, Blocking):
                    store.close()


def test_write_args_batch_in_a_pipeline(raw: redis.Redis, resource: str) -> None:
    with raw.pipeline(transaction=False) as pipe:
        for token in (3, 1, 3, 4):
            pipe.eval(*fenced_write_args(resource, token, f"v{token}"))
        replies = pipe.execute()
    assert replies == [[1, 3], [0, 3], [1, 3], [1, 4]]
    assert FencedStore(raw).read(resource) == (b"v4", 4)


def test_script_header_names_its_keys_and_arguments() -> None:
    source = files("tenure._lua").joinpath("fenced_write.lua").read_text()
    header = []
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    assert header, "fenced_write.lua must open with a comment block"
    text = "\n".join(header)
    for name in ("KEYS[1]", "KEYS[2]", "ARGV[1]", "ARGV[2]", "Returns"):
        assert name in text


# --- Concurrent writers -----------------------------------------------------------------


class Write(NamedTuple):
    token: int
    start: int  # time.monotonic_ns(), comparable across processes on one machine
    end: int
    refused_by: int | None  # StaleToken.highest; None if the write was accepted


def write_all(store: FencedStore, resource: str, tokens: list[int]) -> list[Write]:
    writes = []
    for token in tokens:
        start = time.monotonic_ns()
        try:
            store.write(resource, token, str(token))
            refused_by = None
        except StaleToken as stale:
            refused_by = stale.highest
        writes.append(Write(token, start, time.monotonic_ns(), refused_by))
    return writes


async def awrite_all(store: AsyncFencedStore, resource: str, tokens: list[int]) -> list[Write]:
    writes = []
    for token in tokens:
        start = time.monotonic_ns()
        try:
            await store.write(resource, token, str(token))
            refused_by = None
        except StaleToken as stale:
            refused_by = stale.highest
        writes.append(Write(token, start, time.monotonic_ns(), refused_by))
    return writes


def check_history(writes: list[Write]) -> None:
    """Accepted tokens never go backwards in real time, and every refusal is justified."""
    accepted = sorted((w for w in writes if w.refused_by is None), key=lambda w: w.end)
    ends = [w.end for w in accepted]
    highest_by = list(accumulate((w.token for w in accepted), max))  # over accepted[:i+1]
    started_at = {w.token: w.start for w in accepted}
    for w in writes:
        done = bisect.bisect_left(ends, w.start)  # accepted writes that ended before w began
        if w.refused_by is None:
            assert done == 0 or w.token >= highest_by[done - 1], f"{w} accepted after a newer one"
        else:
            # The store named a higher token that a write really stored, and had begun to.
            assert w.refused_by > w.token
            assert w.refused_by in started_at
            assert started_at[w.refused_by] < w.end


def deal(tokens: list[int], hands: int) -> list[list[int]]:
    return [tokens[i::hands] for i in range(hands)]


def shuffled_tokens() -> list[int]:
    tokens = list(range(1, WRITES + 1))
    random.shuffle(tokens)
    return tokens


def test_check_history_catches_a_token_going_backwards() -> None:
    check_history([Write(5, 0, 1, None), Write(7, 2, 3, None), Write(6, 4, 5, 7)])
    with pytest.raises(AssertionError):
        check_history([Write(7, 0, 1, None), Write(6, 2, 3, None)])
    with pytest.raises(AssertionError):  # refused by a token nobody wrote
        check_history([Write(5, 0, 1, None), Write(4, 2, 3, 9)])


def _process_writer(
    url: str, resource: str, tokens: list[int], ready: Barrier, out: Connection
) -> None:
    with redis.Redis.from_url(url) as client:
        store = FencedStore(client)
        ready.wait()
        out.send(write_all(store, resource, tokens))


def test_concurrent_processes_end_with_the_highest_token(
    node: LocalCluster, raw: redis.Redis, resource: str
) -> None:
    ready = _ctx.Barrier(PROCESSES)
    pipes, procs = [], []
    for hand in deal(shuffled_tokens(), PROCESSES):
        parent_end, child_end = _ctx.Pipe(duplex=False)
        args = (node.urls[0], resource, hand, ready, child_end)
        proc = _ctx.Process(target=_process_writer, args=args)
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)
    writes: list[Write] = []
    try:
        for pipe in pipes:
            assert pipe.poll(60), "a writer made no progress"
            writes.extend(pipe.recv())
    finally:
        for pipe in pipes:
            pipe.close()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(w.token for w in writes) == list(range(1, WRITES + 1))
    assert any(w.refused_by is not None for w in writes)
    check_history(writes)
    assert FencedStore(raw).read(resource) == (str(WRITES).encode(), WRITES)


def test_concurrent_tasks_end_with_the_highest_token(node: LocalCluster, resource: str) -> None:
    async def main() -> tuple[list[Write], tuple[bytes | None, int | None]]:
        client = redis.asyncio.Redis.from_url(node.urls[0])
        try:
            store = AsyncFencedStore(client)
            hands = deal(shuffled_tokens(), TASKS)
            done = await asyncio.gather(*(awrite_all(store, resource, hand) for hand in hands))
            return [w for writes in done for w in writes], await store.read(resource)
        finally:
            await client.aclose()

    writes, final = asyncio.run(main())
    assert any(w.refused_by is not None for w in writes)
    check_history(writes)
    assert final == (str(WRITES).encode(), WRITES)

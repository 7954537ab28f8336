"""The objects that take a redis-py client check it when they get it, on a real
redis-server: the flavour (blocking or asyncio), and, where values are raw bytes, that
the client does not decode replies.

Without the check, a blocking object given an asyncio client got coroutines back and
dropped them un-awaited (``StreamProducer.append`` "succeeded" and appended nothing) or
failed with a bare ``TypeError``, and so did an asyncio object given a blocking client. A
``StreamWorker`` given a client made with ``decode_responses=True`` died inside redis-py's
parser (``UnicodeDecodeError``) on the first payload value that is not UTF-8 text, and so
did every worker that took the partition over; ``FencedStore.read`` did the same on a
value the store had written itself.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

import pytest
import redis
import redis.asyncio
import redis.sentinel
import valkey
import valkey.asyncio

import tenure
from tenure.fencing import AsyncFencedStore, FencedStore
from tenure.patterns import (
    Plan,
    Reads,
    RedisIdempotency,
    StreamProducer,
    StreamWorker,
    aoptimistic,
    optimistic,
)
from tenure.testing import LocalCluster


@pytest.fixture
def locks(node: LocalCluster) -> Iterator[tenure.Client]:
    with tenure.Client(node.urls) as client:
        yield client


@pytest.fixture
def name() -> str:
    return f"flavours-{uuid.uuid4().hex[:8]}"


def _asyncio_clients(node: LocalCluster, **options: Any) -> list[Any]:
    """Asyncio clients of ``node`` (made, not connected: the checks must not need to)."""
    url = node.urls[0]
    return [
        redis.asyncio.Redis.from_url(url, **options),
        redis.asyncio.RedisCluster.from_url(url, **options),
    ]


def _close(clients: list[Any]) -> None:
    async def close_all() -> None:
        for client in clients:
            await client.aclose()

    asyncio.run(close_all())


def _set_to(value: int) -> Callable[[Reads[Any]], Plan[int]]:
    def plan(reads: Reads[Any]) -> Plan[int]:
        return Plan(result=value, writes=dict.fromkeys(reads, value))

    return plan


# Each blocking object, made (or called) with ``client``, writing under ``name``.
BLOCKING: dict[str, tuple[str, Callable[[Any, tenure.Client, str], object]]] = {
    "StreamProducer": (
        "redis_client",
        lambda client, locks, name: StreamProducer(client, name, 1).append("k", {"v": "x"}),
    ),
    "StreamWorker": (
        "redis_client",
        lambda client, locks, name: StreamWorker(
            locks, client, name, 1, "g", "w", lambda *entry: None
        ),
    ),
    "FencedStore": (
        "redis_client",
        lambda client, locks, name: FencedStore(client).write(name, 1, b"x"),
    ),
    "RedisIdempotency": (
        "client",
        lambda client, locks, name: RedisIdempotency(client).once(name).__enter__(),
    ),
    "optimistic": ("client", lambda client, locks, name: optimistic(client, [name], _set_to(1))),
}


@pytest.mark.parametrize("owner", list(BLOCKING))
def test_a_blocking_object_refuses_an_asyncio_client(
    owner: str, node: LocalCluster, raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    parameter, use = BLOCKING[owner]
    clients = _asyncio_clients(node)
    try:
        for client in clients:
            with pytest.raises(tenure.ConfigurationError) as info:
                use(client, locks, name)
            assert info.value.parameter == parameter
            message = str(info.value)
            assert f"{owner} is blocking" in message
            assert type(client).__qualname__ in message  # what it got
            assert "pass a redis.Redis" in message  # the fix
    finally:
        _close(clients)
    assert raw.keys(f"*{name}*") == []  # nothing was written, and nothing said so before


# Each asyncio object, awaited with ``client``, writing under ``name``.
ASYNCIO: dict[str, Callable[[Any, str], Awaitable[object]]] = {
    "AsyncFencedStore": lambda client, name: AsyncFencedStore(client).write(name, 1, b"x"),
    "aoptimistic": lambda client, name: aoptimistic(client, [name], _set_to(1)),
}


@pytest.mark.parametrize("owner", list(ASYNCIO))
def test_an_asyncio_object_refuses_a_blocking_client(
    owner: str, raw: redis.Redis, name: str
) -> None:
    async def use() -> object:
        return await ASYNCIO[owner](raw, name)

    with pytest.raises(tenure.ConfigurationError) as info:
        asyncio.run(use())
    assert info.value.parameter in ("client", "redis_client")
    assert f"{owner} is asyncio" in str(info.value)
    assert "pass a redis.asyncio.Redis" in str(info.value)
    assert raw.keys(f"*{name}*") == []


@pytest.mark.parametrize("owner", list(BLOCKING))
def test_a_blocking_object_refuses_a_pipeline(
    owner: str, raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    # A pipeline() is a client class too, but queues every command and answers with
    # itself: a FencedStore's write raised a raw TypeError reading its "reply".
    parameter, use = BLOCKING[owner]
    for pipeline in (raw.pipeline(), raw.pipeline(transaction=False)):
        with pytest.raises(tenure.ConfigurationError) as info:
            use(pipeline, locks, name)
        assert info.value.parameter == parameter
        assert "a pipeline()" in str(info.value)
        assert "pass the client it came from" in str(info.value)  # the fix
    assert raw.keys(f"*{name}*") == []


@pytest.mark.parametrize("owner", list(ASYNCIO))
def test_an_asyncio_object_refuses_a_pipeline(
    owner: str, node: LocalCluster, raw: redis.Redis, name: str
) -> None:
    async def use() -> object:
        async with redis.asyncio.Redis.from_url(node.urls[0]) as client:
            return await ASYNCIO[owner](client.pipeline(), name)

    with pytest.raises(tenure.ConfigurationError) as info:
        asyncio.run(use())
    assert "a pipeline()" in str(info.value)
    assert raw.keys(f"*{name}*") == []


def _no_clients(node: LocalCluster, locks: tenure.Client, *, asyncio: bool) -> dict[str, Any]:
    """What is no redis-py client, each with what its refusal must say (the fix); made,
    not connected. Each was taken before: a URL, None, a pool failed at the first
    command with a raw AttributeError; a Sentinel object sent the commands to the
    Sentinels; a valkey-py client worked, but let valkey-py's own exceptions reach the
    caller when its server went away."""
    url = node.urls[0]
    made = "redis.asyncio.Redis" if asyncio else "redis.Redis"
    return {
        "a URL": (url.replace("://", "://app:s3cret@"), f"{made}.from_url(url)"),
        "None": (None, "has no execute_command"),
        "a pool": (redis.ConnectionPool.from_url(url), f"{made}(connection_pool=pool)"),
        "a Sentinel": (redis.sentinel.Sentinel([("127.0.0.1", 1)]), "master_for(service_name)"),
        "a tenure client": (locks, "pass a redis-py client of the Redis"),
        "valkey-py": (valkey.Valkey.from_url(url), f"of the same server, {made}.from_url(url)"),
        "valkey-py asyncio": (valkey.asyncio.Valkey.from_url(url), "a valkey-py client: "),
    }


@pytest.mark.parametrize("owner", list(BLOCKING))
def test_a_blocking_object_refuses_what_is_no_redis_py_client(
    owner: str, node: LocalCluster, raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    parameter, use = BLOCKING[owner]
    for what, (obj, fix) in _no_clients(node, locks, asyncio=False).items():
        with pytest.raises(tenure.ConfigurationError) as info:
            use(obj, locks, name)
        assert info.value.parameter == parameter, what
        message = str(info.value)
        assert f"{owner} takes a redis-py client (redis.Redis)" in message, what
        assert fix in message, what
        assert "s3cret" not in message
    assert raw.keys(f"*{name}*") == []


@pytest.mark.parametrize("owner", list(ASYNCIO))
def test_an_asyncio_object_refuses_what_is_no_redis_py_client(
    owner: str, node: LocalCluster, raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    for what, (obj, fix) in _no_clients(node, locks, asyncio=True).items():

        async def use() -> object:
            return await ASYNCIO[owner](obj, name)  # noqa: B023 (run at once)

        with pytest.raises(tenure.ConfigurationError) as info:
            asyncio.run(use())
        assert info.value.parameter in ("client", "redis_client"), what
        assert f"{owner} takes a redis-py client (redis.asyncio.Redis)" in str(info.value)
        assert fix in str(info.value), what
    assert raw.keys(f"*{name}*") == []


class _Wrapper:
    """An application's wrapper of a redis-py client (instrumentation, say): not a
    redis-py class, but it has redis-py's methods and raises redis-py's errors."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._client, attribute)


def test_a_wrapper_of_a_redis_py_client_is_still_taken(name: str) -> None:
    # The refusal of what is no client keeps to what is recognisably none: a wrapper
    # with execute_command works, and its server's failures are tenure's errors.
    with LocalCluster(1) as doomed, redis.Redis.from_url(doomed.urls[0]) as client:
        store = FencedStore(cast(redis.Redis, _Wrapper(client)))
        store.write(f"{name}:w", 4, b"v")
        assert store.read(f"{name}:w") == (b"v", 4)
        doomed[0].kill()
        with pytest.raises(tenure.StoreUnavailable):
            store.write(f"{name}:w", 5, b"v")


@pytest.mark.parametrize("owner", list(BLOCKING))
@pytest.mark.parametrize("decode_responses", [False, True])
def test_an_object_refuses_a_client_whose_encoding_python_lacks(
    owner: str,
    decode_responses: bool,
    node: LocalCluster,
    raw: redis.Redis,
    locks: tenure.Client,
    name: str,
) -> None:
    # redis-py encodes every str argument with the client's encoding: without
    # decode_responses the object was made, and its first command raised redis-py's raw
    # LookupError.
    parameter, use = BLOCKING[owner]
    with (
        redis.Redis.from_url(
            node.urls[0], encoding="no-such-codec", decode_responses=decode_responses
        ) as client,
        pytest.raises(tenure.ConfigurationError) as info,
    ):
        use(client, locks, name)
    assert info.value.parameter == parameter
    assert "encoding 'no-such-codec', which Python has no codec for" in str(info.value)
    assert "such as 'utf-8'" in str(info.value)  # the fix
    assert raw.keys(f"*{name}*") == []


def test_an_asyncio_object_refuses_a_client_whose_encoding_python_lacks(
    node: LocalCluster, raw: redis.Redis, name: str
) -> None:
    async def use(owner: str) -> object:
        async with redis.asyncio.Redis.from_url(node.urls[0], encoding="no-such-codec") as client:
            return await ASYNCIO[owner](client, name)

    for owner in ASYNCIO:
        with pytest.raises(tenure.ConfigurationError) as info:
            asyncio.run(use(owner))
        assert "which Python has no codec for" in str(info.value)
    assert raw.keys(f"*{name}*") == []


def test_each_object_works_with_its_own_flavour(
    node: LocalCluster, raw: redis.Redis, name: str
) -> None:
    # The checks refuse only the wrong flavour: a guard against refusing too much.
    producer = StreamProducer(raw, name, 1)
    producer.append("k", {"v": b"\x89PNG"})
    assert raw.xlen(producer.stream_of("k")) == 1
    FencedStore(raw).write(f"{name}:fenced", 5, b"\x89PNG")
    assert FencedStore(raw).read(f"{name}:fenced") == (b"\x89PNG", 5)
    assert optimistic(raw, [f"{name}:n"], _set_to(7)) == 7
    with RedisIdempotency(raw).once(f"{name}:once") as once:
        once.record("done")

    async def go() -> tuple[tuple[bytes | None, int | None], int]:
        async with redis.asyncio.Redis.from_url(node.urls[0]) as client:
            store = AsyncFencedStore(client)
            await store.write(f"{name}:afenced", 3, b"\xff")
            return await store.read(f"{name}:afenced"), await aoptimistic(
                client, [f"{name}:an"], _set_to(9)
            )

    assert asyncio.run(go()) == ((b"\xff", 3), 9)
    assert raw.mget(f"{name}:n", f"{name}:an") == [b"7", b"9"]


def test_a_stream_worker_refuses_a_client_that_decodes_replies(
    node: LocalCluster, raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    StreamProducer(raw, name, 1).append("k", {"v": b"\x89PNG"})
    with (
        node[0].client(decode_responses=True) as decoding,
        pytest.raises(tenure.ConfigurationError) as info,
    ):
        StreamWorker(locks, decoding, name, 1, "g", "w", lambda *entry: None)
    assert info.value.parameter == "redis_client"
    assert "decode_responses=True" in str(info.value)
    assert "decode_responses=False" in str(info.value)  # the fix
    assert raw.keys(f"{name}:g:*") == []  # refused before it took or registered anything


def test_a_stream_worker_hands_on_values_that_are_not_text(
    raw: redis.Redis, locks: tenure.Client, name: str
) -> None:
    # What a decoding client could not do: a value that is not UTF-8, between two that
    # are, all handled in order, as bytes.
    producer = StreamProducer(raw, name, 1)
    writes: list[tuple[str, str | bytes]] = [("a", "text"), ("b", b"\x89PNG"), ("c", "text")]
    for key, value in writes:
        producer.append(key, {"v": value})
    got: list[tuple[str, bytes]] = []
    done = threading.Event()

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        got.append((key, payload["v"]))
        if len(got) == 3:
            done.set()

    worker = StreamWorker(locks, raw, name, 1, "g", "w", handler, lease_ttl=2)
    thread = threading.Thread(target=worker.run, args=(done,))
    thread.start()
    thread.join(10)
    worker.stop()
    assert not thread.is_alive()
    assert got == [("a", b"text"), ("b", b"\x89PNG"), ("c", b"text")]
    assert worker.stats.failed == 0


def test_a_fenced_store_refuses_a_client_that_decodes_replies(
    node: LocalCluster, raw: redis.Redis, name: str
) -> None:
    FencedStore(raw).write(name, 1, b"\x89PNG")
    with (
        node[0].client(decode_responses=True) as decoding,
        pytest.raises(tenure.ConfigurationError) as info,
    ):
        FencedStore(decoding)
    assert info.value.parameter == "redis_client"
    assert "decode_responses=False" in str(info.value)
    clients = _asyncio_clients(node, decode_responses=True)
    try:
        for client in clients:
            with pytest.raises(tenure.ConfigurationError) as info:
                AsyncFencedStore(client)
            assert info.value.parameter == "redis_client"
            assert "decode_responses=False" in str(info.value)
    finally:
        _close(clients)


def test_the_refusal_of_a_decoding_client_names_its_encoding(node: LocalCluster) -> None:
    # It said "fails ... on the first value that is not UTF-8 text" of a client that
    # decodes latin-1, which reads every byte: what goes wrong is that values come back
    # as str, decoded with the client's encoding, not the bytes stored.
    url = node.urls[0]
    with (
        redis.Redis.from_url(url, decode_responses=True, encoding="latin-1") as decoding,
        pytest.raises(tenure.ConfigurationError) as info,
    ):
        FencedStore(decoding)
    text = str(info.value)
    assert info.value.parameter == "redis_client"
    assert "UTF-8" not in text, text
    assert "encoding 'latin-1'" in text, text
    assert "decode_responses=False" in text, text


def test_a_decoding_client_still_suits_what_reads_no_raw_values(
    node: LocalCluster, raw: redis.Redis, name: str
) -> None:
    # The producer only writes, and optimistic and RedisIdempotency give back what they
    # read as bytes or through their codec: they take such a client as before.
    with node[0].client(decode_responses=True) as decoding:
        producer = StreamProducer(decoding, name, 1)
        entry_id = producer.append("k", {"v": b"\x89PNG"})
        assert isinstance(entry_id, str)
        entries: Any = raw.xrange(producer.stream_of("k"))
        assert entries[0][1][b"v"] == b"\x89PNG"
        assert optimistic(decoding, [f"{name}:n"], _set_to(4)) == 4
        store = RedisIdempotency(decoding)
        with store.once(f"{name}:once") as once:
            once.record({"ok": 1})
        with store.once(f"{name}:once") as again:
            assert (again.done, again.result) == (True, {"ok": 1})

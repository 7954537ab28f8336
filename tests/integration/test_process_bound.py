"""Stores, producers and workers wrap live connections of this process, as a client does.

Each had the default repr (``<... object at 0x...>``), so a log line or a failed
assertion said nothing of which namespace or stream it was about; a copy was a second
object on the first one's connections; and pickling one (as a process pool does with a
task's arguments) failed deep in redis-py with "cannot pickle '_thread.RLock' object",
naming neither the object nor what to do instead.
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import tenure
from tenure.fencing import AsyncFencedStore, FencedStore, fenced_keys
from tenure.patterns.idempotency import RedisIdempotency
from tenure.patterns.streams import StreamProducer, StreamWorker
from tenure.testing import LocalCluster

from .conftest import acl_user

PASSWORD = "pw"  # acl_user's: it must appear in no repr and no error


@pytest.fixture(scope="module")
def url(node: LocalCluster) -> Iterator[str]:
    """A URL that carries a user and its password, as a deployment's often does."""
    with acl_user(node, "bound", "+@all") as urls:
        yield urls[0]


def _handler(key: str, payload: Any, fencing_token: int) -> None:
    pass


def _fenced(url: str, keep: list[Any]) -> FencedStore:
    keep.append(client := redis.Redis.from_url(url))
    return FencedStore(client, "fx")


def _async_fenced(url: str, keep: list[Any]) -> AsyncFencedStore:
    keep.append(client := redis.asyncio.Redis.from_url(url))
    return AsyncFencedStore(client, "afx")


def _idempotency(url: str, keep: list[Any]) -> RedisIdempotency:
    keep.append(client := redis.Redis.from_url(url))
    return RedisIdempotency(client, namespace="idx")


def _producer(url: str, keep: list[Any]) -> StreamProducer:
    keep.append(client := redis.Redis.from_url(url))
    return StreamProducer(client, "sx", 4)


def _worker(url: str, keep: list[Any]) -> StreamWorker:
    keep.append(locks := tenure.Client([url]))
    keep.append(client := redis.Redis.from_url(url))
    return StreamWorker(locks, client, "wx", 4, "gx", "consumer-x", _handler)


# kind -> (make one from a URL, keeping what to close; what its repr must name)
MAKERS: dict[str, tuple[Callable[[str, list[Any]], Any], list[str]]] = {
    "FencedStore": (_fenced, ["namespace='fx'"]),
    "AsyncFencedStore": (_async_fenced, ["namespace='afx'"]),
    "RedisIdempotency": (_idempotency, ["namespace='idx'"]),
    "StreamProducer": (_producer, ["stream_prefix='sx'", "partitions=4"]),
    "StreamWorker": (
        _worker,
        ["'consumer-x'", "group='gx'", "stream_prefix='wx'", "partitions=4"],
    ),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_repr_names_it_a_copy_is_itself_and_pickling_says_what_to_do(url: str, kind: str) -> None:
    make, names = MAKERS[kind]
    keep: list[Any] = []
    try:
        thing = make(url, keep)
        assert type(thing).__name__ == kind
        shown = repr(thing)
        assert shown.startswith(f"<{kind} ")
        for name in names:
            assert name in shown
        assert PASSWORD not in shown
        assert "redis://" not in shown

        # A copy of a structure holding it shares it, as a client's does.
        assert copy.copy(thing) is thing
        assert copy.deepcopy({"held": thing})["held"] is thing

        with pytest.raises(TypeError) as info:
            pickle.dumps(thing)
        message = str(info.value)
        assert f"a {kind} belongs to the process that made it and cannot be pickled" in message
        assert f"make a {kind} in the worker from" in message
        assert "pool's initializer" in message
        assert "_thread" not in message
        assert PASSWORD not in message
        assert "redis://" not in message
        # What a user meets: a spawned child's arguments are pickled by start().
        child = multiprocessing.get_context("spawn").Process(target=print, args=(thing,))
        with pytest.raises(TypeError, match=f"a {kind} belongs to the process"):
            child.start()
    finally:
        for held in keep:
            if isinstance(held, redis.asyncio.Redis):
                asyncio.run(held.aclose())
            else:
                held.close()


def test_a_copied_store_writes_through_the_same_connection(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        store = FencedStore(client, "copied")
        copy.deepcopy([store])[0].write("r", 5, b"v")
        assert store.read("r") == (b"v", 5)
        client.delete(*fenced_keys("r", "copied"))

"""Idempotency keys on Redis under client retries: a script runs twice for one call.

redis-py retries a command after a timeout or a connection error (redis-py 8 does by
default). When the reply of ``idem_claim.lua`` or ``idem_record.lua`` is lost, the
retry runs the script again, and that run meets what the first one wrote: our own claim,
or our own record. It must answer as the first run did (claimed; recorded), not "another
attempt holds the key". And the record must be recognisable as *ours*: another attempt
that took over after our lease ran out may have recorded the very same value, and that
is still :class:`ClaimLost`.

A reply is lost for real: the client talks to the node through a
:class:`~tenure.verify.proxy.Proxy` that discards replies, and the client's back-off
(which runs between the timeout and the retry) heals the proxy once the reply has been
discarded, so the command ran exactly once before its retry.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import pytest
import redis
from redis.backoff import AbstractBackoff
from redis.client import Pipeline
from redis.retry import Retry

from tenure.patterns import ClaimLost, Plan, Reads, RedisIdempotency
from tenure.testing import LocalCluster
from tenure.verify.proxy import Proxy

TIMEOUT = 0.3  # seconds: how long the client waits for the lost reply before retrying


class LoseOneReply(AbstractBackoff):
    """Between a lost reply's timeout and the retry: wait until the proxy discarded the
    reply (the command ran), then let replies through again."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.armed_at: int | None = None  # bytes_dropped when a loss was armed
        self.lost = 0

    def __deepcopy__(self, memo: dict[int, object]) -> LoseOneReply:
        # redis-py deep-copies the Retry it is given; every copy must drive this proxy.
        return self

    def arm(self) -> None:
        """Lose the reply of the next command the client sends."""
        self.armed_at = self.proxy.stats.bytes_dropped
        self.proxy.drop_replies()

    def compute(self, failures: int) -> float:
        if self.armed_at is not None:
            deadline = time.monotonic() + 5
            while self.proxy.stats.bytes_dropped == self.armed_at:
                assert time.monotonic() < deadline, "the reply was never discarded"
                time.sleep(0.005)
            self.proxy.heal()
            self.armed_at = None
            self.lost += 1
        return 0.0


@pytest.fixture
def lossy(node: LocalCluster) -> Iterator[tuple[redis.Redis, LoseOneReply]]:
    """A client that retries once, through a proxy that loses a reply when armed."""
    with Proxy(node[0].host, node[0].port or 0) as proxy:
        losses = LoseOneReply(proxy)
        client = redis.Redis(*proxy.address, socket_timeout=TIMEOUT, retry=Retry(losses, 1))
        with client:
            client.ping()  # connected: arming loses a command's reply, not the handshake's
            yield client, losses


def test_a_lost_claim_reply_still_claims(
    lossy: tuple[redis.Redis, LoseOneReply], raw: redis.Redis, key: str
) -> None:
    # The retried claim met our own claim and answered "busy" (InProgress, with the key
    # blocked for the whole lease and nobody working on it).
    client, losses = lossy
    store = RedisIdempotency(client, lease=30)
    losses.arm()
    with store.once(key) as once:
        assert losses.lost == 1
        assert not once.done
        # The claim's 30 s lease (seconds of room for a loaded machine: no other lease
        # comes near it).
        assert 25_000 < raw.pttl(store.redis_key(key)) <= 30_000
        once.record("ok")
    with store.once(key) as again:
        assert (again.done, again.result) == (True, "ok")


@pytest.mark.parametrize("result", [{"balance": 900}, None])
def test_a_lost_record_reply_still_records(
    lossy: tuple[redis.Redis, LoseOneReply], raw: redis.Redis, key: str, result: Any
) -> None:
    # The retried record found our own record and raised ClaimLost, as if another
    # attempt had taken the key over; the effect had run once.
    client, losses = lossy
    store = RedisIdempotency(client, lease=30)
    effects = 0
    with store.once(key) as once:
        effects += 1
        losses.arm()
        if result is not None:
            once.record(result)
        # else: leaving the block records None
    assert losses.lost == 1
    assert (effects, once.result) == (1, result)
    with store.once(key) as again:
        assert (again.done, again.result) == (True, result)


def _eval(client: redis.Redis, name: str, keys: list[str], *args: object) -> Any:
    source = files("tenure._lua").joinpath(f"{name}.lua").read_text()
    return client.eval(source, len(keys), *keys, *args)  # type: ignore[arg-type]


def test_each_script_run_twice_answers_as_the_first_run(raw: redis.Redis, key: str) -> None:
    """What a retry does, without the proxy: the same script, the same arguments."""
    store = RedisIdempotency(raw)
    own, receipt = store.redis_key(key), f"{store.redis_key(key)}:receipt"
    marker = b"p:" + secrets.token_hex(16).encode()
    assert _eval(raw, "idem_claim", [own], marker, 30_000) == [1, b""]
    raw.pexpire(own, 1_000)
    assert _eval(raw, "idem_claim", [own], marker, 30_000) == [1, b""]
    # The lease counts from the run that answered: 30 s again, not the 1 s left (with
    # seconds of room for a loaded machine between the two commands).
    assert 25_000 < raw.pttl(own) <= 30_000
    for _ in range(2):
        assert _eval(raw, "idem_record", [own, receipt], marker, b"n:", 60_000, 30_000) == [
            1,
            b"",
        ]
        assert raw.get(own) == b"n:"
        assert raw.get(receipt) == marker


@pytest.mark.parametrize(("lease", "retention"), [(30, 3600), (30, 5)])
def test_the_receipt_lasts_the_lease_and_never_outlives_the_record(
    raw: redis.Redis, key: str, lease: float, retention: float
) -> None:
    store = RedisIdempotency(raw, lease=lease, retention=retention)
    with store.once(key) as once:
        once.record(1)
    ttl = raw.pttl(f"{store.redis_key(key)}:receipt")
    # (3 s of room for a loaded machine between the record and this read.)
    assert min(lease, retention) * 1000 - 3_000 < ttl <= min(lease, retention) * 1000


def _record_nothing(reads: Reads[Pipeline]) -> Plan[None]:
    return Plan(result=None, writes={})


@pytest.mark.parametrize("how", ["record", "apply"])
def test_an_identical_record_after_a_takeover_is_still_claim_lost(
    raw: redis.Redis, key: str, how: str
) -> None:
    """The record the key holds equals ours, but another attempt wrote it: reported."""
    store = RedisIdempotency(raw, lease=30)
    with store.once(key) as slow:
        raw.delete(store.redis_key(key))  # as if our lease had run out...
        with store.once(key) as fast:  # ...and a duplicate took over and recorded None
            if how == "record":
                fast.record(None)
            else:
                fast.apply([f"{key}:untouched"], _record_nothing)
        assert raw.get(store.redis_key(key)) == b"n:"
        with pytest.raises(ClaimLost) as info:
            slow.record(None)  # the same value: our effect happened too, say so
    assert info.value.holder == "record"

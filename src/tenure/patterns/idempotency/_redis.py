"""Idempotency keys on Redis: a claim with a lease, the record applied with the effect.

Part of :mod:`tenure.patterns.idempotency` (its module docstring is the theory of
operation).
"""

from __future__ import annotations

import contextlib
import functools
import random
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

from ..._core.config import check_name, check_retry_policy, retry_delay
from ..._core.policy import RetryPolicy, wait_random_exponential
from ..._core.slots import hash_tag as _hash_tag
from ..._driver.process_bound import ProcessBound as _ProcessBound
from ..._driver.redis_objects import check_client as _check_client
from ..._driver.redis_objects import reply_encoding as _reply_encoding
from ..._driver.store_errors import FAILURES as _FAILURES
from ..._driver.store_errors import store_error
from ..._errors import ConfigurationError
from ..._lua import script
from ..optimistic import (
    DEFAULT_BACKOFF,
    DEFAULT_RETRIES,
    OptimisticStats,
    Plan,
    Reads,
    _check_keys,
    _checked_plan,
    _queue_writes,
    optimistic,
)
from ._errors import ClaimLost, InProgress, NotClaimed
from ._protocol import (
    JSON,
    Codec,
    _check_codec,
    _check_key,
    _check_wait,
    _decoded,
    _encoded,
    _seconds_to_ms,
)

T = TypeVar("T")

DEFAULT_POLL: RetryPolicy = wait_random_exponential(initial=0.005, maximum=0.25)
"""How a duplicate polls a key in progress: full jitter, up to 0.25 s between looks."""


_CLAIMED, _DONE, _DONE_NO_RESULT, _BUSY = 1, 2, 3, 0


@functools.cache
def _source(name: str) -> str:
    # EVAL with the source, never EVALSHA: nothing to go missing after SCRIPT FLUSH or a
    # restart (docs/architecture.md, "EVALSHA where a NOSCRIPT is always answered").
    return script(name).source.decode()


def _as_bytes(client: object, value: bytes | str) -> bytes:
    # A client made with decode_responses=True hands back str, decoded with its encoding:
    # encoded back with it, the bytes stored (UTF-8 would change those a latin-1 client
    # read above 127).
    return value.encode(*_reply_encoding(client)) if isinstance(value, str) else value


def _holder(value: bytes) -> str:
    """What another attempt left in the key: its ``"claim"``, or its ``"record"``."""
    return "claim" if value.startswith(b"p:") else "record"


def _empty_hash_tag(name: str) -> bool:
    """Whether Redis hashes all of ``name``, an idempotency key's Redis key
    ``<namespace>:{<key>}``, for lack of a hash tag (``{}`` at its first brace). Its
    receipt is that plus a suffix: they share a slot exactly when the tag is not empty.
    When it is, the claim works and ``idem_record.lua``, which writes both, is refused:
    after the effect, on every retry."""
    return _hash_tag(name) is None


def _check_namespace(namespace: str) -> str:
    # "<namespace>:{": a namespace without "{" leaves the tag to the key.
    if _empty_hash_tag(namespace + ":{x}"):
        raise ConfigurationError(
            "namespace",
            f"{namespace!r} holds '{{}}' at its first brace: an empty hash tag, so "
            "each key's claim and receipt would land in different Redis Cluster slots "
            "and every record would fail after its effect. Drop the braces, or put a "
            "tag between them ('idem{1}')",
        )
    return namespace


class RedisOnce:
    """One attempt at an idempotent operation on Redis, from :meth:`RedisIdempotency.once`.

    Attributes:
        key: the idempotency key.
        done: True if a previous attempt had finished when this one began.
        result: the recorded result when ``done``; after :meth:`record` or :meth:`apply`,
            this attempt's result.
    """

    def __init__(
        self,
        store: RedisIdempotency,
        key: str,
        *,
        marker: bytes | None = None,
        done: bool = False,
        result: Any = None,
    ) -> None:
        self.key = key
        self.done = done
        self.result = result
        self._store = store
        self._redis_key = store.redis_key(key)
        self._receipt_key = store._receipt_key(key)
        self._marker = marker  # our claim; None once recorded, released, or never held
        self._lease = store.lease  # seconds the claim was last given (``extend``)

    def __repr__(self) -> str:
        state = "done" if self.done else "claimed" if self._marker else "finished"
        return f"<RedisOnce {self.key!r} {state}>"

    def _require_claim(self, action: str) -> bytes:
        if self._marker is None:
            why = "a previous attempt finished it" if self.done else "recorded or lost already"
            raise NotClaimed(self.key, f"cannot {action}: this attempt holds no claim ({why})")
        return self._marker

    def record(self, result: Any) -> None:
        """Store ``result`` as the outcome; later duplicates get it instead of running.

        Call it after the effect. Only a record that replaces our own claim is stored. A
        client that runs it again after losing the reply (redis-py retries by default)
        finds our record and our receipt, and succeeds.

        Raises:
            ClaimLost: our lease ran out and another attempt took the key; our effect
                happened and theirs may too. Nothing was recorded.
            NotClaimed: this attempt holds no claim (``done``, or recorded already).
            StoreUnavailable: the Redis was not reached or did not answer; the record
                may or may not have been stored, and calling ``record`` again is safe.
            StoreRefused: the Redis answered with an error (full, read-only, an ACL);
                nothing was recorded.
            ConfigurationError: (``result``) the codec cannot encode ``result``. Nothing
                was recorded; leaving the block with it releases the claim, so a retry
                runs the effect again.
        """
        marker = self._require_claim("record")
        store = self._store
        value = store._record_value(result)
        reply = self._run(
            "record",
            "idem_record",
            [self._redis_key, self._receipt_key],
            [marker, value, store._retention_ms, store._receipt_ms],
        )
        # None: another attempt's record the client could not decode (``_run``).
        status, holding = (0, b"d:") if reply is None else reply
        if status != 1:
            holder = _holder(_as_bytes(store.client, holding))
            raise self._lost(
                holder,
                f"and another attempt took the key (it holds a {holder}); our effect "
                "happened and may happen again: not recorded",
            )
        self._marker = None
        self.result = result

    def apply(
        self,
        keys: Sequence[str],
        fn: Callable[[Reads[Pipeline]], Plan[T]],
        *,
        retries: int = DEFAULT_RETRIES,
        backoff: RetryPolicy = DEFAULT_BACKOFF,
        stats: OptimisticStats | None = None,
    ) -> T:
        """Apply an effect on this Redis and record its result in the same ``MULTI``/``EXEC``.

        ``fn`` reads ``keys`` and returns a :class:`~tenure.patterns.optimistic.Plan`: its
        writes are the effect, its result is recorded. Runs as
        :func:`~tenure.patterns.optimistic.optimistic` over the idempotency key and
        ``keys``, so a concurrent write to ``keys`` is retried (up to ``retries``), and the
        effect is committed only while the key holds our claim.

        Args:
            keys: the keys the effect reads (watched; read with one MGET).
            fn: computes the effect from what it read; may run several times. Raising
                from it writes nothing (and the block's exit releases the claim).
            retries, backoff, stats: as :func:`~tenure.patterns.optimistic.optimistic`.

        Returns:
            The plan's result, now recorded.

        Raises:
            ClaimLost: another attempt took the key over; nothing of ours was applied.
            ConflictError: ``keys`` kept changing; nothing was applied, the claim is kept.
            NotClaimed: this attempt holds no claim.
            ConfigurationError: (``result``) the codec cannot encode the plan's result,
                or (``fn``) ``fn`` returned no Plan; nothing was applied.
            StoreUnavailable, StoreRefused: as
                :func:`~tenure.patterns.optimistic.optimistic`.
            Exception: whatever ``fn`` raises.

        Example (one coupon, redeemed once per request)::

            with store.once(request_id) as once:
                if once.done:
                    return once.result
                return once.apply(["coupons:SPRING"], redeem)
        """
        marker = self._require_claim("apply")
        store = self._store
        own, effect_keys = self._redis_key, _check_keys(keys)

        def guarded(reads: Reads[Pipeline]) -> Plan[T]:
            holding = reads[own]
            # Absent: our lease ran out but nobody took over. As in record(), go ahead:
            # the key is watched, so a claim landing before EXEC makes EXEC fail.
            if holding is not None and holding != marker:
                holder = _holder(holding)
                raise self._lost(
                    holder,
                    f"before the effect; the key holds a {holder}; nothing of ours was applied",
                )
            plan = _checked_plan(fn(Reads({k: reads[k] for k in effect_keys}, reads.reader)))
            record = store._record_value(plan.result)

            def writes(tx: Pipeline) -> None:
                _queue_writes(tx, plan.writes)
                tx.set(own, record, px=store._retention_ms)

            return Plan(result=plan.result, writes=writes)

        result = optimistic(
            store.client,
            [own, *effect_keys],
            guarded,
            retries=retries,
            backoff=backoff,
            stats=stats,
        )
        self._marker = None
        self.result = result
        return result

    def extend(self, lease: float | None = None) -> None:
        """Keep the claim for ``lease`` more seconds, counted from now, while the effect runs.

        For an effect that may outlast the store's lease: call it before the lease runs
        out (every third of it, say), so a duplicate keeps waiting or answering
        :class:`InProgress` rather than taking the key over and running the effect again.
        The claim's end is set to ``lease`` from now, shorter or longer than before. A
        call run again after a lost reply finds our claim and succeeds. A key found empty
        (our lease ran out and nobody took it) holds our claim again, as :meth:`record`
        would store a record there.

        Args:
            lease: seconds; default the store's ``lease``.

        Raises:
            ClaimLost: our lease ran out and another attempt took the key (it holds that
                attempt's claim or record). The claim is gone: leaving the block records
                nothing, and the attempt that took over may do the effect again.
            NotClaimed: this attempt holds no claim (``done``, or recorded already).
            StoreUnavailable: the Redis was not reached or did not answer; the claim may
                or may not have been extended, and calling ``extend`` again is safe.
            StoreRefused: the Redis answered with an error (the key holds something that
                is not idempotency state, or the Redis is full, read-only, or refuses by
                its ACL); nothing changed.
            ConfigurationError: (``lease``) not a number of seconds from 0.001 to about a
                century; nothing was sent.
        """
        marker = self._require_claim("extend")
        store = self._store
        lease_ms = store._lease_ms if lease is None else _seconds_to_ms("lease", lease)
        # The claim script, run again with our marker, renews our claim, or takes back
        # an empty key, and otherwise changes nothing (idem_claim.lua).
        reply = self._run("extend", "idem_claim", [self._redis_key], [marker, lease_ms])
        status = _DONE if reply is None else reply[0]  # None: an undecodable record
        if status != _CLAIMED:
            holder = "claim" if status == _BUSY else "record"
            raise self._lost(
                holder,
                f"before it was extended, and another attempt took the key (it holds a "
                f"{holder}); that attempt may do the effect too",
            )
        self._lease = store.lease if lease is None else lease

    def _run(self, action: str, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` for ``action`` (``"record"``, ``"extend"``): its reply, or
        None where a client that decodes replies (``decode_responses=True``) could not
        read it as text in its encoding. Ours and another attempt's claim ("p:" and hex
        digits) are text; so the key holds another attempt's record, written by a codec
        whose bytes are not text, and the script changed nothing.

        Raises:
            StoreUnavailable, StoreRefused: the store failed; calling ``action`` again is
                safe, as it finds what its first run did.
        """
        store = self._store
        try:
            return store.client.eval(_source(name), len(keys), *keys, *args)
        except _FAILURES as exc:
            found = "record" if action == "record" else "claim"
            raise store_error(
                exc,
                store.client,
                "RedisIdempotency",
                action,
                self.key,
                maybe_applied=True,
                retry=f"; calling {action}() again is safe (it finds its own {found})",
            ) from exc
        except UnicodeDecodeError:
            return None

    def _lost(self, holder: str, what: str) -> ClaimLost:
        """The :class:`ClaimLost` to raise: our claim's lease (the store's, or the one it
        was last extended by) ran out ``what``. The claim is gone, so leaving the block
        must not record."""
        self._marker = None
        return ClaimLost(self.key, holder, f"our claim's lease ({self._lease:g} s) ran out {what}")

    def _release(self) -> None:
        """Give the claim up after a failed block, so a retry need not wait for the lease."""
        marker, self._marker = self._marker, None
        if marker is None:
            return
        # The block's own exception matters more than a failed release, and the lease
        # frees the key anyway. Every store failure, a cluster client's own included (a
        # slot no master serves is no RedisError): else it would replace the block's.
        with contextlib.suppress(*_FAILURES):
            self._store.client.eval(_source("idem_release"), 1, self._redis_key, marker)


class RedisIdempotency(_ProcessBound):
    """Idempotency keys on Redis: claims with a lease, results kept for a retention time.

    Args:
        client: a blocking ``redis.Redis`` or ``redis.RedisCluster``; not closed by the
            store. One made with ``decode_responses=True`` reads only text in its
            encoding, so it is taken with the JSON codec alone.
        namespace: the first part of every key: ``<namespace>:{<key>}``, and its
            receipt ``<namespace>:{<key>}:receipt``. Without braces, each key is its
            own hash tag (and a key starting with ``}`` is refused: its tag would be
            empty); with a tag (``idem{1}``), every key is in that tag's slot.
        lease: seconds a claim lasts; after it, a crashed attempt is taken over. Must
            exceed the longest effect, or the effect must call :meth:`RedisOnce.extend`
            (see the module docstring for what happens if not).
        retention: seconds a result is kept; a duplicate arriving later runs again.
        wait: default seconds a duplicate waits for an attempt in progress before
            raising :class:`InProgress` (0: raise at once).
        poll: the back-off between looks while waiting: a retry policy, refused when
            the store is made if it has no ``delay``; each delay it gives is checked when
            it is asked (a ``ConfigurationError`` on ``poll`` unless a number of seconds
            in [0, ``MAX_RETRY_DELAY``]).
        codec: how results are stored (JSON by default).

    Raises:
        ConfigurationError: an asyncio ``client``, or one made with
            ``decode_responses=True`` with a codec other than JSON; a bad ``namespace``,
            ``lease``, ``retention``, ``wait`` or ``codec``.

    Example::

        store = RedisIdempotency(redis.Redis(), lease=30, wait=5)
        with store.once(request.headers["Idempotency-Key"]) as once:
            if once.done:
                return once.result
            receipt = payments.charge(card, amount, idempotency_key=once.key)
            once.record(receipt)
            return receipt
    """

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        *,
        namespace: str = "tenure:idem",
        lease: float = 30.0,
        retention: float = 86400.0,
        wait: float = 0.0,
        poll: RetryPolicy = DEFAULT_POLL,
        codec: Codec = JSON,
    ) -> None:
        _check_client(client, "client", owner="RedisIdempotency", asyncio=False)
        self.client = client
        self.namespace = _check_namespace(check_name(namespace, "namespace"))
        self._lease_ms = _seconds_to_ms("lease", lease)
        self._retention_ms = _seconds_to_ms("retention", retention)
        # idem_record.lua says why the receipt lasts this long.
        self._receipt_ms = min(self._lease_ms, self._retention_ms)
        self.lease = lease
        self.retention = retention
        self.wait = _check_wait(wait)
        # Checked now: otherwise found only when a duplicate first waits.
        self.poll = check_retry_policy(poll, "poll")
        self.codec = _check_codec(codec)
        if self.codec != JSON:
            # JSON's records are ASCII text (json.dumps escapes the rest), which a client
            # made with decode_responses=True reads in any encoding it may have; another
            # codec's bytes need not be text, and such a client fails inside redis-py on
            # them: every duplicate, after the effect.
            _check_client(
                client,
                "client",
                owner="RedisIdempotency with a codec other than JSON",
                asyncio=False,
                raw_bytes=True,
            )
        self._rng = random.Random()

    def __repr__(self) -> str:
        # The namespace only: the client's URL may carry a password.
        return f"<RedisIdempotency namespace={self.namespace!r}>"

    def _remade_from(self) -> tuple[str, str]:
        return (
            f"a redis client made there and namespace={self.namespace!r} (the same "
            "lease and retention)",
            "the Redis URL rather than the store",
        )

    def redis_key(self, key: str) -> str:
        """The Redis key that holds idempotency key ``key``'s claim or record.

        Raises:
            ConfigurationError: a bad ``key``, or one that starts with ``}`` under a
                namespace without a hash tag of its own: its Redis key would have an
                empty hash tag, and Redis Cluster would put its receipt in another slot.
        """
        name = f"{self.namespace}:{{{_check_key(key)}}}"
        if _empty_hash_tag(name):
            # The namespace was checked when the store was made: the key starts with "}".
            raise ConfigurationError(
                "key",
                f"{key!r} starts with '}}', which leaves its Redis key {name!r} an empty "
                "hash tag: Redis Cluster (and sharded Redis behind a proxy) would put it "
                "and its receipt in different slots, and the record would fail after the "
                "effect. Send a key that does not start with '}' (a digest of it, say), "
                "or give the store a namespace with a hash tag of its own, e.g. 'idem{1}'",
            )
        return name

    def _receipt_key(self, key: str) -> str:
        # The whole Redis key, then a suffix: the same hash tag (the first {...}) whatever
        # braces ``key`` holds, so both keys of idem_record.lua share a Cluster slot. No
        # idempotency key's Redis key ends so (they end with "}").
        return f"{self.redis_key(key)}:receipt"

    def _record_value(self, result: Any) -> bytes:
        return b"n:" if result is None else b"d:" + _encoded(self.codec, result)

    def _undecodable(self, key: str) -> ConfigurationError:
        """The error for ``key``'s record that the client, which decodes replies
        (``decode_responses=True``), failed to read as text in its encoding: not JSON
        either, so written by another codec or by hand (as ``_decoded`` says of one it
        reads)."""
        encoding = _reply_encoding(self.client)[0]
        return ConfigurationError(
            "codec",
            f"idempotency key {key!r} holds a record that is not text in the client's "
            f"encoding {encoding!r}, which this client, made with decode_responses=True, "
            "cannot read: it was written by "
            "another codec or by hand. Read it with the codec that wrote it, through a "
            "client without decode_responses (redis.Redis(..., decode_responses=False), "
            "the default); or, to forget the request (a retry then runs the effect "
            f"again), delete the Redis key {self.redis_key(key)!r}",
        )

    @contextmanager
    def once(self, key: str, *, wait: float | None = None) -> Iterator[RedisOnce]:
        """Claim ``key`` for one attempt, or find the result of the attempt that finished.

        Args:
            key: the idempotency key (e.g. the request's ``Idempotency-Key`` header).
            wait: seconds to wait for an attempt in progress; default the store's.

        Yields:
            A :class:`RedisOnce`: ``done`` with the recorded ``result``, or holding the
            claim. Leaving the block normally records ``None`` if nothing was recorded;
            leaving it with an exception releases the claim (nothing is recorded).

        Raises:
            InProgress: another attempt held the key for all of ``wait``.
            ConfigurationError: a bad ``key`` (see :meth:`redis_key`) or ``wait``; or
                (``codec``) the key holds a record the codec cannot read (written by
                another codec), or one that is not text in the client's encoding and
                the client decodes replies: it is left alone, and the block does not run.
            StoreUnavailable: the Redis was not reached or did not answer. A claim may
                have been taken (``.maybe_applied``): it holds the key until its lease
                runs out, and a retry before then finds the key in progress.
            StoreRefused: the Redis answered with an error: the key holds something that
                is not idempotency state, or the Redis is full, read-only, or refuses
                by its ACL. Nothing was claimed.
        """
        attempt = self._claim(_check_key(key), _check_wait(self.wait if wait is None else wait))
        try:
            yield attempt
        except BaseException:
            attempt._release()
            raise
        if attempt._marker is not None:
            attempt.record(None)

    def _claim(self, key: str, wait: float) -> RedisOnce:
        """Run the claim script until it claims or finds a record, or ``wait`` runs out."""
        marker = b"p:" + secrets.token_hex(16).encode()
        started = time.monotonic()
        polls = 0
        while True:
            try:
                status, payload = self.client.eval(
                    _source("idem_claim"), 1, self.redis_key(key), marker, self._lease_ms
                )
            except _FAILURES as exc:
                raise store_error(
                    exc,
                    self.client,
                    "RedisIdempotency",
                    "claim",
                    key,
                    maybe_applied=True,
                    retry=(
                        f"; a claim taken holds the key until its lease ({self.lease} s) "
                        "runs out, and a retry before then finds it in progress"
                    ),
                ) from exc
            except UnicodeDecodeError as exc:
                raise self._undecodable(key) from exc
            if status == _CLAIMED:
                return RedisOnce(self, key, marker=marker)
            if status == _DONE:
                result = _decoded(
                    self.codec,
                    _as_bytes(self.client, payload),
                    key,
                    f"delete the Redis key {self.redis_key(key)!r}",
                )
                return RedisOnce(self, key, done=True, result=result)
            if status == _DONE_NO_RESULT:
                return RedisOnce(self, key, done=True)
            lease_left = int(payload) / 1000 if int(payload) >= 0 else None
            waited = time.monotonic() - started
            if waited >= wait:
                raise InProgress(key, lease_left, waited)
            polls += 1
            delay = retry_delay(self.poll, polls, self._rng, "poll")
            if lease_left is not None:
                # Look again no later than the holder's lease ends: if it crashed, we are
                # the one to take over.
                delay = min(delay, lease_left)
            time.sleep(max(min(delay, wait - waited), 0.001))

"""Single-writer streams: every write for a key goes through one ordered stream,
consumed by exactly one worker at a time, instead of taking a lock per write.

Theory of operation
-------------------

Layout, for a ``stream_prefix`` such as ``"orders"`` and P partitions::

    orders:{p}                  a Redis stream: the writes of every key whose partition is p
    orders:{p}:owner:<g>        the fencing token of the lease that owns partition p now,
                                for consumer group g
    orders:<g>:workers          sorted set: group g's live workers, by heartbeat expiry (ms)
    orders:<g>:partition:<p>    the tenure lock (on the lock nodes) that grants partition
                                p to a worker of group g

Every consumer group reads the whole stream (a ledger and an audit trail, say), so
ownership, the stream's fence and the registry are kept per group: the workers of one
group never take partitions from another's.

A key's partition is ``crc32(key) mod P`` (:class:`Partitioner`), the same in every
process (Python's ``hash()`` is salted per process). A producer ``XADD``s a write to its
key's stream, so per-key order is the order of ``XADD`` on one stream. P is fixed for the
life of the streams: changing it moves keys between streams and mixes their order.

A worker owns a partition while it holds a tenure lease on ``<prefix>:<g>:partition:<p>``,
taken without blocking and kept alive by the lease's watchdog. It consumes a stream it
owns through one consumer group (``XREADGROUP``), calls
``handler(key, payload, fencing_token)`` for each entry in stream order, and
acknowledges the batch (``XACK``) afterwards.

**Taking a partition over.** Whatever the previous owner read but did not acknowledge is
in the group's pending list, under its consumer name. Those entries all precede every
undelivered one (``>`` delivers in id order, past the group's last-delivered id), so the
new owner first claims the whole pending list in id order (``XAUTOCLAIM`` with idle time
0: the lease, not an idle timer, says the previous owner is gone) and processes it, then
reads new entries. Stream order, hence per-key order, is kept across owners; nothing
read by a dead owner is lost; what it had handled but not acknowledged is delivered again.

**Fencing the stream itself.** A lease can end while its holder still runs (a pause, a
slow network). Without care, such a holder's late ``XREADGROUP`` would move fresh entries
into *its* pending list after the new owner's claim, where nobody would process them
before newer ones. So every read and acknowledgement is a Lua script that first compares
the caller's fencing token with ``<prefix>:{p}:owner:<g>``, and a new owner writes its token
there (refused if a newer one is there already) in the same script that creates the
group. From the moment the new owner took the stream, the old one can neither read nor
acknowledge; before that moment whatever it read is pending and will be claimed.

**A worker that lost its lease stops before writing again.** Before each handler call
the worker calls ``lease.check()``; a lease found lost (watchdog, failed extension, or
validity over because the process was paused) drops the partition: no handler call, no
acknowledgement. A holder that pauses *after* its check can still write late; that is
what the fencing token handed to the handler is for: the handler writes through a fenced
store (:class:`tenure.fencing.FencedStore`, per partition or per key), which refuses the
late write with :class:`~tenure.StaleToken`, and the worker drops the partition.

**Delivery: at least once.** An entry is handed to the handler at least once, and again
after a crash, a lost lease or a handler error between the handler call and the
acknowledgement (at most one batch per such event). Effects are exactly once only if the
handler is idempotent *and* fenced: it records, atomically with its effect, what it has
applied (a per-key sequence number checked as ``seq == last + 1``, or an
``applied:<request id>`` marker from the payload). The stream's message id is not a good
idempotency key on its own: a producer that retries an ``XADD`` whose reply was lost
appends a second entry with a new id.

**A read whose reply is lost.** Redis may run a read (``XREADGROUP >`` moving a batch
into this worker's pending list) while its reply never arrives: a timeout, or a
client-side retry that runs the read again. The worker acknowledges every batch it was
handed, or rewinds, or drops the partition, so its own pending list is empty whenever it
asks for new entries; the read script therefore hands out what it finds there first (a
claim from the start, as a rewind does), which makes a read safe to run twice. A read
that fails with an error rewinds its partitions as well.

**Spreading partitions.** Each worker refreshes its entry in ``<prefix>:<g>:workers`` every
``rebalance_interval`` (expiry = Redis server time + ``heartbeat_ttl``, so the workers'
clocks never need to agree), reads the live names, and aims at its share: with W live
workers sorted by name, ``P // W`` partitions plus one for the first ``P % W`` names, so
the shares add up to P and never exceed ``ceil(P / W)``. A worker above its share
releases the extra partitions (between batches, with everything acknowledged); below it,
it tries free partitions in random order. A worker that dies stops heartbeating and
renewing: within about one TTL its leases expire, the others count one worker fewer,
and take the partitions. The registry only guides the shares; the leases are what
decide ownership, so a stale view costs balance, never safety.

**What a handler error does.** The entries already handled are acknowledged, and the
partition rewinds: after ``retry_delay`` it claims its own pending list again from the
start, so the failed entry is retried before anything newer (per-key order over
progress). An entry that always fails therefore stops its partition; the handler should
catch what it can deal with.

**A handler that hangs.** The leases' watchdogs run in their own threads, so they would
extend the leases of a worker stuck in one handler call (a database call without a
timeout) for as long as its process lived: its heartbeat stops, the others count it
out, and still cannot take its partitions. So the worker marks the start of each step
(a pass, a handler call, the acknowledgement after it), and its watchdogs extend only
while the current step is younger than ``handler_timeout`` (``KeepAlive.max_busy``),
as Kafka's ``max.poll.interval.ms`` bounds the time between polls. Past it, every lease
of the worker runs out, is marked lost, and the others take the partitions over. The
late call, when it returns, finds its lease lost before it acknowledges anything or
calls the handler again; a late write it made meanwhile is refused by a fenced store.

Assumptions: the stream Redis keeps its data (a stream node restarted empty has lost the
writes themselves; the owner keys went with them, so the workers' reads are refused as
stale, and they take their partitions again); consumer names are unique among live
workers; a handler call returns within ``handler_timeout`` (or, with None, at all).
"""

from __future__ import annotations

import logging
import random
import secrets
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from .._core.config import check_name as _checked_name
from .._core.watchdog import KeepAlive as _KeepAlive
from .._driver.clock import monotonic
from .._driver.events import Event as _Event
from .._driver.guard import Guard as _Guard
from .._driver.guard import taker as _taker
from .._driver.process_bound import ProcessBound as _ProcessBound
from .._driver.redis_objects import check_client as _check_client
from .._driver.store_errors import FAILURES as _FAILURES
from .._driver.store_errors import Failed as _Failed
from .._driver.store_errors import store_error as _store_error
from .._errors import (
    ConfigurationError,
    LeaseLost,
    LockTimeout,
    NotHeld,
    StaleToken,
    StoreError,
    StoreRefused,
    TenureError,
)
from .._lua import script
from .._sync.client import Client, Lease

__all__ = [
    "KEY_FIELD",
    "Handler",
    "Partitioner",
    "StopSignal",
    "StreamProducer",
    "StreamWorker",
    "WorkerStats",
    "fair_share",
    "partition_lock_name",
    "partition_stream",
]

_log = logging.getLogger("tenure.streams")

KEY_FIELD = "tenure.key"
"""The stream-entry field that carries the resource key; payloads may not use it."""

MAX_BATCH = 1000  # ids per XACK are unpacked onto the Lua stack, which holds ~8000

Handler = Callable[[str, Mapping[str, bytes], int], object]
"""``handler(key, payload, fencing_token)``: apply one write; its return value is ignored."""

Payload = Mapping[str, str | bytes | int]

_NO_CURSOR = ""  # the read script's "read new entries" (an XAUTOCLAIM cursor otherwise)
_CLAIM_FROM_START = "0-0"


class StopSignal(Protocol):
    """What ``StreamWorker.run`` needs of its stop event (``threading.Event`` and
    ``multiprocessing.Event`` both fit)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _check_partitions(partitions: object) -> int:
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ConfigurationError("partitions", f"must be an int >= 1, got {partitions!r}")
    return partitions


# The longest interval a worker sleeps or waits (a day): ``time.sleep`` overflows long
# before a float does.
MAX_INTERVAL = 86_400.0

# Seconds a handler call may hang before its worker lets its partitions go: generous, as
# Kafka's max.poll.interval.ms (5 minutes), so that only a call that is stuck, not one
# that is slow, moves partitions (docs/patterns.md, "A handler that hangs").
DEFAULT_HANDLER_TIMEOUT = 300.0


def _check_positive(parameter: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(parameter, f"must be a number > 0, got {value!r}")
    if not value <= MAX_INTERVAL:
        raise ConfigurationError(
            parameter, f"must be at most {MAX_INTERVAL:,.0f} seconds, got {value!r}"
        )
    return float(value)


def _check_handler_timeout(value: object) -> float | None:
    if value is None:
        return None
    try:
        return _check_positive("handler_timeout", value)
    except ConfigurationError:
        raise ConfigurationError(
            "handler_timeout",
            f"must be a number of seconds > 0 and at most {MAX_INTERVAL:,.0f}, or None to "
            f"keep the partitions however long a handler call hangs, got {value!r}",
        ) from None


def partition_stream(stream_prefix: str, partition: int) -> str:
    """The stream key of ``partition``: ``<prefix>:{<partition>}``.

    The ``{partition}`` hash tag keeps the stream and its owner key in one Redis Cluster
    slot, which the fenced scripts need.
    """
    return f"{stream_prefix}:{{{partition}}}"


def _partitions_key(stream_prefix: str) -> str:
    """Where P is recorded for the streams under ``stream_prefix``: ``<prefix>:partitions``
    (see ``_agree_on_partitions``)."""
    return f"{stream_prefix}:partitions"


def _agree_on_partitions(
    client: redis.Redis, stream_prefix: str, partitions: int, who: str
) -> None:
    """Record P for the streams under ``stream_prefix``, or check it against the record.

    The first producer or worker to write records its P (``SET NX``, kept for good, as
    the streams are); every other one checks its own against it. A worker with another P
    than the producers' reads some streams and never the others, and a producer with
    another P than the writes before it moves keys between streams: both silently, so
    each refuses to start instead.

    Raises:
        ConfigurationError: ``partitions`` differs from the recorded P.
        StoreUnavailable, StoreRefused: the Redis failed or refused the check.
    """
    key = _partitions_key(stream_prefix)
    try:
        if client.set(key, partitions, nx=True):
            return
        recorded = client.get(key)
    except _FAILURES as exc:
        owner = "StreamWorker" if "worker" in who else "StreamProducer"
        raise _store_error(exc, client, owner, "partition count check", key) from exc
    try:
        agreed = int(recorded) if recorded is not None else partitions
    except ValueError:
        raise ConfigurationError(
            "partitions", f"{key} holds {recorded!r}, not a partition count: delete it"
        ) from None
    if agreed != partitions:
        raise ConfigurationError(
            "partitions",
            f"{who} has partitions={partitions}, but the streams under {stream_prefix!r} "
            f"have {agreed} (recorded in {key} by the first producer or worker): give "
            f"every producer and worker partitions={agreed}. To change P, stop them all, "
            f"let the workers drain the streams, then delete {key}",
        )


def partition_lock_name(stream_prefix: str, partition: int, group: str) -> str:
    """The tenure lock name whose lease owns ``partition`` for consumer group ``group``:
    ``<prefix>:<group>:partition:<p>``. Each group consumes the whole stream, so each has
    its own owners (and fence, and registry of workers)."""
    return f"{stream_prefix}:{group}:partition:{partition}"


def _owner_key(stream_prefix: str, partition: int, group: str) -> str:
    return f"{partition_stream(stream_prefix, partition)}:owner:{group}"


def _registry_key(stream_prefix: str, group: str) -> str:
    return f"{stream_prefix}:{group}:workers"


class Partitioner:
    """Maps a resource key to its partition, identically in every process.

    ``Partitioner(8)("orders:42")`` is ``crc32(b"orders:42") % 8``. CRC-32 rather than
    Python's ``hash()``, which is salted per process, so producers and workers agree.

    Args:
        partitions: the number of partitions P (>= 1).

    Raises:
        ConfigurationError: ``partitions`` is not an int >= 1; (when called) ``key`` is
            not a name the nodes can hold (``check_name``: a non-empty str of UTF-8 text).
    """

    __slots__ = ("partitions",)

    def __init__(self, partitions: int) -> None:
        self.partitions = _check_partitions(partitions)

    def __call__(self, key: str) -> int:
        return zlib.crc32(_checked_name(key, "key").encode()) % self.partitions

    def __repr__(self) -> str:
        return f"Partitioner({self.partitions})"


def _pairs(writes: Iterable[tuple[str, Payload]]) -> list[tuple[str, Payload]]:
    """``writes`` as a list of ``(key, payload)`` pairs, each checked to be a pair."""
    pairs = []
    for number, write in enumerate(writes):
        if not isinstance(write, tuple) or len(write) != 2:
            raise ConfigurationError(
                "writes", f"item {number} must be a (key, payload) pair, got {write!r:.80}"
            )
        pairs.append(write)
    return pairs


def _entry_fields(key: str, payload: Payload) -> dict[Any, Any]:
    """The fields of one stream entry: the key, then the payload.

    Raises:
        ConfigurationError: (``key``, ``payload``) an empty key, a payload that is no
            mapping, a field named ``KEY_FIELD``, or a value that is not str, bytes or int.
    """
    _checked_name(key, "key")
    if not isinstance(payload, Mapping):
        raise ConfigurationError(
            "payload", f"must be a mapping of field names to values, got {type(payload).__name__}"
        )
    # dict[Any, Any]: what redis-py's xadd accepts has changed between versions.
    fields: dict[Any, Any] = {KEY_FIELD: key}
    for name, value in payload.items():
        if not isinstance(name, str) or name == KEY_FIELD:
            raise ConfigurationError("payload", f"field name {name!r} is reserved or not a str")
        # bool is an int, but True in a payload is a bug in the caller.
        if isinstance(value, bool) or not isinstance(value, (str, bytes, int)):
            raise ConfigurationError("payload", f"{name!r}: {type(value).__name__} value")
        fields[name] = value
    return fields


class StreamProducer(_ProcessBound):
    """Appends keyed writes to the partition streams.

    Args:
        redis_client: a blocking ``redis.Redis`` (or ``redis.RedisCluster``) of the Redis
            that holds the streams; the producer does not close it.
        stream_prefix: the streams' common prefix (the workers' ``stream_prefix``).
        partitions: P, the same as the workers'.

    Raises:
        ConfigurationError: an asyncio ``redis_client``, an empty prefix, or
            ``partitions`` not an int >= 1.
    """

    def __init__(self, redis_client: redis.Redis, stream_prefix: str, partitions: int) -> None:
        # An asyncio client would hand back coroutines, dropped un-awaited: nothing written.
        _check_client(redis_client, "redis_client", owner="StreamProducer", asyncio=False)
        self.client = redis_client
        self.stream_prefix = _checked_name(stream_prefix, "stream_prefix")
        self.partitioner = Partitioner(partitions)
        self._agreed = False  # P checked against the streams' record (first write)

    def __repr__(self) -> str:
        # No client: its URL may carry a password.
        return (
            f"<StreamProducer stream_prefix={self.stream_prefix!r} "
            f"partitions={self.partitioner.partitions}>"
        )

    def _remade_from(self) -> tuple[str, str]:
        return (
            f"a redis client made there, stream_prefix={self.stream_prefix!r} and "
            f"partitions={self.partitioner.partitions}",
            "the Redis URL rather than the producer",
        )

    def _agree(self) -> None:
        if not self._agreed:
            _agree_on_partitions(
                self.client, self.stream_prefix, self.partitioner.partitions, "this producer"
            )
            self._agreed = True

    def stream_of(self, key: str) -> str:
        """The stream ``key``'s writes go to."""
        return partition_stream(self.stream_prefix, self.partitioner(key))

    def append(self, key: str, payload: Payload) -> str:
        """Append one write for ``key``; writes of one key are consumed in append order.

        Returns:
            The stream entry id.

        Raises:
            ConfigurationError: a bad key or payload (see :data:`KEY_FIELD`); at the
                producer's first write, a ``partitions`` other than the P the streams
                were made with (recorded by the first producer or worker).
            StoreUnavailable: the Redis was not reached or did not answer; the entry
                may or may not have been appended (``.maybe_applied``), and a retry may
                append it twice, which is why handlers deduplicate on a key the payload
                carries, not on the entry id.
            StoreRefused: the Redis answered with an error (the stream's key holds
                another type, full, read-only, an ACL); nothing was appended.
        """
        fields = _entry_fields(key, payload)
        self._agree()
        stream = self.stream_of(key)
        try:
            return _text(self.client.xadd(stream, fields))
        except _FAILURES as exc:
            raise self._failed(exc, stream) from exc

    def _failed(self, exc: _Failed, stream: str) -> StoreError:
        return _store_error(
            exc,
            self.client,
            "StreamProducer",
            "append",
            stream,
            maybe_applied=True,
            retry="; a retry may append it twice (handlers deduplicate on the payload)",
        )

    def append_many(
        self, writes: Iterable[tuple[str, Payload]], *, atomic: bool = False
    ) -> list[str]:
        """Append several writes in one round trip, in the order given.

        Args:
            writes: ``(key, payload)`` pairs.
            atomic: wrap them in ``MULTI``/``EXEC``, so no reader sees some without the
                others (single Redis only: on a cluster the streams are in other slots).

        Returns:
            The entry ids, in the order of ``writes``.

        Raises:
            ConfigurationError, StoreUnavailable, StoreRefused: as :meth:`append`; a
                refused write of a batch that is not ``atomic`` leaves the others
                appended (``MULTI``/``EXEC`` does not roll back either).
        """
        batch = [
            (self.stream_of(key), _entry_fields(key, payload)) for key, payload in _pairs(writes)
        ]
        self._agree()
        try:
            with self.client.pipeline(transaction=atomic) as pipe:
                for stream, fields in batch:
                    pipe.xadd(stream, fields)
                return [_text(entry_id) for entry_id in pipe.execute()]
        except _FAILURES as exc:
            streams = " ".join(dict.fromkeys(stream for stream, _ in batch))
            raise self._failed(exc, streams) from exc


@dataclass
class WorkerStats:
    """What one worker has done so far; for monitoring and tests."""

    taken: int = 0
    """Partitions acquired."""
    released: int = 0
    """Partitions given back (rebalancing, ``stop``)."""
    lost: int = 0
    """Partitions dropped because their lease was found lost (check, watchdog)."""
    fenced: int = 0
    """Partitions dropped because a store or the stream refused the lease's token."""
    claimed: int = 0
    """Entries claimed from a pending list (a previous owner's, or ours after an error)."""
    handled: int = 0
    """Handler calls that returned (an entry may be handled more than once)."""
    failed: int = 0
    """Handler calls that raised something other than a loss of the lease."""
    skipped: int = 0
    """Entries acknowledged without a handler call, as they were deleted from the stream
    while pending or carry no ``KEY_FIELD``."""


@dataclass
class _Held:
    """A partition this worker holds the lease of."""

    number: int
    lease: Lease
    cursor: str = _CLAIM_FROM_START
    """Where the next ``XAUTOCLAIM`` starts; ``_NO_CURSOR`` once the pending list is
    drained and new entries are read."""
    resume_at: float = 0.0
    """After a handler error: not read again before this instant."""

    @property
    def token(self) -> int:
        return self.lease.fencing_token


class StreamWorker(_ProcessBound):
    """Consumes the partitions it holds leases on, one handler call at a time.

    Args:
        lock_client: the tenure client whose leases own partitions (not closed here).
        redis_client: a blocking ``redis.Redis`` (or ``redis.RedisCluster``) of the
            streams' Redis, returning raw bytes (not made with ``decode_responses=True``:
            payload values may be any bytes, and such a client hands them back as str
            decoded with its encoding, failing inside redis-py on the first that is not
            text in it, for the whole batch, in every worker that takes the partition);
            not closed here.
        stream_prefix: as given to :class:`StreamProducer`.
        partitions: P, as given to :class:`StreamProducer`.
        group: the consumer group's name; created at "0" if missing (a group deleted
            while in use is recreated there, so what the stream still holds is
            delivered again: harmless to an idempotent handler).
        consumer_name: this worker's name, unique among live workers.
        handler: ``handler(key, payload, fencing_token)``; payload values are bytes.
        lease_ttl: TTL of each partition lease (the watchdog extends it every TTL/3);
            a dead worker's partitions move after about this long.
        batch_size: entries read per partition per pass (1..1000); also the most a
            crash can deliver twice per partition.
        poll_interval: seconds to sleep when no held partition had anything.
        rebalance_interval: seconds between heartbeats and share checks (default
            ``lease_ttl / 3``).
        heartbeat_ttl: how long a silent worker still counts as live (default
            ``lease_ttl``); longer than ``rebalance_interval``, plus the longest pass
            (a batch of every held partition), so that a live worker never drops out
            of the registry between its beats.
        retry_delay: seconds before a partition whose handler raised is tried again.
        handler_timeout: seconds a handler call (or a pass's own reads and
            acknowledgements) may run before the worker lets every partition it holds
            go: their watchdogs stop extending, the leases run out (within
            ``handler_timeout`` plus about ``lease_ttl``), and other workers take the
            partitions over. The late call, when it returns, acknowledges nothing for
            them. None: keep the leases for as long as the process lives, however long
            a call hangs. Default 300 (Kafka's ``max.poll.interval.ms``).

    Raises:
        ConfigurationError: a parameter out of range (``heartbeat_ttl`` not longer
            than ``rebalance_interval`` too); ``redis_client`` asyncio or
            decoding replies; ``lock_client`` not a blocking ``tenure.Client``;
            ``handler`` not callable.
    """

    def __init__(
        self,
        lock_client: Client,
        redis_client: redis.Redis,
        stream_prefix: str,
        partitions: int,
        group: str,
        consumer_name: str,
        handler: Handler,
        *,
        lease_ttl: float = 10.0,
        batch_size: int = 100,
        poll_interval: float = 0.05,
        rebalance_interval: float | None = None,
        heartbeat_ttl: float | None = None,
        retry_delay: float = 1.0,
        handler_timeout: float | None = DEFAULT_HANDLER_TIMEOUT,
    ) -> None:
        _check_client(
            redis_client, "redis_client", owner="StreamWorker", asyncio=False, raw_bytes=True
        )
        if not isinstance(lock_client, Client):
            # A redis.Redis has a lock() of its own, so nothing failed before run(), and
            # then with an AttributeError; an AsyncClient would hand back coroutines.
            raise ConfigurationError(
                "lock_client",
                f"must be a blocking tenure.Client (the leases that own partitions), got "
                f"{type(lock_client).__name__}: pass tenure.Client([...lock node URLs...])",
            )
        if not callable(handler):
            # Called for the first entry only, where its TypeError became a handler
            # failure, retried every retry_delay: the partition stopped, with a log line.
            raise ConfigurationError(
                "handler",
                f"must be callable as handler(key, payload, fencing_token), got {handler!r}",
            )
        self.lock_client = lock_client
        self.client = redis_client
        self.stream_prefix = _checked_name(stream_prefix, "stream_prefix")
        self.partitions = _check_partitions(partitions)
        self.group = _checked_name(group, "group")
        self.consumer_name = _checked_name(consumer_name, "consumer_name")
        self.handler = handler
        self.lease_ttl = _check_positive("lease_ttl", lease_ttl)
        try:  # the lock client's own rules for a TTL (its max_ttl, its node timeout)
            lock_client.lock(partition_lock_name(self.stream_prefix, 0, self.group), lease_ttl)
        except ConfigurationError as exc:
            detail = str(exc).removeprefix(f"{exc.parameter}: ")
            raise ConfigurationError("lease_ttl", detail) from None
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise ConfigurationError("batch_size", f"must be an int, got {batch_size!r}")
        if not 1 <= batch_size <= MAX_BATCH:
            raise ConfigurationError("batch_size", f"must be in 1..{MAX_BATCH}, got {batch_size}")
        self.batch_size = batch_size
        self.poll_interval = _check_positive("poll_interval", poll_interval)
        self.rebalance_interval = _check_positive(
            "rebalance_interval",
            self.lease_ttl / 3 if rebalance_interval is None else rebalance_interval,
        )
        self.heartbeat_ttl = _check_positive(
            "heartbeat_ttl", self.lease_ttl if heartbeat_ttl is None else heartbeat_ttl
        )
        if not self.heartbeat_ttl > self.rebalance_interval:
            # The entry would expire before the next beat renews it: the others would
            # count this live worker out between beats and take more than their share.
            raise ConfigurationError(
                "heartbeat_ttl",
                f"must be longer than rebalance_interval ({self.rebalance_interval:g} s), "
                f"got {self.heartbeat_ttl:g} s (it defaults to lease_ttl): a worker "
                "beats every rebalance_interval, and its entry must outlive the gap; "
                "raise heartbeat_ttl or lower rebalance_interval",
            )
        self.retry_delay = _check_positive("retry_delay", retry_delay)
        self.handler_timeout = _check_handler_timeout(handler_timeout)
        # The partitions' watchdogs read _busy_since at each wake (from their threads: a
        # float or None, read whole): the start of the worker's current step, None
        # between passes. A step stuck past handler_timeout lets the leases run out.
        self._busy_since: float | None = None
        self._keep = (
            _KeepAlive()
            if self.handler_timeout is None
            else _KeepAlive(max_busy=self.handler_timeout, busy_since=self._current_step)
        )
        self.stats = WorkerStats()
        self._held: dict[int, _Held] = {}
        self._next_balance = 0.0
        self._rng = random.Random(secrets.randbits(64))
        self._stopping = _Event()
        # run(), run_once() and stop() from different threads. Reentrant: a signal
        # handler that calls stop() runs in the thread that may hold it already.
        self._guard = _Guard()
        self._running = False  # run() is looping
        # A pass is running: stop() leaves the give-back to it, so that only one thread
        # ever changes _held (and the leases in it) at a time.
        self._passing = False
        self._agreed = False  # P checked against the streams' record (before any take)

    @property
    def held(self) -> frozenset[int]:
        """The partitions this worker holds leases on now."""
        return frozenset(self._held)

    def run(self, stop_event: StopSignal | None = None) -> None:
        """Consume until ``stop_event`` is set or :meth:`stop` is called, then release
        every lease and leave the registry (also when the handler raises
        ``BaseException``).

        Raises:
            RuntimeError: ``run`` is already running on this worker.
            ConfigurationError: its ``partitions`` differs from the P the streams were
                made with (recorded by the first producer or worker), checked before it
                takes any partition.
            StoreRefused: a refusal no wait ends (``.lasting``: a stream, owner or
                ``<prefix>:partitions`` key of another type, a read-only replica, an ACL,
                the credentials), at any pass; its leases are released first. Other
                failures of the streams' Redis are logged and retried as the loop goes on,
                from the first pass: a worker started while its Redis is down or
                restarting takes no partition until the partition count is checked (tried
                again every ``rebalance_interval``), then works.
        """
        # A Ctrl-C must not leave the worker running for good, its leases kept: what is
        # set is set inside the ``try`` (the return of a ``with``'s exit runs signal
        # handlers), and the ``finally`` takes the guard with none run before its work
        # (a ``with`` of it would run them as it begins on Python 3.14).
        retaking = _taker(self._guard)
        running = False
        try:
            with self._guard:
                if self._running:
                    raise RuntimeError(f"worker {self.consumer_name!r} is already running")
                self._running = running = True
            self._run_until_stopped(stop_event)
        finally:
            if running:
                (_,) = retaking
                try:
                    self._running = False
                    self._shutdown()
                finally:
                    self._guard.release()

    def _run_until_stopped(self, stop_event: StopSignal | None) -> None:
        # A function of its own, not a loop in ``run``'s ``try``: a Ctrl-C must not skip
        # the release of the worker's leases (docs/architecture.md, "A loop in a try or
        # with block").
        while not self._stop_requested(stop_event):
            if self.run_once() == 0:
                self._idle(stop_event)

    def run_once(self) -> int:
        """One pass: rebalance if due, then one batch from each held partition.

        For callers that drive the loop themselves; only ever from one thread at a time.

        Returns:
            The number of entries handled or skipped (0: nothing to do, or the worker
            was stopped: after :meth:`stop` it takes no partition again).

        Raises:
            ConfigurationError, StoreRefused: as for :meth:`run`.
        """
        retaking = _taker(self._guard)  # (as in run)
        passing = False
        try:
            with self._guard:
                if self._stopping.is_set():
                    return 0  # stopped for good: its leases were released, none is taken
                self._passing = passing = True
            now = self._step()
            if now >= self._next_balance:
                # A P that disagrees raises before the next balance is scheduled, so
                # calling run_once again checks again rather than idling for a
                # rebalance_interval.
                agreed = self._agreed or self._agree()
                self._next_balance = now + self.rebalance_interval
                if agreed:
                    self._balance()
            return self._consume()
        finally:
            if passing:
                self._busy_since = None  # between passes: nothing of ours can hang
                (_,) = retaking
                try:
                    self._passing = False
                    if self._stopping.is_set() and not self._running:
                        # stop() came during this pass (another thread, a signal
                        # handler, the handler itself) and left the give-back to us;
                        # run() does its own when its loop ends.
                        self._shutdown()
                finally:
                    self._guard.release()

    def _step(self) -> float:
        """Mark the start of a step (a pass, a handler call, the acknowledgement after
        it): progress, which keeps the leases extended for another handler_timeout."""
        now = monotonic()
        self._busy_since = now
        return now

    def _current_step(self) -> float | None:
        """When the current step began (None: between passes); for the watchdogs."""
        return self._busy_since

    def stop(self) -> None:
        """Stop for good; callable from any thread, a signal handler or the handler.

        Returns at once. A running ``run`` returns after the current batch, and a running
        ``run_once`` at the end of its pass, each releasing every lease then, in its own
        thread; with neither running, ``stop`` releases them now. ``run_once`` then does
        nothing (returns 0), and takes no partition again."""
        self._stopping.set()
        with self._guard:
            if not (self._running or self._passing):
                self._shutdown()

    def __repr__(self) -> str:
        # No client: its URL may carry a password.
        return (
            f"<StreamWorker {self.consumer_name!r} group={self.group!r} "
            f"stream_prefix={self.stream_prefix!r} partitions={self.partitions} "
            f"holds {sorted(self._held)}>"
        )

    def _remade_from(self) -> tuple[str, str]:
        return (
            "a tenure.Client and a redis client made there, with the same arguments (a "
            "consumer_name of its own)",
            "the URLs rather than the worker",
        )

    # -- loop --------------------------------------------------------------------------

    def _stop_requested(self, stop_event: StopSignal | None) -> bool:
        return self._stopping.is_set() or (stop_event is not None and stop_event.is_set())

    def _idle(self, stop_event: StopSignal | None) -> None:
        # Wait on the caller's event when there is one, so that setting it wakes us at
        # once; stop() is seen after at most one poll interval.
        if stop_event is not None:
            stop_event.wait(self.poll_interval)
        else:
            self._stopping.wait(self.poll_interval)

    def _shutdown(self) -> None:
        for number in list(self._held):
            self._release(number)
        try:
            _call(
                self.client,
                _HEARTBEAT,
                [_registry_key(self.stream_prefix, self.group)],
                [self.consumer_name, 0],
            )
        except _FAILURES as exc:
            # Harmless: the entry expires after heartbeat_ttl. Not raised even if lasting:
            # shutting down, maybe for another error.
            _log.warning(
                "tenure: worker %r could not leave the registry: %s",
                self.consumer_name,
                _store_error(
                    exc,
                    self.client,
                    "StreamWorker",
                    "leave the registry",
                    _registry_key(self.stream_prefix, self.group),
                ),
            )

    # -- ownership ---------------------------------------------------------------------

    def _agree(self) -> bool:
        """Check P against the streams' record before taking any partition; False: the
        Redis failed the check, logged, and tried again at the next balance.

        A worker started while its Redis restarts waits for it, as a running worker
        rides out the same outage (a failed heartbeat is retried at the next balance
        too); a refusal no wait ends, and a P other than the recorded one, are raised.
        """
        try:
            _agree_on_partitions(self.client, self.stream_prefix, self.partitions, "this worker")
        except StoreError as error:
            if isinstance(error, StoreRefused) and error.lasting:
                raise
            _log.warning(
                "tenure: worker %r cannot check the partition count yet: %s",
                self.consumer_name,
                error,
            )
            return False
        self._agreed = True
        return True

    def _balance(self) -> None:
        """Heartbeat, then release or take partitions to match this worker's share."""
        self._drop_lost()
        try:
            live = self._heartbeat()
        except _FAILURES as exc:
            error = self._failed(exc, "heartbeat", _registry_key(self.stream_prefix, self.group))
            _log.warning("tenure: worker %r heartbeat failed: %s", self.consumer_name, error)
            return  # keep what we hold; take nothing on a view we could not refresh
        target = fair_share(self.partitions, live, self.consumer_name)
        extra = len(self._held) - target
        for number in sorted(self._held, reverse=True)[: max(extra, 0)]:
            self._release(number)
        if extra < 0:
            self._take_up_to(target)

    def _heartbeat(self) -> list[str]:
        ttl_ms = max(1, int(self.heartbeat_ttl * 1000))
        reply = _call(
            self.client,
            _HEARTBEAT,
            [_registry_key(self.stream_prefix, self.group)],
            [self.consumer_name, ttl_ms],
        )
        return [_text(name) for name in reply]

    def _take_up_to(self, target: int) -> None:
        free = [p for p in range(self.partitions) if p not in self._held]
        self._rng.shuffle(free)  # competing workers start at different partitions
        for number in free:
            if self._stopping.is_set() or len(self._held) >= target:
                return
            if not self._try_take(number):
                return

    def _try_take(self, number: int) -> bool:
        """Acquire ``number``'s lease and fence its stream; False: stop trying for now."""
        name = partition_lock_name(self.stream_prefix, number, self.group)
        try:
            lease = self.lock_client.acquire(name, self.lease_ttl, blocking=False)
            try:
                # This worker's watchdog policy: it stops extending when a step hangs.
                lease._keep_alive(self._keep)
            except BaseException:
                _quiet_release(lease)
                raise
        except LockTimeout:
            return True  # another worker has it: try the next one
        except ConfigurationError:
            raise  # a TTL the lock client refuses, an ACL: no retry will fix it
        except TenureError as exc:  # no quorum, ACL...: no partition is to be had now
            _log.warning("tenure: worker %r cannot acquire %r: %r", self.consumer_name, name, exc)
            return False
        try:
            taken = self._fence_stream(number, lease.fencing_token)
        except _FAILURES as exc:
            _quiet_release(lease)
            error = self._failed(exc, "take", partition_stream(self.stream_prefix, number))
            _log.warning(
                "tenure: worker %r cannot take stream %d: %s", self.consumer_name, number, error
            )
            return False
        except BaseException:
            # Not held yet, so ``stop`` would not release it: its watchdog would keep
            # the partition from every other worker for as long as this process lives.
            _quiet_release(lease)
            raise
        if not taken:  # a newer lease took the stream already: ours is superseded
            self.stats.fenced += 1
            _quiet_release(lease)
            return True
        self._held[number] = _Held(number, lease)
        self.stats.taken += 1
        return True

    def _fence_stream(self, number: int, token: int) -> bool:
        reply = _call(self.client, _TAKE, self._keys(number), [token, self.group])
        return int(reply) == 1

    def _keys(self, number: int) -> list[str]:
        """The keys of the fenced stream scripts: the stream, then its owner key."""
        return [
            partition_stream(self.stream_prefix, number),
            _owner_key(self.stream_prefix, number, self.group),
        ]

    def _release(self, number: int) -> None:
        held = self._held.pop(number, None)
        if held is None:  # released already
            return
        self.stats.released += 1
        _quiet_release(held.lease)

    def _drop(self, held: _Held, *, fenced: bool) -> None:
        """Give up a partition whose lease can no longer be trusted."""
        if self._held.get(held.number) is not held:
            return
        del self._held[held.number]
        if fenced:
            self.stats.fenced += 1
        else:
            self.stats.lost += 1
        _log.info(
            "tenure: worker %r dropped partition %d (%s)",
            self.consumer_name,
            held.number,
            "token refused" if fenced else _loss_of(held.lease),
        )
        _quiet_release(held.lease)

    def _drop_lost(self) -> None:
        for held in list(self._held.values()):
            if held.lease.lost.is_set() or not held.lease.valid:
                self._drop(held, fenced=False)

    # -- consuming ---------------------------------------------------------------------

    def _consume(self) -> int:
        self._drop_lost()
        now = monotonic()
        ready = [h for h in self._held.values() if h.resume_at <= now]
        if not ready:
            return 0
        try:
            replies = self._read(ready)
        except _FAILURES as exc:
            # The scripts may have run with their replies lost (a timeout), leaving
            # entries delivered to us that we never saw: claim our pending lists again,
            # so they come before anything newer (as after a failed acknowledgement).
            streams = " ".join(partition_stream(self.stream_prefix, h.number) for h in ready)
            error = self._failed(exc, "read", streams)
            for held in ready:
                self._rewind(held, error)
            return 0
        return sum(self._on_reply(held, reply) for held, reply in zip(ready, replies, strict=True))

    def _read(self, ready: Sequence[_Held]) -> list[Any]:
        """One batch from each partition in ``ready``, in one round trip."""
        with self.client.pipeline(transaction=False) as pipe:
            for held in ready:
                keys = self._keys(held.number)
                args: list[str | int] = [
                    held.token,
                    self.group,
                    self.consumer_name,
                    self.batch_size,
                    held.cursor,
                ]
                pipe.eval(_READ, len(keys), *keys, *args)
            return pipe.execute(raise_on_error=False)

    def _on_reply(self, held: _Held, reply: Any) -> int:
        if isinstance(reply, redis.RedisError):
            error = self._failed(reply, "read", partition_stream(self.stream_prefix, held.number))
            if isinstance(reply, redis.ResponseError):
                # NOGROUP (the stream or group was deleted) and the like: give the
                # partition back; whoever takes it next recreates the group.
                _log.warning(
                    "tenure: worker %r partition %d: %s", self.consumer_name, held.number, error
                )
                self._release(held.number)
            else:
                self._rewind(held, error)
            return 0
        if isinstance(reply, Exception):
            self._rewind(held, reply)
            return 0
        kind = _text(reply[0])
        if kind == "stale":
            self._drop(held, fenced=True)
            return 0
        entries, skipped = reply[2], int(reply[3])
        self.stats.skipped += skipped
        if kind == "claim":
            self.stats.claimed += len(entries)
            next_cursor = _text(reply[1])
            held.cursor = _NO_CURSOR if next_cursor == _CLAIM_FROM_START else next_cursor
        return self._process(held, entries) + skipped

    def _process(self, held: _Held, entries: Sequence[Any]) -> int:
        """Hand ``entries`` to the handler in order, then acknowledge those handled."""
        done: list[str] = []
        for raw_id, raw_fields in entries:
            entry_id = _text(raw_id)
            parsed = _parse_fields(raw_fields)
            if parsed is None:
                _log.warning(
                    "tenure: entry %s has no usable %s field (missing, or not UTF-8 text); skipped",
                    entry_id,
                    KEY_FIELD,
                )
                self.stats.skipped += 1
                done.append(entry_id)
                continue
            try:
                # The last moment to notice a lost lease before writing.
                held.lease.check()
                self._step()
                self.handler(parsed[0], parsed[1], held.token)
            except (LeaseLost, NotHeld):
                # No acknowledgement either: after a loss this worker writes nothing, and
                # the next owner handles the rest (the handled ones again, idempotently).
                # NotHeld: released under us, the same.
                self._drop(held, fenced=False)
                return len(done)
            except StaleToken:
                self._drop(held, fenced=True)
                return len(done)
            except Exception as exc:
                self.stats.failed += 1
                _log.exception("tenure: handler failed on %s (key %r)", entry_id, parsed[0])
                if self._still_held(held):
                    self._ack(held, done)
                    self._rewind(held, exc)
                return len(done)
            self.stats.handled += 1
            done.append(entry_id)
        if self._still_held(held):
            self._ack(held, done)
        return len(done)

    def _still_held(self, held: _Held) -> bool:
        """Whether ``held``'s lease still stands after handler calls; if not, drop it
        without acknowledging. A call that ran past handler_timeout (or a pause) may
        have outlived the lease; its batch is the next owner's, delivered again. (The
        acknowledgement is fenced as well, for a loss after this check.)"""
        self._step()
        try:
            held.lease.check()
        except (LeaseLost, NotHeld):
            self._drop(held, fenced=False)
            return False
        return True

    def _ack(self, held: _Held, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        keys = self._keys(held.number)
        try:
            acked = int(_call(self.client, _ACK, keys, [held.token, self.group, *entry_ids]))
        except _FAILURES as exc:
            # Maybe acknowledged, maybe not: claim our pending list again, which delivers
            # the unacknowledged ones again, in order.
            self._rewind(held, self._failed(exc, "acknowledge", keys[0]))
            return
        if acked < 0:
            self._drop(held, fenced=True)

    def _failed(self, exc: _Failed, operation: str, key: str) -> StoreError:
        """The streams' Redis failed ``operation`` on ``key`` with ``exc``: the error to
        log, raised instead when no wait ends it (``StoreRefused.lasting``). Logged, such
        a refusal came back every pass, for as long as the worker ran; raised, ``run``
        releases the worker's leases and ends with it."""
        error = _store_error(exc, self.client, "StreamWorker", operation, key)
        if isinstance(error, StoreRefused) and error.lasting:
            raise error from exc
        return error

    def _rewind(self, held: _Held, error: BaseException) -> None:
        """Retry from our own pending list after ``retry_delay``: nothing newer first."""
        _log.warning(
            "tenure: worker %r partition %d rewinds after %r",
            self.consumer_name,
            held.number,
            error,
        )
        held.cursor = _CLAIM_FROM_START
        held.resume_at = monotonic() + self.retry_delay


def fair_share(partitions: int, live: Sequence[str], me: str) -> int:
    """How many partitions worker ``me`` should hold among the ``live`` workers.

    The live names sorted; each gets ``partitions // W``, and the first
    ``partitions % W`` one more, so the shares add up to ``partitions`` exactly and none
    exceeds ``ceil(partitions / W)``. ``me`` counts as live even if missing from ``live``.

    Raises:
        ConfigurationError: ``partitions`` is not an int >= 1, ``live`` no sequence of
            names, ``me`` no name.
    """
    partitions = _check_partitions(partitions)
    if not isinstance(me, str):
        raise ConfigurationError("me", f"must be a worker's name (a str), got {me!r}")
    if isinstance(live, str) or not isinstance(live, Iterable):
        raise ConfigurationError("live", f"must be a sequence of worker names, got {live!r}")
    given = list(live)  # (any iterable, read once: a generator too)
    if not all(isinstance(name, str) for name in given):
        raise ConfigurationError("live", f"must hold worker names (str) only, got {live!r}")
    names = sorted({*given, me})
    base, extra = divmod(partitions, len(names))
    return base + (1 if names.index(me) < extra else 0)


def _loss_of(lease: Lease) -> str:
    """Why ``lease`` is no longer trusted, for the log."""
    error = lease.lost_error
    if error is not None:
        return f"lease lost: {error}"
    return "lease released" if lease.released else "lease expired"


def _quiet_release(lease: Lease) -> None:
    """Release ``lease``; a lease already lost or released is fine here."""
    try:
        lease.release()
    except (LeaseLost, NotHeld):
        pass
    except TenureError as exc:  # nodes unreachable: the lease expires by its TTL
        _log.warning("tenure: releasing %r failed: %r", lease.name, exc)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _parse_fields(raw: Sequence[Any]) -> tuple[str, dict[str, bytes]] | None:
    """``(key, payload)`` of a flat ``[field, value, ...]`` list; None without a usable
    key (no ``KEY_FIELD``, or one that is not UTF-8 text).

    Entries may come from producers other than :class:`StreamProducer`, so nothing here
    may raise: one such entry would stop every worker that reads its partition. Field
    names that are not UTF-8 are decoded with ``surrogateescape``, which loses nothing
    (``name.encode(errors="surrogateescape")`` gives the bytes back).
    """
    fields = {_lossless_text(raw[i]): _bytes(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
    key = fields.pop(KEY_FIELD, None)
    if key is None:
        return None
    try:
        # A key is a name the nodes can hold (Partitioner), so it must be UTF-8 text;
        # one that is not has no partition of its own and no key the handler can use.
        return key.decode(), fields
    except UnicodeDecodeError:
        return None


def _lossless_text(value: Any) -> str:
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)


def _call(client: redis.Redis, source: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
    # EVAL with the source, never EVALSHA: nothing to go missing after SCRIPT FLUSH or a
    # restart (docs/architecture.md, "EVALSHA where a NOSCRIPT is always answered").
    return client.eval(source, len(keys), *keys, *args)


# The scripts (src/tenure/_lua/stream_*.lua: their headers give KEYS, ARGV and replies),
# sent without their comments.
_TAKE = script("stream_take").wire.decode()
_READ = script("stream_read").wire.decode()
_ACK = script("stream_ack").wire.decode()
_HEARTBEAT = script("stream_heartbeat").wire.decode()

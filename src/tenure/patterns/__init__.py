"""The other answers to "a lease can expire under a slow holder": patterns that need no lock.

* :mod:`tenure.patterns.optimistic`: read, compute, and write only if nothing
  changed meanwhile; Redis ``WATCH``/``MULTI``/``EXEC`` (:func:`optimistic`) and
  version-checked SQL updates (:func:`versioned_update`), with a bounded, jittered
  retry loop (:func:`retry_optimistic`) and a clear :class:`ConflictError` at the bound.
* :mod:`tenure.patterns.idempotency`: a repeated request is recognised and its
  effect not applied twice; claims with a lease on Redis (:class:`RedisIdempotency`),
  or a unique key inserted in the effect's own SQL transaction (:class:`SqlIdempotency`),
  and the :func:`idempotent` decorator for request handlers.
* :mod:`tenure.patterns.streams`: single-writer streams: writes for a key go to one
  of P Redis Streams partitions (:class:`StreamProducer`), each consumed by exactly one
  worker holding a fenced tenure lease on it (:class:`StreamWorker`).

The SQL helpers need SQLAlchemy (``pip install 'tenure[sql]'``); it is imported only when
they are first called, so the Redis half needs nothing but redis-py.
"""

from .idempotency import (
    JSON,
    ClaimLost,
    Codec,
    IdempotencyStore,
    InProgress,
    NotClaimed,
    Once,
    RedisIdempotency,
    RedisOnce,
    SqlIdempotency,
    SqlOnce,
    current_claim,
    idempotency_table,
    idempotent,
)
from .optimistic import (
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
from .streams import (
    KEY_FIELD,
    Handler,
    Partitioner,
    StopSignal,
    StreamProducer,
    StreamWorker,
    WorkerStats,
    fair_share,
    partition_lock_name,
    partition_stream,
)

__all__ = [
    "JSON",
    "KEY_FIELD",
    "ClaimLost",
    "Codec",
    "ConflictError",
    "Handler",
    "IdempotencyStore",
    "InProgress",
    "NotClaimed",
    "Once",
    "OptimisticStats",
    "Partitioner",
    "Plan",
    "Reads",
    "RedisIdempotency",
    "RedisOnce",
    "RowMissing",
    "SqlIdempotency",
    "SqlOnce",
    "StaleVersion",
    "StopSignal",
    "StreamProducer",
    "StreamWorker",
    "WorkerStats",
    "aoptimistic",
    "aretry_optimistic",
    "current_claim",
    "fair_share",
    "idempotency_table",
    "idempotent",
    "optimistic",
    "partition_lock_name",
    "partition_stream",
    "retry_optimistic",
    "versioned_update",
]

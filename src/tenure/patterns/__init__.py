"""The other answers to "a lease can expire under a slow holder": patterns that need no lock.

* :mod:`tenure.patterns.optimistic` (R13): read, compute, and write only if nothing
  changed meanwhile; Redis ``WATCH``/``MULTI``/``EXEC`` (:func:`optimistic`) and
  version-checked SQL updates (:func:`versioned_update`), with a bounded, jittered
  retry loop (:func:`retry_optimistic`) and a clear :class:`ConflictError` at the bound.
* :mod:`tenure.patterns.idempotency` (R15): a repeated request is recognised and its
  effect not applied twice; claims with a lease on Redis (:class:`RedisIdempotency`),
  or a unique key inserted in the effect's own SQL transaction (:class:`SqlIdempotency`),
  and the :func:`idempotent` decorator for request handlers.

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

__all__ = [
    "JSON",
    "ClaimLost",
    "Codec",
    "ConflictError",
    "IdempotencyStore",
    "InProgress",
    "NotClaimed",
    "Once",
    "OptimisticStats",
    "Plan",
    "Reads",
    "RedisIdempotency",
    "RedisOnce",
    "RowMissing",
    "SqlIdempotency",
    "SqlOnce",
    "StaleVersion",
    "aoptimistic",
    "aretry_optimistic",
    "idempotency_table",
    "idempotent",
    "optimistic",
    "retry_optimistic",
    "versioned_update",
]

"""tenure: distributed locks on Redis that stay correct under real faults.

One node gives a single-instance lock; three or more independent masters give Redlock.
Start with ``Client`` (blocking) or ``AsyncClient`` (asyncio)::

    client = tenure.Client(["redis://127.0.0.1:6379"])
    with client.lock("orders:42", ttl=10) as lease:
        ...  # finish before lease.remaining runs out
"""

from ._async.client import AsyncClient, AsyncLease, AsyncLock
from ._core.policy import RetryPolicy, wait_random, wait_random_exponential
from ._errors import (
    AcquireError,
    ClientClosed,
    ConfigurationError,
    EventLoopConflict,
    InheritedLease,
    LeaseExpired,
    LeaseLost,
    LockError,
    LockTimeout,
    NodeMisconfigured,
    NotHeld,
    OwnershipError,
    QuorumUnreachable,
    SelfDeadlock,
    ServerUnsupported,
    StaleToken,
    StoreError,
    StoreRefused,
    StoreUnavailable,
    TenureError,
    TLSCertificateError,
)
from ._sync.client import Client, Lease, Lock

__all__ = [
    "AcquireError",
    "AsyncClient",
    "AsyncLease",
    "AsyncLock",
    "Client",
    "ClientClosed",
    "ConfigurationError",
    "EventLoopConflict",
    "InheritedLease",
    "Lease",
    "LeaseExpired",
    "LeaseLost",
    "Lock",
    "LockError",
    "LockTimeout",
    "NodeMisconfigured",
    "NotHeld",
    "OwnershipError",
    "QuorumUnreachable",
    "RetryPolicy",
    "SelfDeadlock",
    "ServerUnsupported",
    "StaleToken",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "TLSCertificateError",
    "TenureError",
    "wait_random",
    "wait_random_exponential",
]

__version__ = "0.1.0"

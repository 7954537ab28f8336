"""The public names are pinned: adding or removing one is a decision, made here."""

from __future__ import annotations

import tenure
from tenure import _errors


def test_public_names() -> None:
    assert tenure.__all__ == [
        "AcquireError",
        "AsyncClient",
        "AsyncLease",
        "AsyncLock",
        "Client",
        "ClientClosed",
        "ConfigurationError",
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
        "TLSCertificateError",
        "TenureError",
        "wait_random",
        "wait_random_exponential",
    ]
    for name in tenure.__all__:
        assert getattr(tenure, name) is not None


def test_every_error_is_exported() -> None:
    assert set(_errors.__all__) <= set(tenure.__all__)
    for name in _errors.__all__:
        assert issubclass(getattr(tenure, name), tenure.TenureError)

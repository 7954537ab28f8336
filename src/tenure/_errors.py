"""Every exception tenure raises.

::

    TenureError
    ├── ConfigurationError (ValueError)      bad parameter; names it and the accepted range
    ├── ServerUnsupported (ConfigurationError) a node refuses a command (ACL) or is too old
    ├── TLSCertificateError (ConfigurationError) a node's TLS certificate failed verification
    ├── StaleToken (RuntimeError)             a fenced store refused a write with an old token
    └── LockError
        ├── AcquireError
        │   ├── LockTimeout (TimeoutError)   waited `timeout` seconds, lock still held elsewhere
        │   └── QuorumUnreachable (ConnectionError)
        │                                    too many nodes failed for a majority to be possible
        └── OwnershipError (RuntimeError)
            ├── NotHeld                      release() of a lock object that holds no lease
            └── LeaseLost                    the lease can no longer be trusted
                └── LeaseExpired             its validity ended before the operation

Errors subclass the matching built-in so that ``except TimeoutError`` and friends keep
working, and carry their context as fields: which lock, and what each node said
(``node_errors``: node name -> message). Redis exceptions never escape raw; the driver
translates them. ``CancelledError`` and ``KeyboardInterrupt`` are never caught or wrapped.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "AcquireError",
    "ConfigurationError",
    "LeaseExpired",
    "LeaseLost",
    "LockError",
    "LockTimeout",
    "NotHeld",
    "OwnershipError",
    "QuorumUnreachable",
    "ServerUnsupported",
    "StaleToken",
    "TLSCertificateError",
    "TenureError",
]


class TenureError(Exception):
    """Base class of every error raised by tenure."""


class ConfigurationError(TenureError, ValueError):
    """A parameter is out of range or malformed.

    Attributes:
        parameter: the name of the offending parameter, as the caller spelled it.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


class ServerUnsupported(ConfigurationError):
    """A node refused a command tenure needs (ACL), or its version is too old."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"node {node}", message)
        self.node = node


class TLSCertificateError(ConfigurationError):
    """A node's TLS certificate failed verification: it does not match the node's host
    name, or no CA we trust signed it. Retrying cannot help; the set-up must be fixed.

    Attributes:
        node: the node's name (its URL without credentials).
    """

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"node {node}", message)
        self.node = node


class StaleToken(TenureError, RuntimeError):
    """A fenced store refused a write: its fencing token is older than the highest it has seen.

    The writer's lease was superseded (it expired, or its holder paused past it, and
    another holder wrote since). Nothing was written.

    Attributes:
        resource: what was being written (the fenced resource's name or key).
        token: the token the write carried.
        highest: the highest token the store had seen, when the store can tell.
    """

    def __init__(self, resource: str, token: int, highest: int | None = None) -> None:
        seen = "" if highest is None else f" (highest seen: {highest})"
        super().__init__(f"stale fencing token {token} for {resource!r}{seen}; nothing written")
        self.resource = resource
        self.token = token
        self.highest = highest


class LockError(TenureError):
    """Base class of errors about a particular lock.

    Attributes:
        name: the lock's resource name.
        node_errors: per-node failure messages collected while the error arose.
    """

    def __init__(
        self, name: str, message: str, node_errors: Mapping[str, str] | None = None
    ) -> None:
        detail = ""
        if node_errors:
            detail = " [" + "; ".join(f"{n}: {e}" for n, e in sorted(node_errors.items())) + "]"
        super().__init__(f"lock {name!r}: {message}{detail}")
        self.name = name
        self.node_errors: dict[str, str] = dict(node_errors or {})


class AcquireError(LockError):
    """The lock could not be acquired."""


class LockTimeout(AcquireError, TimeoutError):
    """A blocking acquire gave up after its timeout; another client holds the lock."""


class QuorumUnreachable(AcquireError, ConnectionError):
    """So many nodes failed (refused connection, timed out, errored) that no majority is possible.

    Raised at once rather than retried: waiting would not help until nodes come back.
    """


class OwnershipError(LockError, RuntimeError):
    """An operation needs a lease the caller does not (or no longer) hold."""


class NotHeld(OwnershipError):
    """``release()`` was called on a lock object that holds no lease."""


class LeaseLost(OwnershipError):
    """The lease can no longer be trusted: another client may hold the lock now."""


class LeaseExpired(LeaseLost):
    """The lease's validity deadline passed before the operation (extend, release)."""

"""Every exception tenure raises.

The classes of the lock client live here and are exported by ``tenure``; those of the
optional parts live beside the code that raises them (the module is named on the right)
and are exported by it. All of them are drawn in this one tree (a unit test checks that
no ``TenureError`` subclass anywhere in the package is missing from it)::

    TenureError
    ├── ConfigurationError (ValueError)      bad parameter; names it and the accepted range
    │   └── NodeMisconfigured                a node's setup, not an outage, stops locking on
    │       │                                it: read-only replica, wrong password, not Redis
    │       ├── ServerUnsupported            a node refuses a command (ACL) or is too old
    │       └── TLSCertificateError          a node's TLS certificate failed verification
    ├── StaleToken (RuntimeError)            a fenced store refused a write with an old token
    ├── StoreError                           a store's or pattern's own Redis failed it
    │   ├── StoreUnavailable (ConnectionError)
    │   │                                    not reached, or no answer in time
    │   └── StoreRefused (RuntimeError)      it answered with an error (WRONGTYPE, OOM, ...)
    ├── ClientClosed (RuntimeError)          the client was closed; it does not reconnect
    ├── EventLoopConflict (RuntimeError)     an AsyncClient used from a second event loop at
    │                                        once (another thread's loop is using it), or
    │                                        a lease's watchdog asked for outside a loop
    ├── LockError
    │   ├── AcquireError
    │   │   ├── LockTimeout (TimeoutError)   waited `timeout` seconds, lock still held elsewhere
    │   │   └── QuorumUnreachable (ConnectionError)
    │   │                                    too many nodes failed for a majority to be possible
    │   ├── SelfDeadlock (RuntimeError)      this thread/task waits for its own `with` block
    │   └── OwnershipError (RuntimeError)
    │       ├── NotHeld                      release() of a lock object that holds no lease
    │       └── LeaseLost                    the lease can no longer be trusted
    │           ├── LeaseExpired             its validity ended before the operation
    │           └── InheritedLease           used in a forked child: the lease is the parent's
    │
    │   tenure.patterns (optimistic updates, idempotency keys)
    ├── ConflictError (RuntimeError)         an optimistic update kept losing to other writes
    │   └── StaleVersion                     a version-checked UPDATE found another version
    ├── RowMissing (LookupError)             a version-checked UPDATE found no row at all
    ├── InProgress (RuntimeError)            another attempt holds the idempotency key
    ├── ClaimLost (RuntimeError)             our claim on an idempotency key ran out, taken over
    ├── NotClaimed (RuntimeError)            record/apply by an attempt that holds no claim
    │
    │   tenure.fencing.http (the fencing proxy)
    ├── UpstreamInterrupted (ConnectionError)
    │                                        the upstream broke off an answer the proxy relayed
    ├── RelayTimeout (TimeoutError)          the proxy's client did not take an answer in time
    │
    │   tenure.testing (local test servers)
    ├── LocalNodeError (RuntimeError)        a local redis-server failed to start, pause or stop
    │   └── NodeNotAnswering                 a node it asked is down, paused or silent
    │
    │   tenure.verify (the verifier)
    ├── FaultNotObserved (TimeoutError)      the evidence of an injected fault did not appear
    └── ProxyError (RuntimeError)            the fault proxy's loop is not running or too slow

Errors subclass the matching built-in so that ``except TimeoutError`` and friends keep
working, and carry their context as fields: which lock, and what each node said
(``node_errors``: node name -> message). Redis exceptions never escape raw: the lock
client's driver translates them, and the fenced stores and the patterns, which run on a
redis-py client the application gives them, raise a ``StoreError`` for each
(``_driver.store_errors``), with the redis-py error as its ``__cause__``.
``CancelledError`` and ``KeyboardInterrupt`` are never caught or wrapped.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

__all__ = [
    "AcquireError",
    "ClientClosed",
    "ConfigurationError",
    "EventLoopConflict",
    "InheritedLease",
    "LeaseExpired",
    "LeaseLost",
    "LockError",
    "LockTimeout",
    "NodeMisconfigured",
    "NotHeld",
    "OwnershipError",
    "QuorumUnreachable",
    "SelfDeadlock",
    "ServerUnsupported",
    "StaleToken",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "TLSCertificateError",
    "TenureError",
]


class TenureError(Exception):
    """Base class of every error raised by tenure."""

    def __reduce__(self) -> tuple[Any, ...]:
        # An error crosses processes by pickle (a process pool's worker that met a
        # LockTimeout) and is copied the same way. Exception's own reduction calls
        # ``cls(*self.args)``, but ``args`` here holds the message only, not what the
        # ``__init__`` takes: unpickling raised TypeError, and a ProcessPoolExecutor
        # broke for good. Rebuilt without ``__init__``, from the message and the
        # attributes; one that cannot cross (a SelfDeadlock's holder) goes as its repr.
        state = {}
        for key, value in self.__dict__.items():
            try:
                pickle.dumps(value)
            except Exception:
                value = repr(value)
            state[key] = value
        return (_rebuilt, (type(self), self.args, state))

    def __copy__(self) -> TenureError:
        # Within the process every attribute can stay what it is (a SelfDeadlock's
        # holder the lease itself, not its repr as a pickle must make it).
        return _rebuilt(type(self), self.args, dict(self.__dict__))


def _rebuilt(cls: type[TenureError], args: tuple[Any, ...], state: dict[str, Any]) -> TenureError:
    """A pickled tenure error, made again (``TenureError.__reduce__``)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigurationError(TenureError, ValueError):
    """A parameter is out of range or malformed.

    Attributes:
        parameter: the name of the offending parameter, as the caller spelled it.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


class NodeMisconfigured(ConfigurationError):
    """A node answers, but its setup keeps tenure from locking on it; waiting will not help.

    A read-only replica listed instead of its master, a wrong or missing password, an ACL
    user without a permission tenure needs, a server that does not speak the Redis
    protocol at that address. Raised when such nodes leave too few others for a majority
    (otherwise the lock goes on with the others, and each such node is logged once as a
    warning on the ``tenure`` logger).

    Attributes:
        node: the node, as displayed (its URL without credentials).
        problem: what is wrong with it and how to fix it.
        node_errors: what every node that failed said (node name -> message).
    """

    # What joins the node's name to ``problem`` in the message.
    _after_name = " "

    def __init__(
        self,
        node: str,
        problem: str,
        node_errors: Mapping[str, str] | None = None,
        *,
        parameter: str | None = None,
    ) -> None:
        others = {n: e for n, e in (node_errors or {}).items() if n != node}
        detail = ""
        if others:
            detail = " [also " + "; ".join(f"{n}: {e}" for n, e in sorted(others.items())) + "]"
        # Not ConfigurationError.__init__: "node X is a read-only replica", not "node X: ...".
        Exception.__init__(self, f"node {node}{self._after_name}{problem}{detail}")
        self.parameter = parameter or f"node {node}"
        self.node = node
        self.problem = problem
        self.node_errors: dict[str, str] = dict(node_errors or {})


class ServerUnsupported(NodeMisconfigured):
    """A node refused a command tenure needs (ACL), or its version is too old."""


class TLSCertificateError(NodeMisconfigured):
    """A node's TLS certificate failed verification: it does not match the host in the
    node's URL, no CA the client trusts signed it, or it has expired. Retrying cannot
    help; the certificate, the URL or ``ssl_ca_certs`` must be fixed.

    The message reads "node rediss://host:port: its TLS certificate ...", then the fix.
    """

    _after_name = ": "


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


class StoreError(TenureError):
    """A fenced store or a pattern could not do its work on its own Redis (the redis-py
    client the application gave it), which failed or refused the command.

    The redis-py error is the ``__cause__``.

    Attributes:
        store: what ran the command (``"FencedStore"``, ``"optimistic"``, ...).
        operation: the operation that failed (``"write"``, ``"read"``, ``"EXEC"``, ...).
        key: the resource, idempotency key, stream or Redis key it was about.
        server: the Redis's address as its client names it (``host:port``, a socket
            path), or ``None`` when the client does not say (a cluster client).
    """

    def __init__(
        self, store: str, operation: str, key: str, server: str | None, message: str
    ) -> None:
        at = "" if server is None else f" (Redis {server})"
        super().__init__(f"{store} {operation} of {key!r}{at}: {message}")
        self.store = store
        self.operation = operation
        self.key = key
        self.server = server


class StoreUnavailable(StoreError, ConnectionError):
    """The store's Redis could not be reached, or did not answer in time.

    Retrying later may succeed. Whether the command ran is said by ``maybe_applied``.

    Attributes:
        maybe_applied: True when a write was sent and its answer lost: it may or may not
            have been applied (the message says whether retrying it is safe); False when
            nothing was written (a read, or a failure before the write was sent).
    """

    def __init__(
        self,
        store: str,
        operation: str,
        key: str,
        server: str | None,
        said: str,
        *,
        maybe_applied: bool,
        retry: str = "",
    ) -> None:
        outcome = (
            f"the write may or may not have been applied{retry}"
            if maybe_applied
            else "nothing was written"
        )
        super().__init__(
            store,
            operation,
            key,
            server,
            f"the Redis could not be reached or did not answer ({said}); {outcome}",
        )
        self.maybe_applied = maybe_applied


class StoreRefused(StoreError, RuntimeError):
    """The store's Redis answered the command with an error (``WRONGTYPE``, ``OOM``,
    ``READONLY``, ``NOPERM``, ``MISCONF``, a script's own refusal, ...).

    Nothing was written (Redis runs none of a refused command), except where the
    operation's documentation says otherwise (a transaction whose queued writes failed
    one by one inside ``EXEC``). The message says what the reply means and what to fix
    where that is known.

    Attributes:
        reply: the Redis's error reply, as it sent it.
        lasting: True when waiting will not help, only a change will: a key of another
            type where the store keeps its data, a read-only replica, an ACL or the
            credentials; False for a state that passes (full, a failed snapshot, a busy
            script, a reply not known).
    """

    def __init__(
        self,
        store: str,
        operation: str,
        key: str,
        server: str | None,
        reply: str,
        problem: str,
        *,
        lasting: bool = False,
    ) -> None:
        super().__init__(store, operation, key, server, problem)
        self.reply = reply
        self.lasting = lasting


class ClientClosed(TenureError, RuntimeError):
    """The client was closed (``close()``, ``aclose()``, or leaving its ``with`` block).

    A closed client does not reconnect: acquiring, extending, releasing and asking
    ``locked()`` through it, or through a lock or lease it made, raise this, as does
    entering ``with client:`` (``async with``) again. Leases it still held stay on the
    nodes until their TTL runs out.

    Attributes:
        name: the lock the refused operation was about, or None.
    """

    def __init__(self, operation: str, name: str | None = None) -> None:
        about = "" if name is None else f"lock {name!r}: "
        super().__init__(
            f"{about}cannot {operation}: its client was closed and does not reconnect; "
            "use an open client (leases it held stay on the nodes until their TTL runs out)"
        )
        self.name = name


class EventLoopConflict(TenureError, RuntimeError):
    """An ``AsyncClient`` was used from an event loop while another event loop, running
    in another thread, uses it; or ``AsyncLease.keep_alive()`` (a plain method) was
    called with no event loop running.

    Its connections and tasks belong to one event loop: a client serves several loops in
    turn (one ``asyncio.run`` after another), not at once. The call is refused before
    any I/O, and the loop using the client goes on undisturbed. Make one ``AsyncClient``
    per event loop (per thread), or run the call on the loop that uses the client
    (``asyncio.run_coroutine_threadsafe``). A watchdog is a task on that loop: start it
    from a coroutine there.

    Attributes:
        name: the lock the refused operation was about, or None.
    """

    def __init__(self, operation: str, name: str | None = None, *, no_loop: bool = False) -> None:
        about = "" if name is None else f"lock {name!r}: "
        if not no_loop:
            message = (
                f"{about}cannot {operation} from this event loop: its AsyncClient is in "
                "use by an event loop running in another thread, and serves one event loop "
                "at a time (its connections belong to that loop); make one AsyncClient per "
                "event loop, or run the call on the loop that uses it "
                "(asyncio.run_coroutine_threadsafe)"
            )
        else:
            message = (
                f"{about}cannot {operation} with no event loop running: the watchdog is a "
                "task on the event loop that uses the AsyncClient; call it from a coroutine "
                "on that loop (or use the blocking tenure.Client outside asyncio)"
            )
        super().__init__(message)
        self.name = name


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


class SelfDeadlock(LockError, RuntimeError):
    """A blocking acquire of a lock by a thread (or asyncio task) inside its own ``with``
    block of that lock, through the same client: it would wait for itself until the TTL
    ran out, or forever with a watchdog. Raised at once, before any I/O; tenure locks are
    not reentrant.

    Other threads and tasks sharing the client still wait for each other as usual, and
    so does the acquirer of a lease held outside any block (it may have handed the lease
    to another thread or task, which releases it).

    Attributes:
        holder: the lease already held (a ``Lease`` or ``AsyncLease``).
    """

    def __init__(self, name: str, message: str, holder: object) -> None:
        super().__init__(name, message)
        self.holder = holder


class OwnershipError(LockError, RuntimeError):
    """An operation needs a lease the caller does not (or no longer) hold."""


class NotHeld(OwnershipError):
    """``release()`` was called on a lock object that holds no lease."""


class LeaseLost(OwnershipError):
    """The lease can no longer be trusted: another client may hold the lock now."""


class LeaseExpired(LeaseLost):
    """The lease's validity deadline passed before the operation (extend, release)."""


class InheritedLease(LeaseLost):
    """A lease used in a process forked from its holder: it belongs to the parent.

    To the child the lease is lost (the parent holds the lock), but it must not act on
    it either: extending or releasing it would act on the parent's lock, so the child
    refuses and sends nothing. The parent's lease is unaffected.

    Attributes:
        pid: the process that acquired the lease.
    """

    def __init__(self, name: str, operation: str, pid: int) -> None:
        super().__init__(
            name,
            f"cannot {operation} in this process: the lease belongs to process {pid}, which "
            "acquired it before fork(); let that process release it, or acquire the lock "
            "here with this process's own client",
        )
        self.pid = pid

"""What the sync and async leases have in common: the facts of one acquisition, the
record of its loss (a holder must learn the moment its lease is lost), who may act
on it (not a forked child, not through a closed client), and how a loss is reported when
the body of a ``with`` block raised its own exception."""

from __future__ import annotations

import inspect
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, NoReturn

from .._core.acquire import HELD_ELSEWHERE, LeaseState
from .._core.config import LockSpec
from .._errors import ConfigurationError, InheritedLease, LeaseExpired, LeaseLost, NotHeld
from .guard import Guard

if TYPE_CHECKING:
    from .client_base import ClientBase

_log = logging.getLogger("tenure")

# This process's pid, kept current in a child after fork(): os.getpid() is a system call,
# and a lease asks whose it is twice per acquire and release.
_pid = os.getpid()


# The leases a watchdog keeps alive or watches in this process (either driver's): in a
# child after fork() each is marked lost, since the lease and its watchdog (a thread,
# a task) belong to the parent and the child must not act as the holder.
_WATCHED: weakref.WeakSet[LeaseView] = weakref.WeakSet()


def watched(lease: LeaseView) -> None:
    """Note that a watchdog keeps ``lease`` alive or watches it (see ``_forked``)."""
    _WATCHED.add(lease)


# Guards a lease's loss and its list of callbacks together, for all leases: a callback
# registered by one thread while another finds the loss must be called once, not lost
# in a list already taken nor called by both; and two threads finding a loss at once
# (the watchdog, a holder's extend) must not both run the callbacks. Held for a few
# attribute reads and writes, never while a callback runs.
_LOSS_LOCK = Guard()


def _forked() -> None:
    global _pid, _LOSS_LOCK
    _pid = os.getpid()
    _LOSS_LOCK = Guard()  # another thread of the parent may have held it
    for lease in list(_WATCHED):
        # No callbacks: they belong to the parent (the ``lost`` event is still set).
        lease._mark_lost(InheritedLease(lease.name, "use the lease", lease._pid), notify=False)
    _WATCHED.clear()


os.register_at_fork(after_in_child=_forked)

__all__ = ["LeaseView", "attach_loss", "closed_under", "leave_block", "not_acquired", "watched"]


def not_acquired(blocking: bool, timeout: float | None, reason: str = HELD_ELSEWHERE) -> str:
    """Why an acquire gave up, for ``LockTimeout`` messages; ``reason``: why its last
    attempt was refused (``_core.acquire.refusal``)."""
    if not blocking:
        return f"{reason} (non-blocking attempt)"
    if reason == HELD_ELSEWHERE:
        return f"still {reason} after timeout={timeout}s"
    return f"not acquired after timeout={timeout}s: {reason}"


def closed_under(name: str) -> LeaseLost:
    """Why a kept-alive lease is lost once its client was closed."""
    return LeaseLost(
        name,
        "its client was closed, so its watchdog can no longer extend it; its keys expire "
        "by their TTL",
    )


def attach_loss(body_error: BaseException, error: BaseException, name: str) -> None:
    """Tell of ``error`` (the lease was lost, or its release failed) on the exception the
    body of a ``with`` block raised, which keeps propagating: a note on Python 3.11+, and
    a warning on the ``tenure`` logger in every version."""
    text = f"tenure: {type(error).__name__} on the lease of {name!r} meanwhile: {error}"
    add_note = getattr(body_error, "add_note", None)  # Python >= 3.11
    if add_note is not None and text not in getattr(body_error, "__notes__", ()):
        add_note(text)
    _log.warning(
        "tenure: %s on the lease of %r while its block raised %s: %s",
        type(error).__name__,
        name,
        type(body_error).__name__,
        error,
    )


def leave_block(
    name: str, lost: LeaseLost | None, exc: BaseException | None, failure: Exception | None
) -> None:
    """The end of a ``with`` block whose lease was lost (``lost``) or whose release at exit
    raised (``failure``).

    The body's exception ``exc`` wins: the caller's ``except`` clauses must keep working,
    so the loss is attached to it rather than raised in its place. A body that finished
    learns of a loss: it ran, at least in part, unprotected.
    """
    error = lost or failure
    if error is None:
        return
    if exc is None:
        raise error
    attach_loss(exc, error, name)


class LeaseView:
    """The facts of a lease. Ownership belongs to this object, not to a thread or task,
    and to the process that acquired it (a forked child may not act on it).

    Attributes:
        name: the lock's resource name.
        token: the owner token: 128 random bits, fresh for every acquisition.
    """

    def __init__(self, state: LeaseState, spec: LockSpec, client: ClientBase) -> None:
        self._state = state
        self._first_started = state.started
        self._spec = spec
        self._node_names = client.node_names
        self._released = False
        self._loss: LeaseLost | None = None
        self._callbacks: list[Callable[[LeaseLost], object]] = []
        self._pid = _pid
        self._client = client
        # The thread or task whose ``with`` block holds it, entered in the client's book
        # of holders (``_bind``); None outside a block: a lease handed to another thread
        # or task binds nobody, so its acquirer may wait for it like anyone else.
        self._owner: Hashable | None = None

    def _held_at(self, now: float) -> bool:
        """Whether the client's book should count it as held by its owner at ``now``."""
        return not self._released and self._loss is None and now < self._state.valid_until

    def _bind(self) -> None:
        """A ``with`` block run by the calling thread (task) holds it from now: a blocking
        acquire of its lock by that caller would wait for its own block (``SelfDeadlock``)."""
        if self._owner is None and not self._released and self._loss is None:
            self._owner = self._client._hold(self)

    def _enter(self) -> None:
        """A ``with`` block of the lease itself begins.

        Raises:
            NotHeld: it was released: the block would run without the lock.
        """
        if self._released:
            raise NotHeld(
                self.name,
                "this lease was already released, so a `with` block of it would run "
                "without the lock: acquire the lock again (`with client.lock(name):`)",
            )
        self._bind()

    def _unbind(self) -> None:
        """Out of the book: its block ended, or it was released or lost."""
        owner, self._owner = self._owner, None
        if owner is not None:
            self._client._unhold(owner, self)

    def _set_released(self) -> None:
        """No longer ours to use: released, or being released after a failed extend."""
        self._released = True
        self._unbind()

    def _check_usable(self, operation: str) -> None:
        """Refuse to act on the nodes from a forked child or through a closed client.

        Raises:
            InheritedLease: this process is a fork of the one that acquired the lease.
            ClientClosed: the client was closed.
        """
        if _pid != self._pid:
            raise InheritedLease(self.name, operation, self._pid)
        self._client._check_open(operation, self.name)

    @property
    def _lost(self) -> bool:
        return self._loss is not None

    @property
    def lost_error(self) -> LeaseLost | None:
        """Why the lease was lost, once it is known to be; None until then."""
        return self._loss

    def on_lost(self, callback: Callable[[LeaseLost], object]) -> None:
        """Call ``callback(error)`` once, when the lease is found lost (at once if it is).

        It runs in whichever thread or task found the loss (the watchdog's, usually), so
        it should be quick: set a flag, cancel a task, signal a process. A callback may
        release the lease itself: called by the extension or release that found the
        loss, the blocking lease's ``release()`` is made once that call let go of the
        lease (it returns at once, and raises nothing of the release's). An
        asyncio lease's callback may also be a coroutine function: its coroutine runs as
        a task of the event loop (the blocking client, with no loop to await it on, logs
        it as an error and closes it). A callback's failure is logged on the ``tenure``
        logger and stops neither the others nor the watchdog.

        Raises:
            ConfigurationError: ``callback`` is not callable (refused now: found only
                at the loss, it would be one more error logged when the holder most
                needs to hear of it).
        """
        if not callable(callback):
            raise ConfigurationError(
                "callback",
                f"must be a callable taking the LeaseLost error, got {callback!r}; pass the "
                "function itself (on_lost(stop), not on_lost(stop()))",
            )
        with _LOSS_LOCK:
            loss = self._loss
            if loss is None:
                self._callbacks.append(callback)
        if loss is not None:
            self._call_back(callback, loss)

    def check(self) -> float:
        """Seconds of validity left; raises if the lease can no longer be trusted.

        Call it before each step of a critical section that must not run unprotected.

        Raises:
            LeaseLost: it was found lost (extension failed, a node lost it, it expired).
            LeaseExpired: its validity deadline has passed.
            NotHeld: it was released (its keys are gone: it protects nothing any more).
            InheritedLease: this process is a fork of its holder (the lease is the parent's).
        """
        if _pid != self._pid:
            raise InheritedLease(self.name, "use the lease", self._pid)
        if self._loss is not None:
            raise self._loss
        if self._released:
            raise NotHeld(self.name, "this lease was released: it protects nothing any more")
        left = self._state.valid_until - time.monotonic()
        if left <= 0:
            raise LeaseExpired(self.name, f"its validity ended {-left:.3f}s ago")
        return left

    def _mark_lost(self, error: LeaseLost, *, notify: bool = True) -> None:
        """Record the loss (the first reason wins) and tell whoever asked to know.

        ``notify=False`` runs no callbacks: in a child right after ``fork()`` they belong
        to the parent and must not act from the child (the ``lost`` event is still set).
        """
        with _LOSS_LOCK:
            if self._loss is not None:
                return
            self._loss = error
            callbacks, self._callbacks = self._callbacks, []
        self._signal_lost()
        if not notify:
            return  # a child after fork: its client's book starts empty anyway
        self._unbind()
        for callback in callbacks:
            self._call_back(callback, error)

    def _call_back(self, callback: Callable[[LeaseLost], object], error: LeaseLost) -> None:
        """Run one ``on_lost`` callback; what it returns goes to ``_await_callback``."""
        try:
            result = callback(error)
        except Exception:  # a failing callback must not stop the others, nor the watchdog
            _log.exception("tenure: on_lost callback for %r failed", self.name)
            return
        if inspect.isawaitable(result):
            self._await_callback(callback, result)

    def _await_callback(self, callback: object, result: Awaitable[object]) -> None:
        """An ``on_lost`` callback returned an awaitable (a coroutine function, say).

        The blocking lease has no event loop to await it on. Dropped unawaited, the
        callback would never run and nothing would say so but a "never awaited" warning
        at garbage collection: it is closed, and the mistake logged where the loss is.
        The asyncio lease runs it as a task instead."""
        close = getattr(result, "close", None)
        if close is not None:
            close()
        _log.error(
            "tenure: on_lost callback %r for %r returned an awaitable, which the blocking "
            "client does not await (it calls callbacks in the thread that found the loss): "
            "give it a plain function, or use an AsyncClient",
            callback,
            self.name,
        )

    def keep_alive(self, *, max_hold: float | None = None) -> None:
        """Start a watchdog that extends the lease (each driver's own)."""
        raise NotImplementedError

    def _signal_lost(self) -> None:
        """Set the driver's ``lost`` event (a ``threading.Event`` or an ``asyncio.Event``)."""

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def token(self) -> str:
        return self._state.token

    @property
    def fencing_token(self) -> int:
        """Strictly increases in the order leases of this lock are granted.

        Send it with every write to a fenced store (``tenure.fencing``), which rejects a
        write whose token is older than one it has seen.
        """
        return self._state.fencing_token

    @property
    def key(self) -> str:
        """The Redis key that holds the token on each node."""
        return self._state.key

    @property
    def ttl(self) -> float:
        """The TTL (seconds) of the latest acquisition or extension."""
        return self._state.ttl

    @property
    def acquired_at(self) -> float:
        """``time.monotonic()`` instant the round that granted (or last extended) it began."""
        return self._state.started

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` instant at which the lease stops being trustworthy."""
        return self._state.valid_until

    @property
    def remaining(self) -> float:
        """Seconds of validity left (negative once expired); what the critical section may use."""
        return self._state.valid_until - time.monotonic()

    @property
    def valid(self) -> bool:
        """True while not released, not lost, and before ``valid_until``; always False in
        a process forked from the holder (the lease is the parent's)."""
        return (
            not (self._released or self._lost)
            and time.monotonic() < self._state.valid_until
            and _pid == self._pid
        )

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes whose grant made (or last extended) this lease."""
        return tuple(self._node_names[i] for i in sorted(self._state.granted))

    @property
    def released(self) -> bool:
        return self._released

    # One lease, one object: a copy (of a structure holding it, say) is the lease itself.
    # A second object of it kept its own "released", and releasing both told a valid
    # lease lost. It does not leave its process: ``fencing_token`` and ``name`` do.
    def __copy__(self) -> LeaseView:
        return self

    def __deepcopy__(self, memo: object) -> LeaseView:
        return self

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"a lease of {self.name!r} belongs to its client's process and cannot be "
            "pickled; send its fencing_token (and name) instead"
        )

    def __repr__(self) -> str:
        status = (
            f"inherited from process {self._pid}"
            if _pid != self._pid
            else "released"
            if self._released
            else "lost"
            if self._lost
            else (f"valid {self.remaining:.3f}s" if self.valid else "expired")
        )
        return f"<{type(self).__name__} {self.name!r} {status} nodes={list(self.nodes)}>"

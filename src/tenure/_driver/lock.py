"""What the sync and async lock objects share: their settings, the one lease they hold,
and what may be released."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Generic, TypeVar

from .._core.acquire import HELD_ELSEWHERE, Refused
from .._core.config import LockSpec, check_acquire_args
from .._core.watchdog import KeepAlive
from .._errors import LockTimeout, NotHeld
from .lease import LeaseView, not_acquired

if TYPE_CHECKING:
    from .client_base import ClientBase

__all__ = ["LockView"]

L = TypeVar("L", bound=LeaseView)


class LockView(Generic[L]):
    """A lock object's state: its spec, how ``with`` acquires it, and its lease (at most
    one at a time; any thread or task may release it)."""

    def __init__(
        self,
        client: ClientBase,
        spec: LockSpec,
        blocking: bool,
        timeout: float | None,
        keep_alive: KeepAlive | None = None,
    ) -> None:
        check_acquire_args(blocking, timeout)
        self._spec = spec
        self._blocking = blocking
        self._timeout = timeout
        self._keep_alive = keep_alive
        self._lease: L | None = None
        # Why the latest acquire through this object was refused, for ``with``'s error.
        self._refused = Refused(HELD_ELSEWHERE)
        self._guard = threading.Lock()  # only ever held for an update of ``_lease``

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def lease(self) -> L | None:
        """The lease this object holds, or None."""
        return self._lease

    def _took(self, lease: L | Refused) -> bool:
        """Hold what an acquire returned (kept alive if the lock asks); False if refused."""
        if isinstance(lease, Refused):
            self._refused = lease
            return False
        if self._keep_alive is not None:
            lease.keep_alive(max_hold=self._keep_alive.max_hold)
        with self._guard:
            self._lease = lease
        return True

    def _entered(self, took: bool) -> L:
        """The lease ``with lock:`` gives its body, or ``LockTimeout``."""
        if not took:
            reason = self._refused.reason
            raise LockTimeout(self.name, not_acquired(self._blocking, self._timeout, reason))
        lease = self._lease
        assert lease is not None
        return lease

    def _to_release(self) -> L:
        """Give up the lease for ``release()``, refusing before anything is sent.

        Raises:
            NotHeld: this object holds no lease.
            InheritedLease, ClientClosed: as ``LeaseView._check_usable`` (the lease is kept).
        """
        with self._guard:
            lease = self._lease
            if lease is None:
                raise NotHeld(self.name, "release() of a lock this object does not hold")
            lease._check_usable("release")
            self._lease = None
        return lease

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} held={self._lease is not None}>"

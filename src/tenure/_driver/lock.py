"""What the sync and async lock objects share: their settings, the one lease they hold,
and what may be released."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar

from .._core.acquire import Refused
from .._core.config import LockSpec, check_acquire_args
from .._core.watchdog import KeepAlive
from .._errors import NotHeld
from .guard import Guard
from .lease import LeaseView

if TYPE_CHECKING:
    from .client_base import ClientBase

__all__ = ["LockView"]

L = TypeVar("L", bound=LeaseView)
X = TypeVar("X")


class LockView(Generic[L, X]):
    """A lock object's state: its spec, how ``with`` acquires it, its lease (at most one
    at a time; any thread or task may release it), and its ``with`` blocks.

    One object may be shared by threads (tasks), as a ``threading.Lock`` is, each
    entering ``with lock:`` in turn. A block's lease may run out while its body still
    runs, and another thread then acquires the lock through the same object: the object
    holds that thread's lease from then on. So each block keeps the lease it entered
    with (and ``X``, what else the driver needs of the block), filed under the thread
    (task) that entered it, and leaving the block releases that lease, never the one
    the object holds by then; unless the body released it and acquired the lock again
    through the object, in its own thread (task): that lease is the block's then.
    """

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
        self._caller = client._owner  # the calling thread (task): the object, not an id
        self._refused = client._refused
        self._lease: L | None = None
        self._taker: object = None  # the thread (task) whose acquire ``_lease`` is
        # The blocks open now, per thread (task) that entered them: a stack, innermost
        # last (nested blocks of one object in one thread: non-blocking ones).
        self._blocks: dict[object, list[tuple[L, X]]] = {}
        self._guard = Guard()  # held for an update of ``_lease`` or ``_blocks``

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def lease(self) -> L | None:
        """The lease this object holds, or None."""
        return self._lease

    def _took(self, got: L | Refused) -> bool:
        """Hold what an acquire returned (kept alive if the lock asks); False if refused."""
        if isinstance(got, Refused):
            return False
        if self._keep_alive is not None:
            got.keep_alive(max_hold=self._keep_alive.max_hold)
        taker = self._caller()
        with self._guard:
            self._lease, self._taker = got, taker
        return True

    def _entered(self, got: L | Refused) -> L:
        """The lease ``with lock:`` gives its body (the one its own acquire returned, not
        whatever the object holds by now), or ``LockTimeout``."""
        if not self._took(got):
            assert isinstance(got, Refused)
            raise self._refused(self.name, self._blocking, self._timeout, got.reason)
        assert not isinstance(got, Refused)
        return got

    def _open(self, lease: L, extra: X) -> None:
        """File the lease of a block the calling thread (task) entered (its last step)."""
        caller = self._caller()
        with self._guard:
            self._blocks.setdefault(caller, []).append((lease, extra))

    def _close(self) -> tuple[L | None, X | None]:
        """The lease (and extra) of the innermost block the calling thread (task)
        entered, taken off; the object no longer holds it.

        The lease acquired through the object in the body, in this thread (task), after
        it released the block's own: the block's now. A block left in another thread or
        task than it entered (a generator resumed elsewhere can be) is not found: then
        the object's lease, and the entry of whichever block entered with it goes too.
        """
        caller = self._caller()
        lease: L | None
        extra: X | None
        with self._guard:
            blocks = self._blocks
            entries = blocks.get(caller)
            if entries:
                lease, extra = entries.pop()
                if not entries:
                    del blocks[caller]
            else:
                lease, extra = self._lease, None
                if lease is not None:
                    self._drop_entry(lease)
            current = self._lease
            if (
                lease is not None
                and lease.released
                and current is not None
                and current is not lease
                and self._taker is caller
            ):
                lease = current
            if lease is not None and self._lease is lease:
                self._lease = None
        return lease, extra

    def _drop_entry(self, lease: L) -> None:
        """Take off the entry of the block that entered with ``lease`` (under the guard)."""
        for caller, entries in list(self._blocks.items()):
            for i, (held, _) in enumerate(entries):
                if held is lease:
                    del entries[i]
                    if not entries:
                        del self._blocks[caller]
                    return

    def _drop_block(self, lease: L) -> None:
        """The object no longer holds ``lease``, if it still does, and no block entered
        with it (one filed just as an interrupt came, which ended its ``with``)."""
        with self._guard:
            if self._lease is lease:
                self._lease = None
            self._drop_entry(lease)

    def _to_release(self) -> L:
        """The lease ``release()`` releases, refusing before anything is sent.

        The object keeps it until its release is under way (``_released``): given up
        here, a release interrupted (Ctrl-C, a cancellation) before it began left the
        lease with nobody, neither released nor releasable again.

        Raises:
            NotHeld: this object holds no lease.
            InheritedLease, ClientClosed: as ``LeaseView._check_usable`` (the lease is kept).
        """
        with self._guard:
            lease = self._lease
            if lease is None:
                raise NotHeld(self.name, "release() of a lock this object does not hold")
            lease._check_usable("release")
        return lease

    def _released(self, lease: L) -> None:
        """After ``release()`` of ``lease``: the object no longer holds it once its
        release is under way (it is marked released as the release begins)."""
        if lease.released:
            with self._guard:
                if self._lease is lease:
                    self._lease = None

    # One lock object, shared as a ``threading.Lock`` is: a copy is the object itself
    # (a second object would hold a lease of its own). It does not leave its process.
    def __copy__(self) -> LockView[L, X]:
        return self

    def __deepcopy__(self, memo: object) -> LockView[L, X]:
        return self

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"a lock object of {self.name!r} belongs to its client's process and cannot be "
            "pickled; send its name and make the lock from a client there"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} held={self._lease is not None}>"

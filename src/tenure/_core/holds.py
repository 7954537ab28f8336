"""Which ``with`` blocks hold what through one client, so that a caller never waits for
its own block.

A blocking acquire of a lock by a thread (blocking client) or asyncio task that is
inside its own ``with`` block of that lock, through the same client, cannot succeed
until the block ends, and the block cannot end while the acquire waits: it would wait
until the TTL ran out, or forever with a watchdog. Such an acquire is refused at once
(``SelfDeadlock``). Other threads and tasks sharing the client are other owners: they
wait for each other as usual, because that is mutual exclusion, not a deadlock.

Only a block binds a lease to a caller (its body runs there, and its end releases the
lease there). A lease held outside a block belongs to the object, which any thread or
task may be handed and release, as a ``threading.Lock`` is released by another thread:
its acquirer waiting for it is ordinary waiting, so it is not in the book.

A non-blocking attempt is let through: it never waits, and it answers "held" as
``threading.Lock.acquire(blocking=False)`` does for a lock its caller holds, saying
that its caller's own block holds it (``own_block``), not another client.

The owner is whatever the driver says identifies the caller (a ``threading.Thread``, an
``asyncio.Task``): this module only compares owners. It is not thread-safe; the client
serialises calls. Leases leave the book when their block ends or they are released or
lost; one that simply ran out (no watchdog, never released) stops counting at its
validity deadline and is swept later, so the book never vouches for a lease the nodes no
longer keep.

Kept in one place so that reentrant locks, if they come, can be decided here too.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from .._errors import SelfDeadlock

__all__ = ["Held", "Holds", "own_block", "self_deadlock"]

_SWEEP_MIN = 64  # entries before the first sweep of leases that ran out unreleased


class Held(Protocol):
    """What the book needs of a lease."""

    @property
    def name(self) -> str: ...

    def _held_at(self, now: float) -> bool:
        """Not released, not lost, and still within its validity at ``now``."""
        ...


class Holds:
    """The leases each owner holds, by lock name."""

    def __init__(self) -> None:
        self._book: dict[tuple[str, Hashable], list[Held]] = {}
        self._sweep_at = _SWEEP_MIN

    def __len__(self) -> int:
        return len(self._book)

    def add(self, owner: Hashable, lease: Held, now: float) -> None:
        """``owner`` was just granted ``lease``."""
        key = (lease.name, owner)
        book = self._book
        book[key] = [*self._live(key, now), lease] if key in book else [lease]
        if len(book) >= self._sweep_at:
            # Leases that ran out without a release would otherwise stay forever; an
            # occasional sweep keeps the book as large as what is really held (amortised O(1)).
            for other in list(self._book):
                if not self._live(other, now):
                    del self._book[other]
            self._sweep_at = max(_SWEEP_MIN, 2 * len(self._book))

    def discard(self, owner: Hashable, lease: Held) -> None:
        """``lease`` (granted to ``owner``) was released or lost."""
        key = (lease.name, owner)
        leases = self._book.get(key)
        if leases is None:
            return
        if len(leases) == 1 and leases[0] is lease:  # the usual case: one lease per owner
            del self._book[key]
            return
        rest = [held for held in leases if held is not lease]
        if rest:
            self._book[key] = rest
        else:
            del self._book[key]

    def conflict(self, name: str, owner: Hashable, now: float, *, blocking: bool) -> Held | None:
        """The lease that makes this acquire of ``name`` by ``owner`` wait for itself, if any."""
        if not blocking:
            return None
        key = (name, owner)
        if key not in self._book:
            return None
        live = self._live(key, now)
        if not live:
            self._book.pop(key, None)
            return None
        return live[0]

    def held_by(self, name: str, owner: Hashable, now: float) -> Held | None:
        """The lease of ``owner``'s innermost block of ``name`` still held, if any."""
        live = self._live((name, owner), now)
        return live[-1] if live else None

    def _live(self, key: tuple[str, Hashable], now: float) -> list[Held]:
        return [held for held in self._book.get(key, ()) if held._held_at(now)]


def self_deadlock(name: str, who: str, holder: Held) -> SelfDeadlock:
    """The error for ``who`` (a thread or task) acquiring ``name`` inside its own block
    of it, whose lease is ``holder``."""
    return SelfDeadlock(
        name,
        f"{who} is inside a `with` block holding it through this client ({holder!r}), so "
        "this acquire would wait for its own block until that lease ran out (forever with "
        "a watchdog). tenure locks are not reentrant: pass the block's lease down "
        "instead of acquiring again, or acquire after the block (another thread or task "
        "acquiring it waits as usual)",
        holder,
    )


def own_block(who: str, holder: Held) -> str:
    """Why a non-blocking acquire of a lock by ``who`` was refused when ``who`` is inside
    its own block of it (lease ``holder``): the refusal's "held by another client"
    would send its reader looking for a client that does not exist."""
    return (
        f"held by the `with` block {who} is inside ({holder!r}), through this client; tenure "
        "locks are not reentrant: pass the block's lease down instead of acquiring again"
    )

"""The book of who holds what through one client (``_core.holds``), with a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import tenure
from tenure._core.holds import Holds, self_deadlock


@dataclass(eq=False)
class FakeLease:
    name: str
    valid_until: float
    released: bool = False

    def _held_at(self, now: float) -> bool:
        return not self.released and now < self.valid_until


def test_the_same_owner_conflicts_other_owners_do_not() -> None:
    book = Holds()
    lease = FakeLease("x", valid_until=10.0)
    book.add("thread-a", lease, now=0.0)
    assert book.conflict("x", "thread-a", 1.0, blocking=True) is lease
    assert book.conflict("x", "thread-b", 1.0, blocking=True) is None  # contention, not ours
    assert book.conflict("y", "thread-a", 1.0, blocking=True) is None  # another lock
    assert book.conflict("x", "thread-a", 1.0, blocking=False) is None  # a try never waits


def test_released_lost_or_run_out_leases_stop_counting() -> None:
    book = Holds()
    lease = FakeLease("x", valid_until=10.0)
    book.add("a", lease, now=0.0)
    book.discard("a", lease)
    assert book.conflict("x", "a", 1.0, blocking=True) is None
    assert len(book) == 0
    book.discard("a", lease)  # twice is harmless
    late = FakeLease("x", valid_until=2.0)
    book.add("a", late, now=0.0)
    assert book.conflict("x", "a", 1.9, blocking=True) is late
    assert book.conflict("x", "a", 2.0, blocking=True) is None  # ran out: the nodes let go
    assert len(book) == 0
    dropped = FakeLease("x", valid_until=10.0)
    book.add("a", dropped, now=0.0)
    dropped.released = True  # whatever the lease says is what counts
    assert book.conflict("x", "a", 1.0, blocking=True) is None


def test_leases_that_ran_out_unreleased_are_swept() -> None:
    book = Holds()
    for i in range(1000):
        book.add("a", FakeLease(f"job-{i}", valid_until=i + 1.0), now=float(i))
    assert len(book) < 200  # not one entry per lock ever taken


def test_the_error_names_the_lock_the_caller_and_the_fix() -> None:
    error = self_deadlock("orders:42", "thread 'worker-1'", FakeLease("orders:42", 1.0))
    assert isinstance(error, tenure.SelfDeadlock)
    assert isinstance(error, RuntimeError)
    assert isinstance(error, tenure.LockError)
    assert error.name == "orders:42"
    assert "thread 'worker-1'" in str(error)
    assert "pass the block's lease down" in str(error)


@pytest.mark.parametrize("owner", ["a", "b"])
def test_two_leases_of_one_owner_are_kept_apart(owner: str) -> None:
    book = Holds()
    first, second = FakeLease("x", 5.0), FakeLease("x", 10.0)
    book.add(owner, first, now=0.0)
    book.add(owner, second, now=0.0)
    book.discard(owner, first)
    assert book.conflict("x", owner, 1.0, blocking=True) is second

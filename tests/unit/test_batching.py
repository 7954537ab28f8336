"""Which acquires may run as one script on a node (``_core.batching``)."""

from __future__ import annotations

from tenure._core import commands
from tenure._core.batching import Batch
from tenure._core.config import ClientConfig, LockSpec

CONFIG = ClientConfig.build(["redis://a"])


def _acquire(name: str) -> commands.Command:
    return commands.acquire(LockSpec.build(CONFIG, name, 1.5), "tok", 7, 1, 1)


def _release(name: str) -> commands.Command:
    return commands.release_waking(LockSpec.build(CONFIG, name, 1.5), "tok", "q", 7)


def test_acquires_of_other_locks_join_across_what_was_written_between() -> None:
    batch: Batch[str] = Batch()
    assert batch.join(_acquire("a"), "a")
    batch.passed(_release("b"))  # another task's release, written after "a"
    assert batch.join(_acquire("c"), "c")
    assert batch.join(_acquire("a"), "a again")  # nothing of "a" was written between
    assert batch.callbacks == ["a", "c", "a again"]
    assert len(batch.commands) == 3


def test_an_acquire_never_overtakes_a_command_on_its_own_lock() -> None:
    # A cancelled acquire's cleanup is written right behind it; an acquire of the same
    # lock written after the cleanup must run after it, so it opens a batch of its own.
    batch: Batch[str] = Batch()
    assert batch.join(_acquire("a"), "a")
    batch.passed(_release("a"))
    assert not batch.join(_acquire("a"), "a again")
    assert batch.join(_acquire("b"), "b")
    assert batch.callbacks == ["a", "b"]


def test_a_command_without_a_key_closes_the_batch() -> None:
    batch: Batch[str] = Batch()
    assert batch.join(_acquire("a"), "a")
    batch.passed(commands.Command(commands.pack("PING")))
    assert not batch.join(_acquire("b"), "b")


def test_one_acquire_goes_as_itself_and_more_as_one_batch() -> None:
    one: Batch[str] = Batch()
    acquire = _acquire("a")
    one.join(acquire, "a")
    assert one.command() is acquire
    two: Batch[str] = Batch()
    two.join(acquire, "a")
    two.join(_acquire("b"), "b")
    assert two.command().packed.startswith(b"*")
    assert two.command().packed != acquire.packed
    assert two.command().by_sha

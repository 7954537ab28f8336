"""Which acquires may run as one script on a node (``_core.batching``)."""

from __future__ import annotations

from tenure._core import commands
from tenure._core.batching import MAX_BATCH, Batch, Batches
from tenure._core.config import ClientConfig, LockSpec

CONFIG = ClientConfig.build(["redis://a"])


def _acquire(name: str) -> commands.Command:
    return commands.acquire(LockSpec.build(CONFIG, name, 1.5), "tok", 7, 1, 1)


def _release(name: str) -> commands.Command:
    return commands.release_waking(LockSpec.build(CONFIG, name, 1.5), "tok", "q", 7)


def test_acquires_of_other_locks_join_across_what_was_written_between() -> None:
    batch: Batch[str] = Batch("acquire_batch")
    assert batch.join(_acquire("a"), "a")
    batch.passed(_release("b"))  # another task's release, written after "a"
    assert batch.join(_acquire("c"), "c")
    assert batch.join(_acquire("a"), "a again")  # nothing of "a" was written between
    assert batch.callbacks == ["a", "c", "a again"]
    assert len(batch.commands) == 3


def test_an_acquire_never_overtakes_a_command_on_its_own_lock() -> None:
    # A cancelled acquire's cleanup is written right behind it; an acquire of the same
    # lock written after the cleanup must run after it, so it opens a batch of its own.
    batch: Batch[str] = Batch("acquire_batch")
    assert batch.join(_acquire("a"), "a")
    batch.passed(_release("a"))
    assert not batch.join(_acquire("a"), "a again")
    assert batch.join(_acquire("b"), "b")
    assert batch.callbacks == ["a", "b"]


def test_a_command_without_a_key_closes_the_batch() -> None:
    batch: Batch[str] = Batch("acquire_batch")
    assert batch.join(_acquire("a"), "a")
    batch.passed(commands.Command(commands.pack("PING")))
    assert not batch.join(_acquire("b"), "b")


def test_one_acquire_goes_as_itself_and_more_as_one_batch() -> None:
    one: Batch[str] = Batch("acquire_batch")
    acquire = _acquire("a")
    one.join(acquire, "a")
    assert one.command() is acquire
    two: Batch[str] = Batch("acquire_batch")
    two.join(acquire, "a")
    two.join(_acquire("b"), "b")
    assert two.command().packed.startswith(b"*")
    assert two.command().packed != acquire.packed
    assert two.command().by_sha


def test_acquires_and_releases_batch_apart_and_keep_their_order_per_lock() -> None:
    # A release of "a" written after the acquires' batch opened: the release opens its
    # own batch (by EVAL), and an acquire of "a" written after it may not join the
    # acquires' batch ahead of it; one of "b" may.
    batches: Batches[str] = Batches()
    acquires = batches.join(_acquire("b"), "acquire b")
    assert acquires is not None
    assert acquires.script == "acquire_batch"
    releases = batches.join(_release("a"), "release a")
    assert releases is not None
    assert releases.script == "release_batch"
    assert batches.join(_release("c"), "release c") is None  # joined the releases'
    again = batches.join(_acquire("a"), "acquire a")
    assert again is not None  # a new batch of acquires, after the release of "a"
    assert batches.join(_acquire("d"), "acquire d") is None  # into the newest
    assert acquires.callbacks == ["acquire b"]
    assert releases.callbacks == ["release a", "release c"]
    assert again.callbacks == ["acquire a", "acquire d"]
    # Nor may a release overtake an acquire of its lock written alone between.
    batches.passed(_acquire("c"))
    assert batches.join(_release("c"), "release c again") is not None
    batches.clear()
    assert batches.join(_acquire("a"), "next turn") is not None


def test_a_batch_holds_at_most_max_batch_commands() -> None:
    # A script run holds the node: a busier turn opens another batch behind the full one.
    batches: Batches[int] = Batches()
    opened = [batches.join(_acquire(f"n{i}"), i) for i in range(MAX_BATCH + 1)]
    assert opened[0] is not None
    assert opened[1:MAX_BATCH] == [None] * (MAX_BATCH - 1)
    assert opened[MAX_BATCH] is not None
    assert len(opened[0].commands) == MAX_BATCH
    one: Batch[int] = Batch("acquire_batch")
    for i in range(MAX_BATCH):
        assert one.join(_acquire(f"n{i}"), i)
    assert not one.join(_acquire("one more"), MAX_BATCH)

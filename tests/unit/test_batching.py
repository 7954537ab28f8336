"""Which acquires may run as one script on a node (``_core.batching``)."""

from __future__ import annotations

from tenure._core import commands
from tenure._core.batching import MAX_BATCH, Batches
from tenure._core.config import ClientConfig, LockSpec

CONFIG = ClientConfig.build(["redis://a"])


def _acquire(name: str) -> commands.Command:
    return commands.acquire(LockSpec.build(CONFIG, name, 1.5), "tok", 7, 1, 1)


def _release(name: str) -> commands.Command:
    return commands.release_waking(LockSpec.build(CONFIG, name, 1.5), "tok", "q", 7)


def _alone(name: str) -> commands.Command:
    # A command of the lock ``name`` that goes alone (a failed attempt's cleanup).
    return commands.release(LockSpec.build(CONFIG, name, 1.5).keys.lock, "tok")


def test_acquires_of_other_locks_join_across_what_was_written_between() -> None:
    batches: Batches[str] = Batches()
    batch = batches.join(_acquire("a"), "a")
    assert batch is not None
    batches.passed(_alone("b"))  # another task's command, written after "a"
    assert batches.join(_acquire("c"), "c") is None
    assert batches.join(_acquire("a"), "a again") is None  # nothing of "a" between
    assert batch.callbacks == ["a", "c", "a again"]
    assert len(batch.commands) == 3


def test_an_acquire_never_overtakes_a_command_on_its_own_lock() -> None:
    # A cancelled acquire's cleanup is written right behind it; an acquire of the same
    # lock written after the cleanup must run after it, so it opens a batch of its own.
    batches: Batches[str] = Batches()
    batch = batches.join(_acquire("a"), "a")
    assert batch is not None
    batches.passed(_alone("a"))
    again = batches.join(_acquire("a"), "a again")
    assert again is not None
    assert batches.join(_acquire("b"), "b") is None
    assert batch.callbacks == ["a"]
    assert again.callbacks == ["a again", "b"]


def test_a_command_without_a_key_closes_the_batch() -> None:
    batches: Batches[str] = Batches()
    assert batches.join(_acquire("a"), "a") is not None
    batches.passed(commands.Command(commands.pack("PING")))
    assert batches.join(_acquire("b"), "b") is not None


def test_one_acquire_goes_as_itself_and_more_as_one_batch() -> None:
    acquire = _acquire("a")
    one = Batches[str]().join(acquire, "a")
    assert one is not None
    assert one.command() is acquire
    batches: Batches[str] = Batches()
    two = batches.join(acquire, "a")
    assert two is not None
    batches.join(_acquire("b"), "b")
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

"""The model's fake node answers as the scripts do: every return branch, and key expiry.

These pin the fake to the semantics stated in ``src/tenure/_lua/*.lua``; the scripts'
headers are checked here too, so a change of a script's contract shows up as a failure
in the fake's tests rather than as a model that silently tests something else. The
commands as ``tenure._core.commands`` packs them are run on the fake as well
(``eval_packed`` reads KEYS and ARGV by position), so the argument layout is pinned too.
``tests/integration/test_waiting.py::test_the_fake_node_answers_like_redis`` runs the
waiting paths against a real server.
"""

from __future__ import annotations

import pytest

from tenure._core import commands
from tenure._core.acquire import Seed
from tenure._core.config import (
    NODE_FLOOR,
    NODE_REPLID,
    NODE_WARM,
    ClientConfig,
    LockKeys,
    LockSpec,
)
from tenure._lua import script
from tenure.testing.fake import (
    RETENTION_MS,
    Bus,
    FakeNode,
    acquire_lua,
    acquire_wait_lua,
    eval_packed,
    extend_lua,
    release_lua,
    release_wait_lua,
    seed_lua,
)

KEYS = LockKeys.of("r")
OTHER = LockKeys.of("s")  # another lock name on the same node
RET = 5_000  # a short retention, to see keys expire


def seeded(floor: int = 10, warm_ms: int = 0, now: int = 0, retention: int = RET) -> FakeNode:
    node = FakeNode()
    assert seed_lua(node, KEYS, floor, warm_ms, now, retention_ms=retention) == 1
    return node


def test_script_headers_state_the_statuses_the_fake_returns() -> None:
    acquire = script("acquire").source.decode()
    for line in (
        "Returns ARGV[3], the proposal F, as an integer alone when it granted",
        "{ 1, F, F}",
        "{ 0, floor, floor}",
        "{0, floor, floor, pttl}",
        "{-1, floor, floor}",
        "{-2, mark, 0}",
        "{-3, pttl, floor}",
        "{-4, mark, floor, id}",
    ):
        assert line in acquire, line
    assert "KEYS[2]  this node's floor" in acquire
    assert "ARGV[6]  the retention" in acquire
    seed = script("seed").source.decode()
    assert "Returns 1 if seeded, 0 if the node already had a floor" in seed
    assert "ARGV[3]  the retention" in seed
    assert "Also -1 for a seed without a warm-up (ARGV[2] = 0) on a node whose" in seed
    assert "KEYS[2]  (optional) this node's floor" in script("extend").source.decode()
    assert "ARGV[4]  (waiting only) the retention" in script("release").source.decode()


def test_the_node_keys_are_shared_by_every_lock() -> None:
    assert (KEYS.floor, KEYS.warm) == (OTHER.floor, OTHER.warm) == (NODE_FLOOR, NODE_WARM)
    assert KEYS.replid == OTHER.replid == NODE_REPLID
    assert LockKeys.of("r", "app1:").replid == "app1:node:replid"
    assert KEYS.lock != OTHER.lock


# --- acquire.lua ----------------------------------------------------------------------------


def test_a_blank_node_grants_nothing_and_keeps_its_first_mark() -> None:
    node = FakeNode()
    assert acquire_lua(node, KEYS, "t", 1000, 5, now=0, mark=7, mark_ms=100) == [-2, 7, 0]
    assert set(node.data) == {NODE_WARM}  # only the observation mark
    # Another lock, another client: the node answers with the mark it holds.
    assert acquire_lua(node, OTHER, "u", 1000, 5, now=50, mark=9, mark_ms=100) == [-2, 7, 0]
    assert node.pttl(NODE_WARM, 50) == 50
    # The mark lives mark_ms; after it, the next attempt leaves its own.
    assert acquire_lua(node, KEYS, "t", 1000, 5, now=101, mark=9, mark_ms=100) == [-2, 9, 0]


def test_a_blank_node_with_a_lock_left_is_still_blank() -> None:
    # The floor is the node's record of its past; a lock key alone is not.
    node = FakeNode()
    node.set(KEYS.lock, "x", 0)
    assert acquire_lua(node, KEYS, "t", 1000, 50, now=0, mark=3) == [-2, 3, 0]


def test_acquire_grants_above_the_floor_and_raises_it() -> None:
    node = seeded(10)
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=7, retention_ms=RET) == 11
    assert node.get(KEYS.lock, 7) == "t"
    assert node.pttl(KEYS.lock, 7) == 1000
    assert node.floor_of(KEYS, 7) == 11
    assert node.pttl(NODE_FLOOR, 7) == RET  # kept for the retention from the grant
    # Nothing else, per name or not: the lock, the floor and the floor's history.
    assert set(node.data) == {KEYS.lock, NODE_FLOOR, NODE_REPLID}
    assert node.get(NODE_REPLID, 7) == node.replid
    assert node.pttl(NODE_REPLID, 7) == RET


def test_every_name_is_judged_against_the_node_floor() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 30, now=0)
    # A new name on this node: it must beat the floor (30), like any other.
    assert acquire_lua(node, OTHER, "b", 1000, 30, now=1) == [-1, 30, 30]
    assert acquire_lua(node, OTHER, "b", 1000, 5, now=1) == [-1, 30, 30]
    assert acquire_lua(node, OTHER, "b", 1000, 31, now=1) == 31
    # And an old one, released, after another name raised the floor.
    release_lua(node, KEYS.lock, "a", now=2)
    assert acquire_lua(node, KEYS, "c", 1000, 31, now=3) == [-1, 31, 31]
    assert acquire_lua(node, KEYS, "c", 1000, 32, now=3000, retention_ms=RET) == 32
    assert node.pttl(NODE_FLOOR, 3000) == RET  # renewed by every grant


@pytest.mark.parametrize("proposal", [10, 9, 0])
def test_acquire_refuses_a_proposal_not_above_the_floor(proposal: int) -> None:
    node = seeded(10)
    assert acquire_lua(node, KEYS, "t", 1000, proposal, now=0) == [-1, 10, 10]
    assert node.exists(KEYS.lock, 0) == 0


def test_acquire_reports_a_held_lock_before_a_low_proposal() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    assert acquire_lua(node, KEYS, "b", 1000, 5, now=1) == [0, 20, 20]
    assert acquire_lua(node, KEYS, "b", 1000, 50, now=1) == [0, 20, 20]
    assert node.get(KEYS.lock, 1) == "a"


def test_lock_expires_after_its_ttl_like_redis() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    assert acquire_lua(node, KEYS, "b", 1000, 21, now=1000) == [0, 20, 20]  # there at t+ttl
    assert acquire_lua(node, KEYS, "b", 1000, 21, now=1001) == 21


def test_warming_node_grants_nothing_until_its_marker_expires() -> None:
    node = seeded(10, warm_ms=1500, now=0)
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=0) == [-3, 1500, 10]
    assert acquire_lua(node, OTHER, "t", 1000, 11, now=1499) == [-3, 1, 10]  # any lock
    # At the marker's last millisecond PTTL is 0: warm.
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=1500) == 11


def test_the_floor_expires_after_the_retention_and_the_node_is_blank() -> None:
    node = seeded(10, retention=RET)
    acquire_lua(node, KEYS, "a", 100, 20, now=0, retention_ms=RET)
    assert node.floor_of(KEYS, RET) == 20  # still there at t + retention
    assert acquire_lua(node, KEYS, "b", 100, 21, now=RET + 1, mark=4) == [-2, 4, 0]
    live = {key for key in list(node.data) if node.exists(key, RET + 1)}
    assert live == {NODE_WARM}  # the mark of the new observation, nothing else


def test_a_lock_idle_past_the_retention_keeps_the_floor_other_locks_renewed() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 100, 20, now=0, retention_ms=RET)
    acquire_lua(node, OTHER, "b", 100, 30, now=1000, retention_ms=RET)
    assert acquire_lua(node, KEYS, "c", 100, 25, now=RET + 1) == [-1, 30, 30]


# --- seed.lua -------------------------------------------------------------------------------


def test_seed_gives_a_blank_node_its_floor_for_the_retention() -> None:
    fresh = FakeNode()
    assert seed_lua(fresh, KEYS, 0, 0, now=5, retention_ms=RET) == 1
    assert fresh.floor_of(KEYS, 5) == 0
    assert fresh.pttl(NODE_FLOOR, 5) == RET
    assert fresh.exists(NODE_WARM, 5) == 0  # no warm-up: the mark is dropped
    assert acquire_lua(fresh, OTHER, "t", 1000, 1, now=5) == 1


def test_seed_with_a_warm_up() -> None:
    node = FakeNode()
    acquire_lua(node, KEYS, "t", 1000, 5, now=0, mark=3)
    assert seed_lua(node, KEYS, 99, 1500, now=1, marks=frozenset({3})) == 1
    assert node.floor_of(KEYS, 1) == 99
    assert node.get(NODE_WARM, 1) == "1"
    assert node.pttl(NODE_WARM, 1) == 1500


def test_seed_only_a_blank_node() -> None:
    node = seeded(10)
    assert seed_lua(node, KEYS, 99, 1500, now=0) == 0
    assert node.floor_of(KEYS, 0) == 10
    assert node.pttl(NODE_WARM, 0) == -2


@pytest.mark.parametrize("marks", [frozenset({4}), frozenset()])
def test_seed_needs_the_mark_the_node_holds(marks: frozenset[int]) -> None:
    node = FakeNode()
    acquire_lua(node, KEYS, "t", 1000, 5, now=0, mark=3)
    assert seed_lua(node, KEYS, 99, 0, now=1, marks=marks) == -1
    assert node.floor_of(KEYS, 1) is None
    node.wipe()  # restarted since the observation: no mark at all
    assert seed_lua(node, KEYS, 99, 0, now=1, marks=frozenset({3})) == -1


# --- release.lua and extend.lua -------------------------------------------------------------


def test_release_and_extend_compare_the_token() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 11, now=0)
    assert release_lua(node, KEYS.lock, "b", now=1) == 0
    assert extend_lua(node, KEYS.lock, "b", 5000, now=1) == 0
    assert extend_lua(node, KEYS.lock, "a", 5000, now=500) == 1
    assert node.pttl(KEYS.lock, 500) == 5000
    assert release_lua(node, KEYS.lock, "a", now=600) == 1
    assert node.exists(KEYS.lock, 600) == 0
    assert extend_lua(node, KEYS.lock, "a", 5000, now=601) == 0  # never re-created
    assert node.exists(KEYS.lock, 601) == 0


def test_extend_keeps_the_floor_for_another_retention() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 11, now=0, retention_ms=RET)
    assert extend_lua(node, KEYS.lock, "a", 1000, 900, NODE_FLOOR, RET) == 1
    assert node.pttl(NODE_FLOOR, 900) == RET
    # Refused (not our token): the floor is left alone.
    assert extend_lua(node, KEYS.lock, "b", 1000, 1000, NODE_FLOOR, 2 * RET) == 0
    assert node.pttl(NODE_FLOOR, 1000) == RET - 100
    # Without the floor key (the optional KEYS[2]): the lock alone.
    assert extend_lua(node, KEYS.lock, "a", 1000, 1100) == 1
    assert node.pttl(NODE_FLOOR, 1100) == RET - 200


def test_extend_does_not_revive_an_expired_key() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 11, now=0)
    assert extend_lua(node, KEYS.lock, "a", 1000, 1001, NODE_FLOOR, RET) == 0
    assert release_lua(node, KEYS.lock, "a", now=1001) == 0


# --- data loss ------------------------------------------------------------------------------


def test_a_failover_that_lost_the_last_grant_is_a_changed_history() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    copy = node.replicate()  # the replica has A's grant...
    release_lua(node, KEYS.lock, "a", now=1)
    acquire_lua(node, KEYS, "b", 1000, 30, now=2)  # ...but not B's
    old = node.replid
    node.promote(copy)
    assert (node.replid2, node.get(NODE_REPLID, 3)) == (old, old)
    # The replica's floor (20) is older than the grant it lost (30): no vote, a mark.
    assert acquire_lua(node, OTHER, "c", 1000, 40, now=3, mark=5) == [-4, 5, 20, node.replid]
    assert acquire_lua(node, OTHER, "c", 1000, 40, now=4, mark=7) == [
        -4,
        5,
        20,
        node.replid,
    ]  # kept
    assert node.get(NODE_WARM, 4) == f"5 {node.replid}"
    assert node.get(KEYS.lock, 4) == "a"  # nothing else was touched
    # Never seeded as new; with the warm-up, from the higher of the two floors.
    assert seed_lua(node, KEYS, 0, 0, now=5, marks=frozenset({5})) == -1
    assert seed_lua(node, KEYS, 15, 1500, now=5, marks=frozenset({7})) == -1
    assert seed_lua(node, KEYS, 15, 1500, now=5, marks=frozenset({5})) == 1
    assert node.floor_of(KEYS, 5) == 20
    assert node.get(NODE_REPLID, 5) == node.replid
    assert acquire_lua(node, OTHER, "c", 1000, 40, now=6) == [-3, 1499, 20]
    assert seed_lua(node, KEYS, 99, 1500, now=6, marks=frozenset({5})) == 0  # done once
    assert acquire_lua(node, OTHER, "c", 1000, 40, now=1505) == 40


def test_a_restart_with_the_data_kept_is_a_changed_history() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    node.restart()  # appendfsync always: every key is back, under a new ID
    assert node.get(KEYS.lock, 1) == "a"
    assert acquire_lua(node, OTHER, "b", 1000, 30, now=1, mark=3) == [-4, 3, 20, node.replid]
    assert seed_lua(node, KEYS, 25, 1000, now=2, marks=frozenset({3})) == 1
    assert node.floor_of(KEYS, 2) == 25


def test_a_promoted_node_without_a_floor_is_not_blank() -> None:
    # The replica never received the floor (its master's first grant was lost with it):
    # that history may have had grants, so the node is not new.
    node = FakeNode()
    copy = node.replicate()
    assert seed_lua(node, KEYS, 0, 0, now=0) == 1
    acquire_lua(node, KEYS, "a", 1000, 20, now=1)
    node.promote(copy)
    # Blank, with the server's ID: the client tells how long it has known that history.
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=2, mark=9) == [-2, 9, 0, node.replid]
    assert seed_lua(node, KEYS, 0, 0, now=3, marks=frozenset({9})) == -1
    assert seed_lua(node, KEYS, 0, 500, now=3, marks=frozenset({9})) == 1
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=4) == [-3, 499, 0]
    # Known for max_ttl: seeded with the warm-up served (1 ms), no marker kept.
    node.delete(NODE_FLOOR, 5)
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=5, mark=4) == [-2, 4, 0, node.replid]
    assert seed_lua(node, KEYS, 0, 1, now=5, marks=frozenset({4})) == 1
    assert node.get(NODE_WARM, 5) is None
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=5) == 30
    # Restarted without its data, the same server is blank again, and may be new.
    node.wipe()
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=5, mark=11) == [-2, 11, 0]


def test_a_mark_made_under_another_history_is_not_accepted() -> None:
    # A client saw every node blank (mark 3), then the node failed over to a replica
    # that received the mark: its seed without a warm-up must not reach the new master.
    node = FakeNode()
    assert acquire_lua(node, KEYS, "a", 1000, 20, now=0, mark=3) == [-2, 3, 0]
    node.promote(node.replicate())
    assert seed_lua(node, KEYS, 0, 0, now=1, marks=frozenset({3})) == -1
    assert node.floor_of(KEYS, 1) is None
    assert acquire_lua(node, KEYS, "a", 1000, 20, now=2, mark=5) == [-2, 5, 0, node.replid]


def test_a_floor_without_a_history_records_this_one_and_votes() -> None:
    # Written by a tenure that kept no replication ID: taken as it is.
    node = FakeNode()
    node.set(NODE_FLOOR, 10, 0, px=RET)
    assert acquire_lua(node, KEYS, "a", 1000, 20, now=1000, retention_ms=100) == 20
    assert node.get(NODE_REPLID, 1000) == node.replid
    # Kept for at least as long as the floor (granted with a shorter retention here).
    node.set(NODE_FLOOR, 20, 1000, px=RET)
    node.delete(NODE_REPLID, 1000)
    assert acquire_lua(node, KEYS, "b", 1000, 30, now=1000, retention_ms=100) == [0, 20, 20]
    assert node.pttl(NODE_REPLID, 1000) == RET
    # An extension records it too.
    node.delete(NODE_REPLID, 1000)
    assert extend_lua(node, KEYS.lock, "a", 1000, 1001, NODE_FLOOR, RET) == 1
    assert node.get(NODE_REPLID, 1001) == node.replid


def test_a_promoted_node_with_a_floor_but_no_history_is_changed() -> None:
    # Its master may have recorded an ID the replica never received (or wrote the floor
    # before IDs were kept): a promoted node vouches only for what it recorded itself.
    node = FakeNode()
    node.set(NODE_FLOOR, 10, 0, px=RET)
    node.promote(node.replicate())
    assert acquire_lua(node, KEYS, "a", 1000, 20, now=1, mark=3) == [-4, 3, 10, node.replid]
    assert extend_lua(node, KEYS.lock, "a", 1000, 1, NODE_FLOOR, RET) == 0  # not ours
    node.set(KEYS.lock, "a", 1, px=1000)
    assert extend_lua(node, KEYS.lock, "a", 1000, 2, NODE_FLOOR, RET) == 1
    assert node.get(NODE_REPLID, 2) is None  # an extension records nothing here
    assert seed_lua(node, KEYS, 5, 500, now=3, marks=frozenset({3})) == 1
    assert (node.floor_of(KEYS, 3), node.get(NODE_REPLID, 3)) == (10, node.replid)


def test_the_history_expires_with_the_floor_and_not_before() -> None:
    node = seeded(10, retention=RET)
    acquire_lua(node, KEYS, "a", 100, 20, now=1000, retention_ms=RET)
    assert extend_lua(node, KEYS.lock, "a", 100, 1050, NODE_FLOOR, RET) == 1
    assert node.pttl(NODE_REPLID, 1050) == node.pttl(NODE_FLOOR, 1050) == RET
    assert node.exists(NODE_REPLID, 1050 + RET) == 1
    assert node.exists(NODE_REPLID, 1051 + RET) == node.exists(NODE_FLOOR, 1051 + RET) == 0


def test_an_extension_on_a_changed_node_keeps_our_own_key() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    node.promote(node.replicate())  # nothing lost this time, but the node cannot know
    assert extend_lua(node, KEYS.lock, "a", 1000, 10, NODE_FLOOR, RET) == 1
    assert node.get(NODE_REPLID, 10) == node.replid2  # still the old history
    assert acquire_lua(node, OTHER, "b", 1000, 30, now=11, mark=3) == [-4, 3, 20, node.replid]


def test_flush_keeps_the_history_of_the_server() -> None:
    node = seeded(10)
    rid = node.replid
    node.flush()
    assert node.replid == rid
    assert acquire_lua(node, KEYS, "a", 1000, 20, now=0, mark=3) == [-2, 3, 0]


@pytest.mark.parametrize("lose", [FakeNode.wipe, FakeNode.flush])
def test_wipe_and_flush_lose_everything(lose: object) -> None:
    assert callable(lose)
    node = seeded(10, warm_ms=1500)
    acquire_lua(node, KEYS, "a", 1000, 11, now=1600)
    lose(node)
    assert node.data == {}
    assert acquire_lua(node, OTHER, "b", 1000, 12, now=1601, mark=5) == [-2, 5, 0]


# --- the waiting paths ----------------------------------------------------------------------


def test_held_while_waiting_queues_with_the_pttl_and_the_queue_expires_with_the_places() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    reply = acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 300, now=100)
    assert reply == [0, 20, 20, 900]
    assert node.pttl(KEYS.queue, 100) == 300  # the queue lives as long as its place
    # A renewal with a shorter place does not shorten the queue; a longer one extends it.
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 100, now=150)
    assert node.pttl(KEYS.queue, 150) == 250
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 800, now=200)
    assert node.pttl(KEYS.queue, 200) == 800
    assert node.exists(KEYS.queue, 1001) == 0


def test_a_non_blocking_waiter_is_not_queued() -> None:
    node, bus = seeded(10), Bus()
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    assert acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "n", "b", "ch:b", 0, now=1) == [
        0,
        20,
        20,
        999,
    ]
    assert node.exists(KEYS.queue, 1) == 0


def test_a_blank_or_warming_node_answers_a_waiter_before_queuing_it() -> None:
    blank, bus = FakeNode(), Bus()
    assert acquire_wait_lua(blank, bus, KEYS, "b", 1000, 30, "q", "b", "c", 300, now=0) == [
        -2,
        1,
        0,
    ]
    warming = seeded(10, warm_ms=500)
    assert acquire_wait_lua(warming, bus, KEYS, "b", 1000, 30, "q", "b", "c", 300, now=0) == [
        -3,
        500,
        10,
    ]
    assert blank.exists(KEYS.queue, 0) == warming.exists(KEYS.queue, 0) == 0


def test_fair_hand_off_on_one_node_commits_floor_plus_one() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_wait_lua(node, bus, KEYS, "a", 1000, 20, "f", "a", "ch:a", 300, now=0)
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 300, now=1)
    assert release_wait_lua(node, bus, KEYS, "a", "f", 100, now=2, retention_ms=RET) == 1
    assert bus.published == [("ch:b", "G b 21")]
    assert node.get(KEYS.lock, 2) == "b"
    assert node.floor_of(KEYS, 2) == 21
    assert node.pttl(NODE_FLOOR, 2) == RET
    # "b" comes to take it: renewed, with the floor (here the hand-off's token).
    assert acquire_wait_lua(node, bus, KEYS, "b", 1000, 99, "f", "b", "ch:b", 300, now=3) == [
        1,
        21,
        21,
    ]
    assert node.pttl(KEYS.lock, 3) == 1000


def test_fair_hand_off_starts_from_the_floor_other_locks_raised() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_wait_lua(node, bus, KEYS, "a", 1000, 20, "f", "a", "ch:a", 300, now=0)
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 300, now=1)
    acquire_lua(node, OTHER, "x", 1000, 70, now=1)  # raises the floor to 70
    release_wait_lua(node, bus, KEYS, "a", "f", 100, now=2)
    assert bus.published == [("ch:b", "G b 71")]


def test_a_release_on_a_blank_node_only_wakes_the_head() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_wait_lua(node, bus, KEYS, "a", 1000, 20, "f", "a", "ch:a", 300, now=0)
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "f", "b", "ch:b", 300, now=1)
    node.delete(NODE_FLOOR, 1)  # evicted, say
    release_wait_lua(node, bus, KEYS, "a", "f", 100, now=2)
    assert bus.published == [("ch:b", "W b")]
    assert node.exists(KEYS.lock, 2) == 0


def test_quorum_fair_renewal_commits_the_proposal_and_refuses_a_low_one() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_wait_lua(node, bus, KEYS, "a", 1000, 20, "q", "a", "ch:a", 300, now=0, ticket=1)
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "q", "b", "ch:b", 300, now=1, ticket=2)
    assert release_wait_lua(node, bus, KEYS, "a", "q", 40, now=2, retention_ms=RET) == 1
    assert bus.published == [("ch:b", "G b 40")]
    assert node.floor_of(KEYS, 2) == 40
    assert acquire_wait_lua(node, bus, KEYS, "b", 1000, 40, "q", "b", "ch:b", 300, now=3) == [
        -1,
        40,
        40,
    ]
    reply = acquire_wait_lua(
        node, bus, KEYS, "b", 1000, 45, "q", "b", "ch:b", 300, now=4, retention_ms=RET
    )
    assert reply == 45  # granted its proposal, renewed
    assert node.pttl(NODE_FLOOR, 4) == RET


def test_a_newcomer_hands_a_free_lock_to_the_head_and_reports_the_new_floor() -> None:
    node, bus = seeded(10), Bus(listening={"ch:b"})
    acquire_wait_lua(node, bus, KEYS, "a", 1000, 20, "q", "a", "ch:a", 300, now=0, ticket=1)
    acquire_wait_lua(node, bus, KEYS, "b", 1000, 30, "q", "b", "ch:b", 300, now=1, ticket=2)
    release_wait_lua(node, bus, KEYS, "a", "q", 20, now=2)  # P = floor: only wakes "b"
    assert bus.published == [("ch:b", "W b")]
    bus.published.clear()
    reply = acquire_wait_lua(node, bus, KEYS, "c", 1000, 60, "q", "c", "ch:c", 300, 3, 5)
    # Handed to "b" with the newcomer's proposal; the reply carries the floor as the
    # hand-off left it (a seed must never land below a token it committed).
    assert reply == [0, 60, 60, 1000]
    assert bus.published == [("ch:b", "G b 60")]
    assert node.floor_of(KEYS, 3) == 60


# --- the commands tenure packs, run on the fake --------------------------------------------


SPEC = LockSpec.build(
    ClientConfig.build(["redis://a"], max_ttl=2.0, retention=6.0), "r", 1.0, fair=True
)


def test_packed_commands_run_on_the_fake_with_the_scripts_argument_layout() -> None:
    node, bus = FakeNode(), Bus(listening={"ch:w"})
    acquire = commands.acquire(SPEC, "t1", 100, 77, 2000)
    assert eval_packed(node, acquire.packed, 0) == [-2, 77, 0]
    seed = Seed(frozenset({0}), 50, 0, frozenset({77}))
    assert eval_packed(node, commands.seed(SPEC, seed.floor, seed.warm_ms, seed.marks).packed, 1)
    assert node.pttl(NODE_FLOOR, 1) == 6000
    low = eval_packed(node, commands.acquire(SPEC, "t1", 40, 77, 2000).packed, 2)
    assert low == [-1, 50, 50]
    granted = eval_packed(node, commands.acquire(SPEC, "t1", 120, 77, 2000).packed, 3)
    assert granted == 120  # a grant of the proposal: the proposal alone
    assert commands.acquire(SPEC, "t1", 120, 77, 2000).parse(granted) == (True, (1, 120, 120))
    assert node.pttl(KEYS.lock, 3) == 1000
    assert node.pttl(NODE_FLOOR, 3) == 6000
    wait = commands.WaitArgs("f", "w", "ch:w", 300)
    held = eval_packed(node, commands.acquire(SPEC, "w", 130, 77, 2000, wait).packed, 4, bus)
    assert held == [0, 120, 120, 999]
    assert eval_packed(node, commands.extend(SPEC, "t1").packed, 200) == 1
    assert node.pttl(NODE_FLOOR, 200) == 6000
    assert node.pttl(KEYS.lock, 200) == 1000
    release = commands.release_waking(SPEC, "t1", "f", 0)
    assert eval_packed(node, release.packed, 250, bus) == 1
    assert bus.published == [("ch:w", "G w 121")]
    assert eval_packed(node, commands.release(SPEC.key, "w").packed, 260) == 1
    cleanup = commands.release_waking(SPEC, "w", "f", 0, cleanup=True)
    assert eval_packed(node, cleanup.packed, 261, bus) == 0


def test_the_retention_default_matches_the_clients() -> None:
    assert ClientConfig.build(["redis://a"]).retention_ms == RETENTION_MS


def test_a_lease_released_where_its_key_is_not_raises_the_floor_to_its_token() -> None:
    # Its acquire may still be on its way to that node (another connection, run after
    # the release): proposing the lease's token, it must then find the floor at it.
    bus = Bus()
    node = seeded(floor=10)
    assert release_wait_lua(node, bus, KEYS, "t", "q", 50, 1, retention_ms=RET, fencing=40) == 0
    assert node.floor_of(KEYS, 1) == 40
    assert node.pttl(NODE_FLOOR, 1) == RET
    assert node.pttl(NODE_REPLID, 1) == RET  # the floor's history lives as long
    assert acquire_wait_lua(node, bus, KEYS, "t", 1000, 40, "q", "t", "ch", 0, 2) == [-1, 40, 40]
    assert release_wait_lua(node, bus, KEYS, "t", "q", 50, 3, fencing=30) == 0
    assert node.floor_of(KEYS, 3) == 40  # never lowered
    assert release_wait_lua(node, bus, KEYS, "w", "q", 90, 4, cleanup=True) == 0
    assert node.floor_of(KEYS, 4) == 40  # a cleanup or a give-up carries no lease's token
    # Where the key is ours, the grant already set the floor: nothing to raise.
    assert acquire_wait_lua(node, bus, KEYS, "u", 1000, 60, "q", "u", "ch", 0, 5) == 60
    assert release_wait_lua(node, bus, KEYS, "u", "q", 90, 6, fencing=80) == 1
    assert node.floor_of(KEYS, 6) == 60
    # Unless an attempt of its call may still come ("l"): the key may be an earlier
    # grant's or a hand-off's, with a lower token than that attempt's proposal.
    assert acquire_wait_lua(node, bus, KEYS, "v", 1000, 70, "q", "v", "ch", 0, 7) == 70
    assert release_wait_lua(node, bus, KEYS, "v", "q", 95, 8, fencing=85, late=True) == 1
    assert node.floor_of(KEYS, 8) == 85
    assert acquire_wait_lua(node, bus, KEYS, "v", 1000, 85, "q", "v", "ch", 0, 9) == [-1, 85, 85]
    # Where another holds the lock too: it may release before the late attempt comes.
    assert acquire_wait_lua(node, bus, KEYS, "x", 1000, 86, "q", "x", "ch", 0, 10) == 86
    assert release_wait_lua(node, bus, KEYS, "v", "q", 99, 11, fencing=95, late=True) == 0
    assert node.floor_of(KEYS, 11) == 95
    # A blank node stays blank: a floor is also the node's incarnation.
    blank = FakeNode()
    assert release_wait_lua(blank, bus, KEYS, "t", "q", 50, 0, fencing=40) == 0
    assert blank.floor_of(KEYS, 0) is None

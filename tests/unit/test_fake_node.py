"""The model's fake node answers as the scripts do: every return branch, and key expiry.

These pin the fake to the semantics stated in ``src/tenure/_lua/*.lua``; the scripts'
headers are checked here too, so a change of a script's contract shows up as a failure
in the fake's tests rather than as a model that silently tests something else.
"""

from __future__ import annotations

import pytest

from tenure._core.config import LockKeys
from tenure._lua import script

from .fake_node import FakeNode, acquire_lua, extend_lua, release_lua, seed_lua

KEYS = LockKeys.of("r")


def seeded(counter: int = 10, warm_ms: int = 0, now: int = 0) -> FakeNode:
    node = FakeNode()
    assert seed_lua(node, KEYS, counter, warm_ms, now) == 1
    return node


def test_script_headers_state_the_statuses_the_fake_returns() -> None:
    acquire = script("acquire").source.decode()
    for line in ("{ 1, F}", "{ 0, counter}", "{-1, counter}", "{-2, mark}", "{-3, pttl}"):
        assert line in acquire
    assert (
        "Returns 1 if seeded, 0 if the node already had a counter" in script("seed").source.decode()
    )


def test_acquire_without_history_grants_nothing() -> None:
    node = FakeNode()
    assert acquire_lua(node, KEYS, "t", 1000, 5, now=0, mark=7) == [-2, 7]
    assert set(node.data) == {KEYS.warm}  # only the observation mark


def test_acquire_grants_above_the_counter_and_commits_the_proposal() -> None:
    node = seeded(10)
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=0) == [1, 11]
    assert node.get(KEYS.lock, 0) == "t"
    assert node.counter(KEYS, 0) == 11
    assert node.pttl(KEYS.lock, 0) == 1000
    assert node.pttl(KEYS.fence, 0) == -1  # the history never expires


@pytest.mark.parametrize("proposal", [10, 9, 0])
def test_acquire_refuses_a_proposal_not_above_the_counter(proposal: int) -> None:
    node = seeded(10)
    assert acquire_lua(node, KEYS, "t", 1000, proposal, now=0) == [-1, 10]
    assert node.exists(KEYS.lock, 0) == 0


def test_acquire_reports_a_held_lock_before_a_low_proposal() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    assert acquire_lua(node, KEYS, "b", 1000, 5, now=1) == [0, 20]
    assert acquire_lua(node, KEYS, "b", 1000, 50, now=1) == [0, 20]
    assert node.get(KEYS.lock, 1) == "a"


def test_lock_expires_after_its_ttl_like_redis() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 20, now=0)
    assert acquire_lua(node, KEYS, "b", 1000, 21, now=1000) == [0, 20]  # still there at t+ttl
    assert acquire_lua(node, KEYS, "b", 1000, 21, now=1001) == [1, 21]


def test_warming_node_grants_nothing_until_its_marker_expires() -> None:
    node = seeded(10, warm_ms=1500, now=0)
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=0) == [-3, 1500]
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=1499) == [-3, 1]
    # At the marker's last millisecond PTTL is 0: warm.
    assert acquire_lua(node, KEYS, "t", 1000, 11, now=1500) == [1, 11]


def test_seed_only_a_node_without_history() -> None:
    node = seeded(10)
    assert seed_lua(node, KEYS, 99, 1500, now=0) == 0
    assert node.counter(KEYS, 0) == 10
    assert node.pttl(KEYS.warm, 0) == -2
    fresh = FakeNode()
    assert seed_lua(fresh, KEYS, 0, 0, now=0) == 1
    assert fresh.counter(KEYS, 0) == 0
    assert fresh.exists(KEYS.warm, 0) == 0


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


def test_extend_does_not_revive_an_expired_key() -> None:
    node = seeded(10)
    acquire_lua(node, KEYS, "a", 1000, 11, now=0)
    assert extend_lua(node, KEYS.lock, "a", 1000, now=1001) == 0
    assert release_lua(node, KEYS.lock, "a", now=1001) == 0


def test_wipe_loses_everything() -> None:
    node = seeded(10, warm_ms=1500)
    acquire_lua(node, KEYS, "a", 1000, 11, now=1600)
    node.wipe()
    assert acquire_lua(node, KEYS, "b", 1000, 12, now=1601, mark=5) == [-2, 5]

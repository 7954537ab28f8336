"""The verifier's guards against a cycle that tests nothing: a step the race needs (the
holder holding the lock, the fault taking effect) that did not happen is an error of the
run, with the reason, never a cycle counted as safe."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest

from tenure.verify.proof import FaultNotObserved, observed
from tenure.verify.scenarios import (
    SETUP_ATTEMPTS,
    ChoreographyError,
    MissedWindow,
    at_least,
    memory_pressure,
    premise,
    require_grant,
    require_heard,
    retried,
    unheard,
    unobserved,
    zero,
)
from tenure.verify.world import World


def test_a_grant_passes_and_a_refusal_says_who_where_why_and_what_is_lost() -> None:
    require_grant("A", "granted", "before the failover", "nothing to lose")
    with pytest.raises(ChoreographyError) as info:
        require_grant(
            "A0",
            "refused: LockTimeout: lock 'x': still held by another client",
            "before the failover",
            "the failover would have no lock to lose",
        )
    assert str(info.value) == (
        "A0 was refused the lock before the failover (LockTimeout: lock 'x': still held by "
        "another client): the failover would have no lock to lose"
    )


class _Notes:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def _missing(times: int) -> tuple[list[int], Callable[[], None]]:
    runs: list[int] = []

    def cycle() -> None:
        runs.append(1)
        if len(runs) <= times:
            raise MissedWindow("the pause came late")

    return runs, cycle


def test_a_missed_window_sets_the_cycle_up_again_a_few_times_at_most() -> None:
    notes = _Notes()
    runs, cycle = _missing(SETUP_ATTEMPTS - 1)
    retried(cast(World, notes), cycle)
    assert len(runs) == SETUP_ATTEMPTS
    assert notes.notes == ["cycle set up again: the pause came late"] * (SETUP_ATTEMPTS - 1)
    runs, cycle = _missing(SETUP_ATTEMPTS)
    with pytest.raises(MissedWindow) as info:
        retried(cast(World, notes), cycle)
    assert str(info.value) == f"the pause came late (in each of {SETUP_ATTEMPTS} attempts)"
    assert len(runs) == SETUP_ATTEMPTS


def test_only_a_missed_window_is_retried() -> None:
    """A holder refused with time to spare is no accident of load: no second attempt."""
    runs: list[int] = []

    def cycle() -> None:
        runs.append(1)
        require_grant("A", "refused: held", "before its pause", "nothing to take")

    with pytest.raises(ChoreographyError):
        retried(cast(World, _Notes()), cycle)
    assert runs == [1]


@pytest.mark.parametrize(
    ("policy", "evicted", "refused", "missing"),
    [
        ("noeviction", 0, 517, None),
        ("noeviction", 0, 0, "writes refused (OOM)"),
        ("volatile-lru", 519, 0, None),
        ("volatile-lru", 0, 0, "keys evicted"),
        # Refusals are no eviction: the lock key of a volatile-* policy was never at risk.
        ("allkeys-lru", 0, 12, "keys evicted"),
    ],
)
def test_memory_pressure_must_be_seen(
    policy: str, evicted: int, refused: int, missing: str | None
) -> None:
    if missing is None:
        proof = memory_pressure(policy, evicted, refused)
        assert proof == f"{evicted} keys evicted, {refused} writes refused (OOM)"
        return
    with pytest.raises(FaultNotObserved) as info:
        memory_pressure(policy, evicted, refused)
    assert str(info.value) == (
        f"memory pressure under maxmemory-policy {policy}: {missing}: not observed (last seen: 0)"
    )


def test_evidence_read_once_is_returned_or_not_observed() -> None:
    assert observed(3, lambda n: n > 0, "keys evicted") == 3
    with pytest.raises(FaultNotObserved) as info:
        observed(0, lambda n: n > 0, "keys evicted")
    assert info.value.what == "keys evicted"
    assert info.value.last == "0"
    assert isinstance(info.value, TimeoutError)


def test_a_premise_unmet_is_the_error_of_the_run_naming_what_was_not_seen() -> None:
    """A count of zero under a fault (grants_in_slow = 0) holds as well when nobody
    asked for the lock while it lasted: the figure that shows someone did is a premise,
    and a run without it tested nothing."""
    expect = [
        *zero("C1"),
        at_least("stale_rejected", 1),  # a FAIL if unmet, not a premise
        premise("attempts_in_slow", 1, "acquires begun while every node was slow"),
    ]
    missing = unobserved(expect, {"C1": 0, "stale_rejected": 0, "attempts_in_slow": 0})
    assert isinstance(missing, FaultNotObserved)
    assert str(missing) == (
        "acquires begun while every node was slow: not observed (last seen: attempts_in_slow = 0)"
    )
    # Not measured at all (the window never opened) is not seen either.
    assert unobserved(expect, {"C1": 0}) is not None
    assert unobserved(expect, {"C1": 1, "stale_rejected": 0, "attempts_in_slow": 3}) is None
    assert expect[2].label == "attempts_in_slow >= 1"
    assert not expect[2].broken({"attempts_in_slow": 0})  # a premise is no limit


# B's refusals on {3,4,5} after node 3's restart (scenario 2), n1 and n2 cut off: as
# tenure's LockTimeout and the plain Redlock baseline word them.
_TENURE_HEARD = (
    "refused: LockTimeout: lock 'verify-lock': not acquired after timeout=0.3s: 3 of 5 "
    "nodes blank (never used, or they lost their data) and not yet set up; 2 of 5 nodes "
    "failed or did not answer"
)
_PLAIN_HEARD = "refused: 1 of 5 votes; 2 of 5 nodes failed or did not answer"
_PLAIN_UNHEARD = "refused: 2 of 5 votes; 3 of 5 nodes failed or did not answer"


@pytest.mark.parametrize(
    ("outcome", "silent"),
    [("granted", 0), ("refused: held", 0), (_TENURE_HEARD, 2), (_PLAIN_UNHEARD, 3)],
)
def test_a_refusal_says_how_many_nodes_it_did_not_hear(outcome: str, silent: int) -> None:
    assert unheard(outcome) == silent


@pytest.mark.parametrize("outcome", ["granted", _TENURE_HEARD, _PLAIN_HEARD, "refused: held"])
def test_a_refusal_by_every_node_the_worker_could_reach_is_the_locks_answer(
    outcome: str,
) -> None:
    require_heard("B", outcome, 2, "on n3, n4, n5 after node 3 restarted")


@pytest.mark.parametrize(
    "outcome",
    [
        _PLAIN_UNHEARD,
        _TENURE_HEARD.replace("2 of 5 nodes failed", "4 of 5 nodes failed"),
        "refused: 3 of 5 votes; 2 of 5 nodes failed or did not answer; validity spent "
        "after 2107 ms",
    ],
)
def test_a_refusal_by_a_slow_machine_sets_the_cycle_up_again(outcome: str) -> None:
    """Scenario 2's control on a loaded machine: B's 0.3 s ran out while n3, n4 or n5
    timed out on it (50 ms each), so B never won {3,4,5}, the run showed no overlap and
    read FAIL (expected C1 > 0), and a mitigation refusing B so would read PASS: the
    cycle tested nothing either way. It is set up again (MissedWindow, :func:`retried`),
    an ERROR naming the refusal if every attempt misses."""
    with pytest.raises(MissedWindow) as info:
        require_heard("B", outcome, 2, "on n3, n4, n5 after node 3 restarted")
    reason = outcome.removeprefix("refused: ")
    assert str(info.value) == (
        f"B was refused the lock on n3, n4, n5 after node 3 restarted without hearing in "
        f"time every node it could reach ({reason}): the machine decided, not the lock, "
        "and the cycle tested nothing"
    )

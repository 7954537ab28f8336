"""The verifier's guards against a cycle that tests nothing: a step the race needs (the
holder holding the lock) that did not happen is an error of the run, with the reason,
never a cycle counted as safe."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest

from tenure.verify.scenarios import (
    SETUP_ATTEMPTS,
    ChoreographyError,
    MissedWindow,
    require_grant,
    retried,
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

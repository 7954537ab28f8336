"""Majorities, the tally of one round, and validity."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core.quorum import (
    BEHIND,
    Failure,
    NodeResult,
    Round,
    drift_allowance,
    majority,
)

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

Answer = Literal["yes", "no", "fail"]
ANSWERS: tuple[Answer, ...] = ("yes", "no", "fail")


# --- majority ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4), (99, 50)]
)
def test_majority_table(n: int, expected: int) -> None:
    assert majority(n) == expected


@pytest.mark.parametrize("n", range(1, 100))
def test_majority_is_the_smallest_strict_majority(n: int) -> None:
    m = majority(n)
    assert m > n / 2
    assert m - 1 <= n / 2
    assert m <= n


@SETTINGS
@given(st.data())
def test_two_majorities_always_intersect(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 99), label="n")
    nodes = list(range(n))
    m = majority(n)
    a = set(data.draw(st.permutations(nodes), label="a")[:m])
    b = set(data.draw(st.permutations(nodes), label="b")[:m])
    assert a & b


def test_drift_allowance() -> None:
    assert drift_allowance(10.0, 0.01, 0.002) == pytest.approx(0.102)
    assert drift_allowance(10.0, 0.0, 0.0) == 0.0


# --- Round: tables -------------------------------------------------------------------------


def _feed(rnd: Round, node: int, answer: Answer) -> None:
    if answer == "yes":
        rnd.record(node, True)
    elif answer == "no":
        rnd.record(node, False)
    else:
        rnd.fail(node, Failure.ERROR, "boom")


@pytest.mark.parametrize(
    ("n", "answers", "decided", "succeeded", "impossible"),
    [
        (3, "", False, False, False),
        (3, "y", False, False, False),
        (3, "yy", True, True, False),
        (3, "n", False, False, False),
        (3, "nn", True, False, True),
        (3, "ff", True, False, True),
        (3, "nf", True, False, True),
        (3, "yn", False, False, False),
        (3, "ynf", True, False, True),
        (3, "yny", True, True, False),
        (1, "y", True, True, False),
        (1, "n", True, False, True),
        (1, "f", True, False, True),
        (5, "yyy", True, True, False),
        (5, "yy", False, False, False),
        (5, "nny", False, False, False),
        (5, "nnf", True, False, True),
        (5, "yynn", False, False, False),
        (5, "yynny", True, True, False),
        (5, "yynnn", True, False, True),
    ],
)
def test_round_table(
    n: int, answers: str, decided: bool, succeeded: bool, impossible: bool
) -> None:
    rnd = Round(n, majority(n), started=0.0)
    code: dict[str, Answer] = {"y": "yes", "n": "no", "f": "fail"}
    for node, a in enumerate(answers):
        _feed(rnd, node, code[a])
    assert (rnd.decided, rnd.succeeded, rnd.impossible) == (decided, succeeded, impossible)
    assert rnd.yes == answers.count("y")


def test_round_starts_undecided_and_all_maybe_holding() -> None:
    rnd = Round(5, 3, started=1.5)
    assert rnd.started == 1.5
    assert rnd.needed == 3
    assert not rnd.decided
    assert rnd.granted() == frozenset()
    assert rnd.maybe_holding() == frozenset(range(5))
    assert rnd.failures() == {}


def test_second_answer_from_a_node_is_ignored() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, True)
    rnd.record(0, True)
    assert rnd.yes == 1
    assert not rnd.decided
    rnd.fail(0, Failure.UNREACHABLE, "late")
    rnd.record(0, False)
    assert rnd.results[0] == NodeResult(ok=True)
    rnd.fail(1, Failure.ERROR, "x")
    rnd.record(1, True)
    assert rnd.yes == 1
    assert rnd.results[1] == NodeResult(failure=Failure.ERROR, detail="x")


def test_record_keeps_the_acquire_info() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, True, (1, 1234))
    rnd.record(1, False, (-1, 99))
    rnd.record(1, True, (1, 5))  # a second answer changes nothing
    rnd.record(2, False)
    assert [r.info for r in rnd.results if r is not None] == [(1, 1234), (-1, 99), None]
    assert rnd.yes == 1


def decided(rnd: Round) -> bool:
    """``rnd.decided``, read afresh (mypy narrows a property read twice)."""
    return rnd.decided


def test_wait_all_round_is_decided_only_when_every_node_answered() -> None:
    rnd = Round(5, 3, started=0.0, wait_all=True)
    for i in range(4):
        rnd.record(i, True)
        assert not rnd.decided, i
    assert rnd.succeeded
    rnd.fail(4, Failure.UNREACHABLE, "down")
    assert rnd.decided
    refused = Round(3, 2, started=0.0, wait_all=True)
    refused.record(0, False)
    refused.record(1, False)
    assert refused.impossible
    assert not refused.decided
    refused.time_out()
    assert decided(refused)
    assert not Round(3, 2, started=0.0).decided


def test_a_heard_out_round_decides_a_success_at_once_and_a_failure_when_all_answered() -> None:
    won = Round(5, 3, started=0.0, hear_out=0.002)
    for i in range(3):
        won.record(i, True)
    assert won.decided
    assert won.succeeded
    held = Round(5, 3, started=0.0, hear_out=0.002)
    for i in range(3):
        held.record(i, False)
    assert held.impossible
    assert not held.decided, "the other two nodes are still to be heard"
    held.record(3, False)
    held.fail(4, Failure.UNREACHABLE, "down")
    assert decided(held)
    late = Round(3, 2, started=0.0, hear_out=0.002)
    late.record(0, False)
    late.record(1, False)
    assert not late.decided
    # Its time is up: decided, and the node not heard from is unknown, not failed.
    late.stop_hearing()
    assert decided(late)
    assert late.results[2] is None
    assert not late.failures()


def test_failures_and_unreachable_blocks_quorum() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, False)
    rnd.fail(1, Failure.UNREACHABLE, "refused")
    # One refusal and one failure: impossible, but not because of failures alone.
    assert rnd.impossible
    assert not rnd.unreachable_blocks_quorum()
    assert rnd.failures() == {1: NodeResult(failure=Failure.UNREACHABLE, detail="refused")}
    rnd.fail(2, Failure.UNSUPPORTED, "NOPERM")
    assert rnd.unreachable_blocks_quorum()
    assert set(rnd.failures()) == {1, 2}


def test_time_out_fails_exactly_the_silent_nodes() -> None:
    rnd = Round(5, 3, started=0.0)
    rnd.record(0, True)
    rnd.record(1, False)
    rnd.fail(2, Failure.ERROR, "oops")
    rnd.time_out()
    assert rnd.results[0] == NodeResult(ok=True)
    assert rnd.results[1] == NodeResult(ok=False)
    assert rnd.results[2] == NodeResult(failure=Failure.ERROR, detail="oops")
    for i in (3, 4):
        result = rnd.results[i]
        assert result is not None
        assert result.failure is Failure.UNREACHABLE
        assert result.ok is None
    assert rnd.decided
    assert not rnd.succeeded
    assert rnd.maybe_holding() == frozenset({0, 2, 3, 4})
    assert rnd.silent == 2


def test_time_out_tells_the_nodes_that_answered_since_heard_from_as_behind() -> None:
    rnd = Round(4, 3, started=1.0, heard_from=0.5)
    rnd.record(3, True)
    rnd.time_out([0.4, 0.5, 2.0, 2.0])  # node 3 answered in this round: untouched
    details = [r.detail if r is not None else None for r in rnd.results]
    assert details == ["no reply before the deadline", BEHIND, BEHIND, ""]
    assert (rnd.silent, rnd.behind) == (3, 2)
    assert rnd.behind_blocks_quorum()  # 3 failed, 1 to spare: the two made the difference
    # Without ``heard_from``, from the round's start; a driver that tells nothing, plain.
    rnd = Round(3, 2, started=1.0)
    rnd.time_out([0.9, 1.0])
    assert (rnd.silent, rnd.behind) == (3, 1)
    assert not rnd.behind_blocks_quorum()  # one behind of three failed, one to spare
    rnd = Round(1, 1, started=1.0)
    rnd.time_out()
    assert (rnd.silent, rnd.behind) == (1, 0)
    assert not rnd.behind_blocks_quorum()


@pytest.mark.parametrize(
    ("answered", "blocks"),
    [
        ({}, True),  # every node silent
        ({0: "yes"}, True),
        ({0: "no"}, False),  # a refusal beside the silent node: not failures alone
        ({0: "refused"}, True),  # one answered failure leaves a majority possible
        ({0: "refused", 1: "refused"}, False),  # two answered failures rule it out
        ({0: "yes", 1: "yes"}, False),  # decided
    ],
)
def test_silence_blocks_quorum_only_when_the_silent_nodes_made_the_difference(
    answered: dict[int, str], blocks: bool
) -> None:
    rnd = Round(3, 2, started=0.0)
    for i, what in answered.items():
        if what == "refused":
            rnd.fail(i, Failure.UNREACHABLE, "connection refused")
        else:
            rnd.record(i, what == "yes")
    rnd.went_silent(2, "not connected yet; sent once it is")
    rnd.went_silent(2, "counted once")
    if not rnd.decided:
        rnd.time_out()
    assert rnd.silence_blocks_quorum() is blocks
    silent = ("not connected yet; sent once it is", "no reply before the deadline")
    assert rnd.silent == sum(1 for r in rnd.results if r is not None and r.detail in silent)


@pytest.mark.parametrize(
    ("started", "ttl", "drift", "now", "expected"),
    [
        (100.0, 10.0, 0.1, 100.0, 9.9),
        (100.0, 10.0, 0.1, 105.0, 4.9),
        (100.0, 10.0, 0.1, 109.9, 0.0),
        (100.0, 10.0, 0.1, 111.0, -1.1),
        (0.0, 1.0, 0.0, 0.25, 0.75),
    ],
)
def test_validity(started: float, ttl: float, drift: float, now: float, expected: float) -> None:
    rnd = Round(3, 2, started=started)
    assert rnd.validity(now, ttl, drift) == pytest.approx(expected, abs=1e-9)


@SETTINGS
@given(
    started=st.floats(-1e6, 1e6),
    ttl=st.floats(0.001, 1e4),
    drift=st.floats(0, 100),
    now=st.floats(-1e6, 1e6),
)
def test_validity_formula(started: float, ttl: float, drift: float, now: float) -> None:
    rnd = Round(3, 2, started=started)
    assert rnd.validity(now, ttl, drift) == started + ttl - drift - now


# --- Round: properties ---------------------------------------------------------------------


@st.composite
def rounds(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, Answer]]]:
    """(n, needed, events): answers in any order, some nodes repeated, some never heard."""
    n = draw(st.integers(1, 9), label="n")
    needed = draw(st.one_of(st.just(majority(n)), st.integers(1, n)), label="needed")
    events = draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(ANSWERS)), max_size=3 * n),
        label="events",
    )
    return n, needed, events


@SETTINGS
@given(rounds(), st.booleans())
def test_round_tally_properties(
    case: tuple[int, int, list[tuple[int, Answer]]], hear_out: bool
) -> None:
    n, needed, events = case
    rnd = Round(n, needed, started=0.0, hear_out=0.002 if hear_out else 0.0)
    first: dict[int, Answer] = {}
    was_succeeded = False
    was_decided = False
    outcome_when_decided: bool | None = None
    for node, answer in events:
        _feed(rnd, node, answer)
        first.setdefault(node, answer)  # a second answer from a node is ignored

        yes = sum(1 for a in first.values() if a == "yes")
        not_yes = len(first) - yes
        assert rnd.yes == yes
        assert rnd.succeeded == (yes >= needed)
        assert rnd.impossible == (not_yes > n - needed)
        # Hearing out a failure: decided only once every node answered.
        failed = not_yes > n - needed and (not hear_out or len(first) == n)
        assert rnd.decided == (yes >= needed or failed)
        assert not (rnd.succeeded and rnd.impossible)

        # Once decided, the outcome is final: more answers never change it.
        assert not (was_decided and not rnd.decided)
        assert not (was_succeeded and not rnd.succeeded)
        if rnd.decided and outcome_when_decided is None:
            outcome_when_decided = rnd.succeeded
        if outcome_when_decided is not None:
            assert rnd.succeeded == outcome_when_decided
        was_decided, was_succeeded = rnd.decided, rnd.succeeded

        said = {a: {i for i, x in first.items() if x == a} for a in ANSWERS}
        silent = set(range(n)) - set(first)
        assert rnd.granted() == said["yes"]
        assert set(rnd.failures()) == said["fail"]
        holding = rnd.maybe_holding()
        assert not holding & said["no"], "a definite no can never be holding our token"
        assert holding == said["yes"] | said["fail"] | silent

    silent_before = set(range(n)) - set(first)
    before = list(rnd.results)
    rnd.time_out()
    assert rnd.decided
    for i in range(n):
        result = rnd.results[i]
        assert result is not None
        if i in silent_before:
            assert result.failure is Failure.UNREACHABLE
        else:
            assert result is before[i], "time_out must not touch a node that answered"
    assert set(rnd.failures()) == {i for i, a in first.items() if a == "fail"} | silent_before
    assert not rnd.maybe_holding() & {i for i, a in first.items() if a == "no"}


@SETTINGS
@given(rounds())
def test_unreachable_blocks_quorum_counts_only_failures(
    case: tuple[int, int, list[tuple[int, Answer]]],
) -> None:
    n, needed, events = case
    rnd = Round(n, needed, started=0.0)
    first: dict[int, Answer] = {}
    for node, answer in events:
        _feed(rnd, node, answer)
        first.setdefault(node, answer)
    failed = sum(1 for a in first.values() if a == "fail")
    assert rnd.unreachable_blocks_quorum() == (failed > n - needed)
    if rnd.unreachable_blocks_quorum():
        assert rnd.impossible


# --- cleanup rounds -----------------------------------------------------------------------


def test_cleanup_round_counts_non_targets_as_done() -> None:
    rnd = Round.cleanup(5, frozenset({1, 3}), started=2.0)
    assert rnd.started == 2.0
    assert not rnd.decided
    rnd.record(1, True)
    assert not rnd.decided
    rnd.record(3, True)
    assert rnd.decided


def test_cleanup_round_with_no_targets_is_decided_at_once() -> None:
    assert Round.cleanup(3, frozenset(), started=0.0).decided


@pytest.mark.parametrize(
    "first",
    [
        pytest.param("no", id="release-answered-0"),
        pytest.param("fail", id="release-failed"),
    ],
)
def test_cleanup_round_waits_for_every_target(first: Answer) -> None:
    """Its docstring: "done when *every* target answered", not at the first 0 or error.

    The drivers stop reading as soon as ``decided``; a target that answers 0 (it never
    stored our token, e.g. its SET timed out before running) must not cut the wait for
    the other targets short, or the caller returns while our keys may still be there.
    """
    rnd = Round.cleanup(5, frozenset({0, 2, 4}), started=0.0)
    _feed(rnd, 0, first)
    assert not rnd.decided, "targets 2 and 4 have not answered yet"
    rnd.record(2, True)
    assert not rnd.decided, "target 4 has not answered yet"
    rnd.record(4, True)
    assert rnd.decided


# --- connection set-up before a round ------------------------------------------------------


def test_a_round_begins_once_the_ready_nodes_could_decide_it() -> None:
    rnd = Round(5, 3, started=0.0)
    assert not rnd.enough_ready(2)
    assert rnd.enough_ready(3)
    rnd.fail(0, Failure.BACKING_OFF, "down")
    rnd.fail(1, Failure.UNREACHABLE, "refused")
    assert not rnd.enough_ready(2)  # three nodes left, all of them needed
    rnd.fail(2, Failure.CERTIFICATE, "wrong host")
    assert rnd.impossible
    assert rnd.enough_ready(0)  # nothing to wait for: it cannot succeed


@pytest.mark.parametrize(
    "rnd",
    [Round(3, 2, started=0.0, wait_all=True), Round.cleanup(3, frozenset({0, 1}), started=0.0)],
    ids=["hear-every-node", "cleanup"],
)
def test_a_round_that_hears_every_node_waits_for_every_set_up(rnd: Round) -> None:
    assert not rnd.enough_ready(3)
    assert rnd.set_up_wait(2, 1, 0, now=5.0, grace=0.05) is None


def test_set_ups_a_round_started_get_the_grace_once_the_others_could_decide_it() -> None:
    rnd = Round(3, 2, started=0.0)
    # Too few ready: wait for a set-up to end, however long that takes.
    assert rnd.set_up_wait(1, 2, 2, now=0.1, grace=0.05) is None
    # Two ready could decide it: the third, connecting for this round, gets the grace,
    # counted from the moment the round could begin.
    assert rnd.set_up_wait(2, 1, 1, now=0.3, grace=0.05) == pytest.approx(0.05)
    assert rnd.set_up_wait(2, 1, 1, now=0.32, grace=0.05) == pytest.approx(0.03)
    assert rnd.set_up_wait(2, 1, 1, now=0.35, grace=0.05) == 0.0
    # Nothing left to set up: begin.
    assert Round(3, 2, started=0.0).set_up_wait(3, 0, 0, now=0.0, grace=0.05) == 0.0


def test_a_set_up_an_earlier_round_waited_for_is_not_waited_for_again() -> None:
    rnd = Round(3, 2, started=0.0)
    assert rnd.set_up_wait(2, 1, 0, now=0.0, grace=0.05) == 0.0
    # ... unless the round cannot begin without it.
    assert rnd.set_up_wait(1, 1, 0, now=0.0, grace=0.05) is None


def test_an_impossible_round_waits_for_no_set_up() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.fail(0, Failure.CERTIFICATE, "wrong host")
    rnd.fail(1, Failure.MISCONFIGURED, "wrong password")
    assert rnd.set_up_wait(0, 1, 1, now=0.0, grace=0.05) == 0.0


def test_begin_at_moves_the_start_and_the_validity_with_it() -> None:
    rnd = Round(3, 2, started=10.0)
    assert rnd.begin_at(10.25) == 0.25
    assert rnd.started == 10.25
    assert rnd.validity(10.25, ttl=5.0, drift=0.0) == 5.0
    assert rnd.begin_at(10.0) == 0.0  # never earlier
    assert rnd.started == 10.25


def test_a_node_not_asked_while_connecting_needs_no_cleanup_and_is_no_strike() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, False)
    rnd.fail(1, Failure.CONNECTING, "not connected yet")
    rnd.fail(2, Failure.BACKING_OFF, "down")
    assert rnd.maybe_holding() == frozenset({2})
    assert rnd.failed_untried()
    rnd = Round(3, 2, started=0.0)
    rnd.fail(0, Failure.CONNECTING, "not connected yet")
    rnd.fail(1, Failure.UNREACHABLE, "no reply before the deadline")
    assert not rnd.failed_untried()


def test_a_round_begun_at_its_begin_by_or_later_asks_no_node() -> None:
    """``Run.begin_by`` (an extension never begins after the validity it extends): set-ups
    that held the round back that long leave its nodes not asked, still connecting."""
    rnd = Round(3, 2, 10.0)
    assert not rnd.began_too_late(None, [0, 1, 2])
    assert not rnd.began_too_late(10.5, [0, 1, 2])
    assert rnd.results == [None, None, None]
    assert rnd.began_too_late(10.0, [1, 2])
    assert rnd.results[0] is None
    assert rnd.failed_connecting()
    assert sorted(rnd.failures()) == [1, 2]


def test_a_round_that_refusals_decide_hears_every_node_a_failure_leaves_undecided() -> None:
    # One of three down and one "no": the third decides whether it is a failure.
    for refusals_decide, decided in ((False, True), (True, False)):
        rnd = Round(3, 2, started=0.0, refusals_decide=refusals_decide)
        rnd.fail(0, Failure.UNREACHABLE, "refused")
        rnd.record(1, False)
        assert rnd.decided is decided
        assert rnd.enough_ready(0) is decided
    rnd.record(2, False)
    assert rnd.decided
    assert rnd.refused == 2
    # Refusals alone past what a majority can spare decide it at once.
    rnd = Round(5, 3, started=0.0, refusals_decide=True)
    for i in range(3):
        assert not rnd.decided
        rnd.record(i, False)
    assert rnd.decided
    assert rnd.refused == 3
    # A success is decided at once either way.
    rnd = Round(3, 2, started=0.0, refusals_decide=True)
    rnd.record(0, True)
    rnd.record(1, True)
    assert rnd.decided
    assert rnd.succeeded


def test_set_ups_could_decide_counts_nodes_not_asked_or_queued_while_connecting() -> None:
    # The asyncio driver queues a request to a node still connecting; silent at the
    # deadline, that node is no more known than one the blocking driver did not ask.
    for connecting in (True, False):
        rnd = Round(3, 2, started=0.0)
        rnd.record(0, True)
        rnd.fail(1, Failure.ERROR, "BUSY")
        rnd.went_silent(2, "not connected yet; sent once it is", connecting=connecting)
        assert rnd.silent == 1
        assert rnd.set_ups_could_decide() is connecting
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, True)
    rnd.fail(1, Failure.ERROR, "BUSY")
    rnd.fail(2, Failure.CONNECTING, "not connected yet when the round began")
    assert rnd.set_ups_could_decide()
    rnd = Round(3, 2, started=0.0)  # a refusal: a yes from node 2 would make no majority
    rnd.record(0, False)
    rnd.fail(1, Failure.ERROR, "BUSY")
    rnd.fail(2, Failure.CONNECTING, "not connected yet when the round began")
    assert not rnd.set_ups_could_decide()

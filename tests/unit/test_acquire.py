"""The acquisition state machine, driven with a fake clock (plain floats) and a seeded RNG.

Replies are written as strings, one letter per node, in the words of ``acquire.lua``:
``y`` granted, ``n`` held by another client, ``l`` proposal too low, ``b`` no history
(blank), ``w`` warming up; ``u``/``e``/``x`` failed (unreachable, error, unsupported);
``.`` silent (timed out).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError, QuorumUnreachable, ServerUnsupported
from tenure._core.acquire import (
    GRANTED,
    HELD,
    MAX_FIXES,
    NO_HISTORY,
    TOO_LOW,
    WARMING,
    Acquisition,
    GiveUp,
    Granted,
    LeaseState,
    Retry,
    Seed,
    Step,
    round_errors,
)
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.policy import RetryPolicy, wait_random_exponential
from tenure._core.quorum import Failure, Round

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

TTL = 10.0
DRIFT = TTL * 0.01 + 0.002
POLICY = wait_random_exponential(initial=0.01, maximum=0.5)
MAX_TTL_MS = 60_000
WALL = 1_700_000_000_000_000  # a wall clock in µs: the usual first proposal
HELD_COUNTER = WALL - 5_000_000  # what a node holding someone's earlier lease answers


def names(n: int) -> list[str]:
    return [f"node{i}" for i in range(n)]


def make_spec(n: int = 5, ttl: float = TTL) -> LockSpec:
    cfg = ClientConfig.build(
        [f"redis://h{i}" for i in range(n)],
        node_timeout=0.05,
        drift_factor=0.01,
        drift_floor=0.002,
        allow_even=True,
    )
    return LockSpec.build(cfg, "res", ttl)


def make(
    n: int = 5,
    *,
    blocking: bool = True,
    timeout: float | None = None,
    now: float = 100.0,
    retry: RetryPolicy = POLICY,
    seed: int = 0,
    floor: int = 1,
) -> Acquisition:
    return Acquisition(
        make_spec(n),
        retry,
        random.Random(seed),
        blocking=blocking,
        timeout=timeout,
        now=now,
        node_names=names(n),
        max_ttl_ms=MAX_TTL_MS,
        floor=floor,
    )


def reply(rnd: Round, i: int, a: str, proposal: int, counter: int | None = None) -> None:
    """Record node ``i``'s answer ``a`` to an acquire proposing ``proposal``.

    ``counter``: the node's counter for ``n`` (default: an earlier token) and ``l``
    (default: equal to the proposal, the smallest that is too low).
    """
    if a == "y":
        rnd.record(i, True, (GRANTED, proposal))
    elif a == "n":
        rnd.record(i, False, (HELD, HELD_COUNTER if counter is None else counter))
    elif a == "l":
        rnd.record(i, False, (TOO_LOW, proposal if counter is None else counter))
    elif a == "b":
        rnd.record(i, False, (NO_HISTORY, 0))
    elif a == "w":
        rnd.record(i, False, (WARMING, 30_000 if counter is None else counter))
    elif a in "uex":
        failure = {"u": Failure.UNREACHABLE, "e": Failure.ERROR, "x": Failure.UNSUPPORTED}[a]
        rnd.fail(i, failure, f"detail{i}")
    else:
        assert a == ".", a


def feed(
    rnd: Round, answers: str, proposal: int = WALL, counters: Sequence[int | None] = ()
) -> None:
    for i, a in enumerate(answers):
        reply(rnd, i, a, proposal, counters[i] if i < len(counters) else None)


def attempt(
    acq: Acquisition,
    answers: str,
    started: float,
    now: float,
    *,
    wall: int = WALL,
    counters: Sequence[int | None] = (),
) -> tuple[Round, Step]:
    """One attempt: begin, propose from ``wall``, answer, conclude."""
    rnd = acq.begin(started)
    proposal = acq.proposal(wall)
    feed(rnd, answers, proposal, counters)
    if not rnd.decided:
        rnd.time_out()
    return rnd, acq.conclude(rnd, "tok", now)


# --- granted ------------------------------------------------------------------------------


def test_majority_with_validity_is_granted() -> None:
    acq = make()
    rnd, step = attempt(acq, "yyy..", started=100.0, now=100.01)
    assert isinstance(step, Granted)
    assert step.lease == LeaseState(
        name="res",
        key=acq.spec.key,
        token="tok",
        ttl=TTL,
        started=100.0,
        valid_until=100.0 + TTL - DRIFT,
        granted=frozenset({0, 1, 2}),
        fencing_token=WALL,
    )
    assert step.seed is None
    assert step.lease.valid_until == rnd.started + acq.spec.ttl - acq.spec.drift


def test_granted_set_is_exactly_the_yes_nodes() -> None:
    acq = make()
    _, step = attempt(acq, "nyuyy", started=5.0, now=5.04)
    assert isinstance(step, Granted)
    assert step.lease.granted == frozenset({1, 3, 4})


def test_single_node_lock() -> None:
    acq = make(1)
    _, step = attempt(acq, "y", started=0.0, now=0.001)
    assert isinstance(step, Granted)
    assert step.lease.granted == frozenset({0})


@pytest.mark.parametrize("late", [0.0, 1e-9, 0.5, 100.0])
def test_majority_that_arrives_too_late_is_not_granted(late: float) -> None:
    acq = make()
    expiry = 100.0 + TTL - DRIFT
    _, step = attempt(acq, "yyy..", started=100.0, now=expiry + late)
    assert isinstance(step, Retry)
    # Every node that said yes, and every node not heard from, is released.
    assert step.cleanup == frozenset({0, 1, 2, 3, 4})


def test_majority_just_before_expiry_is_granted() -> None:
    acq = make()
    _, step = attempt(acq, "yyy..", started=100.0, now=100.0 + TTL - DRIFT - 1e-6)
    assert isinstance(step, Granted)


def test_late_majority_non_blocking_gives_up_and_cleans_up() -> None:
    acq = make(blocking=False)
    _, step = attempt(acq, "yyynn", started=0.0, now=TTL)
    assert step == GiveUp(frozenset({0, 1, 2}), None)


# --- retry --------------------------------------------------------------------------------


def test_refusals_give_retry_with_bounded_sleep_and_cleanup() -> None:
    acq = make(seed=3)
    rnd, step = attempt(acq, "ynnny", started=1.0, now=1.01)
    assert isinstance(step, Retry)
    assert step.cleanup == rnd.maybe_holding() == frozenset({0, 4})
    assert 0.0 <= step.sleep <= 0.01  # first attempt: cap is `initial`


def test_retry_sleeps_grow_within_the_policy_bound() -> None:
    acq = make(seed=11)
    now = 0.0
    for k in range(1, 12):
        _, step = attempt(acq, "nnn..", started=now, now=now + 0.001)
        assert isinstance(step, Retry)
        assert acq.attempts == k
        assert 0.0 <= step.sleep <= min(0.5, 0.01 * 2 ** (k - 1))
        now += 0.001 + step.sleep


def test_retry_delays_are_reproducible_with_a_seeded_rng() -> None:
    def sleeps(seed: int) -> list[float]:
        acq = make(seed=seed)
        out = []
        for _ in range(6):
            _, step = attempt(acq, "nnn..", started=0.0, now=0.0)
            assert isinstance(step, Retry)
            out.append(step.sleep)
        return out

    assert sleeps(1) == sleeps(1)
    assert sleeps(1) != sleeps(2)


def test_retry_never_sleeps_past_the_timeout_and_then_gives_up() -> None:
    start = 50.0
    timeout = 0.3
    acq = make(timeout=timeout, now=start, seed=5)
    now = start
    steps: list[Step] = []
    for _ in range(1000):
        _, step = attempt(acq, "nnn..", started=now, now=now + 0.002)
        now += 0.002
        steps.append(step)
        if isinstance(step, GiveUp):
            break
        assert isinstance(step, Retry)
        assert step.sleep >= 0.0
        assert now + step.sleep <= start + timeout + 1e-12
        now += step.sleep
    final = steps[-1]
    assert isinstance(final, GiveUp)
    assert final.error is None
    assert now >= start + timeout
    assert len(steps) > 2


def test_timeout_zero_makes_exactly_one_attempt() -> None:
    acq = make(timeout=0.0, now=10.0)
    _, step = attempt(acq, "yynnn", started=10.0, now=10.001)
    assert step == GiveUp(frozenset({0, 1}), None)
    assert acq.attempts == 1


def test_timeout_elapsed_gives_up_without_error() -> None:
    acq = make(timeout=1.0, now=0.0)
    _, step = attempt(acq, "nnnyy", started=0.9, now=1.0)
    assert step == GiveUp(frozenset({3, 4}), None)


def test_non_blocking_gives_up_without_error() -> None:
    acq = make(blocking=False)
    _, step = attempt(acq, "ynnn.", started=0.0, now=0.01)
    assert step == GiveUp(frozenset({0, 4}), None)


def test_non_blocking_ignores_timeout_argument() -> None:
    # check_acquire_args refuses this combination; the machine itself must not crash on it.
    acq = make(blocking=False, timeout=5.0)
    _, step = attempt(acq, "nnn..", started=0.0, now=0.0)
    assert step == GiveUp(frozenset({3, 4}), None)


# --- unreachable --------------------------------------------------------------------------


def test_failures_that_make_a_majority_impossible_raise_quorum_unreachable() -> None:
    acq = make()
    _, step = attempt(acq, "yue..", started=0.0, now=0.05)  # nodes 3, 4 silent: time out
    assert isinstance(step, GiveUp)
    assert step.cleanup == frozenset({0, 1, 2, 3, 4})
    error = step.error
    assert isinstance(error, QuorumUnreachable)
    assert isinstance(error, ConnectionError)
    assert error.name == "res"
    assert set(error.node_errors) == {"node1", "node2", "node3", "node4"}
    assert error.node_errors["node1"] == "unreachable: detail1"
    assert error.node_errors["node2"] == "error: detail2"
    assert error.node_errors["node3"] == "unreachable: no reply before the deadline"
    assert error.node_errors["node4"] == "unreachable: no reply before the deadline"
    assert "4 of 5 nodes failed" in str(error)


def test_quorum_unreachable_even_when_non_blocking() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "uu.", started=0.0, now=0.0)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)


def test_failures_that_leave_a_majority_possible_retry() -> None:
    acq = make()
    _, step = attempt(acq, "uunny", started=0.0, now=0.01)
    assert isinstance(step, Retry)
    assert step.cleanup == frozenset({0, 1, 4})


def test_unsupported_failures_raise_server_unsupported() -> None:
    acq = make(3)
    _, step = attempt(acq, "yxx", started=0.0, now=0.01)
    assert isinstance(step, GiveUp)
    error = step.error
    assert isinstance(error, ServerUnsupported)
    assert isinstance(error, ConfigurationError)
    assert error.node == "node1"
    assert "detail1" in str(error)


def test_unsupported_wins_over_unreachable() -> None:
    acq = make(5)
    _, step = attempt(acq, "uuxyy", started=0.0, now=0.01)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, ServerUnsupported)
    assert step.error.node == "node2"


# --- plumbing -----------------------------------------------------------------------------


def test_begin_and_deadline() -> None:
    acq = make(7)
    assert acq.attempts == 0
    rnd = acq.begin(3.0)
    assert acq.attempts == 1
    assert (rnd.started, rnd.needed, len(rnd.results)) == (3.0, 4, 7)
    assert acq.deadline(rnd) == 3.0 + acq.spec.node_timeout


def test_round_errors_uses_names_or_indexes() -> None:
    rnd = Round(3, 2, 0.0)
    rnd.fail(2, Failure.ERROR, "WRONGTYPE")
    rnd.record(0, False)
    assert round_errors(rnd) == {"2": "error: WRONGTYPE"}
    assert round_errors(rnd, ["a", "b", "c"]) == {"c": "error: WRONGTYPE"}


# --- property -----------------------------------------------------------------------------

Vote = Literal["y", "n", "u", "e", "."]
VOTES: tuple[Vote, ...] = ("y", "n", "u", "e", ".")


@SETTINGS
@given(
    n=st.sampled_from([1, 3, 5, 7]),
    data=st.data(),
    elapsed=st.one_of(st.floats(0, 0.05), st.floats(0, 2 * TTL), st.just(TTL - DRIFT)),
    blocking=st.booleans(),
    timeout=st.one_of(st.none(), st.floats(0, 1)),
    seed=st.integers(0, 1000),
)
def test_granted_exactly_with_a_majority_and_positive_validity(
    n: int,
    data: st.DataObject,
    elapsed: float,
    blocking: bool,
    timeout: float | None,
    seed: int,
) -> None:
    votes: list[Vote] = data.draw(
        st.lists(st.sampled_from(VOTES), min_size=n, max_size=n),
        label="votes",
    )
    order = data.draw(st.permutations(range(n)), label="order")
    acq = make(n, blocking=blocking, timeout=timeout, now=0.0, seed=seed)
    started = data.draw(st.floats(0, 1), label="started")
    rnd = acq.begin(started)
    for i in order:  # replies arrive in any order; the driver stops once decided
        if rnd.decided:
            break
        feed_one(rnd, i, votes[i])
    if not rnd.decided:
        rnd.time_out()
    now = started + elapsed
    step = acq.conclude(rnd, "tok", now)

    spec = acq.spec
    validity = started + spec.ttl - spec.drift - now
    if isinstance(step, Granted):
        assert rnd.yes >= spec.quorum
        assert validity > 0
        assert step.lease.valid_until == started + spec.ttl - spec.drift
        assert step.lease.valid_until > now
        assert len(step.lease.granted) >= spec.quorum
        assert step.lease.granted == rnd.granted()
        return
    assert not (rnd.yes >= spec.quorum and validity > 0)
    assert step.cleanup == rnd.maybe_holding()
    assert rnd.granted() <= step.cleanup
    if isinstance(step, Retry):
        assert blocking
        assert 0.0 <= step.sleep <= min(POLICY.maximum, POLICY.initial)
        if timeout is not None:
            assert now + step.sleep <= timeout + 1e-9
    else:
        assert isinstance(step, GiveUp)
        assert (step.error is not None) == rnd.unreachable_blocks_quorum()
        if step.error is None:
            assert not blocking or (timeout is not None and now >= timeout)


def feed_one(rnd: Round, i: int, vote: Vote) -> None:
    if vote == "y":
        rnd.record(i, True)
    elif vote == "n":
        rnd.record(i, False)
    elif vote == "u":
        rnd.fail(i, Failure.UNREACHABLE, "refused")
    elif vote == "e":
        rnd.fail(i, Failure.ERROR, "ERR")

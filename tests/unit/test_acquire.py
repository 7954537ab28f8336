"""The acquisition state machine, driven with a fake clock (plain floats) and a seeded RNG.

Replies are written as strings, one letter per node, in the words of ``acquire.lua``:
``y`` granted, ``n`` held by another client, ``l`` proposal too low, ``b`` no history
(blank), ``w`` warming up; ``u``/``e``/``x`` failed (unreachable, error, unsupported);
``.`` silent (timed out).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError, QuorumUnreachable, ServerUnsupported
from tenure._core.acquire import (
    BEHIND_SPAN,
    GRANTED,
    HELD,
    HISTORIES_KEPT,
    MAX_FIXES,
    SERVED_WARM_MS,
    SILENT_ASKS,
    TOO_LOW,
    UNREACHABLE_SPAN,
    UNREACHABLE_STRIKES,
    WARMING,
    Acquisition,
    GiveUp,
    Granted,
    LeaseState,
    Refused,
    Retry,
    Seed,
    Step,
    cleanup_to_await,
    round_errors,
)
from tenure._core.commands import HISTORY_CHANGED, NO_HISTORY
from tenure._core.config import ClientConfig, LockSpec, WaitMode
from tenure._core.policy import RetryPolicy, wait_random_exponential
from tenure._core.quorum import BEHIND, NEVER, Failure, Round
from tenure.verify.scenarios import unheard

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

TTL = 10.0
DRIFT = TTL * 0.01 + 0.002
POLICY = wait_random_exponential(initial=0.01, maximum=0.5)
MAX_TTL_MS = 60_000
WALL = 1_700_000_000_000_000  # a wall clock in µs: the usual first proposal
HELD_COUNTER = WALL - 5_000_000  # what a node holding someone's earlier lease answers
REPLID = 0xC0FFEE << 100  # a changed node's replication ID, as the parser reads it (+ i)


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
    histories: dict[int, float] | None = None,
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
        histories=histories,
    )


def reply(
    rnd: Round,
    i: int,
    a: str,
    proposal: int,
    counter: int | None = None,
    floor: int | None = None,
) -> None:
    """Record node ``i``'s answer ``a`` to an acquire proposing ``proposal``.

    ``counter``: the node's counter for ``n`` (default: an earlier token) and ``l``
    (default: equal to the proposal, the smallest that is too low); the pttl for ``w``.
    ``floor``: the node's floor (default: its counter, or the granted token; 1 for ``w``).
    """
    if a == "y":
        rnd.record(i, True, (GRANTED, proposal, proposal if floor is None else floor))
    elif a == "n":
        number = HELD_COUNTER if counter is None else counter
        rnd.record(i, False, (HELD, number, number if floor is None else floor))
    elif a == "l":
        number = proposal if counter is None else counter
        rnd.record(i, False, (TOO_LOW, number, number if floor is None else floor))
    elif a == "b":
        rnd.record(i, False, (NO_HISTORY, 1000 + i, 0))  # its observation mark
    elif a == "c":  # history changed: its mark, its own (old) floor and its new history
        changed_floor = 1 if floor is None else floor
        rnd.record(i, False, (HISTORY_CHANGED, 2000 + i, changed_floor, REPLID + i))
    elif a == "p":  # blank, on a promoted server: its mark and its history
        rnd.record(i, False, (NO_HISTORY, 3000 + i, 0, REPLID + i))
    elif a == "r":  # granted, but too few replicas acknowledged it (wait_replicas)
        rnd.record(i, None, (GRANTED, proposal, proposal if floor is None else floor))
    elif a == "w":
        pttl = 30_000 if counter is None else counter
        rnd.record(i, False, (WARMING, pttl, 1 if floor is None else floor))
    elif a in "uexok":
        failure = {
            "u": Failure.UNREACHABLE,
            "e": Failure.ERROR,
            "x": Failure.UNSUPPORTED,
            "o": Failure.BACKING_OFF,
            "k": Failure.CONNECTING,
        }[a]
        rnd.fail(i, failure, f"detail{i}")
    else:
        assert a == ".", a


def feed(
    rnd: Round,
    answers: str,
    proposal: int = WALL,
    counters: Sequence[int | None] = (),
    floors: Sequence[int | None] = (),
) -> None:
    for i, a in enumerate(answers):
        counter = counters[i] if i < len(counters) else None
        reply(rnd, i, a, proposal, counter, floors[i] if i < len(floors) else None)


def decided(rnd: Round) -> bool:
    """``rnd.decided``, read afresh (mypy narrows a property read twice)."""
    return rnd.decided


def waits_for_every_node(rnd: Round) -> bool:
    """Whether ``rnd`` stays undecided once a majority is impossible (it is used up)."""
    n = len(rnd.results)
    for i in range(n - rnd.needed + 1):
        rnd.record(i, False, (HELD, 1))
    assert rnd.impossible
    return not rnd.decided


def attempt(
    acq: Acquisition,
    answers: str,
    started: float,
    now: float,
    *,
    wall: int = WALL,
    counters: Sequence[int | None] = (),
    floors: Sequence[int | None] = (),
    answered_at: Sequence[float] = (),
) -> tuple[Round, Step]:
    """One attempt: begin, propose from ``wall``, answer, conclude (``answered_at``: when
    each node last answered a request no round waited for, ``Round.time_out``)."""
    rnd = acq.begin(started)
    proposal = acq.proposal(wall)
    feed(rnd, answers, proposal, counters, floors)
    if not rnd.decided:
        rnd.time_out(answered_at)
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


@pytest.mark.parametrize(
    ("answers", "said", "not_said"),
    [
        ("nnnyy", "held by another client", "nodes"),  # held on a majority: the plain words
        ("wwwyy", "3 of 5 nodes warming up", "held"),
        ("ccwyy", "3 of 5 nodes warming up", "held"),  # history changed: the same
        ("nnwwy", "held by another client on 2 of 5 nodes; 2 of 5 nodes warming up", "?"),
        ("yyuuu", "3 of 5 nodes failed or did not answer", "held"),
        ("bbb..", "3 of 5 nodes blank", "warming"),
        ("yynny", "granted by 3 of 5 nodes, but the round left no validity", "?"),
        # Below the floor twice: the grants that fell short come after the causes.
        ("yyllu", "nodes failed or did not answer; so only 2 of 5 nodes granted, 3 needed", "held"),
        ("wwwyy", "warming up after a restart", "granted by"),  # not read as contention
        ("nnnnn", "held by another client", "granted"),
        ("nnyyu", "held by another client on 2 of 5 nodes; 1 of 5 nodes failed", "?"),
        ("lllyy", "3 of 5 nodes had granted a higher fencing token meanwhile", "held"),
        # A master without its replicas is not contention: it says so, and what to check.
        ("rrryy", "3 of 5 nodes granted, but fewer of their replicas than wait_replicas", "held"),
        ("r", "1 of 1 nodes granted, but fewer of their replicas than wait_replicas", "held"),
    ],
)
def test_a_refusal_says_why(answers: str, said: str, not_said: str) -> None:
    acq = make(len(answers), blocking=False)
    now = TTL if answers == "yynny" else 0.01  # that one: a majority, but too late
    attempt(acq, answers, started=0.0, now=now)
    assert isinstance(acq.refused, Refused)
    assert said in acq.refused.reason
    assert not_said not in acq.refused.reason


@pytest.mark.parametrize(("answers", "silent"), [("yyuu.", 3), ("bbuky", 2), ("nnyyo", 1)])
def test_the_verifier_reads_how_many_nodes_a_refusal_did_not_hear(
    answers: str, silent: int
) -> None:
    # The verifier tells a refusal by the nodes a fault left a worker from one a loaded
    # machine caused by the count of nodes it did not hear, read from the refusal's
    # reason (it crosses a process boundary as text): pinned here to the core's words.
    acq = make(len(answers), blocking=False)
    attempt(acq, answers, started=0.0, now=0.01)
    assert isinstance(acq.refused, Refused)
    assert unheard(f"refused: LockTimeout: {acq.refused.reason}") == silent


def test_a_refusal_by_blank_nodes_says_when_they_are_set_up_and_warm_up() -> None:
    # Every node answered; the blank ones wait out the patience before their seed.
    acq = Acquisition(
        make_spec(5),
        POLICY,
        random.Random(0),
        blocking=False,
        timeout=None,
        now=0.0,
        node_names=names(5),
        max_ttl_ms=MAX_TTL_MS,
        seed_patience=0.2,
    )
    attempt(acq, "bbbyy", started=0.0, now=0.01)
    _, step = attempt(acq, "bbbyy", started=0.06, now=0.07)
    assert isinstance(step, GiveUp)
    reason = acq.refused.reason
    assert "3 of 5 nodes blank: they lost their data" in reason
    assert "blank for 0.20 s" in reason
    assert "in 0.14 s" in reason
    assert "warm-up of max_ttl (60 s)" in reason
    assert "hearing every node" not in reason


def test_a_refusal_by_warming_nodes_says_how_long_is_left() -> None:
    acq = make(5, blocking=False)
    attempt(acq, "wwwyy", started=0.0, now=0.01, counters=[1_000, 25_500, 2_000])
    assert "at most max_ttl (60 s); the longest has 25.50 s left" in acq.refused.reason


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


class _GoesWrong:
    """A retry policy fine at its first attempt (all the client checks when it is made),
    then not: it raises, or asks for no number of seconds, or for too many."""

    def __init__(self, later: object) -> None:
        self.later = later

    def delay(self, attempt: int, rng: random.Random) -> float:
        if attempt == 1:
            return 0.01
        if isinstance(self.later, Exception):
            raise self.later
        return self.later  # type: ignore[return-value]


@pytest.mark.parametrize("later", [ValueError("oops"), math.nan, -1.0, 1e300, "soon"])
def test_a_retry_policy_that_goes_wrong_later_is_a_configuration_error(later: object) -> None:
    acq = make(retry=_GoesWrong(later), seed=3)
    _, step = attempt(acq, "nnn..", started=0.0, now=0.0)
    assert isinstance(step, Retry)
    with pytest.raises(ConfigurationError) as info:
        attempt(acq, "nnn..", started=0.1, now=0.1)
    assert info.value.parameter == "retry"
    assert "delay(2, rng)" in str(info.value)


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
    acq = make(blocking=False)
    _, step = attempt(acq, "yue..", started=0.0, now=0.05)  # nodes 3, 4 silent: time out
    assert step == Retry(0.0, frozenset({0, 1, 2, 3, 4}))  # the silent ones made it
    _, step = attempt(acq, "yue..", started=0.05, now=0.1)
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
    assert acq.attempts == 1  # failures that answered (refused, reset) need no second look


@pytest.mark.parametrize("first", ["y..", "u..", "n.."])
def test_non_blocking_tries_once_more_when_silent_nodes_made_the_difference(first: str) -> None:
    # Nodes silent past the node timeout may be up and starved (an overloaded machine);
    # one attempt more at once turns that into a grant when they answer it.
    acq = make(3, blocking=False)
    _, step = attempt(acq, first, started=0.0, now=0.05)
    assert step == Retry(0.0, frozenset({0, 1, 2}) if first != "n.." else frozenset({1, 2}))
    _, step = attempt(acq, first[0] + "yy", started=0.05, now=0.06)
    assert isinstance(step, Granted)
    assert acq.attempts == 2


def test_non_blocking_tries_once_more_for_silence_only_once() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "y..", started=0.0, now=0.05)
    assert isinstance(step, Retry)
    _, step = attempt(acq, "y..", started=0.05, now=0.1)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)
    assert step.error.node_errors == {
        "node1": "unreachable: no reply before the deadline",
        "node2": "unreachable: no reply before the deadline",
    }


def test_blocking_acquire_gives_up_after_consecutive_unreachable_attempts() -> None:
    # One attempt in which every node looks silent may be our own process descheduled
    # past the node timeout; several in a row are not.
    acq = make(3, seed=1)
    for k in range(UNREACHABLE_STRIKES - 1):
        _, step = attempt(acq, "uu.", started=k * 0.1, now=k * 0.1 + 0.05)
        assert isinstance(step, Retry), k
        assert step.cleanup == frozenset({0, 1, 2})
        assert 0.0 < step.sleep <= POLICY.maximum
    _, step = attempt(acq, "uu.", started=0.3, now=0.35)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)
    assert acq.attempts == UNREACHABLE_STRIKES


def test_nodes_still_in_their_back_off_are_no_new_evidence() -> None:
    # After a blip reset every connection, the next attempts find the nodes in their
    # reconnect back-off, not tried at all: waiting that out is not three strikes.
    # (Within UNREACHABLE_SPAN of the first, as a blip's short back-offs are.)
    acq = make(3, seed=1)
    _, step = attempt(acq, "uu.", started=0.0, now=0.05)
    assert isinstance(step, Retry)
    for k in range(3 * UNREACHABLE_STRIKES):
        _, step = attempt(acq, "oo.", started=0.06 + k * 0.04, now=0.06 + k * 0.04)
        assert isinstance(step, Retry), k
    # Tried again and failed again: the strikes continue from where they were.
    _, step = attempt(acq, "uo.", started=0.42, now=0.45)
    assert isinstance(step, Retry)
    _, step = attempt(acq, "ou.", started=0.46, now=0.49)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)
    assert step.error.node_errors["node0"] == "backing off: detail0"


@pytest.mark.parametrize("blocking", [False, True])
def test_nodes_still_connecting_get_one_attempt_more(blocking: bool) -> None:
    # A Cluster slot's new owner, its connection not up yet when a redirection pointed
    # there: not an outage. One attempt more, at once (the driver begins it once the
    # set-ups ended), even for a caller that does not block; then as any failure.
    acq = make(3, blocking=blocking)
    _, step = attempt(acq, "kk.", started=0.0, now=0.0)
    assert isinstance(step, Retry)
    assert step.sleep == 0.0
    assert step.cleanup == frozenset({2})  # not the nodes never asked
    _, step = attempt(acq, "kk.", started=0.1, now=0.1)
    if blocking:
        assert isinstance(step, Retry)  # waited out, as a back-off is
        assert step.sleep > 0.0
    else:
        assert isinstance(step, GiveUp)
        assert isinstance(step.error, QuorumUnreachable)


@pytest.mark.parametrize("blocking", [False, True])
def test_a_node_still_connecting_that_could_decide_beside_a_failed_one_is_waited_for(
    blocking: bool,
) -> None:
    # A new client's first attempt: nodes 0 and 1 connected first (the round could be
    # decided by them, so it began without node 2, still connecting); node 0 granted,
    # node 1 failed (BUSY). Node 2 could have made the majority: no outage yet. One
    # attempt more, even for a caller that does not block, which waits for node 2's
    # set-up though nodes 0 and 1, connected, could decide it by number.
    acq = make(3, blocking=blocking)
    _, step = attempt(acq, "yek", started=0.0, now=0.05)
    assert isinstance(step, Retry)
    assert step.sleep == 0.0
    assert step.cleanup == frozenset({0, 1})  # node 0's grant, and node 1's maybe
    rnd = acq.begin(0.06)
    assert rnd.set_up_wait(2, 1, 0, 0.06, grace=0.05) is None  # until node 2 is up
    feed(rnd, "yen", acq.proposal(WALL))  # node 1 BUSY again; node 2 holds another's lease
    step = acq.conclude(rnd, "tok", 0.1)
    if blocking:  # held by another on one node, a split: it backs off and tries again
        assert isinstance(step, Retry)
        assert step.sleep > 0.0
    else:  # refused as held, not QuorumUnreachable
        assert step == GiveUp(frozenset({0, 1}), None)
    # Only once per call, and only then: the attempt after begins as any.
    assert acq.begin(0.2).set_up_wait(2, 1, 0, 0.2, grace=0.05) == 0.0


def test_nodes_still_connecting_that_could_not_decide_beside_a_failed_one_are_an_outage() -> None:
    # Node 0 refused (held), node 1 failed, node 2 still connecting: a "yes" from node 2
    # would not make a majority, so nothing is worth waiting for.
    acq = make(3, blocking=False)
    _, step = attempt(acq, "nek", started=0.0, now=0.05)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)


def test_a_round_failed_by_connecting_and_silent_nodes_is_no_set_up_to_wait_for() -> None:
    # Node 0 still connecting, nodes 1 and 2 failed: node 0 alone makes no majority.
    for answers in ("kuu", "ku."):  # node 2 unreachable, or silent until the deadline
        acq = make(3, blocking=False)
        rnd = acq.begin(0.0)
        feed(rnd, answers, acq.proposal(WALL))
        rnd.time_out()
        step = acq.conclude(rnd, "tok", 0.05)
        assert isinstance(step, GiveUp), answers
        assert isinstance(step.error, QuorumUnreachable)


def test_a_node_not_heard_from_counts_as_one_that_may_say_yes() -> None:
    # Node 1 failed first, and node 0 still connecting made the round impossible before
    # node 2's answer was read: node 2 may have granted, so node 0 could still decide it.
    acq = make(3, blocking=False)
    _, step = attempt(acq, "ku.", started=0.0, now=0.05)  # decided before node 2 is read
    assert isinstance(step, Retry)
    assert step.cleanup == frozenset({1, 2})


def test_non_blocking_gives_up_at_once_on_nodes_in_back_off() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "oo.", started=0.0, now=0.0)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)


def test_an_attempt_that_reaches_a_majority_resets_the_unreachable_count() -> None:
    acq = make(3, seed=1)
    for k in range(3 * UNREACHABLE_STRIKES):
        answers = "nn." if k % UNREACHABLE_STRIKES == UNREACHABLE_STRIKES - 1 else "uu."
        _, step = attempt(acq, answers, started=k * 0.1, now=k * 0.1 + 0.05)
        assert isinstance(step, Retry), k


def test_a_blocking_acquire_gives_up_once_an_outage_outlasts_the_span() -> None:
    # Nodes down for a while are tried once a second (their back-off has grown): the
    # attempts between find them in it, no strike, yet the outage goes on. Failures
    # that rule out a majority in every attempt for UNREACHABLE_SPAN are enough.
    acq = make(3, seed=1)
    k = 0
    while k * 0.1 < UNREACHABLE_SPAN:
        _, step = attempt(acq, "oo.", started=k * 0.1, now=k * 0.1 + 0.001)
        assert isinstance(step, Retry), k
        k += 1
    _, step = attempt(acq, "oo.", started=k * 0.1, now=k * 0.1 + 0.001)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)
    # An attempt that could reach a majority begins the span again.
    acq = make(3, seed=1)
    _, step = attempt(acq, "oo.", started=0.0, now=0.001)
    _, step = attempt(acq, "nn.", started=0.3, now=0.301)
    _, step = attempt(acq, "oo.", started=0.6, now=0.601)
    assert isinstance(step, Retry)
    _, step = attempt(acq, "oo.", started=0.9, now=0.901)
    assert isinstance(step, Retry)


def test_nodes_behind_are_no_outage_until_the_behind_span() -> None:
    # Silent nodes that answered earlier requests meanwhile are up and behind (an
    # overloaded machine): no strikes, however many attempts, for BEHIND_SPAN; then the
    # error says what a node timeout shorter than their round trip would also look like.
    acq = make(3, seed=1)
    k = 0
    while k * 0.1 < BEHIND_SPAN:
        t = k * 0.1
        rnd, step = attempt(acq, "y..", started=t, now=t + 0.05, answered_at=[NEVER, t, t + 0.01])
        assert rnd.behind == 2
        assert isinstance(step, Retry), k
        k += 1
    t = k * 0.1
    _, step = attempt(acq, "y..", started=t, now=t + 0.05, answered_at=[NEVER, t, t])
    assert isinstance(step, GiveUp)
    assert step.cleanup == frozenset({0, 1, 2})
    assert isinstance(step.error, QuorumUnreachable)
    assert "only after the node timeout (0.05 s), ruled it out for 5.0 s" in str(step.error)
    assert "longer node_timeout" in str(step.error)
    assert step.error.node_errors["node1"] == f"unreachable: {BEHIND}"
    # One node down and one behind leave a majority up: no strikes. Two down, and the
    # one behind makes no difference: strikes, as before.
    acq = make(3, seed=1)
    for k in range(UNREACHABLE_STRIKES + 1):
        t = k * 0.1
        _, step = attempt(acq, "yu.", started=t, now=t + 0.05, answered_at=[NEVER, NEVER, t])
        assert isinstance(step, Retry)
    acq = make(3, seed=1)
    for k in range(UNREACHABLE_STRIKES):
        t = k * 0.1
        _, step = attempt(acq, "uu.", started=t, now=t + 0.05, answered_at=[NEVER, NEVER, t])
    assert isinstance(step, GiveUp)
    assert "node timeout" not in str(step.error)


def test_a_late_answer_between_two_attempts_shows_the_node_behind() -> None:
    # The reply to the attempt before came in the back-off, before this attempt began:
    # the node is up all the same. One that came before the attempt before began is not
    # news of it.
    acq = make(1, seed=1)
    _, step = attempt(acq, ".", started=0.0, now=0.05, answered_at=[NEVER])  # strike 1
    assert isinstance(step, Retry)
    rnd, step = attempt(acq, ".", started=0.1, now=0.15, answered_at=[0.07])
    assert rnd.behind == 1
    assert isinstance(step, Retry)
    # The strikes start again after it: two more are not three.
    for t in (0.2, 0.3):
        rnd, step = attempt(acq, ".", started=t, now=t + 0.05, answered_at=[0.07])
        assert rnd.behind == 0
        assert isinstance(step, Retry), t
    _, step = attempt(acq, ".", started=0.4, now=0.45, answered_at=[0.07])
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, QuorumUnreachable)
    assert "node timeout" not in str(step.error)


def test_an_attempt_behind_begins_the_unreachable_span_again() -> None:
    # Attempts far apart (a back-off grown long): silent, behind, silent. The span of
    # failures alone counts from the last, not from the first: the node answered between.
    acq = make(1, seed=1)
    _, step = attempt(acq, ".", started=0.0, now=0.05, answered_at=[NEVER])
    assert isinstance(step, Retry)
    rnd, step = attempt(acq, ".", started=0.3, now=0.35, answered_at=[0.2])
    assert rnd.behind == 1
    _, step = attempt(acq, ".", started=0.6, now=0.65, answered_at=[0.2])
    assert isinstance(step, Retry)  # 0 s of failures alone, not 0.6 (UNREACHABLE_SPAN)
    assert UNREACHABLE_SPAN <= 0.6  # (counted from the first, it would have ended)


def test_a_round_that_a_majority_answers_ends_the_behind_span() -> None:
    acq = make(1, seed=1)
    for k in range(3):
        t = k * 2.0
        _, step = attempt(acq, ".", started=t, now=t + 0.05, answered_at=[t])
        assert isinstance(step, Retry)
    _, step = attempt(acq, "n", started=6.0, now=6.01)
    _, step = attempt(acq, ".", started=7.0, now=7.05, answered_at=[7.0])
    assert isinstance(step, Retry)  # 1 s behind since the answer, not 7


def test_nodes_still_connecting_never_count_toward_the_span() -> None:
    # Connections being set up (a slow TLS handshake across zones) are no outage.
    acq = make(3, seed=1)
    for k in range(20):
        _, step = attempt(acq, "kk.", started=k * 0.1, now=k * 0.1 + 0.001)
        assert isinstance(step, Retry), k


def test_blocking_acquire_keeps_its_timeout_while_nodes_are_unreachable() -> None:
    acq = make(3, timeout=0.01, now=0.0)
    _, step = attempt(acq, "uuu", started=0.0, now=0.05)
    assert step == GiveUp(frozenset({0, 1, 2}), None)


def test_failures_that_leave_a_majority_possible_retry() -> None:
    acq = make()
    _, step = attempt(acq, "uunny", started=0.0, now=0.01)
    assert isinstance(step, Retry)
    assert step.cleanup == frozenset({0, 1, 4})


def test_unsupported_failures_raise_server_unsupported() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "yxx", started=0.0, now=0.01)
    assert isinstance(step, GiveUp)
    error = step.error
    assert isinstance(error, ServerUnsupported)
    assert isinstance(error, ConfigurationError)
    assert error.node == "node1"
    assert "detail1" in str(error)


def test_unsupported_wins_over_unreachable() -> None:
    acq = make(5)
    for k in range(UNREACHABLE_STRIKES):
        _, step = attempt(acq, "uuxyy", started=k, now=k + 0.01)
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


def test_cleanup_to_await_only_before_returning_and_not_on_failed_nodes() -> None:
    acq = make(5, blocking=False)
    rnd, step = attempt(acq, "yue.n", started=0.0, now=0.05)  # decided before node 3
    assert isinstance(step, GiveUp)
    assert step.cleanup == frozenset({0, 1, 2, 3})
    # Nodes 1 and 2 just failed: their release would queue behind a request nobody
    # answered. Node 3 was merely not read: wait for it.
    assert cleanup_to_await(step, rnd) == frozenset({0, 3})
    rnd, step = attempt(make(3, blocking=False), "yuu", started=0.0, now=0.05)
    assert isinstance(step, GiveUp)
    assert rnd.failures().keys() == {1, 2}
    assert cleanup_to_await(step, rnd) == frozenset({0})
    # One attempt more when a node only timed out (it may be slow, not gone), then the
    # same: nodes that just failed are not waited for.
    silent = make(3, blocking=False)
    rnd, step = attempt(silent, "yu.", started=0.0, now=0.05)
    assert isinstance(step, Retry)
    rnd, step = attempt(silent, "yu.", started=0.05, now=0.1)
    assert isinstance(step, GiveUp)
    assert rnd.failures().keys() == {1, 2}  # node 2 timed out
    assert cleanup_to_await(step, rnd) == frozenset({0})
    retrying = make(5)
    rnd, step = attempt(retrying, "ynnn.", started=0.0, now=0.01)
    assert isinstance(step, Retry)
    assert step.cleanup == frozenset({0, 4})
    # Before another attempt: the release goes ahead of it on the same connections.
    assert cleanup_to_await(step, rnd) == frozenset()


def test_round_errors_uses_names_or_indexes() -> None:
    rnd = Round(3, 2, 0.0)
    rnd.fail(2, Failure.ERROR, "WRONGTYPE")
    rnd.record(0, False)
    assert round_errors(rnd) == {"2": "error: WRONGTYPE"}
    assert round_errors(rnd, ["a", "b", "c"]) == {"c": "error: WRONGTYPE"}


# --- fencing: the proposal ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wall", "floor", "proposal"),
    [
        (WALL, 1, WALL),  # the wall clock is the usual first guess
        (WALL, WALL + 7, WALL + 7),  # a client behind the counters it has seen
        (0, 1, 1),  # a clock at (or before) the epoch still proposes above 0
        (-5, 1, 1),
        (WALL, WALL, WALL),
    ],
)
def test_proposal_is_the_wall_clock_or_the_floor_whichever_is_higher(
    wall: int, floor: int, proposal: int
) -> None:
    acq = make(floor=floor)
    assert acq.proposal(wall) == proposal
    assert acq.floor == floor  # proposing does not move the floor; a grant does


@SETTINGS
@given(wall=st.integers(-(2**53), 2**53), floor=st.integers(1, 2**53))
def test_proposal_is_max_of_wall_and_floor(wall: int, floor: int) -> None:
    assert make(floor=floor).proposal(wall) == max(wall, floor)


def test_granted_lease_carries_the_proposal_as_its_fencing_token() -> None:
    acq = make(floor=WALL + 100)
    _, step = attempt(acq, "yyy..", started=0.0, now=0.01, wall=WALL)
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == WALL + 100
    # The next acquisition by this client proposes above the token it was handed.
    assert acq.floor == WALL + 101


def test_granted_on_the_last_proposal_of_several_attempts() -> None:
    acq = make(3)
    _, first = attempt(acq, "nn.", started=0.0, now=0.001, wall=WALL)
    assert isinstance(first, Retry)
    _, second = attempt(acq, "yy.", started=1.0, now=1.001, wall=WALL + 1_000_000)
    assert isinstance(second, Granted)
    assert second.lease.fencing_token == WALL + 1_000_000


def test_failed_round_raises_the_floor_above_every_counter_heard() -> None:
    acq = make(5)
    # A partial grant commits our proposal on node 0; nodes 1 and 2 hold older floors.
    _, step = attempt(
        acq, "ynn..", started=0.0, now=0.01, wall=WALL, counters=[None, WALL + 9, WALL - 9]
    )
    assert isinstance(step, Retry)
    assert acq.floor == WALL + 10
    assert acq.proposal(WALL) == WALL + 10


def test_warming_pttl_is_not_a_counter() -> None:
    acq = make(3)
    _, step = attempt(acq, "www", started=0.0, now=0.01, wall=5, counters=[10**12] * 3)
    assert isinstance(step, Retry)
    assert acq.floor == 1


# --- fencing: a proposal that is too low --------------------------------------------------


def test_too_low_retries_at_once_above_the_highest_counter() -> None:
    acq = make(5)
    counters = [WALL + 50, WALL + 70, WALL + 60]
    rnd, step = attempt(acq, "lll..", started=0.0, now=0.01, counters=counters)
    assert step == Retry(0.0, rnd.maybe_holding(), None)
    assert step.cleanup == frozenset({3, 4})  # not heard from: they may have granted
    assert acq.floor == WALL + 71
    # The next attempt, with a clock still behind the counters, proposes above them.
    acq.begin(0.01)
    assert acq.proposal(WALL) == WALL + 71


def test_too_low_retries_at_once_even_when_non_blocking() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "lly", started=0.0, now=0.01, counters=[WALL + 3, WALL + 4])
    assert step == Retry(0.0, frozenset({2}), None)
    _, step = attempt(acq, "yyy", started=0.01, now=0.02)
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == WALL + 5


def test_too_low_retries_at_once_even_after_the_timeout() -> None:
    acq = make(3, timeout=0.0, now=0.0)
    _, step = attempt(acq, "ll.", started=0.0, now=0.01, counters=[WALL + 1, WALL + 1])
    assert step == Retry(0.0, frozenset({2}), None)


def test_too_low_fixes_are_bounded() -> None:
    acq = make(3, blocking=False)
    for k in range(MAX_FIXES):
        # Other clients keep raising the counters faster than we catch up.
        ahead = [max(acq.floor, WALL) + 1] * 3
        _, step = attempt(acq, "lll", started=k, now=k, counters=ahead)
        assert step == Retry(0.0, frozenset(), None), k
    ahead = [max(acq.floor, WALL) + 1] * 3
    _, step = attempt(acq, "lll", started=9.0, now=9.0, counters=ahead)
    assert step == GiveUp(frozenset(), None)
    assert acq.attempts == MAX_FIXES + 1


def test_a_free_lock_survives_a_dozen_overtaken_proposals_without_blocking() -> None:
    # Threads of one busy process overtake one another's proposals with grants of other
    # locks; under a CPU hog 4 immediate retries refused about 1 free lock in 700.
    acq = make(3, blocking=False)
    for k in range(11):
        ahead = [max(acq.floor, WALL) + 1] * 3
        _, step = attempt(acq, "lll", started=k, now=k, counters=ahead)
        assert step == Retry(0.0, frozenset(), None), k
    _, step = attempt(acq, "yyy", started=11.0, now=11.0)
    assert isinstance(step, Granted)


def test_too_low_fixes_are_bounded_then_back_off_when_blocking() -> None:
    acq = make(3, seed=4)
    for k in range(MAX_FIXES):
        ahead = [max(acq.floor, WALL)] * 2
        _, step = attempt(acq, "ll.", started=k, now=k, counters=ahead)
        assert step == Retry(0.0, frozenset({2}), None)
    ahead = [max(acq.floor, WALL)] * 2
    _, step = attempt(acq, "ll.", started=9.0, now=9.0, counters=ahead)
    assert isinstance(step, Retry)
    assert 0.0 < step.sleep <= POLICY.maximum


def test_a_split_vote_sits_out_its_round_from_the_second_in_a_row() -> None:
    """Two contenders that each held one node of three, the third silent until the
    deadline, each took its node again a jitter (a few ms) after its cleanup, where each
    round lasted a node timeout: neither found the other's node free, round after round,
    and the lock had no holder for longer than its TTL. A split vote sits out part of
    its round, at random, and from the second in a row all of it."""
    acq = make(3, seed=1)
    _, first = attempt(acq, "yn.", started=0.0, now=0.05)
    assert isinstance(first, Retry)
    assert 0.0 < first.sleep <= POLICY.initial + 0.05
    _, second = attempt(acq, "yn.", started=1.0, now=1.05)
    assert isinstance(second, Retry)
    assert second.sleep >= 0.05
    # A round the process was descheduled in counts for two node timeouts at most.
    _, third = attempt(acq, "ny.", started=2.0, now=5.0)
    assert isinstance(third, Retry)
    assert 0.1 <= third.sleep <= POLICY.maximum + 0.1


@pytest.mark.parametrize("answers", ["lnn..", "nlnnn", "llnl.", "ln.uy"])
def test_too_low_and_held_is_contention(answers: str) -> None:
    # Somebody holds the lock: proposing higher at once would only be refused again.
    acq = make(5, seed=2)
    rnd, step = attempt(acq, answers, started=0.0, now=0.01)
    assert isinstance(step, Retry)
    assert step.seed is None
    # A split vote with a grant of ours ("y") also sits out up to its round (0.01 s).
    assert 0.0 < step.sleep <= POLICY.initial + (0.01 if rnd.yes else 0.0)
    non_blocking = make(5, blocking=False)
    _, step = attempt(non_blocking, answers, started=0.0, now=0.01)
    assert isinstance(step, GiveUp)
    assert step.error is None


def test_too_low_with_failures_only_is_still_ours_to_fix() -> None:
    acq = make(5, blocking=False)
    rnd, step = attempt(acq, "lluu.", started=0.0, now=0.01, counters=[WALL + 1, WALL + 2])
    assert step == Retry(0.0, frozenset({2, 3, 4}), None)
    assert rnd.maybe_holding() == frozenset({2, 3, 4})


# --- fencing: blank nodes (no floor), seeded per node ------------------------------------


@pytest.mark.parametrize("n", [1, 3, 5])
def test_all_nodes_blank_are_seeded_at_zero_without_warm_up(n: int) -> None:
    acq = make(n, blocking=False)
    rnd, step = attempt(acq, "b" * n, started=0.0, now=0.01)
    every = frozenset(range(n))
    assert step == Retry(0.0, frozenset(), Seed(every, 0, 0))
    assert isinstance(step, Retry)
    assert step.seed is not None
    assert step.seed.marks == frozenset(range(1000, 1000 + n))  # what each node answered
    assert rnd.maybe_holding() == frozenset()
    # Seeded: the next round asks every node again and may be decided early.
    rnd = acq.begin(0.02)
    feed(rnd, "y" * (n // 2 + 1), acq.proposal(WALL))
    assert rnd.decided
    assert isinstance(acq.conclude(rnd, "tok", 0.03), Granted)


def test_a_new_name_on_nodes_with_floors_is_granted_in_the_first_round() -> None:
    # A name never used answers like any other lock once its nodes have a floor: the
    # floor stands in for its counter. Nothing to seed, no round to hear every node.
    acq = make(5, blocking=False)
    rnd, step = attempt(acq, "yyy..", started=0.0, now=0.01, floors=[WALL, WALL, WALL])
    assert isinstance(step, Granted)
    assert step.seed is None
    assert acq.attempts == 1
    assert rnd.decided


def test_a_new_name_whose_floor_is_ahead_is_too_low_once_then_granted() -> None:
    acq = make(3, blocking=False)
    floor = WALL + 10**9  # another lock's tokens on these nodes, far ahead of our clock
    _, step = attempt(acq, "lll", started=0.0, now=0.01, counters=[floor] * 3)
    assert step == Retry(0.0, frozenset(), None)
    _, step = attempt(acq, "yyy", started=0.01, now=0.02)
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == floor + 1


def test_blank_nodes_and_a_majority_with_floors_are_seeded_with_the_max_floor_and_a_warm_up() -> (
    None
):
    acq = make(5, blocking=False)
    counters = [None, WALL + 8, WALL + 30, WALL - 1]
    _, step = attempt(acq, "bllnb", started=0.0, now=0.01, counters=counters)
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 4}), WALL + 30, MAX_TTL_MS))
    assert acq.floor == WALL + 31
    assert not waits_for_every_node(acq.begin(1.0))


def test_the_seed_is_the_highest_floor_not_the_highest_counter_of_this_lock() -> None:
    # This lock's counters are low; another lock raised the floors far above them. A
    # blank node seeded from this lock's counter could later grant that other lock a
    # token below one it already handed out.
    acq = make(3, blocking=False)
    _, step = attempt(
        acq, "bln", started=0.0, now=0.01, counters=[None, 5, 6], floors=[None, 900, 700]
    )
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), 900, MAX_TTL_MS))


def test_warming_nodes_count_as_nodes_with_a_floor() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "bww", started=0.0, now=0.01, floors=[None, 40, 70])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), 70, MAX_TTL_MS))


def test_blank_with_a_majority_of_floors_is_seeded_even_if_held() -> None:
    # The lock is held by someone else, but a blank node must still be seeded before it
    # can vote; the immediate retry then meets the holder and backs off.
    acq = make(3, seed=1)
    _, step = attempt(acq, "bnn", started=0.0, now=0.01, counters=[None, 7, 9])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), 9, MAX_TTL_MS))
    _, step = attempt(acq, "wnn", started=0.01, now=0.02, counters=[None, 7, 9])
    assert isinstance(step, Retry)
    assert step.seed is None
    assert step.sleep > 0


def test_granted_round_seeds_the_blank_nodes_it_heard() -> None:
    acq = make(5)
    _, step = attempt(acq, "yybyn", started=0.0, now=0.01, wall=WALL, counters=[None] * 4 + [3])
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == WALL
    assert step.lease.granted == frozenset({0, 1, 3})
    # The highest floor now is at least our own token: every past token is below it.
    assert step.seed == Seed(frozenset({2}), WALL, MAX_TTL_MS)


FLOOR = make_spec().keys.floor  # the nodes' floor key (one per slot on a Cluster)


def _patient(
    seen: dict[tuple[int, str], float], patience: float = 0.2, *, blocking: bool = True
) -> Acquisition:
    acq = make(5, blocking=blocking)
    acq._blank_seen, acq._seed_patience = seen, patience  # as Flows gives them
    return acq


def test_a_blank_node_beside_floors_is_seeded_only_once_seen_blank_for_the_patience() -> None:
    # Another client may be seeding a new node set right now (every node was blank to
    # it) and its seed to node 2 is still on the way: a warm-up seed of ours that got
    # there first would keep a node that never granted anything out for max_ttl.
    seen: dict[tuple[int, str], float] = {}
    _, step = attempt(_patient(seen), "yybyn", started=0.0, now=0.01, counters=[None] * 4 + [3])
    assert isinstance(step, Granted)
    assert step.seed is None  # not yet: first seen blank now
    assert seen == {(2, FLOOR): 0.01}
    # Another call of the same client, still within the patience: still not.
    _, step = attempt(_patient(seen), "yybyn", started=0.1, now=0.11, counters=[None] * 4 + [3])
    assert isinstance(step, Granted)
    assert step.seed is None
    # Still blank after the patience: it lost its data; seeded with the warm-up.
    _, step = attempt(_patient(seen), "yybyn", started=0.3, now=0.31, counters=[None] * 4 + [3])
    assert isinstance(step, Granted)
    assert step.seed == Seed(frozenset({2}), WALL, MAX_TTL_MS)


def test_a_node_seen_with_a_floor_starts_its_patience_again_when_blank() -> None:
    seen: dict[tuple[int, str], float] = {}
    attempt(_patient(seen), "yybyn", started=0.0, now=0.01, counters=[None] * 4 + [3])
    attempt(_patient(seen), "yyyyn", started=0.1, now=0.11, counters=[None] * 4 + [3])
    assert seen == {}  # the other client's seed landed
    _, step = attempt(_patient(seen), "yybyn", started=0.5, now=0.51, counters=[None] * 4 + [3])
    assert isinstance(step, Granted)
    assert step.seed is None  # blank again (lost its data since): a new patience
    assert seen == {(2, FLOOR): 0.51}


def test_a_refused_attempt_waits_out_the_patience_before_a_warm_up_seed() -> None:
    seen: dict[tuple[int, str], float] = {}
    acq = _patient(seen)
    _, step = attempt(acq, "bnnnn", started=0.0, now=0.01, counters=[None, 7, 9, 9, 9])
    assert isinstance(step, Retry)  # held: the contention back-off, no seed
    assert step.seed is None
    assert step.sleep > 0
    _, step = attempt(acq, "bnnnn", started=0.3, now=0.31, counters=[None, 7, 9, 9, 9])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), 9, MAX_TTL_MS))


def test_a_non_blocking_acquire_that_meets_a_set_being_seeded_tries_once_more() -> None:
    # Another client found every node blank and is seeding them; its seed reached node 0
    # (which grants us) and not yet the others. A free lock: not refused for that, but
    # asked again once, a node timeout later (that client's seed round is over by then).
    seen: dict[tuple[int, str], float] = {}
    acq = _patient(seen, blocking=False)
    _, step = attempt(acq, "ybbbb", started=0.0, now=0.01, counters=[WALL - 5])
    assert step == Retry(0.05, frozenset({0}), None)  # our grant on node 0 released
    _, step = attempt(acq, "yyyyy", started=0.06, now=0.07)
    assert isinstance(step, Granted)


def test_a_non_blocking_acquire_waits_for_seeds_once_only() -> None:
    # Still blank a node timeout later: nobody is seeding them (they lost their data);
    # the refusal stands, and they are seeded with the warm-up once the patience is over.
    acq = _patient({}, blocking=False)
    _, step = attempt(acq, "ybbbb", started=0.0, now=0.01, counters=[WALL - 5])
    assert isinstance(step, Retry)
    _, step = attempt(acq, "ybbbb", started=0.06, now=0.07, counters=[WALL - 5])
    assert step == GiveUp(frozenset({0}), None)


@pytest.mark.parametrize(
    "answers",
    [
        "nbbbb",  # held where it has a floor: another client's lock, not a set-up
        # Blank beside warming nodes only (seeded after a data loss): no new set being
        # seeded is seen, since a new set is seeded without a warm-up.
        "bbwww",
    ],
)
def test_a_non_blocking_acquire_does_not_wait_for_seeds_otherwise(answers: str) -> None:
    acq = _patient({}, blocking=False)
    _, step = attempt(acq, answers, started=0.0, now=0.01, counters=[WALL - 5])
    assert isinstance(step, GiveUp | Retry)
    assert not (isinstance(step, Retry) and step.sleep > 0)


def test_a_node_whose_history_changed_is_seeded_without_patience() -> None:
    # A failover or a restart: never a node of a new set, so no seeding to wait for.
    seen: dict[tuple[int, str], float] = {}
    _, step = attempt(_patient(seen), "yycyn", started=0.0, now=0.01, floors=[WALL - 7] * 4)
    assert isinstance(step, Granted)
    assert step.seed is not None
    assert step.seed.nodes == frozenset({2})
    assert step.seed.warm_ms == MAX_TTL_MS
    assert seen == {}


def test_granted_round_seeds_from_a_floor_above_the_token() -> None:
    # Our lock's counter was low, the nodes' floors (another lock's tokens) are higher.
    acq = make(3)
    _, step = attempt(acq, "yyb", started=0.0, now=0.01, floors=[WALL + 5, WALL + 9])
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == WALL
    assert step.seed == Seed(frozenset({2}), WALL + 9, MAX_TTL_MS)


def test_granted_round_without_blank_nodes_seeds_nothing() -> None:
    _, step = attempt(make(5), "yyywn", started=0.0, now=0.01)
    assert isinstance(step, Granted)
    assert step.seed is None


def test_asking_every_node_is_never_cut_short_by_a_waiters_hear_out() -> None:
    # A fair waiter on a quorum hears out a failed attempt only briefly (HEAR_OUT) ...
    spec = make_spec(5)
    assert spec.wait_mode is WaitMode.FAIR_QUORUM
    acq = Acquisition(
        spec,
        POLICY,
        random.Random(0),
        blocking=True,
        timeout=None,
        now=0.0,
        node_names=names(5),
        max_ttl_ms=MAX_TTL_MS,
        recheck=0.5,
    )
    first = acq.begin(0.0)
    assert first.hear_out > 0
    feed(first, "bbn", acq.proposal(WALL))
    assert acq.conclude(first, "tok", 0.01) == Retry(0.0, frozenset({3, 4}), None)
    # ... but the round that asks every node whether the set is new waits for each of
    # them up to the node timeout: a node a little slower than the others is not
    # silent, and the blank ones must not be seeded with a warm-up for it.
    second = acq.begin(0.01)
    assert second.hear_out == 0.0
    assert waits_for_every_node(second)


def test_blank_heard_before_an_early_decision_asks_every_node_again() -> None:
    acq = make(5, blocking=False)
    first = acq.begin(0.0)
    proposal = acq.proposal(WALL)
    feed(first, "bbn", proposal)  # three "no"s out of five: decided without nodes 3, 4
    assert first.decided
    step = acq.conclude(first, "tok", 0.01)
    # A new node set, or two nodes that lost their data? Only all five can say.
    assert step == Retry(0.0, frozenset({3, 4}), None)

    second = acq.begin(0.01)
    proposal = acq.proposal(WALL)
    feed(second, "bbnn", proposal)
    # Not decided before every node has answered, however many "no"s came in.
    assert second.impossible
    assert not second.decided
    reply(second, 4, "n", proposal)
    assert decided(second)
    step = acq.conclude(second, "tok", 0.02)
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1}), HELD_COUNTER, MAX_TTL_MS))
    # Seeded: later rounds are decided early again.
    third = acq.begin(0.02)
    feed(third, "yyy", acq.proposal(WALL))
    assert third.decided


def test_wait_all_round_that_finds_every_node_blank_seeds_at_zero() -> None:
    acq = make(3, blocking=False)
    _, step = attempt(acq, "bb.", started=0.0, now=0.01)
    assert step == Retry(0.0, frozenset({2}), None)
    _, step = attempt(acq, "bbb", started=0.01, now=0.02)
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1, 2}), 0, 0))


def test_a_blank_majority_with_a_silent_node_is_seeded_at_zero_with_a_warm_up() -> None:
    # Two blank, one silent: a node set idle past the retention while a node was down
    # (or two nodes that lost their data one at a time). Having heard every node that
    # answers, the blank ones are seeded from what is there (nothing: 0), kept out for
    # max_ttl, rather than left unusable until the silent node answers. The token order
    # across this is only as good as the clocks (docs/fencing.md).
    acq = make(3, blocking=False)
    attempt(acq, "bb.", started=0.0, now=0.01)
    rnd, step = attempt(acq, "bb.", started=0.01, now=0.07)
    assert rnd.failures().keys() == {2}
    assert step == Retry(0.0, frozenset({2}), Seed(frozenset({0, 1}), 0, MAX_TTL_MS))


def test_a_blocking_acquire_asks_a_silent_node_again_before_the_warm_up() -> None:
    # A new node set whose first rounds met a slow node (connections still being set up
    # on a loaded machine): a blocking acquire hears every node again, after back-offs,
    # before it settles for seeding the blank ones with a warm-up of max_ttl.
    acq = make(3, seed=4)
    _, step = attempt(acq, "bb.", started=0.0, now=0.01)
    assert step == Retry(0.0, frozenset({2}), None)  # first, hear every node at once
    now = 0.01
    for _ in range(SILENT_ASKS):
        assert waits_for_every_node(acq.begin(now))
        _, step = attempt(acq, "bb.", started=now, now=now + 0.06)
        assert isinstance(step, Retry)
        assert step.seed is None
        assert step.sleep > 0  # a back-off: the slow node gets time
        now += 0.1
    _, step = attempt(acq, "bb.", started=now, now=now + 0.06)
    assert step == Retry(0.0, frozenset({2}), Seed(frozenset({0, 1}), 0, MAX_TTL_MS))


def test_a_blank_minority_that_answered_alone_is_not_seeded() -> None:
    # Fewer than a majority answered at all: nothing to decide from; back off.
    acq = make(5, seed=2)
    _, step = attempt(acq, "bb...", started=0.0, now=0.01)
    assert step == Retry(0.0, frozenset({2, 3, 4}), None)  # hear every node first
    _, step = attempt(acq, "bb...", started=0.01, now=0.07)
    assert isinstance(step, Retry)
    assert step.seed is None
    assert step.sleep > 0


def test_blank_majority_is_seeded_from_what_is_left_once_every_node_answered() -> None:
    # Two of three nodes blank, one with a floor: no answer can vouch for the tokens the
    # lost majority committed, but never seeding would leave the set unusable for good.
    # Once every node has answered, the blank ones are seeded from what is left, with the
    # warm-up (docs/fencing.md states what this costs the token guarantee).
    acq = make(3, seed=3)
    _, step = attempt(acq, "bb.", started=0.0, now=0.01)
    assert step == Retry(0.0, frozenset({2}), None)  # first, hear every node
    assert waits_for_every_node(acq.begin(0.02))
    _, step = attempt(acq, "bbn", started=1, now=1, counters=[None, None, 5])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1}), 5, MAX_TTL_MS))


def test_warming_counts_as_a_refusal() -> None:
    acq = make(5, blocking=False)
    rnd, step = attempt(acq, "wwy..", started=0.0, now=0.01)
    assert rnd.yes == 1
    assert step == GiveUp(frozenset({2, 3, 4}), None)
    acq = make(3)
    _, step = attempt(acq, "wyy", started=0.0, now=0.01)
    assert isinstance(step, Granted)
    assert step.lease.granted == frozenset({1, 2})
    assert step.seed is None  # a warming node has been seeded already


# --- a changed replication history (failover, restart) ------------------------------------


def test_one_node_whose_history_changed_is_seeded_from_its_own_floor_with_a_warm_up() -> None:
    # N = 1 after a failover: no other node to vouch for it. Heard in full already, so
    # seeded at once (no round to hear every node), and never as a new node set.
    acq = make(1, blocking=False)
    _, step = attempt(acq, "c", started=0.0, now=0.01, floors=[WALL - 7])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), WALL - 7, MAX_TTL_MS))
    assert isinstance(step, Retry)
    assert step.seed is not None
    assert step.seed.marks == frozenset({2000})


def test_a_changed_node_never_makes_a_new_node_set() -> None:
    # Every other node blank, one changed: had it been blank too, all would start at 0
    # with no warm-up. A failover must not look like a new node set.
    acq = make(3, blocking=False)
    _, step = attempt(acq, "bbc", started=0.0, now=0.01, floors=[None, None, 40])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1, 2}), 40, MAX_TTL_MS))
    acq = make(3, blocking=False)
    _, step = attempt(acq, "ccc", started=0.0, now=0.01, floors=[5, 9, 7])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1, 2}), 9, MAX_TTL_MS))


def test_a_changed_floor_does_not_vouch_for_a_blank_node() -> None:
    # One blank, one changed, one with a floor: no majority of floors vouches for the
    # past, so the round first hears every node, then seeds from what is there.
    acq = make(5, blocking=False)
    _, step = attempt(acq, "bcn..", started=0.0, now=0.01, counters=[None, None, 30])
    assert step == Retry(0.0, frozenset({3, 4}), None)
    _, step = attempt(
        acq, "bcnnn", started=0.01, now=0.02, counters=[None, None, 30, 31, 32], floors=[None, 99]
    )
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1}), 99, MAX_TTL_MS))


def test_a_changed_node_next_to_a_majority_of_floors_is_seeded_from_the_highest() -> None:
    acq = make(3, seed=4)
    _, step = attempt(acq, "cnn", started=0.0, now=0.01, counters=[None, 7, 9], floors=[50])
    assert step == Retry(0.0, frozenset(), Seed(frozenset({0}), 50, MAX_TTL_MS))


def test_granted_round_seeds_the_changed_nodes_it_heard() -> None:
    acq = make(3)
    _, step = attempt(acq, "yyc", started=0.0, now=0.01, floors=[None, None, WALL + 3])
    assert isinstance(step, Granted)
    assert step.lease.fencing_token == WALL
    assert step.seed == Seed(frozenset({2}), WALL + 3, MAX_TTL_MS)


def test_a_changed_history_heard_max_ttl_ago_is_seeded_without_the_warm_up() -> None:
    # A promoted master's first use of a Cluster slot (or of its node after the floor
    # expired), long after the failover: the client first heard that history at 100.0,
    # so every lease of the old one had expired by 100.0 + max_ttl. Later calls of the
    # same client, to any slot of that node, count the warm-up from then.
    histories: dict[int, float] = {}
    max_ttl = MAX_TTL_MS / 1000

    def seed_at(now: float, answers: str = "c") -> Seed | None:
        acq = make(len(answers), blocking=False, now=now, histories=histories)
        _, step = attempt(acq, answers, started=now, now=now, floors=[7] * len(answers))
        assert isinstance(step, Retry)
        return step.seed

    first = seed_at(100.0)
    assert first is not None
    assert first.warm_ms == MAX_TTL_MS
    assert histories == {REPLID: 100.0}
    half = seed_at(100.0 + max_ttl / 2)
    assert half is not None
    assert half.warm_ms == MAX_TTL_MS // 2
    later = seed_at(100.0 + max_ttl + 5)
    assert later == Seed(frozenset({0}), 7, 1)  # seed.lua never seeds a changed node at 0
    assert histories == {REPLID: 100.0}  # the first hearing stays
    # Another node's history, or another history of the same node, is heard anew.
    fresh = seed_at(100.0 + max_ttl + 6, "nc")
    assert fresh is not None
    assert fresh.warm_ms == MAX_TTL_MS
    # A node that lost its data may have granted until it answered blank: a seed that
    # covers it keeps the full warm-up.
    blank = seed_at(100.0 + 3 * max_ttl, "cb")
    assert blank is not None
    assert blank.warm_ms == MAX_TTL_MS
    assert blank.nodes == {0, 1}


def test_a_promoted_blank_node_is_changed_until_its_history_is_max_ttl_old() -> None:
    # Its master may have had a floor there that never reached it: not part of a new
    # node set, the full warm-up. Once the client has known the history for max_ttl, the
    # old master's leases have expired, and the node is blank like any other: a Cluster
    # slot nobody used, on a master promoted long ago, is a new set of one.
    histories: dict[int, float] = {}
    max_ttl = MAX_TTL_MS / 1000

    def step_at(now: float, answers: str, floors: Sequence[int | None] = ()) -> object:
        acq = make(len(answers), blocking=False, now=now, histories=histories)
        return attempt(acq, answers, started=now, now=now, floors=floors)[1]

    assert step_at(100.0, "p") == Retry(0.0, frozenset(), Seed(frozenset({0}), 0, MAX_TTL_MS))
    # Half-way: still the full warm-up (a flush may have lost grants of this history).
    assert step_at(100.0 + max_ttl / 2, "p") == Retry(
        0.0, frozenset(), Seed(frozenset({0}), 0, MAX_TTL_MS)
    )
    # A new node set: seeded at once, with the warm-up served (seed.lua refuses 0 here).
    assert step_at(100.0 + max_ttl, "p") == Retry(
        0.0, frozenset(), Seed(frozenset({0}), 0, SERVED_WARM_MS)
    )
    assert histories == {REPLID: 100.0}
    # Beside nodes with a floor, blank like any other: the full warm-up.
    step = step_at(100.0 + 2 * max_ttl, "pnn")
    assert isinstance(step, Retry)
    assert step.seed == Seed(frozenset({0}), HELD_COUNTER, MAX_TTL_MS)


def test_the_histories_a_client_remembers_are_bounded() -> None:
    histories = {REPLID + 1 + k: float(k) for k in range(HISTORIES_KEPT)}
    acq = make(1, blocking=False, now=5000.0, histories=histories)
    _, step = attempt(acq, "c", started=5000.0, now=5000.0, floors=[7])
    assert len(histories) == HISTORIES_KEPT
    assert REPLID + 1 not in histories
    assert histories[REPLID] == 5000.0
    assert isinstance(step, Retry)
    assert step.seed is not None
    assert step.seed.warm_ms == MAX_TTL_MS


def test_seeding_fixes_are_bounded() -> None:
    acq = make(3, blocking=False)
    for k in range(MAX_FIXES):
        # Each attempt finds every node blank again (its seeds were lost).
        _, step = attempt(acq, "bbb", started=k, now=k)
        assert step == Retry(0.0, frozenset(), Seed(frozenset({0, 1, 2}), 0, 0)), k
    _, step = attempt(acq, "bbb", started=9.0, now=9.0)
    assert step == GiveUp(frozenset(), None)


# --- property -----------------------------------------------------------------------------

Vote = Literal["y", "n", "l", "b", "c", "w", "u", "e", "."]
VOTES: tuple[Vote, ...] = ("y", "n", "l", "b", "c", "w", "u", "e", ".")


@SETTINGS
@given(
    n=st.sampled_from([1, 3, 5, 7]),
    data=st.data(),
    elapsed=st.one_of(st.floats(0, 0.05), st.floats(0, 2 * TTL), st.just(TTL - DRIFT)),
    blocking=st.booleans(),
    timeout=st.one_of(st.none(), st.floats(0, 1)),
    seed=st.integers(0, 1000),
    wall=st.integers(0, 2**52),
    floor=st.integers(1, 2**52),
)
def test_granted_exactly_with_a_majority_and_positive_validity(
    n: int,
    data: st.DataObject,
    elapsed: float,
    blocking: bool,
    timeout: float | None,
    seed: int,
    wall: int,
    floor: int,
) -> None:
    votes: list[Vote] = data.draw(
        st.lists(st.sampled_from(VOTES), min_size=n, max_size=n),
        label="votes",
    )
    counters = data.draw(st.lists(st.integers(0, 2**52), min_size=n, max_size=n), label="ctr")
    drawn = data.draw(st.lists(st.integers(0, 2**52), min_size=n, max_size=n), label="floors")
    order = data.draw(st.permutations(range(n)), label="order")
    acq = make(n, blocking=blocking, timeout=timeout, now=0.0, seed=seed, floor=floor)
    started = data.draw(st.floats(0, 1), label="started")
    rnd = acq.begin(started)
    proposal = acq.proposal(wall)
    assert proposal == max(wall, floor)
    heard: dict[int, Vote] = {}
    for i in order:  # replies arrive in any order; the driver stops once decided
        if rnd.decided:
            break
        vote = votes[i]
        # A node that says "too low" has a counter >= the proposal; a node's floor is at
        # least its counter (and, once it granted, the token).
        counter = max(counters[i], proposal) if vote == "l" else counters[i]
        node_floor = max(drawn[i], proposal if vote == "y" else counter)
        reply(rnd, i, vote, proposal, counter, node_floor)
        heard[i] = vote
    if not rnd.decided:
        rnd.time_out()
    now = started + elapsed
    step = acq.conclude(rnd, "tok", now)

    spec = acq.spec
    infos = {i: r.info for i, r in enumerate(rnd.results) if r is not None and r.info}
    numbers = [info[1] for info in infos.values() if info[0] in (GRANTED, HELD, TOO_LOW)]
    # The floors that vouch for a node's past: not a blank one, nor a changed one's.
    floors = [info[2] for info in infos.values() if info[0] not in (NO_HISTORY, HISTORY_CHANGED)]
    own = [info[2] for info in infos.values() if info[0] == HISTORY_CHANGED]
    blank = frozenset(i for i, v in heard.items() if v == "b")
    lost = frozenset(i for i, v in heard.items() if v in "bc")
    assert acq.floor >= max([floor, *(x + 1 for x in numbers)])
    validity = started + spec.ttl - spec.drift - now
    if isinstance(step, Granted):
        assert rnd.yes >= spec.quorum
        assert validity > 0
        assert step.lease.valid_until == started + spec.ttl - spec.drift
        assert step.lease.valid_until > now
        assert len(step.lease.granted) >= spec.quorum
        assert step.lease.granted == rnd.granted()
        assert step.lease.fencing_token == proposal
        assert acq.floor > proposal
        if lost:
            assert step.seed == Seed(lost, max(floors + own), MAX_TTL_MS)
            assert step.seed.floor >= proposal
        else:
            assert step.seed is None
        return
    assert not (rnd.yes >= spec.quorum and validity > 0)
    assert step.cleanup == rnd.maybe_holding()
    assert rnd.granted() <= step.cleanup
    ours = bool(lost) or ("l" in heard.values() and "n" not in heard.values())
    if isinstance(step, Retry):
        if step.sleep == 0.0 and (ours or step.seed):
            assert ours
            if step.seed is not None:
                assert step.seed.nodes == lost
                if blank == frozenset(range(n)):
                    assert step.seed == Seed(blank, 0, 0)
                else:
                    # Seeded from the nodes with a floor (a majority of them, or whatever
                    # is there once a majority answered), the changed ones' own floors
                    # included, kept out for max_ttl: never new while a node changed.
                    assert len(floors) >= spec.quorum or len(infos) >= spec.quorum
                    assert step.seed == Seed(lost, max(floors + own, default=0), MAX_TTL_MS)
            return
        if not blocking:
            # Nodes merely silent made the difference: one attempt more, at once.
            assert rnd.silence_blocks_quorum()
            assert step == Retry(0.0, rnd.maybe_holding())
            return
        assert step.seed is None
        # A split vote with grants of ours sits out up to its round (at most two node
        # timeouts) on top of the policy's delay.
        split = 0 < rnd.yes < spec.quorum
        extra = min(elapsed, 2 * spec.node_timeout) if split else 0.0
        assert 0.0 <= step.sleep <= min(POLICY.maximum, POLICY.initial) + extra
        if timeout is not None:
            assert now + step.sleep <= timeout + 1e-9
    else:
        assert isinstance(step, GiveUp)
        # One attempt: a blocking acquire does not give up on unreachable nodes yet.
        assert (step.error is not None) == (rnd.unreachable_blocks_quorum() and not blocking)
        assert not (step.error is not None and rnd.silence_blocks_quorum())  # first attempt
        if step.error is None:
            assert not ours or (lost and len(floors) < spec.quorum and blank != set(range(n)))
            assert not blocking or (timeout is not None and now >= timeout)
